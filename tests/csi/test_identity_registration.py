"""Identity and registration over a real unix socket with a real gRPC client."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from localpv.csi.identity import IdentityService
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.proto import pluginregistration_pb2 as reg
from localpv.csi.registration import RegistrationService, SocketPaths
from localpv.csi.rpc import SocketInUse, UnixServer
from tests.csi.conftest import Client

DRIVER = "local.csi.localpv.dev"


def test_identity_answers_name_capabilities_and_readiness(serve: Callable[..., Client]) -> None:
    ready = {"now": False}
    client = serve(IdentityService(DRIVER, ready=lambda: ready["now"]).handler())
    info = client.call("/csi.v1.Identity/GetPluginInfo", csi.GetPluginInfoRequest(), csi.GetPluginInfoResponse)
    assert info.name == DRIVER and info.vendor_version  # type: ignore[attr-defined]
    caps = client.call("/csi.v1.Identity/GetPluginCapabilities", csi.GetPluginCapabilitiesRequest(),
                       csi.GetPluginCapabilitiesResponse)
    kinds = {c.WhichOneof("type") for c in caps.capabilities}  # type: ignore[attr-defined]
    assert kinds == {"service", "volume_expansion"}
    expansion = next(c.volume_expansion for c in caps.capabilities if c.HasField("volume_expansion"))  # type: ignore[attr-defined]
    assert expansion.type == csi.PluginCapability.VolumeExpansion.ONLINE
    probe = client.call("/csi.v1.Identity/Probe", csi.ProbeRequest(), csi.ProbeResponse)
    assert probe.HasField("ready") and probe.ready.value is False  # type: ignore[attr-defined]
    ready["now"] = True
    probe = client.call("/csi.v1.Identity/Probe", csi.ProbeRequest(), csi.ProbeResponse)
    assert probe.ready.value is True  # type: ignore[attr-defined]


def test_an_unknown_method_is_unimplemented(serve: Callable[..., Client]) -> None:
    client = serve(IdentityService(DRIVER).handler())
    with pytest.raises(grpc.RpcError) as err:
        client.call("/csi.v1.Controller/CreateVolume", csi.ProbeRequest(), csi.ProbeResponse)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_socket_layout_under_any_kubelet_dir() -> None:
    paths = SocketPaths("/data/kubelet", DRIVER)
    assert paths.registration == f"/data/kubelet/plugins_registry/{DRIVER}-reg.sock"
    assert paths.csi == f"/data/kubelet/plugins/{DRIVER}/csi.sock"


def test_registration_as_the_kubelet_does_it(serve: Callable[..., Client], socket_dir: Path) -> None:
    """The kubelet's plugin watcher: GetInfo on the registration socket, then the status."""
    paths = SocketPaths(str(socket_dir / "kubelet"), DRIVER)
    service = RegistrationService(DRIVER, paths.csi)
    server = UnixServer(paths.registration, [service.handler()])
    server.start()
    client = Client(paths.registration)
    try:
        info = client.call("/pluginregistration.Registration/GetInfo", reg.InfoRequest(), reg.PluginInfo)
        assert (info.type, info.name, info.endpoint) == ("CSIPlugin", DRIVER, paths.csi)  # type: ignore[attr-defined]
        assert list(info.supported_versions) == ["1.0.0"]  # type: ignore[attr-defined]
        assert service.problem() is None
        client.call("/pluginregistration.Registration/NotifyRegistrationStatus",
                    reg.RegistrationStatus(plugin_registered=False, error="driver name too long"),
                    reg.RegistrationStatusResponse)
        assert service.problem() == f"the kubelet refused CSI driver {DRIVER}: driver name too long"
        client.call("/pluginregistration.Registration/NotifyRegistrationStatus",
                    reg.RegistrationStatus(plugin_registered=True), reg.RegistrationStatusResponse)
        assert service.problem() is None
    finally:
        client.close()
        server.stop()
    assert not os.path.exists(paths.registration), "a stopped plugin's socket must go: the kubelet unregisters it"


def test_a_stale_socket_is_replaced_and_anything_else_refused(socket_dir: Path) -> None:
    stale = socket_dir / "stale.sock"
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))
    leftover.close()
    server = UnixServer(str(stale), [IdentityService(DRIVER).handler()])
    server.start()
    client = Client(str(stale))
    try:
        info = client.call("/csi.v1.Identity/GetPluginInfo", csi.GetPluginInfoRequest(), csi.GetPluginInfoResponse)
        assert info.name == DRIVER  # type: ignore[attr-defined]
    finally:
        client.close()
        server.stop()
    regular = socket_dir / "file.sock"
    regular.write_text("not a socket")
    with pytest.raises(SocketInUse, match="another kind of file"):
        UnixServer(str(regular), [IdentityService(DRIVER).handler()]).start()
    assert regular.read_text() == "not a socket"

"""The agent's hook: the CSI and registration sockets under the kubelet dir, the controller,
metrics on the agent's registry; and grpcio never loaded by an agent without dynamic classes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from localpv.config import ProvisionerConfig
from localpv.config.dynamic import DynamicClass
from localpv.csi.app import DynamicStartError, start_dynamic
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.proto import pluginregistration_pb2 as reg
from localpv.kube.api import KubeApi
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node
from tests.conftest import wait_for
from tests.csi.conftest import Client, PoolEnv

DRIVER = "local.csi.localpv.dev"


def test_no_dynamic_class_no_grpc() -> None:
    code = ("import sys, localpv.cli, localpv.config, localpv.agent.node, localpv.agent.executor; "
            "sys.exit(1 if [m for m in sys.modules if m == 'grpc' or m.startswith('google.protobuf')] else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.root
def test_start_dynamic_serves_both_sockets(apiserver: ApiServer, kube: KubeApi, pool_env: PoolEnv,
                                           socket_dir: Path, tmp_path: Path) -> None:
    apiserver.create(node("node-1"))
    config = ProvisionerConfig(dynamic_pools={"fast": pool_env.pool.config},
                               dynamic_classes={"dyn": DynamicClass("dyn", "fast")})
    registry = CollectorRegistry()
    dynamic = start_dynamic(kube, node_name="node-1", config=lambda: config, state_dir=str(tmp_path / "state"),
                            kubelet_dir=str(socket_dir / "kubelet"), registry=registry)
    registration = Client(str(socket_dir / "kubelet" / "plugins_registry" / f"{DRIVER}-reg.sock"))
    plugin = Client(str(socket_dir / "kubelet" / "plugins" / DRIVER / "csi.sock"))
    try:
        info = registration.call("/pluginregistration.Registration/GetInfo", reg.InfoRequest(), reg.PluginInfo)
        assert info.endpoint == dynamic.paths.csi  # type: ignore[attr-defined]
        assert plugin.node("NodeGetInfo", csi.NodeGetInfoRequest()).node_id == "node-1"  # type: ignore[attr-defined]
        wait_for(dynamic.controller.synced.is_set, what="the controller's caches")
        probe = plugin.call("/csi.v1.Identity/Probe", csi.ProbeRequest(), csi.ProbeResponse)
        assert probe.ready.value is True  # type: ignore[attr-defined]
        assert dynamic.problems() == []
        text = generate_latest(registry).decode()
        assert 'localpv_dynamic_pool_capacity_bytes{pool="fast"}' in text
        assert 'localpv_csi_calls_total{code="OK",method="NodeGetInfo"} 1.0' in text
    finally:
        registration.close()
        plugin.close()
        dynamic.stop()
    assert not (socket_dir / "kubelet" / "plugins" / DRIVER / "csi.sock").exists()


def test_an_unreadable_image_journal_is_one_clear_error(apiserver: ApiServer, kube: KubeApi, tmp_path: Path,
                                                        socket_dir: Path) -> None:
    apiserver.create(node("node-1"))
    (tmp_path / "csi-images.json").write_text("{not json")
    with pytest.raises(DynamicStartError, match="unreadable image journal"):
        start_dynamic(kube, node_name="node-1", config=ProvisionerConfig, state_dir=str(tmp_path),
                      kubelet_dir=str(socket_dir), registry=CollectorRegistry())

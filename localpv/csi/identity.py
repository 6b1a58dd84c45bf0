"""The CSI Identity service: who the plugin is, what it can do, whether it is ready.

The kubelet does not need it to mount volumes, but CSI tools (``csc``, csi-sanity) and
liveness checks do, and it is the cheapest way for the agent to prove, over its own socket,
that the plugin answers.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from google.protobuf import wrappers_pb2

from localpv import __version__
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.rpc import CallObserver, Method, service

SERVICE = "csi.v1.Identity"


class IdentityService:
    """``ready`` says whether the node service can serve now (pools readable, journal loaded)."""

    def __init__(self, driver_name: str, ready: Callable[[], bool] = lambda: True) -> None:
        self.driver_name = driver_name
        self.ready = ready

    def get_plugin_info(self, _request: csi.GetPluginInfoRequest) -> csi.GetPluginInfoResponse:
        return csi.GetPluginInfoResponse(name=self.driver_name, vendor_version=__version__)

    def get_plugin_capabilities(self, _request: csi.GetPluginCapabilitiesRequest
                                ) -> csi.GetPluginCapabilitiesResponse:
        """Volumes are reachable from one node only, and grow while mounted."""
        service_cap = csi.PluginCapability.Service(type=csi.PluginCapability.Service.VOLUME_ACCESSIBILITY_CONSTRAINTS)
        expansion = csi.PluginCapability.VolumeExpansion(type=csi.PluginCapability.VolumeExpansion.ONLINE)
        return csi.GetPluginCapabilitiesResponse(capabilities=[
            csi.PluginCapability(service=service_cap), csi.PluginCapability(volume_expansion=expansion)])

    def probe(self, _request: csi.ProbeRequest) -> csi.ProbeResponse:
        return csi.ProbeResponse(ready=wrappers_pb2.BoolValue(value=bool(self.ready())))

    def handler(self, observer: CallObserver | None = None) -> grpc.GenericRpcHandler:
        return service(SERVICE, {
            "GetPluginInfo": Method(csi.GetPluginInfoRequest, self.get_plugin_info),
            "GetPluginCapabilities": Method(csi.GetPluginCapabilitiesRequest, self.get_plugin_capabilities),
            "Probe": Method(csi.ProbeRequest, self.probe),
        }, observer)

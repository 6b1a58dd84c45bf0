"""Registration with the kubelet, done by the plugin itself (no node-driver-registrar).

The kubelet watches ``<kubelet dir>/plugins_registry/`` for sockets. A socket there that
serves ``pluginregistration.Registration`` is asked ``GetInfo`` (type ``CSIPlugin``, the
driver name, the CSI socket's path, the CSI versions spoken); the kubelet then calls the
plugin's ``NodeGetInfo`` on that socket, records the driver in the Node's ``CSINode``
object, and tells the plugin how it went with ``NotifyRegistrationStatus``. The agent
keeps that answer: a refused registration makes ``/healthz`` say why.

Sockets: ``plugins_registry/<driver>-reg.sock`` and ``plugins/<driver>/csi.sock``, the
layout every CSI driver uses, so a kubelet root dir other than ``/var/lib/kubelet`` only
changes the prefix (the chart's ``kubeletDir``).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import grpc

from localpv.csi.proto import pluginregistration_pb2 as reg
from localpv.csi.rpc import CallObserver, Method, service

log = logging.getLogger(__name__)

SERVICE = "pluginregistration.Registration"
PLUGIN_TYPE = "CSIPlugin"
#: The CSI versions the node service speaks (the kubelet 1.20 accepts 1.x).
SUPPORTED_VERSIONS = ("1.0.0",)


@dataclass(frozen=True)
class SocketPaths:
    """Where the registration and CSI sockets go under the kubelet's root directory."""

    kubelet_dir: str
    driver: str

    @property
    def registration(self) -> str:
        return os.path.join(self.kubelet_dir, "plugins_registry", f"{self.driver}-reg.sock")

    @property
    def csi(self) -> str:
        return os.path.join(self.kubelet_dir, "plugins", self.driver, "csi.sock")


@dataclass(frozen=True)
class RegistrationStatus:
    registered: bool
    error: str


class RegistrationService:
    """Answers the kubelet's plugin watcher; ``status`` is its last verdict (None: not yet)."""

    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.status: RegistrationStatus | None = None
        self.notified = threading.Event()

    def get_info(self, _request: reg.InfoRequest) -> reg.PluginInfo:
        return reg.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                              supported_versions=list(SUPPORTED_VERSIONS))

    def notify(self, request: reg.RegistrationStatus) -> reg.RegistrationStatusResponse:
        self.status = RegistrationStatus(request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("the kubelet registered CSI driver %s (socket %s)", self.driver, self.endpoint)
        else:
            log.error("the kubelet refused CSI driver %s: %s", self.driver, request.error)
        self.notified.set()
        return reg.RegistrationStatusResponse()

    def problem(self) -> str | None:
        """Why the plugin is not usable by the kubelet (None when registered or not asked yet)."""
        if self.status is not None and not self.status.registered:
            return f"the kubelet refused CSI driver {self.driver}: {self.status.error}"
        return None

    def handler(self, observer: CallObserver | None = None) -> grpc.GenericRpcHandler:
        return service(SERVICE, {
            "GetInfo": Method(reg.InfoRequest, self.get_info),
            "NotifyRegistrationStatus": Method(reg.RegistrationStatus, self.notify),
        }, observer)

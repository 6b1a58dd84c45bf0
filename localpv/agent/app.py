"""``localpv agent``'s composition root: the node agent, and dynamic volumes when configured.

Wiring only: the API connection with the process's metrics and rate limit, the journal, the
:class:`~localpv.agent.node.NodeAgent`, the CSI side (:mod:`localpv.csi.app`, imported only
when the ConfigMap has dynamic classes: grpcio is heavy), all run by :func:`localpv.daemon.serve`.
The command line (:mod:`localpv.cli.agent`) has checked everything a user can type before.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from localpv.agent.journal import Journal
from localpv.agent.metrics import AgentMetrics
from localpv.agent.node import AgentError, AgentOptions, NodeAgent
from localpv.config import ProvisionerConfig
from localpv.daemon import Verdict, serve
from localpv.kube.api import KubeApi
from localpv.kube.ratelimit import RateLimiter
from localpv.kube.transport import Transport

log = logging.getLogger("localpv.agent")


@dataclass(frozen=True)
class AgentProcess:
    """What ``localpv agent`` runs with, beyond the agent's own options."""

    options: AgentOptions
    config: ProvisionerConfig
    #: The kubelet's root directory: where dynamic volumes' sockets go.
    kubelet_dir: str = "/var/lib/kubelet"
    metrics_path: str = "/metrics"
    #: Publish CSIStorageCapacity objects for the dynamic classes (the chart's ``dynamic.storageCapacity``).
    capacity_tracking: bool = True


class AgentService:
    """The node agent and, when dynamic classes exist, the CSI plugin and its provisioner."""

    def __init__(self, agent: NodeAgent, api: KubeApi, metrics: AgentMetrics, process: AgentProcess) -> None:
        self.agent = agent
        self.api = api
        self.metrics = metrics
        self.process = process
        self.dynamic: Any = None  # localpv.csi.app.DynamicVolumes once started

    def start(self) -> None:
        self.agent.start()
        if self.process.config.dynamic_classes:  # grpcio is imported only then
            from localpv.csi.app import DynamicStartError, start_dynamic

            options = self.process.options
            try:
                self.dynamic = start_dynamic(self.api, node_name=options.node_name,
                                             config=lambda: self.agent.config.current,
                                             state_dir=options.state_dir or "", kubelet_dir=self.process.kubelet_dir,
                                             registry=self.metrics.registry,
                                             volume_health_period=options.volume_health_period,
                                             namespace=options.namespace,
                                             capacity_tracking=self.process.capacity_tracking)
            except DynamicStartError as err:
                raise AgentError(str(err)) from err
            self.agent.condition_sources.append(self.dynamic.conditions)
        log.info("agent running on node %s", self.process.options.node_name)

    def stop(self) -> None:
        if self.dynamic is not None:
            self.dynamic.stop()
        self.agent.stop()

    def status(self) -> dict[str, Any]:
        """The agent's ``/status`` document, with the dynamic volumes' part when they run."""
        doc = self.agent.status()
        if self.dynamic is not None:
            doc["dynamic"] = self.dynamic.status()
        return doc

    def ready(self) -> Verdict:
        return self.agent.readiness()

    def healthy(self) -> Verdict:
        ok, why = self.agent.healthy()
        problems = self.dynamic.problems() if self.dynamic is not None else []
        return (ok and not problems), "; ".join([why, *problems]) if problems else why


def run(process: AgentProcess, journal: Journal, *, transport: Transport, listener: socket.socket | str,
        limiter: RateLimiter | None = None, event_limiter: RateLimiter | None = None) -> None:
    """Run the agent until SIGTERM/SIGINT. Raises :class:`~localpv.agent.node.AgentError` or
    :class:`~localpv.kube.errors.ApiError` when it cannot start (no Node, say)."""
    metrics = AgentMetrics()
    api = KubeApi(transport, observer=metrics.api.observe, limiter=limiter, event_limiter=event_limiter)
    agent = NodeAgent(api, process.options, process.config, journal, metrics=metrics)
    service = AgentService(agent, api, metrics, process)
    serve(service, registry=metrics.registry, listener=listener, metrics_path=process.metrics_path,
          documents={"/status": service.status}, loopback_only=("/status",), connection=transport.about())


def journal_path(state_dir: str) -> str:
    return os.path.join(state_dir, "journal.json")

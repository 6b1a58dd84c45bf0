"""One replica of ``localpv nfs``: leader election in front of the provisioning controller.

Wiring only. A replica campaigns for the Lease; the leader starts the informers and
workers (as the lib does, so standby replicas cost the API server nothing), and a leader
that loses the lease stops all work at once and reports itself finished, so the command
exits and the pod restarts as a fresh candidate (upstream exits via ``Fatalf``).

A replica knows its cluster id before it campaigns (:mod:`localpv.nfs.cluster`): given, or read
once at start, and a replica that cannot read it does not start.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from localpv.clock import Clock
from localpv.daemon import serve
from localpv.kube.api import KubeApi
from localpv.kube.leader import LeaseConfig, default_identity
from localpv.kube.ratelimit import RateLimiter
from localpv.kube.replica import LeaderReplica
from localpv.kube.transport import Transport
from localpv.naming import lock_name
from localpv.nfs.cluster import CLUSTER_NAMESPACE, read_cluster_id
from localpv.nfs.controller import ClusterCache, ControllerSettings, ProvisionController
from localpv.nfs.export import Export
from localpv.nfs.metrics import NfsMetrics
from localpv.nfs.provisioner import NfsProvisioner, NfsSource

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def election_namespace(pod_namespace: str | None, sa_file: str = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """POD_NAMESPACE, else the service account's namespace, else ``default`` (as the lib)."""
    if pod_namespace:
        return pod_namespace
    try:
        with open(sa_file, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


@dataclass(frozen=True)
class NfsOptions:
    """Everything a replica needs besides the API connection."""

    source: NfsSource
    controller: ControllerSettings
    leader_election: bool = True
    namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: The id ownership records name (``--cluster-id``); None: the kube-system namespace's uid.
    cluster_id: str | None = None

    def lease(self) -> LeaseConfig:
        return LeaseConfig(self.namespace, lock_name(self.controller.provisioner_name), self.identity,
                           self.lease_duration, self.renew_deadline, self.retry_period)


class NfsReplica(LeaderReplica[ProvisionController]):
    """One replica of the NFS provisioner (:class:`~localpv.kube.replica.LeaderReplica`)."""

    def __init__(self, api: KubeApi, options: NfsOptions, *, metrics: NfsMetrics | None = None,
                 clock: Clock | None = None) -> None:
        self.options = options
        self.metrics = metrics or NfsMetrics()
        self.cluster_id = options.cluster_id
        super().__init__(api, options.lease() if options.leader_election else None,
                         component=f"{options.controller.provisioner_name}_{options.identity}",
                         leader=self.metrics.leader, clock=clock)

    @property
    def controller(self) -> ProvisionController | None:
        return self.worker

    def identify(self) -> str:
        """This cluster's id, read on the first call when it was not given.

        Raises :class:`~localpv.nfs.cluster.ClusterIdUnavailable`; ``run`` calls this before
        anything serves, so that a replica without a cluster id never starts.
        """
        if self.cluster_id is None:
            self.cluster_id = read_cluster_id(self.api)
            log.info("cluster id %s (the uid of namespace %s)", self.cluster_id, CLUSTER_NAMESPACE)
        return self.cluster_id

    def start(self) -> None:
        self.identify()
        super().start()

    def work(self, may_act: Callable[[], bool]) -> ProvisionController:
        opts = self.options
        cache = ClusterCache(self.api, clock=self.clock)
        export = Export(opts.source.mount_dir, on_mkdir=self.metrics.directories_created.inc)
        provisioner = NfsProvisioner(opts.source, export, cache, cluster=self.identify())
        log.info("%s: provisioning for %s (export %s:%s mounted at %s, cluster id %s)", opts.identity,
                 opts.controller.provisioner_name, opts.source.server, opts.source.path, opts.source.mount_dir,
                 provisioner.cluster)
        return ProvisionController(self.api, cache, provisioner, opts.controller, recorder=self.recorder,
                                   metrics=self.metrics, clock=self.clock, may_act=may_act)


def check_mount_dir(path: str) -> str | None:
    """Why ``path`` cannot be the export mount (None if it can)."""
    if not os.path.isdir(path):
        return f"mount directory {path!r} does not exist or is not a directory (mount the export there)"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"mount directory {path!r} is not writable"
    return None


def run(options: NfsOptions, *, transport: Transport, listener: socket.socket | str, metrics_path: str = "/metrics",
        limiter: RateLimiter | None = None, event_limiter: RateLimiter | None = None) -> int:
    """The ``localpv nfs`` process: serve probes and metrics, provision until told to stop.

    ``transport`` and ``listener`` (a listening socket, or an address to listen on) are
    made by the caller, so that a bad kubeconfig or a port in use is reported before this runs.
    Returns 0 after SIGTERM/SIGINT, 1 when the leader lease was lost (the pod restarts). Raises
    :class:`~localpv.nfs.cluster.ClusterIdUnavailable` before serving anything when the cluster
    id was not given and cannot be read.
    """
    metrics = NfsMetrics()
    api = KubeApi(transport, observer=metrics.api.observe, user_agent="localpv-nfs", limiter=limiter,
                  event_limiter=event_limiter)
    replica = NfsReplica(api, options, metrics=metrics)
    replica.identify()
    if serve(replica, registry=metrics.registry, listener=listener, metrics_path=metrics_path,
             finished=replica.finished, connection=transport.about()):
        return 0
    log.error("%s: leader lease lost; exiting so that the pod restarts as a candidate", options.identity)
    return 1

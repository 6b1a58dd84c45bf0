"""``localpv claim-labeller``'s composition root: the API connection, leader election, the labeller.

One replica labels at a time (two would only repeat each other's writes, but a rolling update
must not leave a moment with none either, so the replicas campaign for a Lease). The leader
starts the informers, a standby costs the API server nothing; a leader that loses its lease
stops labelling and the process exits so that the pod restarts as a candidate.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from localpv.claimlabeller.controller import ClaimLabeller, LabellerSettings
from localpv.claimlabeller.metrics import LabellerMetrics
from localpv.clock import Clock
from localpv.csi.claimlabels import labeller_lease_name
from localpv.daemon import serve
from localpv.kube.api import KubeApi
from localpv.kube.leader import LeaseConfig, default_identity
from localpv.kube.ratelimit import RateLimiter
from localpv.kube.replica import LeaderReplica
from localpv.kube.transport import Transport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabellerOptions:
    settings: LabellerSettings
    leader_election: bool = True
    namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def lease(self) -> LeaseConfig:
        return LeaseConfig(self.namespace, labeller_lease_name(self.settings.driver), self.identity,
                           self.lease_duration, self.renew_deadline, self.retry_period)


class LabellerReplica(LeaderReplica[ClaimLabeller]):
    """One replica of the claim labeller (:class:`~localpv.kube.replica.LeaderReplica`)."""

    def __init__(self, api: KubeApi, options: LabellerOptions, *, metrics: LabellerMetrics | None = None,
                 clock: Clock | None = None) -> None:
        self.options = options
        self.metrics = metrics or LabellerMetrics()
        super().__init__(api, options.lease() if options.leader_election else None,
                         component=f"{options.settings.driver}_claim-labeller", leader=self.metrics.leader, clock=clock)

    @property
    def labeller(self) -> ClaimLabeller | None:
        return self.worker

    def work(self, may_act: Callable[[], bool]) -> ClaimLabeller:
        log.info("%s: labelling the claims of driver %s's classes with their selected node", self.options.identity,
                 self.options.settings.driver)
        return ClaimLabeller(self.api, self.options.settings, recorder=self.recorder, metrics=self.metrics,
                             clock=self.clock, may_act=may_act)


def run(options: LabellerOptions, *, transport: Transport, listener: socket.socket | str | None,
        metrics_path: str = "/metrics", limiter: RateLimiter | None = None,
        event_limiter: RateLimiter | None = None) -> int:
    """Run until SIGTERM/SIGINT (0) or until the leader lease is lost (1: the pod restarts)."""
    metrics = LabellerMetrics()
    api = KubeApi(transport, observer=metrics.api.observe, user_agent="localpv-claim-labeller", limiter=limiter,
                  event_limiter=event_limiter)
    replica = LabellerReplica(api, options, metrics=metrics)
    if serve(replica, registry=metrics.registry, listener=listener, metrics_path=metrics_path,
             finished=replica.finished, connection=transport.about()):
        return 0
    log.error("%s: leader lease lost; exiting so that the pod restarts as a candidate", options.identity)
    return 1

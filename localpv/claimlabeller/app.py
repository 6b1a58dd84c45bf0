"""``localpv claim-labeller``'s composition root: the API connection, leader election, the labeller.

One replica labels at a time (two would only repeat each other's writes, but a rolling update
must not leave a moment with none either, so the replicas campaign for a Lease). The leader
starts the informers, a standby costs the API server nothing; a leader that loses its lease
stops labelling and the process exits so that the pod restarts as a candidate.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field

from localpv.claimlabeller.controller import ClaimLabeller, LabellerSettings
from localpv.claimlabeller.metrics import LabellerMetrics
from localpv.clock import Clock, SystemClock
from localpv.csi.claimlabels import labeller_lease_name
from localpv.daemon import serve
from localpv.kube.api import KubeApi
from localpv.kube.errors import NO_RETRY
from localpv.kube.events import EventRecorder
from localpv.kube.leader import LeaderElector, LeaseConfig, default_identity
from localpv.kube.ratelimit import RateLimiter
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


class LabellerReplica:
    """Start/stop one replica; ``finished`` is set once it will do no more work."""

    def __init__(self, api: KubeApi, options: LabellerOptions, *, metrics: LabellerMetrics | None = None,
                 clock: Clock | None = None) -> None:
        self.api = api
        self.options = options
        self.metrics = metrics or LabellerMetrics()
        self.clock = clock or SystemClock()
        self.recorder = EventRecorder(api.for_events(), component=f"{options.settings.driver}_claim-labeller",
                                      clock=self.clock)
        self.labeller: ClaimLabeller | None = None
        self.finished = threading.Event()
        self.elector: LeaderElector | None = None
        if options.leader_election:
            # Election requests fail fast: a retry inside one renewal would outlast the deadline.
            lease_api = api.with_policy(backoff=NO_RETRY, timeout=options.renew_deadline)
            self.elector = LeaderElector(lease_api, options.lease(), on_started=self._lead, on_stopped=self._unlead,
                                         clock=self.clock, recorder=self.recorder)

    def start(self) -> None:
        self.recorder.start()
        if self.elector is None:
            self._lead()
        else:
            self.elector.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop working; ``release=False`` leaves the lease to expire (a crash, for tests)."""
        if self.elector is not None:
            self.elector.stop(release=release)
        self._unlead()
        self.recorder.flush(2.0)
        self.recorder.stop()

    def healthy(self) -> tuple[bool, str]:
        if self.elector is not None and not self.elector.healthy():
            return False, "leader lease lost"
        problems = self.labeller.problems() if self.labeller is not None else []
        return (False, "; ".join(problems)) if problems else (True, "ok")

    def ready(self) -> tuple[bool, str]:
        if self.labeller is not None and not self.labeller.synced.is_set():
            return False, "caches not synced"
        return True, "leader" if self.labeller is not None else "standby"

    def _lead(self) -> None:
        may_act = self.elector.is_leader if self.elector is not None else (lambda: True)
        self.labeller = ClaimLabeller(self.api, self.options.settings, recorder=self.recorder, metrics=self.metrics,
                                      clock=self.clock, may_act=may_act)
        self.metrics.leader.set(1)
        log.info("%s: labelling the claims of driver %s's classes with their selected node", self.options.identity,
                 self.options.settings.driver)
        self.labeller.start()

    def _unlead(self) -> None:
        labeller, self.labeller = self.labeller, None
        if labeller is not None:
            labeller.stop()
            self.metrics.leader.set(0)
        if self.elector is None or self.elector.finished.is_set():
            self.finished.set()


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

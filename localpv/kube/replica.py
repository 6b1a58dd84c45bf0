"""One replica of a leader-elected component (``localpv nfs``, ``localpv claim-labeller``).

Replicas campaign for a Lease; the one that holds it builds its worker (informers and all)
and runs it, a standby costs the API server nothing. A leader that loses the lease stops its
worker, and ``finished`` is set so that the process exits and the pod restarts as a
candidate. Without leader election the replica leads from its start. What differs between
components is only the worker a leader builds: :meth:`LeaderReplica.work`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from prometheus_client import Gauge

from localpv.clock import Clock, SystemClock
from localpv.kube.api import KubeApi
from localpv.kube.errors import NO_RETRY
from localpv.kube.events import EventRecorder
from localpv.kube.leader import LeaderElector, LeaseConfig


class Worker(Protocol):
    """What a leader runs: started once, stopped once, its caches' sync and its problems."""

    synced: threading.Event

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def problems(self) -> list[str]: ...


W = TypeVar("W", bound=Worker)


class LeaderReplica(Generic[W]):
    """Start/stop one replica; ``finished`` is set once it will do no more work."""

    def __init__(self, api: KubeApi, lease: LeaseConfig | None, *, component: str, leader: Gauge,
                 clock: Clock | None = None) -> None:
        """``lease`` None: no leader election (the replica leads from its start); ``leader``:
        the gauge that is 1 while this replica leads; ``component``: its events' source."""
        self.api = api
        self.clock = clock or SystemClock()
        self._leader = leader
        # Events have a rate budget of their own: a burst of them must not slow the work.
        self.recorder = EventRecorder(api.for_events(), component=component, clock=self.clock)
        self.worker: W | None = None
        self.finished = threading.Event()
        self.elector: LeaderElector | None = None
        if lease is not None:
            # Election requests fail fast: a retry loop inside one renewal would outlast the
            # renew deadline; the elector retries on its own period. Same connection, metrics
            # and rate limiter as every other request of the process.
            lease_api = api.with_policy(backoff=NO_RETRY, timeout=lease.renew_deadline)
            self.elector = LeaderElector(lease_api, lease, on_started=self._lead, on_stopped=self._unlead,
                                         clock=self.clock, recorder=self.recorder)

    def work(self, may_act: Callable[[], bool]) -> W:
        """The worker a new leader runs; ``may_act`` is False once the lease is lost."""
        raise NotImplementedError

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

    def is_leader(self) -> bool:
        return self.elector.is_leader() if self.elector is not None else self.worker is not None

    def healthy(self) -> tuple[bool, str]:
        if self.elector is not None and not self.elector.healthy():
            return False, "leader lease lost"
        problems = self.worker.problems() if self.worker is not None else []
        return (False, "; ".join(problems)) if problems else (True, "ok")

    def ready(self) -> tuple[bool, str]:
        """Ready when leading with synced caches, or when standing by as a candidate."""
        if self.worker is not None and not self.worker.synced.is_set():
            return False, "caches not synced"
        return True, "leader" if self.worker is not None else "standby"

    def _lead(self) -> None:
        may_act = self.elector.is_leader if self.elector is not None else (lambda: True)
        self.worker = self.work(may_act)
        self._leader.set(1)
        self.worker.start()

    def _unlead(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.stop()
            self._leader.set(0)
        if self.elector is None or self.elector.finished.is_set():
            self.finished.set()

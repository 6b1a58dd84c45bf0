"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it.

Only one replica of a controller may act at a time (two NFS provisioners racing on one
claim would each create a directory). The rules follow client-go's ``leaderelection``:

* A lease is *expired* when its record has not changed for ``lease_duration`` as measured
  on **our** clock since we first saw that record - never by comparing the timestamps in
  it with our wall clock, so clock skew between nodes cannot hand out two leases.
* Every write is an optimistic-concurrency update (resourceVersion): of two candidates
  that both saw an expired lease, exactly one wins, the other gets 409 and stays follower.
* The leader renews every ``retry_period``; if it has not renewed within
  ``renew_deadline`` (< ``lease_duration``) it stops leading *before* anyone else may take
  over. Losing the lease is final for this elector (upstream exits the process); callers
  stop their work in ``on_stopped`` and usually exit so the pod restarts as a candidate.
* A clean :meth:`LeaderElector.stop` releases the lease (empty holder, 1 s duration), so a
  rolling update hands over at once instead of after a full lease duration.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from localpv.clock import Clock, SystemClock
from localpv.kube.api import KubeApi
from localpv.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from localpv.kube.events import NORMAL, EventRecorder
from localpv.kube.objects import Obj
from localpv.kube.resources import LEASES

log = logging.getLogger(__name__)


def default_identity() -> str:
    """``<hostname>_<uuid>``: unique per process even when pods share a hostname."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True)
class LeaseConfig:
    """Where the lock lives, who we are, and the timing (client-go defaults 15 s / 10 s / 2 s)."""

    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs 0 < retry_period < renew_deadline < lease_duration, got "
                             f"{self.retry_period} / {self.renew_deadline} / {self.lease_duration}")


def _micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for the lease in a thread; calls back when leadership starts and ends.

    ``on_started`` runs in the elector thread once the lease is ours and must return
    promptly (start worker threads there); ``on_stopped`` runs once after leadership was
    lost or given up, also on :meth:`stop`.
    """

    def __init__(
        self,
        api: KubeApi,
        config: LeaseConfig,
        *,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        clock: Clock | None = None,
        recorder: EventRecorder | None = None,
    ) -> None:
        self.api = api
        self.config = config
        self.clock = clock or SystemClock()
        self.recorder = recorder
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._stop = threading.Event()
        self._release_on_stop = True
        self._thread: threading.Thread | None = None
        self._observed: dict[str, Any] = {}
        self._observed_at = 0.0
        self._renewed_at = -math.inf
        self._observed_lease: Obj | None = None
        self._lock = threading.Lock()
        self.leading = threading.Event()
        #: Set when leadership ended (lost or given up); the elector does not campaign again.
        self.finished = threading.Event()

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True, timeout: float = 10.0) -> None:
        """Stop campaigning/leading; ``release=False`` emulates a crash (the lease just expires)."""
        self._release_on_stop = release
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def is_leader(self) -> bool:
        """True while we hold a lease renewed recently enough that no one else can hold it."""
        with self._lock:
            fresh = self.clock.monotonic() - self._renewed_at < self.config.renew_deadline
        return self.leading.is_set() and fresh

    def healthy(self) -> bool:
        """For ``/healthz``: false once leadership was lost (the process should restart)."""
        return not self.finished.is_set() or self._stop.is_set()

    @property
    def holder(self) -> str:
        """The holder last observed on the lease ("" if none)."""
        with self._lock:
            return str(self._observed.get("holderIdentity") or "")

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        if not self._acquire():
            self.finished.set()
            return
        self.leading.set()
        log.info("%s became leader of lease %s/%s", self.config.identity, self.config.namespace, self.config.name)
        if self.recorder is not None and self._observed_lease is not None:
            self.recorder.event(self._observed_lease, NORMAL, "LeaderElection",
                                f"{self.config.identity} became leader")
        try:
            self._on_started()
            self._renew_loop()
        finally:
            self.leading.clear()
            if self._stop.is_set() and self._release_on_stop:
                self._release()
            self.finished.set()
            self._on_stopped()

    def _acquire(self) -> bool:
        while not self._stop.is_set():
            if self._try_acquire_or_renew():
                return True
            self.clock.wait(self._stop, self.config.retry_period)
        return False

    def _renew_loop(self) -> None:
        while not self._stop.is_set():
            self.clock.wait(self._stop, self.config.retry_period)
            if self._stop.is_set():
                return
            while not self._try_acquire_or_renew():
                with self._lock:
                    overdue = self.clock.monotonic() - self._renewed_at >= self.config.renew_deadline
                if overdue:
                    log.error("%s: failed to renew lease %s/%s within %.1fs; stopping",
                              self.config.identity, self.config.namespace, self.config.name,
                              self.config.renew_deadline)
                    return
                if self.clock.wait(self._stop, min(self.config.retry_period / 4, 0.5)):
                    return

    # ------------------------------------------------------------------ one attempt

    def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        now_wall = self.clock.now()
        try:
            lease = self.api.get(LEASES, cfg.name, cfg.namespace)
        except NotFound:
            return self._create(now_wall)
        except ApiError as err:
            log.warning("leader election: reading lease %s/%s: %s", cfg.namespace, cfg.name, err)
            return False
        spec = dict(lease.get("spec") or {})
        now = self.clock.monotonic()
        with self._lock:
            if spec != self._observed:
                self._observed = spec
                self._observed_at = now
            holder = str(spec.get("holderIdentity") or "")
            duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
            if holder and holder != cfg.identity and now < self._observed_at + duration:
                return False
        ours = holder == cfg.identity
        new_spec = {
            "holderIdentity": cfg.identity,
            "leaseDurationSeconds": max(1, math.ceil(cfg.lease_duration)),
            "acquireTime": spec.get("acquireTime") if ours else _micro_time(now_wall),
            "renewTime": _micro_time(now_wall),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if ours or not holder else 1),
        }
        lease["spec"] = new_spec
        return self._write(lambda: self.api.replace(LEASES, lease), now)

    def _create(self, now_wall: float) -> bool:
        cfg = self.config
        lease = {
            "apiVersion": LEASES.api_version, "kind": LEASES.kind,
            "metadata": {"name": cfg.name, "namespace": cfg.namespace},
            "spec": {
                "holderIdentity": cfg.identity,
                "leaseDurationSeconds": max(1, math.ceil(cfg.lease_duration)),
                "acquireTime": _micro_time(now_wall), "renewTime": _micro_time(now_wall),
                "leaseTransitions": 0,
            },
        }
        return self._write(lambda: self.api.create(LEASES, lease, cfg.namespace), self.clock.monotonic())

    def _write(self, call: Callable[[], Obj], started: float) -> bool:
        try:
            written = call()
        except (Conflict, AlreadyExists):
            return False  # another candidate wrote first; re-read next round
        except ApiError as err:
            log.warning("leader election: writing lease %s/%s: %s", self.config.namespace, self.config.name, err)
            return False
        with self._lock:
            self._observed = dict(written.get("spec") or {})
            self._observed_at = started
            self._renewed_at = started
            self._observed_lease = written
        return True

    def _release(self) -> None:
        """Hand the lease back so a successor need not wait for it to expire."""
        cfg = self.config
        try:
            lease = self.api.get(LEASES, cfg.name, cfg.namespace)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != cfg.identity:
                return
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro_time(self.clock.now()))
            lease["spec"] = spec
            self.api.replace(LEASES, lease)
        except ApiError as err:
            log.warning("leader election: releasing lease %s/%s: %s", cfg.namespace, cfg.name, err)

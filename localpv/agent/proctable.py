"""In-process cleanups: a bounded pool of worker threads with per-volume state.

Upstream starts one goroutine per released volume, unbounded and without a timeout, and
restarts a failed cleanup immediately on the next 10 s pass. Here a fixed pool bounds
the I/O (shredding ten disks at once helps nobody), each volume has a timeout enforced by
the cleaning function, and a failed cleanup becomes retryable only after an exponential
backoff, so a broken disk does not spin.

The table is keyed by PV name (as upstream's, and as Jobs are named), and only reports
state; the reconcile planner decides what to do with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from localpv.agent.model import FAILED, RUNNING, SUCCEEDED, CleanupStatus
from localpv.agent.outcome import CleanFn, CleanOutcome
from localpv.clock import Clock, SystemClock
from localpv.kube.errors import Backoff

__all__ = ["DEFAULT_RETRY_BACKOFF", "CleanFn", "CleanOutcome", "ProcTable"]

log = logging.getLogger(__name__)

DEFAULT_RETRY_BACKOFF = Backoff(initial=10.0, maximum=600.0, factor=2.0, attempts=1_000_000, jitter=0.2)


class ProcTable:
    """Runs cleaning functions on a fixed pool and remembers how each one ended."""

    def __init__(
        self,
        workers: int = 4,
        *,
        clock: Clock | None = None,
        retry_backoff: Backoff = DEFAULT_RETRY_BACKOFF,
        on_done: Callable[[str], None] | None = None,
    ) -> None:
        self.clock = clock or SystemClock()
        self.retry_backoff = retry_backoff
        self.on_done = on_done
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cleanup")
        self._lock = threading.Lock()
        self._states: dict[str, CleanupStatus] = {}
        self._cancel: dict[str, threading.Event] = {}
        self._progress: dict[str, str] = {}
        self.succeeded_total = 0
        self.failed_total = 0

    def start(self, name: str, fn: CleanFn, *, pv_uid: str | None = None) -> bool:
        """Queue a cleanup; False if one for ``name`` is already running."""
        with self._lock:
            previous = self._states.get(name)
            if previous is not None and previous.state == RUNNING:
                return False
            attempts = previous.attempts + 1 if previous is not None and previous.state == FAILED else 1
            self._states[name] = CleanupStatus(RUNNING, self.clock.now(), pv_uid, attempts=attempts)
            cancel = self._cancel[name] = threading.Event()
        self._pool.submit(self._run, name, fn, cancel)
        return True

    def _run(self, name: str, fn: CleanFn, cancel: threading.Event) -> None:
        with self._lock:
            current = self._states.get(name)
            if current is not None:
                # Elapsed time and durations count from the actual start, not the queueing.
                self._states[name] = replace(current, started=self.clock.now())
        try:
            outcome = fn(cancel)
        except Exception as err:  # a bug or OS error in cleaning is a failed cleanup
            log.exception("cleanup of %s crashed", name)
            outcome = CleanOutcome(False, f"{type(err).__name__}: {err}")
        now = self.clock.now()
        with self._lock:
            current = self._states.get(name)
            if current is None:
                return  # forgotten meanwhile
            if outcome.ok:
                self.succeeded_total += 1
                self._states[name] = replace(current, state=SUCCEEDED, finished=now, message=outcome.message)
            else:
                self.failed_total += 1
                delay = self.retry_backoff.delay(current.attempts)
                self._states[name] = replace(current, state=FAILED, finished=now, retry_at=now + delay,
                                             message=outcome.message)
            self._cancel.pop(name, None)
            self._progress.pop(name, None)
        log.log(logging.INFO if outcome.ok else logging.WARNING, "cleanup of %s %s: %s",
                name, "succeeded" if outcome.ok else "failed", outcome.message)
        if self.on_done is not None:
            self.on_done(name)

    def set_progress(self, name: str, text: str) -> None:
        with self._lock:
            if name in self._states:
                self._progress[name] = text

    def progress(self, name: str) -> str:
        with self._lock:
            return self._progress.get(name, "")

    def status(self, name: str) -> CleanupStatus | None:
        with self._lock:
            return self._states.get(name)

    def statuses(self) -> dict[str, CleanupStatus]:
        with self._lock:
            return dict(self._states)

    def forget(self, name: str) -> None:
        """Drop a finished entry (after its PV was deleted); running ones are kept."""
        with self._lock:
            status = self._states.get(name)
            if status is not None and status.state != RUNNING:
                del self._states[name]

    def stats(self) -> dict[str, float]:
        with self._lock:
            running = sum(1 for s in self._states.values() if s.state == RUNNING)
            return {
                "local_volume_provisioner_proctable_running": running,
                "local_volume_provisioner_proctable_succeeded": self.succeeded_total,
                "local_volume_provisioner_proctable_failed": self.failed_total,
            }

    def shutdown(self, wait: bool = True) -> None:
        """Drop queued cleanups, cancel running ones, and stop the pool (the journal makes
        the next agent start them again)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for event in self._cancel.values():
                event.set()
        if wait:
            self._pool.shutdown(wait=True)

"""A keyed work queue with per-item exponential backoff (client-go's rate-limited queue).

Why this shape: a key is never handed to two workers at once (``processing``), adding a
key that is already waiting is a no-op (``dirty``), so a burst of watch events for one
claim costs one sync; failures come back after ``initial * 2**n`` seconds, capped, per
item, so one broken claim never slows the others. Delays run on the injected clock, so
tests drive backoff with :class:`~localpv.clock.ManualClock` instead of sleeping.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from dataclasses import dataclass

from localpv.clock import Clock, SystemClock


@dataclass(frozen=True)
class ItemBackoff:
    """Per-item exponential delays: ``initial`` doubling up to ``maximum`` (lib: 15 s → 1000 s)."""

    initial: float = 15.0
    maximum: float = 1000.0

    def delay(self, failures: int) -> float:
        return float(min(self.maximum, self.initial * 2 ** min(failures, 64)))


class WorkQueue:
    """``add``/``get``/``done`` plus ``add_rate_limited``/``forget``; ``shutdown`` ends ``get``."""

    def __init__(self, name: str, *, backoff: ItemBackoff | None = None, clock: Clock | None = None) -> None:
        self.name = name
        self.backoff = backoff or ItemBackoff()
        self.clock = clock or SystemClock()
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._failures: dict[str, int] = {}
        self._delayed: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._shutdown = False
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._timer = threading.Thread(target=self._run_timer, name=f"{name}-delays", daemon=True)
        self._timer.start()

    # ------------------------------------------------------------------ immediate

    def add(self, key: str) -> None:
        with self._cond:
            if self._shutdown or key in self._dirty:
                return
            self._dirty.add(key)
            if key not in self._processing:
                self._queue.append(key)
                self._cond.notify()

    def get(self) -> str | None:
        """The next key (now owned by the caller until :meth:`done`); None after shutdown."""
        with self._cond:
            while not self._queue and not self._shutdown:
                self._cond.wait()
            if self._shutdown:
                return None
            key = self._queue.popleft()
            self._processing.add(key)
            self._dirty.discard(key)
            return key

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def idle(self) -> bool:
        """Nothing queued, being processed or waiting out a delay."""
        with self._cond:
            return not (self._queue or self._processing or self._delayed)

    # ------------------------------------------------------------------ delayed

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            heapq.heappush(self._delayed, (self.clock.monotonic() + delay, next(self._seq), key))
        self._wake.set()

    def add_rate_limited(self, key: str) -> float:
        """Requeue after this item's next backoff step; returns the delay chosen."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = self.backoff.delay(failures)
        self.add_after(key, delay)
        return delay

    def num_requeues(self, key: str) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def waiting(self) -> list[tuple[float, str]]:
        """Delayed items as (seconds until due, key), soonest first: what backoff decided."""
        with self._cond:
            now = self.clock.monotonic()
            return [(due - now, key) for due, _, key in sorted(self._delayed)]

    def forget(self, key: str) -> None:
        """Reset the item's backoff (after a success, or to re-arm a given-up item)."""
        with self._cond:
            self._failures.pop(key, None)

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
        self._stopped.set()
        self._wake.set()
        self._timer.join(5)

    def _run_timer(self) -> None:
        while not self._stopped.is_set():
            with self._cond:
                now = self.clock.monotonic()
                due: list[str] = []
                while self._delayed and self._delayed[0][0] <= now:
                    due.append(heapq.heappop(self._delayed)[2])
                wait = self._delayed[0][0] - now if self._delayed else 3600.0
                self._wake.clear()
            for key in due:
                self.add(key)
            if not due:
                self.clock.wait(self._wake, wait)

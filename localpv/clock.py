"""An injectable clock, so that backoff, timeouts and periodic loops are testable.

Production code takes a :class:`Clock`; tests pass a :class:`ManualClock` and advance it,
so no test has to sleep to see a timer fire.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time, wall time and an interruptible wait."""

    def monotonic(self) -> float: ...

    def now(self) -> float: ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait for ``event`` at most ``timeout`` seconds; True if it was set."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout))


class ManualClock:
    """A clock that moves only when told to; waits return as soon as time reaches them."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._t = start
        self._cond = threading.Condition()
        self._waiters = 0

    @property
    def waiters(self) -> int:
        """How many threads wait on this clock now: a test advances it once they do, or the
        deadline of a wait that starts after the advance is still ahead."""
        with self._cond:
            return self._waiters

    def monotonic(self) -> float:
        with self._cond:
            return self._t

    def now(self) -> float:
        return self.monotonic()

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._t += seconds
            self._cond.notify_all()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        with self._cond:
            deadline = self._t + timeout
            self._waiters += 1
            try:
                while not event.is_set() and self._t < deadline:
                    # Real-time poll of the event, virtual-time deadline.
                    self._cond.wait(0.01)
            finally:
                self._waiters -= 1
            return event.is_set()

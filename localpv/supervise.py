"""Supervised background threads: a loop that crashes is logged, counted and restarted.

A DaemonSet that silently loses its config-reload or reconcile thread keeps answering
``/healthz`` with 200 while it no longer does its job. Every long-running loop of the
agent therefore runs under a :class:`Supervisor`:

* an exception escaping the loop is logged with the thread's name and counted;
* the loop is started again after a backoff (short at first, capped), because most
  crashes are one bad input (a malformed object, a config the parser chokes on);
* a loop that keeps crashing - ``crash_limit`` crashes without ``stable_after`` seconds
  of quiet in between - is reported by :meth:`Supervisor.problems`, which makes the
  liveness probe fail so that the kubelet restarts the whole process (crash-only).

A loop that *returns* while the supervisor is not stopping is treated like a crash: a
loop that was meant to run forever and ended has stopped doing its job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from localpv.clock import Clock, SystemClock

log = logging.getLogger(__name__)


@dataclass
class _Loop:
    name: str
    thread: threading.Thread
    crashes: int = 0
    recent: int = 0
    last_crash: float = 0.0
    last_error: str = ""


class Supervisor:
    """Starts named loops and keeps them running; ``stop`` ends them all."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        on_crash: Callable[[str], None] | None = None,
        initial_delay: float = 0.5,
        max_delay: float = 30.0,
        crash_limit: int = 5,
        stable_after: float = 300.0,
        stopping: threading.Event | None = None,
    ) -> None:
        """``stopping`` is the owner's stop event, when it has one: loops that end because
        it is set are not crashes."""
        self.clock = clock or SystemClock()
        self.on_crash = on_crash
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        self.crash_limit = crash_limit
        self.stable_after = stable_after
        self.stopping = stopping or threading.Event()
        self._loops: dict[str, _Loop] = {}
        self._lock = threading.Lock()

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=self._run, args=(name, target), name=name, daemon=True)
        with self._lock:
            self._loops[name] = _Loop(name, thread)
        thread.start()
        return thread

    def _run(self, name: str, target: Callable[[], None]) -> None:
        while not self.stopping.is_set():
            try:
                target()
                if self.stopping.is_set():
                    return
                error = "the loop returned"
            except Exception as err:  # the point of supervision: any bug, logged and counted
                if self.stopping.is_set():
                    return
                log.exception("thread %s crashed; restarting it", name)
                error = f"{type(err).__name__}: {err}"
            delay = self._record_crash(name, error)
            self.clock.wait(self.stopping, delay)

    def _record_crash(self, name: str, error: str) -> float:
        now = self.clock.monotonic()
        with self._lock:
            loop = self._loops[name]
            if loop.last_crash and now - loop.last_crash > self.stable_after:
                loop.recent = 0
            loop.crashes += 1
            loop.recent += 1
            loop.last_crash = now
            loop.last_error = error[:300]
            recent = loop.recent
        if self.on_crash is not None:
            self.on_crash(name)
        return float(min(self.max_delay, self.initial_delay * 2 ** (recent - 1)))

    def problems(self) -> list[str]:
        """Why the supervised loops are not doing their job (empty when they are)."""
        found = []
        with self._lock:
            loops = list(self._loops.values())
        for loop in loops:
            # ident is None between spawn()'s registration and the thread's start: starting, not dead
            if loop.thread.ident is not None and not loop.thread.is_alive() and not self.stopping.is_set():
                found.append(f"thread {loop.name} is not running")
            elif loop.recent >= self.crash_limit:
                found.append(f"thread {loop.name} crashed {loop.recent} times in a row (last: {loop.last_error})")
        return found

    def crashes(self, name: str) -> int:
        with self._lock:
            loop = self._loops.get(name)
            return loop.crashes if loop else 0

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        with self._lock:
            threads = [loop.thread for loop in self._loops.values()]
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

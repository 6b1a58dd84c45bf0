"""Bounded waits on storage that may never answer.

A ``stat``, ``statvfs`` or ``ioctl`` on a hung FUSE or NFS mount, or on a dying disk, can
block in the kernel for ever, and nothing interrupts a thread stuck there. So every probe
of storage the agent makes on its own schedule (discovery) runs on a small pool of daemon
threads, and the caller waits for it only up to a timeout. A probe that does not answer
in time is *abandoned*: its thread stays blocked until the storage answers or its mount is
aborted, the caller gets :class:`StorageHung` at once, and a fresh thread takes the
abandoned one's place, so a hung mount never starves probes of healthy ones.

Abandoned threads are bounded: a stuck thread is replaced at most ``max_stuck`` times
over (at most ``workers + max_stuck`` threads exist), and once all of them are stuck a
probe is refused at once rather than leaving yet another thread behind. And a probe that hung is remembered under
its key (a path): until its stuck thread returns, asking again answers :class:`StorageHung`
straight away, without a new thread, unless the caller's ``signature`` for the key (the
mount on that path) changed meanwhile - a new mount is looked at afresh.

Cleaning, which may take hours and must be killed when it overruns, runs in child
processes instead (:mod:`localpv.agent.cleaning`); this module is for short probes.
"""

from __future__ import annotations

import collections
import errno
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

__all__ = ["DEFAULT_PROBE_TIMEOUT", "StorageHung", "StorageProbes", "default_probes"]

T = TypeVar("T")

#: How long a probe of storage may take before it is abandoned as hung. Healthy local
#: storage answers a stat or statvfs in microseconds; a second is far beyond any of them,
#: and short enough that a pass meeting a newly hung mount is only a second late.
DEFAULT_PROBE_TIMEOUT = 1.0
DEFAULT_WORKERS = 4
DEFAULT_MAX_STUCK = 32
_IDLE_EXIT = 60.0  # a surplus idle worker ends after this long


class StorageHung(OSError):
    """A probe of storage did not answer in time, or was not run.

    ``key`` is what was probed, ``timeout`` the bound it overran, ``since`` the monotonic
    time the probe that hung started. ``probed`` is False when nothing ran this time:
    the key is known hung, or (``refused``) every thread the cap allows is stuck already.
    """

    def __init__(self, key: str, message: str, *, timeout: float, since: float, probed: bool,
                 refused: bool = False) -> None:
        super().__init__(errno.ETIMEDOUT, message)
        self.key = key
        self.timeout = timeout
        self.since = since
        self.probed = probed
        self.refused = refused


@dataclass(eq=False)
class _Job(Generic[T]):
    key: str
    fn: Callable[[], T]
    timeout: float
    signature: Callable[[], Hashable]
    started: float | None = None
    finished: bool = False
    result: T | None = None
    error: BaseException | None = None
    #: what ``signature`` said when the probe was declared hung
    hung_signature: Hashable = None
    abandoned: bool = False


def _no_signature() -> Hashable:
    return None


class StorageProbes:
    """Runs short blocking calls on storage with a timeout each; see the module docstring.

    ``workers`` calls run side by side (not counting abandoned ones); at most
    ``workers + max_stuck`` threads exist, so at most that many are ever left blocked on
    hung storage. Thread-safe.
    """

    def __init__(self, *, workers: int = DEFAULT_WORKERS, max_stuck: int = DEFAULT_MAX_STUCK,
                 timeout: float = DEFAULT_PROBE_TIMEOUT) -> None:
        if workers < 1 or max_stuck < 0 or timeout <= 0:
            raise ValueError("workers >= 1, max_stuck >= 0 and timeout > 0 expected")
        self.workers = workers
        self.max_stuck = max_stuck
        self.timeout = timeout
        self._reset()
        _POOLS.add(self)

    def _reset(self) -> None:
        """Empty state; also what a forked child starts from (no thread of the parent exists
        there, and the lock may have been held by one of them)."""
        # One lock, two conditions: idle workers wait for a job (``_jobs``), callers for their
        # jobs to end (``_cond``). Waking every worker whenever any probe ended cost a pass
        # dozens of thread wake-ups for nothing.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._jobs = threading.Condition(lock)
        self._queue: collections.deque[_Job[object]] = collections.deque()
        self._threads = 0
        self._idle = 0
        self._running: set[_Job[object]] = set()
        self._abandoned: set[_Job[object]] = set()
        #: key -> the probe of it that hung and has not returned yet
        self._hung: dict[str, _Job[object]] = {}

    # ------------------------------------------------------------------ what callers use

    def run(self, key: str, fn: Callable[[], T], *, timeout: float | None = None,
            signature: Callable[[], Hashable] = _no_signature) -> T:
        """``fn()``, or :class:`StorageHung` after ``timeout`` seconds (default: the pool's).

        Exceptions of ``fn`` are raised here. ``signature`` names what ``key`` currently is
        (e.g. the mount on a path); it is asked only when the probe hangs and when ``key``
        is known hung, so it must not touch the storage itself.
        """
        outcome = self.run_all([(key, fn)], timeout=timeout, signature=lambda _key: signature())[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def run_all(self, calls: Sequence[tuple[str, Callable[[], T]]], *, timeout: float | None = None,
                signature: Callable[[str], Hashable] = lambda _key: None) -> list[T | BaseException]:
        """Run every ``(key, fn)`` side by side; each result, or the exception it raised, in order.

        A call that hangs gives :class:`StorageHung`; the whole takes about
        ``timeout * ceil(hung / workers)`` at worst, the first time those keys hang, and
        nothing more once they are known.
        """
        limit = self.timeout if timeout is None else timeout
        outcomes: list[object] = [None] * len(calls)
        jobs: list[tuple[int, _Job[object]]] = []
        with self._cond:
            for i, (key, fn) in enumerate(calls):
                known = self._known_hung_locked(key, functools.partial(signature, key))
                if known is not None:
                    outcomes[i] = known
                    continue
                job: _Job[object] = _Job(key, fn, limit, functools.partial(signature, key))
                self._queue.append(job)
                jobs.append((i, job))
            self._spawn_locked()
            self._jobs.notify(len(jobs))
            for i, job in jobs:
                outcomes[i] = self._wait_locked(job)
        return cast("list[T | BaseException]", outcomes)

    def stuck(self) -> int:
        """Threads blocked on probes that were abandoned as hung."""
        with self._cond:
            return len(self._abandoned)

    def hung(self) -> dict[str, float]:
        """Keys known hung, with the monotonic time their stuck probe started."""
        with self._cond:
            return {key: job.started or 0.0 for key, job in self._hung.items() if not job.finished}

    # ------------------------------------------------------------------ internals

    def _known_hung_locked(self, key: str, signature: Callable[[], Hashable]) -> StorageHung | None:
        job = self._hung.get(key)
        if job is None:
            return None
        if job.finished or signature() != job.hung_signature:
            del self._hung[key]  # it answered, or something else is there now: look again
            return None
        since = job.started or 0.0
        return StorageHung(key, f"{key}: still hung (no answer for {time.monotonic() - since:.0f}s)",
                           timeout=job.timeout, since=since, probed=False)

    def _spawn_locked(self) -> None:
        """Start threads for queued probes, up to ``workers`` healthy ones and the stuck cap."""
        while (len(self._queue) > self._idle
               and self._threads - len(self._abandoned) < self.workers
               and self._threads < self.workers + self.max_stuck):
            try:
                threading.Thread(target=self._work, name="storage-probe", daemon=True).start()
            except RuntimeError:  # no thread to be had: what is queued waits for a running one
                return
            self._threads += 1
            self._idle += 1  # counted idle until it takes a job (it needs this lock first)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if not self._jobs.wait(_IDLE_EXIT) and not self._queue and \
                            self._threads - len(self._abandoned) > self.workers:
                        self._threads -= 1
                        self._idle -= 1
                        return
                job = self._queue.popleft()
                self._idle -= 1
                job.started = time.monotonic()
                self._running.add(job)
                self._cond.notify_all()
            try:
                job.result = job.fn()
            except BaseException as err:  # handed to the caller
                job.error = err
            with self._cond:
                job.finished = True
                self._running.discard(job)
                self._abandoned.discard(job)  # the storage answered after all: back to work
                self._idle += 1
                self._cond.notify_all()

    def _wait_locked(self, job: _Job[object]) -> object:
        """Wait for ``job`` to finish or to overrun; a hung one is abandoned and reported."""
        while not job.finished:
            now = time.monotonic()
            self._abandon_overdue_locked(now)
            if job.abandoned:
                break
            if job.started is None and self._threads - len(self._abandoned) == 0 and \
                    self._threads >= self.workers + self.max_stuck:
                self._queue.remove(job)  # every thread is stuck on hung storage: nobody will run it
                return StorageHung(job.key, f"{job.key}: not probed: {len(self._abandoned)} probes are blocked on "
                                            "hung storage already (the limit)", timeout=job.timeout, since=now,
                                   probed=False, refused=True)
            self._cond.wait(self._next_deadline_locked(job, now) - now)
        if job.error is not None:
            return job.error
        if job.finished:
            return job.result
        since = job.started or 0.0
        return StorageHung(job.key, f"{job.key}: did not answer within {job.timeout:g}s", timeout=job.timeout,
                           since=since, probed=True)

    def _next_deadline_locked(self, job: _Job[object], now: float) -> float:
        """When to look again: the earliest moment a running probe overruns (at least soon)."""
        deadlines = [j.started + j.timeout for j in self._running if j.started is not None and not j.abandoned]
        if job.started is not None:
            deadlines.append(job.started + job.timeout)
        return max(now + 0.001, min(deadlines, default=now + job.timeout))

    def _abandon_overdue_locked(self, now: float) -> None:
        """Declare every running probe past its timeout hung, and replace its thread."""
        overdue = [j for j in self._running if not j.abandoned and j.started is not None
                   and now >= j.started + j.timeout]
        for job in overdue:
            job.abandoned = True
            job.hung_signature = job.signature()
            self._abandoned.add(job)
            self._hung[job.key] = job
        if overdue:
            self._spawn_locked()
            self._jobs.notify(len(self._queue))


_POOLS: weakref.WeakSet[StorageProbes] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_POOLS):
        pool._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)

_DEFAULT = StorageProbes()  # no thread starts before the first probe


def default_probes() -> StorageProbes:
    """The process-wide pool (abandoned threads are a process-wide resource)."""
    return _DEFAULT

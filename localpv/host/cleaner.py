"""Running a block-volume cleaner command (``blockCleanerCommand``) with a deadline.

Upstream execs the command with ``LOCAL_PV_BLKDEVICE`` set, logs its output line by line
and waits forever. Here the command runs in its own session (so its whole process group
can be killed: a script's ``shred`` or ``dd`` child must not keep writing to a disk that
is about to be offered again), with a timeout and a cancel flag, and its output is
streamed to a callback as it comes.

One thread does everything with ``poll``: the output pipe and a pidfd (readable when the
command exits, before it is reaped, so its process-group id cannot be recycled while we
still signal it) are watched together. A cancel flag is a ``threading.Event``, which has
no descriptor, so while one is given the poll wakes every ``CANCEL_CHECK_INTERVAL``
seconds to look at it. Requires Linux 5.3+ (``pidfd_open``).

A killed command does not always die: one blocked in the kernel on storage that never
answers (a FUSE daemon that took the request and hangs, a dying disk) sleeps
uninterruptibly, SIGKILL pending, until the storage lets it go. The caller does not wait
for that: ``abandon_after`` seconds after the SIGKILL the result comes back ``lingering``
and a background thread reaps the command whenever it dies (then ``on_exit`` runs).

Before any of that, :func:`block_device_problem` says whether a path may be wiped at all:
only a block device that nothing else uses.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import select
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from localpv.host.fsclean import file_kind

__all__ = ["CANCEL_CHECK_INTERVAL", "CleanerResult", "ProcessRecords", "block_device_problem", "run_cleaner"]

CANCEL_CHECK_INTERVAL = 0.1
_READ_SIZE = 65536
_MAX_LINE = 65536  # a command printing without newlines still reaches on_line in pieces
_DRAIN_AFTER_EXIT = 2.0  # bound on reading output left in the pipe once the group is dead
DEFAULT_ABANDON_AFTER = 2.0  # how long a killed command may take to die before it is left to a reaper


@dataclass(frozen=True)
class CleanerResult:
    """Outcome of one cleaner run.

    ``exit_code`` is the command's status (negative: killed by that signal), or None if it
    never started, in which case ``error`` says why, or if it is ``lingering``: killed but
    not dead yet (stuck in the kernel), left to a background reaper. ``tail`` holds the
    last output lines, for events and failure messages.
    """

    argv: tuple[str, ...]
    exit_code: int | None
    duration: float
    timed_out: bool = False
    cancelled: bool = False
    tail: tuple[str, ...] = ()
    error: str | None = None
    lingering: bool = False
    pid: int | None = None

    @property
    def succeeded(self) -> bool:
        """True only for a command that ran to completion and exited 0."""
        return self.exit_code == 0 and not (self.timed_out or self.cancelled) and self.error is None


def block_device_problem(path: str, expect_identity: str = "") -> str | None:
    """Why ``path`` must not be given to a block cleaner ("expected ..., found ..."), or None.

    With ``expect_identity``, it must also be the device of that identity (WWN, serial...: see
    :mod:`localpv.host.identity`): a cleanup decided for one disk never runs on the one that
    took its device name since (a reboot that renumbered disks, a Job starting late).

    It must be a block device (symlinks followed: block volumes are links into ``/dev``) that
    nothing uses. "In use" is the kernel's own answer: an exclusive open (``O_EXCL``) fails
    with ``EBUSY`` while the device is mounted, holds a mounted partition, or is claimed by
    device-mapper, md RAID or swap - the system disk always is. The check is a snapshot (the
    device is not held, since cleaners such as ``blkdiscard`` open it exclusively themselves).
    """
    try:
        st = os.stat(path)
    except OSError as e:
        return f"expected a block device, found nothing there ({e.strerror})"
    if not stat.S_ISBLK(st.st_mode):
        return f"expected a block device, found {file_kind(st.st_mode)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_EXCL | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.EBUSY:
            return ("expected a block device that nothing uses, found it busy (mounted, holding a mounted "
                    "partition, or claimed by device-mapper, RAID or swap)")
        return f"expected a block device that can be opened, found: {e.strerror}"
    try:
        if os.fstat(fd).st_rdev != st.st_rdev:
            return "expected a block device, found it replaced while it was checked"
    finally:
        os.close(fd)
    if expect_identity:
        from localpv.host.identity import default_identity_reader

        found = default_identity_reader().block(st.st_rdev)
        if found.value != expect_identity:
            return (f"expected the device {expect_identity}, found {found.value or found.error or found.how} "
                    "(disks renumbered or swapped since the cleanup was decided?)")
    return None


def run_cleaner(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float | None,
    on_line: Callable[[str], None],
    cancel: threading.Event | None = None,
    kill_grace: float = 5.0,
    tail_lines: int = 20,
    on_start: Callable[[int], None] | None = None,
    on_exit: Callable[[int], None] | None = None,
    abandon_after: float = DEFAULT_ABANDON_AFTER,
) -> CleanerResult:
    """Run ``argv`` (no shell) with ``env`` merged over ``os.environ``; see the module docstring.

    Combined stdout and stderr go to ``on_line`` one line at a time (without the newline).
    On timeout (None: none) or cancel the process group gets SIGTERM, then SIGKILL after
    ``kill_grace`` seconds. When the command exits, whatever it left running in its group is
    killed too. A command that cannot be started gives a result with ``error`` set, not an
    exception. ``on_start`` gets the pid (which is also the process-group id) once it runs,
    so the caller can record it and kill the group should the caller itself die (see
    :class:`ProcessRecords`); ``on_exit`` gets it once the command is dead and reaped, which
    for a ``lingering`` one happens after this returns, on another thread.
    """
    started = time.monotonic()
    if not argv:
        return CleanerResult((), None, 0.0, error="empty cleaner command")
    try:
        proc = subprocess.Popen(
            list(argv),
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as e:
        return CleanerResult(
            tuple(argv), None, time.monotonic() - started, error=f"cannot run {argv[0]!r}: {e.strerror}"
        )
    try:
        run = _Run(proc, on_line, collections.deque(maxlen=tail_lines))
    except BaseException:  # e.g. no pidfd_open on this kernel: never leave the command behind
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if on_start is not None:
        on_start(proc.pid)
    lingering = True
    try:
        timed_out, cancelled = run.wait(None if timeout is None else started + timeout, cancel)
        if timed_out or cancelled:
            run.terminate(kill_grace)
    finally:
        lingering = not run.finish(abandon_after, on_exit)
    return CleanerResult(
        tuple(argv),
        None if lingering else proc.returncode,
        time.monotonic() - started,
        timed_out=timed_out,
        cancelled=cancelled,
        tail=tuple(run.tail),
        lingering=lingering,
        pid=proc.pid,
    )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a whole process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


class _Run:
    """One started command: its pipe, pidfd, line splitting and group signalling."""

    def __init__(self, proc: subprocess.Popen[bytes], on_line: Callable[[str], None], tail: collections.deque[str]):
        assert proc.stdout is not None
        self.proc = proc
        self.tail = tail
        self._on_line = on_line
        self._out = proc.stdout.fileno()
        os.set_blocking(self._out, False)
        self._out_open = True
        self._pidfd = os.pidfd_open(proc.pid)
        self._exited = False
        self._partial = b""
        self._poller = select.poll()
        self._poller.register(self._out, select.POLLIN)
        self._poller.register(self._pidfd, select.POLLIN)

    def wait(self, deadline: float | None, cancel: threading.Event | None) -> tuple[bool, bool]:
        """Stream output until the command exits; return (timed_out, cancelled)."""
        while not self._exited:
            if cancel is not None and cancel.is_set():
                return False, True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return True, False
            if cancel is not None:
                remaining = CANCEL_CHECK_INTERVAL if remaining is None else min(remaining, CANCEL_CHECK_INTERVAL)
            self._poll(remaining)
        return False, False

    def terminate(self, grace: float) -> None:
        """SIGTERM the group, give the command ``grace`` seconds to exit, then SIGKILL (in finish)."""
        _signal_group(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not self._exited and (remaining := deadline - time.monotonic()) > 0:
            self._poll(remaining)

    def finish(self, abandon_after: float, on_exit: Callable[[int], None] | None) -> bool:
        """Kill what is left of the group, read the pipe to its end, reap, release descriptors.

        False when the command did not die within ``abandon_after`` seconds of the SIGKILL
        (stuck in the kernel): a background thread then reaps it and calls ``on_exit``.
        """
        # The leader is not reaped yet, so its pid still names our group: no recycled-pgid risk.
        _signal_group(self.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + abandon_after
        while not self._exited and (remaining := deadline - time.monotonic()) > 0:
            self._poll(remaining)
        if not self._exited:
            threading.Thread(target=self._reap_when_dead, args=(on_exit,), name=f"reap-{self.proc.pid}",
                             daemon=True).start()
            return False
        try:
            deadline = time.monotonic() + _DRAIN_AFTER_EXIT
            while self._out_open and (remaining := deadline - time.monotonic()) > 0:
                self._poll(remaining)
            self._flush_partial()
        finally:
            self._release()
        if on_exit is not None:
            on_exit(self.proc.pid)
        return True

    def _reap_when_dead(self, on_exit: Callable[[int], None] | None) -> None:
        """Wait as long as it takes for a killed command stuck in the kernel, then reap it."""
        try:
            select.select([self._pidfd], [], [])
            _signal_group(self.proc.pid, signal.SIGKILL)  # whatever it started meanwhile, while the pid is ours
        finally:
            self._release()
        if on_exit is not None:
            on_exit(self.proc.pid)

    def _release(self) -> None:
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        os.close(self._pidfd)

    def _poll(self, timeout: float | None) -> None:
        for fd, _mask in self._poller.poll(-1 if timeout is None else max(1, round(timeout * 1000))):
            if fd == self._pidfd:
                self._exited = True
                self._poller.unregister(self._pidfd)
            else:
                self._read()

    def _read(self) -> None:
        try:
            chunk = os.read(self._out, _READ_SIZE)
        except BlockingIOError:
            return
        if not chunk:  # EOF: every writer (the command and its children) is gone
            self._out_open = False
            self._poller.unregister(self._out)
            return
        *lines, partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            self._emit(line)
        # Pass on whole _MAX_LINE pieces of an unfinished line now rather than hoarding them.
        cut = len(partial) - len(partial) % _MAX_LINE
        if cut:
            self._emit(partial[:cut])
        self._partial = partial[cut:]

    def _flush_partial(self) -> None:
        if self._partial:
            self._emit(self._partial)
            self._partial = b""

    def _emit(self, raw: bytes) -> None:
        """Hand one line to the callback, in pieces of at most _MAX_LINE bytes."""
        for start in range(0, max(len(raw), 1), _MAX_LINE):
            line = raw[start : start + _MAX_LINE].decode(errors="replace")
            self.tail.append(line)
            self._on_line(line)


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (identifies it across pid reuse);
    None when it is gone, or dead and waiting to be reaped (a zombie runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] == b"Z" else int(fields[19])


class ProcessRecords:
    """Cleaner process groups recorded on disk, so a restarted agent can kill leftovers.

    A cleaner runs in its own session so its whole group can be signalled; the flip side
    is that it outlives an agent killed with SIGKILL. If the restarted agent then started
    a second cleaner on the same device, the first could still be writing after the second
    declared the volume clean - onto the next tenant's data. So every running cleaner is
    recorded (pid and start time, which together identify the process even if the pid is
    reused), and :meth:`kill_leftovers` kills whatever is still running at start-up.

    A record is written once the process runs, so an agent killed between the two leaves an
    unrecorded cleaner. Each cleaner therefore also carries a marker in its environment
    (:meth:`marker`, naming this records directory), and :meth:`kill_leftovers` finds such
    processes in ``/proc`` whether or not they were recorded.
    """

    MARKER = "LOCALPV_CLEANER_OF"

    def marker(self) -> dict[str, str]:
        """The environment entry that marks a cleaner as one of these records' owner's."""
        return {self.MARKER: os.path.realpath(self.directory)} if self.directory is not None else {}

    def _marked(self) -> list[int]:
        """Processes (own session: pid = group) carrying this owner's marker."""
        wanted = f"{self.MARKER}={os.path.realpath(self.directory or '')}".encode()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if wanted in environ and _start_time(int(name)) is not None:
                found.append(int(name))
        return found

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self.directory = None if directory is None else os.fspath(directory)
        if self.directory is not None:
            os.makedirs(self.directory, exist_ok=True)

    def _path(self, key: str) -> str | None:
        if self.directory is None:
            return None
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
        return os.path.join(self.directory, f"{safe}.pid")

    def add(self, key: str, pid: int) -> None:
        path = self._path(key)
        start = _start_time(pid)
        if path is None or start is None:
            return
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(f"{pid} {start}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def remove(self, key: str) -> None:
        path = self._path(key)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def kill_leftovers(self, timeout: float = 10.0) -> list[int]:
        """SIGKILL every recorded group still running; wait until they are gone."""
        if self.directory is None:
            return []
        killed = []
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            try:
                with open(path, encoding="ascii") as f:
                    pid, start = (int(x) for x in f.read().split())
            except (OSError, ValueError):
                pid, start = 0, -1
            if pid and _start_time(pid) == start:
                _signal_group(pid, signal.SIGKILL)
                killed.append(pid)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        for pid in self._marked():
            if pid not in killed:
                _signal_group(pid, signal.SIGKILL)
                killed.append(pid)
        deadline = time.monotonic() + timeout
        for pid in killed:
            while time.monotonic() < deadline and _group_alive(pid):
                time.sleep(0.01)
        return killed


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

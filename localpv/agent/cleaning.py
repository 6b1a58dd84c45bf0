"""The two ways a volume is wiped in-process: filesystem contents, or a block command.

Both return a :class:`~localpv.agent.proctable.CleanOutcome` and succeed only when the
volume is verified clean: the filesystem walk checks the root is empty at the end; a
block cleaner must exit 0 (the shipped scripts check their own work, e.g. ``dd_zero.sh``
requires the device to have been written to its end).

Both first refuse what is not a volume, with the reason, so the cleanup fails and is
retried later instead of wiping somebody else's data: a filesystem volume must be a mount
point directly inside its discovery directory (a plain directory there means the disk is
unmounted and the directory is the host's), a block volume a block device nothing uses.

Both run in a child process of their own, killed (its whole process group) at the timeout
or on cancel: storage can hang for ever, and a thread stuck on it could never be taken
back, so the worker would be lost. A child killed while stuck in the kernel may not even
die before the storage lets it go; the worker does not wait for that (the cleanup fails
with "timed out", the slot is free), the child stays recorded in ``records`` until it is
reaped, so that a restarted agent kills it, and no second cleaner is started on the same
volume while it lingers.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from localpv.agent.outcome import CleanFn, CleanOutcome
from localpv.host.cleaner import CleanerResult, ProcessRecords, block_device_problem, run_cleaner
from localpv.host.fsclean import PARENT_ENV, already_empty, directly_inside, file_kind, not_an_entry_problem
from localpv.host.probes import StorageHung, default_probes

__all__ = [
    "IMAGE_SCRIPTS_DIR",
    "block_cleaner",
    "cleaner_processes",
    "discovery_dir_problem",
    "filesystem_cleaner",
    "home_discovery_dir",
    "not_an_entry_problem",
    "packaged_scripts_dir",
    "resolve_command",
]

log = logging.getLogger(__name__)

#: The filesystem cleaner's child process: the same interpreter running localpv.host.fsclean.
_FS_CLEANER = (sys.executable, "-m", "localpv.host.fsclean")
#: Where this copy of the package lives, for the child to import the very same code.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: Bound on the checks made in the agent's own process before a block cleaner starts (they
#: open the device, which a dying disk can make wait for ever).
BLOCK_CHECK_TIMEOUT = 10.0


class _Lingering:
    """Cleaner processes not reaped yet, by volume: running, or killed but stuck in the kernel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pids: dict[str, int] = {}

    def problem(self, volume: str) -> str | None:
        with self._lock:
            pid = self._pids.get(volume)
        if pid is None:
            return None
        return (f"refusing to clean {volume} again: its previous cleaner (pid {pid}) is still there, stuck in the "
                "kernel (hung storage?); it was killed and goes away as soon as the storage lets it go")

    def add(self, volume: str, pid: int) -> None:
        with self._lock:
            self._pids[volume] = pid

    def remove(self, volume: str, pid: int) -> None:
        with self._lock:
            if self._pids.get(volume) == pid:
                del self._pids[volume]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._pids)


_LINGERING = _Lingering()


def cleaner_processes() -> dict[str, int]:
    """Every cleaner process of this agent not reaped yet, by volume (pid): running ones, and
    killed ones stuck in the kernel on hung storage (those outlive their cleanup's end)."""
    return _LINGERING.snapshot()

#: Where the image installs the cleaner scripts (upstream's path, kept for compatibility).
IMAGE_SCRIPTS_DIR = "/scripts"


def packaged_scripts_dir() -> Path:
    """The copy of the cleaner scripts shipped inside the Python package."""
    return Path(__file__).resolve().parents[1] / "scripts"


def resolve_command(argv: Sequence[str]) -> list[str]:
    """Map ``/scripts/x.sh`` to the packaged copy when the image's ``/scripts`` is absent,
    so the default cleaner works outside the container image too."""
    argv = list(argv)
    if argv and argv[0].startswith(IMAGE_SCRIPTS_DIR + "/") and not os.path.exists(argv[0]):
        candidate = packaged_scripts_dir() / os.path.basename(argv[0])
        if candidate.exists():
            argv[0] = str(candidate)
    return argv


def discovery_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be a discovery directory ("expected ..., found ..."), or None."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"expected a directory, found nothing there ({e.strerror})"
    return None if stat.S_ISDIR(st.st_mode) else f"expected a directory, found {file_kind(st.st_mode)}"


def home_discovery_dir(path: str, discovery_dirs: Sequence[str]) -> str | None:
    """The one of ``discovery_dirs`` that ``path`` is an entry of (compared as directories), or None."""
    return next((d for d in discovery_dirs if directly_inside(path, d)), None)


def _run_in_child(
    volume: str,
    argv: Sequence[str],
    env: dict[str, str],
    cancel: threading.Event,
    *,
    timeout: float | None,
    on_line: Callable[[str], None],
    kill_grace: float,
    records: ProcessRecords | None,
    key: str,
) -> CleanerResult:
    """Run one cleaner process for ``volume``; record it while it lives (until it is reaped,
    which for one stuck in the kernel is after this returns)."""

    def started(pid: int) -> None:
        _LINGERING.add(volume, pid)
        if records is not None:
            records.add(f"{key}.{pid}", pid)

    def reaped(pid: int) -> None:
        _LINGERING.remove(volume, pid)
        if records is not None:
            records.remove(f"{key}.{pid}")

    if records is not None:
        env = {**env, **records.marker()}  # found again by a restarted agent even if never recorded
    result = run_cleaner(argv, env, timeout=timeout, on_line=on_line, cancel=cancel, kill_grace=kill_grace,
                         on_start=started, on_exit=reaped)
    if result.lingering:
        log.warning("cleaner of %s (pid %s) was killed but is stuck in the kernel (hung storage?); it is reaped "
                    "when it dies", volume, result.pid)
    return result


def _lingering_note(result: CleanerResult) -> str:
    if not result.lingering:
        return ""
    return (f"; its process {result.pid} is stuck in the kernel (hung storage?): killed, it goes away as soon as "
            "the storage lets it go")


#: Seconds the in-process look for an already empty volume may take before the cleaner
#: process is started instead (which can be killed if the storage never answers).
EMPTY_LOOK_TIMEOUT = 2.0


def _already_empty(path: str, mount_dir: str | None, require_mount_point: bool, expect_identity: str) -> bool:
    """:func:`~localpv.host.fsclean.already_empty`, through the bounded storage probes."""
    look = functools.partial(already_empty, path, mount_dir, require_mount_point=require_mount_point,
                             expect_identity=expect_identity)
    try:
        return default_probes().run(f"empty:{path}", look, timeout=EMPTY_LOOK_TIMEOUT)
    except StorageHung:
        return False


def _numbers_problem(path: str, expected: str, *, block: bool) -> str | None:
    """Why the volume at ``path`` is not the one numbered ``expected`` in this boot (the journal's
    ``ident``, spelled as :mod:`localpv.host.scan` spells it), None when it is. For volumes
    without a stable identity, whose numbers are all the cleaner can check."""
    def look() -> str:
        st = os.stat(path)
        return f"blk:{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" if block else f"fs:{st.st_dev}:{st.st_ino}"

    try:
        found = default_probes().run(f"numbers:{path}", look, timeout=EMPTY_LOOK_TIMEOUT)
    except StorageHung as hung:
        return f"refusing to clean {path}: looking at it did not answer within {hung.timeout:g}s (hung storage?)"
    except OSError as err:
        return f"refusing to clean {path}: cannot tell which volume it is ({err.strerror})"
    if found != expected:
        return (f"refusing to clean {path}: it is the volume numbered {found}, not the volume {expected} this "
                "cleanup is for (volumes swapped or moved since it was decided?)")
    return None


def volume_is_empty(path: str, mount_dir: str, *, require_mount_point: bool = True) -> bool:
    """The mounted volume at ``path``, directly inside ``mount_dir``, holds nothing (looked at
    through the bounded probes; False when that cannot be told in time)."""
    return _already_empty(path, mount_dir, require_mount_point, "")


def filesystem_cleaner(
    container_path: str,
    mount_dir: str | None,
    *,
    timeout: float | None = None,
    require_mount_point: bool = True,
    records: ProcessRecords | None = None,
    key: str = "",
    expect_identity: str = "",
    expect_numbers: str = "",
) -> CleanFn:
    """Remove everything inside a mounted volume (never following links or crossing mounts),
    giving up when cancelled or after ``timeout`` seconds; with ``expect_identity``, only if
    the volume is that one (see :mod:`localpv.host.identity`) when the cleaner starts; with
    ``expect_numbers`` (a volume without identity), only if it has those device and inode
    numbers then.

    Refuses a path that is not an entry of ``mount_dir`` (compared as directories, not
    strings) or, unless ``require_mount_point`` is False, that is not a mount point.
    ``mount_dir`` None skips the first check: for a person who said so explicitly
    (``localpv cleanup --unsafe-any-directory``), never for the agent.

    The checks and the walk run in a child process (``python -m localpv.host.fsclean``),
    whose process group is killed at the timeout or on cancel, so that storage which never
    answers cannot hold the worker. With ``records``, the child is recorded under ``key``
    while it lives, so that a restarted agent kills it. A volume that passes the same checks
    and is empty - every volume of a first start, which is cleaned before it is offered -
    needs no child: that look runs here, bounded like every look at storage
    (:data:`EMPTY_LOOK_TIMEOUT`), and the child runs whenever it cannot say "empty".
    """
    argv = [*_FS_CLEANER, container_path]
    if mount_dir is not None:
        argv += ["--within", mount_dir]
    if not require_mount_point:
        argv.append("--any-directory")
    if expect_identity:
        argv += ["--expect-identity", expect_identity]

    def clean(cancel: threading.Event) -> CleanOutcome:
        problem = _LINGERING.problem(container_path)
        if problem is None and expect_numbers:
            problem = _numbers_problem(container_path, expect_numbers, block=False)
        if problem is not None:
            return CleanOutcome(False, problem)
        if _already_empty(container_path, mount_dir, require_mount_point, expect_identity):
            return CleanOutcome(True, "removed 0 files and 0 directories in 0.0s (it was empty)")
        lines: list[str] = []

        def line(text: str) -> None:
            lines.append(text)
            if not text.startswith(("clean: ", "NOT clean: ")):
                log.warning("filesystem cleaner of %s: %s", container_path, text)

        pythonpath = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        env = {PARENT_ENV: str(os.getpid()), "PYTHONPATH": pythonpath}
        # Killed at once: stopping the walk anywhere leaves a volume that is simply not clean yet.
        result = _run_in_child(container_path, argv, env, cancel, timeout=timeout, on_line=line, kill_grace=0.0,
                               records=records, key=key or container_path)
        last = lines[-1] if lines else ""
        if result.error:
            return CleanOutcome(False, f"cannot clean {container_path}: {result.error}")
        if result.timed_out:
            return CleanOutcome(False, f"cleaning {container_path} stopped: timed out after {timeout:.0f}s"
                                       + _lingering_note(result))
        if result.cancelled:
            return CleanOutcome(False, f"cleaning {container_path} stopped: cancelled" + _lingering_note(result))
        if result.exit_code == 0 and last.startswith("clean: "):
            return CleanOutcome(True, last.removeprefix("clean: "))
        if result.exit_code == 1 and last.startswith("NOT clean: "):
            return CleanOutcome(False, last.removeprefix("NOT clean: "))
        return CleanOutcome(False, f"cleaning {container_path} failed: the cleaner "
                                   f"{_exited(result.exit_code, result.tail)}")

    return clean


def _exited(exit_code: int | None, tail: Sequence[str]) -> str:
    """``exited with N: <its last lines>``, or ``exited with N (no output)`` when it said nothing."""
    said = " | ".join(line for line in tail[-3:] if line.strip())
    return f"exited with {exit_code}: {said}" if said else f"exited with {exit_code} (no output)"


def block_cleaner(
    device_path: str,
    command: Sequence[str],
    *,
    timeout: float,
    on_line: Callable[[str], None] | None = None,
    records: ProcessRecords | None = None,
    key: str = "",
    expect_identity: str = "",
    expect_numbers: str = "",
) -> CleanFn:
    """Run the class's ``blockCleanerCommand`` with ``LOCAL_PV_BLKDEVICE`` set.

    The command is not started unless ``device_path`` is a block device that nothing uses
    (see :func:`~localpv.host.cleaner.block_device_problem`) and, with ``expect_identity``,
    that is that very device (see :mod:`localpv.host.identity`), or with ``expect_numbers``
    the device of those numbers, nor while a previous cleaner of it is stuck in the kernel.
    With ``records``, the running process group is recorded under ``key`` so that a restarted
    agent can kill it (it must never write on after a newer clean finished).
    """
    argv = resolve_command(command)

    def clean(cancel: threading.Event) -> CleanOutcome:
        lingering = _LINGERING.problem(device_path)
        if lingering is None and expect_numbers:
            lingering = _numbers_problem(device_path, expect_numbers, block=True)
        if lingering is not None:
            return CleanOutcome(False, lingering)
        try:
            problem = default_probes().run(f"block-check:{device_path}",
                                           functools.partial(block_device_problem, device_path, expect_identity),
                                           timeout=BLOCK_CHECK_TIMEOUT)
        except StorageHung as hung:
            problem = f"checking it did not answer within {hung.timeout:g}s (hung storage?)"
        if problem is not None:
            return CleanOutcome(False, f"refusing to clean {device_path}: {problem}")

        def line(text: str) -> None:
            log.info("cleaner %s: %s", device_path, text)
            if on_line is not None:
                on_line(text)

        result = _run_in_child(device_path, argv, {"LOCAL_PV_BLKDEVICE": device_path}, cancel, timeout=timeout,
                               on_line=line, kill_grace=5.0, records=records, key=key or device_path)
        if result.succeeded:
            return CleanOutcome(True, f"{argv[0]} finished in {result.duration:.1f}s")
        if result.error:
            return CleanOutcome(False, result.error)
        tail = " | ".join(result.tail[-3:])
        if result.timed_out:
            return CleanOutcome(False, f"{argv[0]} timed out after {timeout:.0f}s: {tail}" + _lingering_note(result))
        if result.cancelled:
            return CleanOutcome(False, f"{argv[0]} was cancelled" + _lingering_note(result))
        return CleanOutcome(False, f"{argv[0]} {_exited(result.exit_code, result.tail)}")

    return clean

"""The two ways a volume is wiped in-process: filesystem contents, or a block command.

Both return a :class:`~localpv.agent.proctable.CleanOutcome` and succeed only when the
volume is verified clean: the filesystem walk checks the root is empty at the end; a
block cleaner must exit 0 (the shipped scripts check their own work, e.g. ``dd_zero.sh``
requires the device to have been written to its end).

Both first refuse what is not a volume, with the reason, so the cleanup fails and is
retried later instead of wiping somebody else's data: a filesystem volume must be a mount
point directly inside its discovery directory (a plain directory there means the disk is
unmounted and the directory is the host's), a block volume a block device nothing uses.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from localpv.agent.proctable import CleanFn, CleanOutcome
from localpv.host.cleaner import ProcessRecords, block_device_problem, run_cleaner
from localpv.host.fsclean import CleanError, clean_directory, directly_inside, file_kind

log = logging.getLogger(__name__)

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


def not_an_entry_problem(path: str, discovery_dirs: Sequence[str]) -> str:
    """What to say when ``path`` is an entry of none of ``discovery_dirs``."""
    return (f"expected a directory directly inside {' or '.join(discovery_dirs)}, "
            f"found one inside {os.path.dirname(os.path.abspath(path))}")


def filesystem_cleaner(
    container_path: str,
    mount_dir: str | None,
    *,
    timeout: float | None = None,
    require_mount_point: bool = True,
) -> CleanFn:
    """Remove everything inside a mounted volume (never following links or crossing mounts),
    giving up when cancelled or after ``timeout`` seconds.

    Refuses a path that is not an entry of ``mount_dir`` (compared as directories, not
    strings) or, unless ``require_mount_point`` is False, that is not a mount point.
    ``mount_dir`` None skips the first check: for a person who said so explicitly
    (``localpv cleanup --unsafe-any-directory``), never for the agent.
    """

    def clean(cancel: threading.Event) -> CleanOutcome:
        if mount_dir is not None and not directly_inside(container_path, mount_dir):
            problem = not_an_entry_problem(container_path, [mount_dir])
            return CleanOutcome(False, f"refusing to clean {container_path}: {problem}")
        deadline = time.monotonic() + timeout if timeout is not None else None

        def should_stop() -> str | None:
            if cancel.is_set():
                return "cancelled"
            if deadline is not None and time.monotonic() > deadline:
                return f"timed out after {timeout:.0f}s"
            return None

        try:
            report = clean_directory(container_path, should_stop=should_stop,
                                     require_mount_point=require_mount_point)
        except CleanError as err:
            return CleanOutcome(False, str(err))
        except OSError as err:
            return CleanOutcome(False, f"cleaning {container_path} failed: {err}")
        return CleanOutcome(True, f"removed {report.files_removed} files and {report.dirs_removed} directories "
                                  f"in {report.seconds:.1f}s")

    return clean


def block_cleaner(
    device_path: str,
    command: Sequence[str],
    *,
    timeout: float,
    on_line: Callable[[str], None] | None = None,
    records: ProcessRecords | None = None,
    key: str = "",
) -> CleanFn:
    """Run the class's ``blockCleanerCommand`` with ``LOCAL_PV_BLKDEVICE`` set.

    The command is not started unless ``device_path`` is a block device that nothing uses
    (see :func:`~localpv.host.cleaner.block_device_problem`). With ``records``, the running
    process group is recorded under ``key`` so that a restarted agent can kill it (it must
    never write on after a newer clean finished).
    """
    argv = resolve_command(command)

    def clean(cancel: threading.Event) -> CleanOutcome:
        problem = block_device_problem(device_path)
        if problem is not None:
            return CleanOutcome(False, f"refusing to clean {device_path}: {problem}")

        def line(text: str) -> None:
            log.info("cleaner %s: %s", device_path, text)
            if on_line is not None:
                on_line(text)

        on_start = (lambda pid: records.add(key, pid)) if records is not None else None
        try:
            result = run_cleaner(argv, {"LOCAL_PV_BLKDEVICE": device_path}, timeout=timeout, on_line=line,
                                 cancel=cancel, on_start=on_start)
        finally:
            if records is not None:
                records.remove(key)
        if result.succeeded:
            return CleanOutcome(True, f"{argv[0]} finished in {result.duration:.1f}s")
        if result.error:
            return CleanOutcome(False, result.error)
        tail = " | ".join(result.tail[-3:])
        if result.timed_out:
            return CleanOutcome(False, f"{argv[0]} timed out after {timeout:.0f}s: {tail}")
        if result.cancelled:
            return CleanOutcome(False, f"{argv[0]} was cancelled")
        return CleanOutcome(False, f"{argv[0]} exited with {result.exit_code}: {tail}")

    return clean

"""The two ways a volume is wiped in-process: filesystem contents, or a block command.

Both return a :class:`~localpv.agent.proctable.CleanOutcome` and succeed only when the
volume is verified clean: the filesystem walk checks the root is empty at the end; a
block cleaner must exit 0 (the shipped scripts check their own work, e.g. ``dd_zero.sh``
requires the device to have been written to its end).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from localpv.agent.proctable import CleanFn, CleanOutcome
from localpv.host.cleaner import ProcessRecords, run_cleaner
from localpv.host.fsclean import CleanError, clean_directory, is_within

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


def filesystem_cleaner(container_path: str, mount_dir: str, *, timeout: float | None = None) -> CleanFn:
    """Remove everything inside a mounted volume (never following links or crossing mounts),
    giving up when cancelled or after ``timeout`` seconds."""

    def clean(cancel: threading.Event) -> CleanOutcome:
        if not is_within(container_path, mount_dir):
            return CleanOutcome(False, f"refusing to clean {container_path}: not inside {mount_dir}")
        deadline = time.monotonic() + timeout if timeout is not None else None

        def should_stop() -> str | None:
            if cancel.is_set():
                return "cancelled"
            if deadline is not None and time.monotonic() > deadline:
                return f"timed out after {timeout:.0f}s"
            return None

        try:
            report = clean_directory(container_path, should_stop=should_stop)
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

    With ``records``, the running process group is recorded under ``key`` so that a
    restarted agent can kill it (it must never write on after a newer clean finished).
    """
    argv = resolve_command(command)

    def clean(cancel: threading.Event) -> CleanOutcome:
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

"""Snapshot of one discovery directory, the host input of the agent's pure reconcile step.

Each first-level entry of a class's ``mountDir`` is classified once, with its capacity and,
for entries that cannot become volumes, the human reason. Reconcile logic then works on
these plain values and never touches the OS itself (upstream interleaves stat calls with
its decisions, which makes it hard to test).
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from localpv.host.block import block_device_size
from localpv.host.capacity import filesystem_capacity

__all__ = ["Entry", "EntryKind", "ScanError", "scan_directory"]


class EntryKind(enum.Enum):
    """What a discovery-directory entry is, from the provisioner's point of view."""

    MOUNTPOINT = "mountpoint"  # a directory that is a mount point: a Filesystem volume
    BLOCK = "block"  # a block device or a symlink to one: a Block (or fs-on-block) volume
    DIRECTORY = "directory"  # a plain directory: not offered (mount or bind-mount it first)
    OTHER = "other"  # regular file, socket, fifo, character device...: not offered
    BROKEN = "broken"  # stat failed, e.g. a dangling symlink


@dataclass(frozen=True)
class Entry:
    """One classified entry of a discovery directory.

    ``path`` is the path under the scanned directory (the container path). ``capacity`` is
    in bytes for MOUNTPOINT (filesystem total) and BLOCK (device size), else None; it is
    also None when measuring failed, and then ``reason`` says why. ``device`` is ``st_rdev``
    for a block device and ``st_dev`` for a mount point, so callers can spot two entries
    that are the same disk.

    ``ident`` is what the volume *is*, independent of the path that names it: for a mount
    point ``fs:<st_dev>:<st_ino>`` of its root, for a block device ``blk:<major>:<minor>``.
    Two paths with one ident are one volume (a hostDir alias, a second symlink), so the
    journal records it and refuses to offer a volume it knows as dirty under another name.
    """

    name: str
    path: str
    kind: EntryKind
    capacity: int | None = None
    reason: str | None = None
    device: int | None = None
    ident: str | None = None


class ScanError(Exception):
    """The discovery directory itself cannot be listed."""

    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(f'cannot list discovery directory "{path}": {error.strerror or error}')
        self.path = path
        self.error = error


def scan_directory(mount_dir: str, mount_points: frozenset[str]) -> list[Entry]:
    """Classify every first-level entry of ``mount_dir``, sorted by name.

    ``mount_points`` is the mount table as a set of paths (see ``mounts.mount_points``),
    read by the caller once per pass. A directory is a mount point when its path, or its
    resolved path, is in that set: the resolved path matters when ``mount_dir`` is reached
    through a symlink, since the kernel reports the real location. Per-entry failures end
    up in the entry (BROKEN, or a ``reason``); only an unreadable ``mount_dir`` raises
    :class:`ScanError`.
    """
    try:
        names = sorted(os.listdir(mount_dir))
    except OSError as e:
        raise ScanError(mount_dir, e) from e
    return [_classify(name, os.path.join(mount_dir, name), mount_points) for name in names]


def _classify(name: str, path: str, mount_points: frozenset[str]) -> Entry:
    """Classify one entry, following symlinks as upstream does (a by-id link is a device)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return Entry(name, path, EntryKind.BROKEN, reason=f'cannot stat "{path}": {e.strerror}')
    if stat.S_ISBLK(st.st_mode):
        capacity, reason = _measure(block_device_size, path)
        return Entry(name, path, EntryKind.BLOCK, capacity, reason, device=st.st_rdev,
                     ident=f"blk:{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
    if stat.S_ISDIR(st.st_mode):
        if path in mount_points or os.path.realpath(path) in mount_points:
            capacity, reason = _measure(filesystem_capacity, path)
            return Entry(name, path, EntryKind.MOUNTPOINT, capacity, reason, device=st.st_dev,
                         ident=f"fs:{st.st_dev}:{st.st_ino}")
        # Upstream's wording; its e2e test greps the log for it.
        return Entry(name, path, EntryKind.DIRECTORY, reason=f'path "{path}" is not a valid mount point')
    return Entry(name, path, EntryKind.OTHER, reason=f'path "{path}" is neither a directory nor a block device')


def _measure(measure: Callable[[str], int], path: str) -> tuple[int | None, str | None]:
    """Run a capacity probe; a failure becomes a reason instead of aborting the whole scan."""
    try:
        return measure(path), None
    except OSError as e:
        return None, f'cannot measure capacity of "{path}": {e.strerror or e}'

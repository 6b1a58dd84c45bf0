"""Snapshot of one discovery directory, the host input of the agent's pure reconcile step.

Each first-level entry of a class's ``mountDir`` is classified once, with its capacity and,
for entries that cannot become volumes, the human reason. Reconcile logic then works on
these plain values and never touches the OS itself (upstream interleaves stat calls with
its decisions, which makes it hard to test).
"""

from __future__ import annotations

import enum
import errno
import functools
import os
import stat
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from localpv.config import normalise_dir, system_directory_refusal
from localpv.host.block import block_device_size
from localpv.host.capacity import filesystem_capacity
from localpv.host.identity import Identity, IdentityReader, default_identity_reader, device_name
from localpv.host.mounts import PSEUDO_FILESYSTEMS, FilesystemTypes, MountInfo, read_mountinfo
from localpv.host.probes import StorageHung, StorageProbes, default_probes

__all__ = ["HUNG_STORAGE", "Entry", "EntryKind", "ScanError", "scan_directory"]

#: In every reason given for storage that does not answer (hung entries, hung discovery
#: dirs), so that logs, events and alerts can be matched on it.
HUNG_STORAGE = "hung storage"


#: The identity of an entry that is no volume, or of one looked at without reading identities.
NO_IDENTITY = Identity("", "not read")


class EntryKind(enum.Enum):
    """What a discovery-directory entry is, from the provisioner's point of view."""

    MOUNTPOINT = "mountpoint"  # a directory that is a mount point: a Filesystem volume
    BLOCK = "block"  # a block device or a symlink to one: a Block (or fs-on-block) volume
    DIRECTORY = "directory"  # a plain directory: not offered (mount or bind-mount it first)
    OTHER = "other"  # regular file, socket, fifo, character device...: not offered
    BROKEN = "broken"  # stat failed, e.g. a dangling symlink
    PSEUDOFS = "pseudofs"  # a mount of a kernel filesystem (proc, sysfs, cgroup...): never offered
    #: looking at it did not finish in time (a hung FUSE or NFS mount, a dying disk): not offered,
    #: and not looked at again until the stuck look returns or another mount is there
    HUNG = "hung"


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
    Those numbers are the kernel's of this boot: ``identity`` is what survives a reboot
    (filesystem UUID, WWN...; see :mod:`localpv.host.identity`), empty for volatile volumes.

    ``read_only`` and ``fs_errors`` are what the volume health check reads: the mount (or the
    block device) is read-only, and ext4's count of errors met since the filesystem was made
    (``/sys/fs/ext4/<dev>/errors_count``; None where the kernel keeps no such count).
    """

    name: str
    path: str
    kind: EntryKind
    capacity: int | None = None
    reason: str | None = None
    device: int | None = None
    ident: str | None = None
    identity: Identity = NO_IDENTITY
    read_only: bool = False
    fs_errors: int | None = None
    #: The block device the volume is on (or is) is gone from the kernel (a disk pulled while mounted).
    device_missing: bool = False


class ScanError(Exception):
    """The discovery directory itself cannot be listed; ``hung`` when it did not answer in time."""

    def __init__(self, path: str, error: OSError, *, hung: bool = False) -> None:
        super().__init__(f'cannot list discovery directory "{path}": {error.strerror or error}')
        self.path = path
        self.error = error
        self.hung = hung


_PATH_FLAGS = os.O_PATH | os.O_CLOEXEC


def scan_directory(
    mount_dir: str,
    mount_points: frozenset[str],
    *,
    probes: StorageProbes | None = None,
    timeout: float | None = None,
    identities: IdentityReader | None = None,
    simulated: frozenset[str] = frozenset(),
) -> list[Entry]:
    """Classify every first-level entry of ``mount_dir``, sorted by name.

    ``mount_points`` is the mount table as a set of paths (see ``mounts.mount_points``),
    read by the caller once per pass. A directory is a mount point when its path, or its path
    under the resolved ``mount_dir``, is in that set: the resolved one matters when
    ``mount_dir`` is reached through a symlink, since the kernel reports the real location.
    An entry that is itself a symlink to a mount elsewhere is not a mount point (as upstream):
    it would hand that other mount to a tenant. A mount of a kernel filesystem is never a
    volume (:data:`~localpv.host.mounts.PSEUDO_FILESYSTEMS`), told by its mount id.

    Every look at storage is bounded (:mod:`localpv.host.probes`; ``probes`` defaults to
    the process-wide pool, ``timeout`` to its own): entries are looked at side by side, and
    one that does not answer in time is a :attr:`EntryKind.HUNG` entry whose reason says
    so, while the others are classified as usual. A hung entry is not looked at again (it
    stays HUNG, at no cost) until the stuck look returns or another mount is on its path.

    ``simulated``: paths that ``mount_points`` lists although nothing is mounted there (the
    demo without root): they are taken for mount points without asking the kernel. Any other
    listed entry must be the root of a mount at its path when it is opened.

    Per-entry failures end up in the entry (BROKEN, HUNG, or a ``reason``); an unreadable
    ``mount_dir``, one that does not answer in time (``ScanError.hung``), or one that
    resolves to the root or a system directory (which the configuration cannot see: a
    symlink on the node), raises :class:`ScanError`.
    """
    probes = probes or default_probes()
    identities = identities or default_identity_reader()
    mounts = _TopMounts()
    try:
        real_dir, names = probes.run(f"dir:{mount_dir}", functools.partial(_list, mount_dir), timeout=timeout,
                                     signature=functools.partial(mounts.signature, os.path.abspath(mount_dir)))
    except StorageHung as hung:
        raise ScanError(mount_dir, OSError(errno.ETIMEDOUT, _hung_reason(hung)), hung=True) from hung
    except OSError as e:
        raise ScanError(mount_dir, e) from e
    fs_types = FilesystemTypes()
    paths: dict[str, tuple[str, str]] = {}
    calls: list[tuple[str, Callable[[], Entry]]] = []
    for name in names:
        path = os.path.join(mount_dir, name)
        real = os.path.join(real_dir, name)
        listed = path in mount_points or real in mount_points
        key = f"entry:{path}"
        paths[key] = (path, real)
        spellings = () if path in simulated or real in simulated else (path, real)
        calls.append((key, functools.partial(_classify, name, path, spellings if listed else None, fs_types,
                                             identities)))
    outcomes = probes.run_all(calls, timeout=timeout, signature=lambda key: mounts.signature(*paths[key]))
    entries = []
    for name, (key, _), outcome in zip(names, calls, outcomes, strict=True):
        if isinstance(outcome, StorageHung):
            path = paths[key][0]
            entries.append(Entry(name, path, EntryKind.HUNG, reason=f'"{path}" {_hung_reason(outcome)}'))
        elif isinstance(outcome, BaseException):
            raise outcome  # not a storage failure (those are in the entry): a bug
        else:
            entries.append(outcome)
    return entries


def look_again(
    entry: Entry, *, probes: StorageProbes | None = None, timeout: float | None = None,
    identities: IdentityReader | None = None, fs_types: FilesystemTypes | None = None,
) -> Entry:
    """``entry`` as its path shows it now, to compare with what a pass saw a moment ago.

    A pass scans, plans, then acts: a disk swapped in between (an operator remounting
    disks, a disk replaced under the same path) would be published under the plan made for
    the one before. Whatever is at the path now is classified as the scan would classify a
    mount point (without asking the mount table: what it is, not whether it is listed, is the
    question), bounded like every look at storage; it is then the same volume when kind,
    ``ident`` and ``identity`` are those of ``entry``. A volume unmounted meanwhile shows the
    directory underneath, with the identity of the filesystem that holds it: not the same.
    ``fs_types`` may be shared by the looks of one pass: it reads the mount table once, and
    again only for a mount it does not know (one made since).
    """
    probes = probes or default_probes()
    identities = identities or default_identity_reader()
    look = functools.partial(_classify, entry.name, entry.path, (), fs_types or FilesystemTypes(), identities)
    try:
        return probes.run(f"entry:{entry.path}", look, timeout=timeout)
    except StorageHung as hung:
        return Entry(entry.name, entry.path, EntryKind.HUNG, reason=f'"{entry.path}" {_hung_reason(hung)}')


def same_volume(before: Entry, now: Entry) -> bool:
    """``now`` (see :func:`look_again`) is the volume ``before`` was."""
    return (before.kind, before.ident, before.identity.value) == (now.kind, now.ident, now.identity.value)


def _list(mount_dir: str) -> tuple[str, list[str]]:
    """The resolved discovery dir and its entries, sorted."""
    return _resolve_discovery_dir(mount_dir), sorted(os.listdir(mount_dir))


def _hung_reason(hung: StorageHung) -> str:
    """What to say about storage that did not answer: the same words each pass (events are
    deduplicated on them), with :data:`HUNG_STORAGE` in them."""
    if hung.refused:
        return (f"not looked at: too many looks at {HUNG_STORAGE} are still blocked (an unresponsive FUSE or "
                "network mount, or a failing disk?); skipped for now")
    return (f"did not answer within {hung.timeout:g}s: {HUNG_STORAGE} (an unresponsive FUSE or network mount, "
            "or a failing disk?); skipped until it answers")


class _TopMounts:
    """What is mounted on a path (the top mount's id and device), read from this process's
    mount table only when asked: it names what a hung path was, so that another mount there
    later is looked at afresh. Reading the table never touches the storage itself."""

    def __init__(self) -> None:
        self._top: dict[str, MountInfo] | None = None

    def signature(self, *paths: str) -> Hashable:
        if self._top is None:
            try:
                self._top = {m.mount_point: m for m in read_mountinfo()}  # later lines are mounted on top
            except (OSError, ValueError):
                self._top = {}
        return tuple((m.mount_id, m.major_minor) if (m := self._top.get(p)) else None for p in paths)


def _resolve_discovery_dir(mount_dir: str) -> str:
    """Where ``mount_dir`` really is; ScanError when that is the root or a system directory."""
    real_dir = normalise_dir(os.path.realpath(mount_dir))
    expected = system_directory_refusal(real_dir)
    if expected is not None:
        refusal = OSError(errno.EPERM, f'resolves to "{real_dir}", expected {expected}')
        raise ScanError(mount_dir, refusal)
    return real_dir


def _classify(name: str, path: str, spellings: tuple[str, ...] | None, fs_types: FilesystemTypes,
              identities: IdentityReader) -> Entry:
    """Classify one entry, following symlinks as upstream does (a by-id link is a device).

    ``spellings``: given when the mount table the caller read lists the entry as a mount
    point - the paths a mount there may have (the entry's, and under the resolved discovery
    dir), or none for a simulated mount point. The entry is opened once (``O_PATH``: no I/O,
    no blocking on a fifo) and everything is read from that one object, so its type,
    identity, capacity and mount cannot come from two different things swapped in between.
    """
    try:
        fd = os.open(path, _PATH_FLAGS)
    except OSError as e:
        return Entry(name, path, EntryKind.BROKEN, reason=f'cannot stat "{path}": {e.strerror}')
    try:
        try:
            st = os.fstat(fd)
        except OSError as e:  # e.g. ENOTCONN: a FUSE mount whose daemon died
            return Entry(name, path, EntryKind.BROKEN, reason=f'cannot stat "{path}": {e.strerror}')
        if stat.S_ISBLK(st.st_mode):
            # Through the descriptor: the device measured is the one stat'ed, even if the
            # entry (a by-id symlink) points elsewhere by now.
            capacity, reason = _measure(lambda _: block_device_size(f"/proc/self/fd/{fd}"), path)
            major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
            return Entry(name, path, EntryKind.BLOCK, capacity, reason, device=st.st_rdev,
                         ident=f"blk:{major}:{minor}", identity=identities.block(st.st_rdev),
                         read_only=_sys_flag(f"/sys/dev/block/{major}:{minor}/ro"),
                         device_missing=not os.path.exists(f"/sys/dev/block/{major}:{minor}"))
        if stat.S_ISDIR(st.st_mode):
            if spellings is not None:
                return _mount_point(name, path, spellings, fd, st, fs_types, identities)
            # Upstream's wording; its e2e test greps the log for it.
            return Entry(name, path, EntryKind.DIRECTORY, reason=f'path "{path}" is not a valid mount point')
        return Entry(name, path, EntryKind.OTHER,
                     reason=f'path "{path}" is neither a directory nor a block device')
    finally:
        os.close(fd)


def _mount_point(name: str, path: str, spellings: tuple[str, ...], fd: int, st: os.stat_result,
                 fs_types: FilesystemTypes, identities: IdentityReader) -> Entry:
    """A mount point: a Filesystem volume, unless it is a kernel filesystem or cannot be told.

    The table that listed the entry was read before it was opened: what was opened must be
    the root of a mount at that very path (one of ``spellings``; none: a simulated mount
    point, taken as it is). Otherwise the volume was unmounted
    in between (an operator remounting disks one by one), and what is left is a plain
    directory of the filesystem under it, whose capacity and identity are not a volume's.
    """
    try:
        mount = fs_types.mount_of_fd(fd)
    except OSError as e:
        return Entry(name, path, EntryKind.BROKEN,
                     reason=f'cannot tell which filesystem "{path}" is: {e.strerror or e}')
    if spellings and mount.mount_point not in spellings:
        return Entry(name, path, EntryKind.DIRECTORY, reason=f'path "{path}" is not a valid mount point')
    if mount.fs_type in PSEUDO_FILESYSTEMS:
        return Entry(name, path, EntryKind.PSEUDOFS,
                     reason=f'path "{path}" is a {mount.fs_type} filesystem, not a volume')
    capacity, reason = _measure(lambda _: filesystem_capacity(fd), path)
    return Entry(name, path, EntryKind.MOUNTPOINT, capacity, reason, device=st.st_dev,
                 ident=f"fs:{st.st_dev}:{st.st_ino}", identity=identities.filesystem(mount, fd, st),
                 read_only=_read_only(mount), fs_errors=_ext4_errors(mount),
                 device_missing=not mount.major_minor.startswith("0:")
                 and not os.path.exists(f"/sys/dev/block/{mount.major_minor}"))


def _read_only(mount: MountInfo) -> bool:
    """The mount, or its filesystem (remounted read-only after errors), is read-only."""
    return "ro" in mount.mount_options.split(",") or "ro" in mount.super_options.split(",")


def _sys_flag(path: str) -> bool:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def _ext4_errors(mount: MountInfo) -> int | None:
    """ext4's error count for the mount's device (``errors_count`` in sysfs), None elsewhere."""
    if mount.fs_type not in ("ext4", "ext3", "ext2") or mount.major_minor.startswith("0:"):
        return None
    major, minor = (int(x) for x in mount.major_minor.split(":"))
    name = device_name(major, minor)
    if name is None:
        return None
    try:
        with open(f"/sys/fs/ext4/{name}/errors_count", encoding="ascii") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None


def _measure(measure: Callable[[str], int], path: str) -> tuple[int | None, str | None]:
    """Run a capacity probe; a failure becomes a reason instead of aborting the whole scan."""
    try:
        return measure(path), None
    except OSError as e:
        return None, f'cannot measure capacity of "{path}": {e.strerror or e}'

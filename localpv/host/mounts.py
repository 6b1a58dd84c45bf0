"""The node's mount table: parsing ``/proc/self/mountinfo`` and waiting for it to change.

Discovery only offers a directory as a Filesystem volume when it is a mount point, so the
agent needs the mount table on every pass and wants to hear as soon as it changes (an admin
mounting a new disk). The kernel signals a change of the mount table to anyone polling an
open ``mountinfo`` file with ``POLLPRI``/``POLLERR``; :class:`MountTableWatcher` wraps that.

Format of one line (``proc(5)``)::

    36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    (1)(2) (3)   (4)      (5)        (6)        (7)  (8) (9)    (10)        (11)

Fields 4, 5 and 10 (and 9) are written by the kernel with space, tab, newline and backslash
as three-digit octal escapes (``\\040``, ``\\011``, ``\\012``, ``\\134``); field 7 is zero or
more optional fields ended by a lone ``-``.
"""

from __future__ import annotations

import errno
import math
import os
import re
import select
from dataclasses import dataclass, field
from types import TracebackType

__all__ = [
    "PSEUDO_FILESYSTEMS",
    "FilesystemTypes",
    "MountInfo",
    "MountTableWatcher",
    "fd_mount_id",
    "mount_points",
    "parse_mountinfo",
    "read_mountinfo",
]

#: Filesystem types that show kernel state or are kernel interfaces, never storage. A mount of
#: one of them is not a volume whatever directory it sits in: offering ``/proc`` or a cgroup
#: hierarchy as a PV hands the kernel's controls to a tenant, and "cleaning" it means deleting
#: through them. ``tmpfs`` and ``ramfs`` are absent on purpose: they do hold data.
PSEUDO_FILESYSTEMS = frozenset({
    "autofs", "binder", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts",
    "devtmpfs", "efivarfs", "fusectl", "hugetlbfs", "mqueue", "nfsd", "nsfs", "proc", "pstore",
    "resctrl", "rpc_pipefs", "securityfs", "selinuxfs", "smackfs", "sysfs", "tracefs", "xenfs",
})

PROC_MOUNTINFO = "/proc/self/mountinfo"

# Fields before the optional ones, and after the "-" separator.
_LEADING_FIELDS = 6
_TRAILING_FIELDS = 3
_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")
_MAJOR_MINOR = re.compile(r"\d+:\d+")


@dataclass(frozen=True)
class MountInfo:
    """One mount as the kernel reports it in ``mountinfo`` (paths already unescaped)."""

    mount_id: int
    parent_id: int
    major_minor: str
    root: str
    mount_point: str
    mount_options: str
    fs_type: str
    source: str
    super_options: str
    #: field 7, propagation tags such as ``shared:1``, ``master:2``, ``unbindable``; not part
    #: of a mount's identity (``mount --make-*`` changes them on the same mount)
    optional_fields: tuple[str, ...] = field(default=(), compare=False)


def _unescape(field: str) -> str:
    """Decode the kernel's ``\\ooo`` escapes.

    Work on bytes: an escape stands for one byte, and the path around it may be any bytes
    (the table is decoded with the filesystem encoding and ``surrogateescape``, like
    ``os.listdir``), so decoding octal escapes on the ``str`` would break multi-byte names.
    """
    if "\\" not in field:
        return field
    return os.fsdecode(_OCTAL_ESCAPE.sub(_octal_byte, os.fsencode(field)))


def _octal_byte(match: re.Match[bytes]) -> bytes:
    """The byte an octal escape stands for; an out-of-range escape (never written by the kernel) stays as is."""
    value = int(match.group(1), 8)
    return bytes([value]) if value <= 0xFF else match.group(0)


def _parse_line(line: str, lineno: int) -> MountInfo:
    """Parse one non-empty ``mountinfo`` line; raise ``ValueError`` naming ``lineno`` if malformed."""
    # Split on single spaces, not on runs of whitespace: an empty source field is legal
    # (``mount -t tmpfs "" /x``) and shows up as two adjacent spaces.
    fields = line.split(" ")
    try:
        sep = fields.index("-", _LEADING_FIELDS)
    except ValueError:
        raise ValueError(f"mountinfo line {lineno}: no '-' separator after field 6: {line!r}") from None
    if len(fields) - sep - 1 != _TRAILING_FIELDS:
        raise ValueError(
            f"mountinfo line {lineno}: expected {_TRAILING_FIELDS} fields after '-', "
            f"got {len(fields) - sep - 1}: {line!r}"
        )
    mount_id, parent_id, major_minor, root, mount_point, mount_options = fields[:_LEADING_FIELDS]
    fs_type, source, super_options = fields[sep + 1 :]
    if not (mount_id.isdigit() and parent_id.isdigit()):
        raise ValueError(f"mountinfo line {lineno}: mount ids are not numbers: {line!r}")
    if not _MAJOR_MINOR.fullmatch(major_minor):
        raise ValueError(f"mountinfo line {lineno}: bad major:minor {major_minor!r}: {line!r}")
    if not root or not mount_point:
        raise ValueError(f"mountinfo line {lineno}: empty root or mount point: {line!r}")
    return MountInfo(
        mount_id=int(mount_id),
        parent_id=int(parent_id),
        major_minor=major_minor,
        root=_unescape(root),
        mount_point=_unescape(mount_point),
        mount_options=mount_options,
        fs_type=_unescape(fs_type),
        source=_unescape(source),
        super_options=super_options,
        optional_fields=tuple(fields[_LEADING_FIELDS:sep]),
    )


def parse_mountinfo(text: str) -> list[MountInfo]:
    """Parse the text of a ``mountinfo`` file into one :class:`MountInfo` per line.

    Empty lines are ignored. A malformed line raises ``ValueError`` whose message names
    its 1-based line number, so a surprising kernel or a truncated read is reported, not
    turned into an ``IndexError`` deep in the agent.
    """
    return [_parse_line(line, n) for n, line in enumerate(text.split("\n"), start=1) if line]


def read_mountinfo(path: str = PROC_MOUNTINFO) -> list[MountInfo]:
    """Read and parse a ``mountinfo`` file (by default the calling process's own).

    Read as bytes and decode with ``os.fsdecode`` so that mount points whose names are
    not valid UTF-8 come out exactly as ``os.listdir`` would spell them.
    """
    with open(path, "rb") as f:
        return parse_mountinfo(os.fsdecode(f.read()))


def mount_points(path: str = PROC_MOUNTINFO) -> frozenset[str]:
    """The set of mount point paths in a ``mountinfo`` file, for fast membership tests."""
    return frozenset(m.mount_point for m in read_mountinfo(path))


def fd_mount_id(fd: int) -> int:
    """The id of the mount an open descriptor is on (``mnt_id`` in ``/proc/self/fdinfo``).

    A descriptor names one object, so this is the mount of what was opened, not of whatever a
    path string matches in the table now. Unlike ``st_dev`` it tells apart two mounts of one
    filesystem (a bind mount).
    """
    with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
        for line in f:
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOTSUP, "no mnt_id in /proc/self/fdinfo (kernel older than 3.15)")


def opened_at_filesystem_root(fd: int, path: str) -> bool:
    """Whether ``fd`` (``path``, opened) is the root of a filesystem mounted at ``path``.

    Asked of the descriptor rather than of the path, so that a disk unmounted between a
    look at a directory and the use of it cannot leave the caller working in the directory
    underneath (the node's root filesystem).
    """
    try:
        mount = FilesystemTypes().mount_of_fd(fd)
    except OSError:
        return False
    return mount.mount_point == os.path.realpath(path) and mount.root == "/"


class FilesystemTypes:
    """The filesystem type (and the whole mount entry) of the mount an open descriptor is on, by mount id.

    The table is read on first use and re-read once when an id is missing (a mount made after
    the read), so one scan reads it once however many mount points it classifies. The ids are
    those of this process's mount namespace: always :data:`PROC_MOUNTINFO`, whatever table a
    caller used for its path set.
    """

    def __init__(self, path: str = PROC_MOUNTINFO) -> None:
        self._path = path
        self._mounts: dict[int, MountInfo] | None = None

    def of_fd(self, fd: int) -> str:
        """The type of the mount ``fd`` is on; ``OSError`` when it cannot be told."""
        return self.mount_of_fd(fd).fs_type

    def mount_of_fd(self, fd: int) -> MountInfo:
        """The mount ``fd`` is on (device, root, type, options); ``OSError`` when it cannot be told."""
        mount_id = fd_mount_id(fd)
        for reread in (False, True):
            if self._mounts is None or reread:
                self._mounts = {m.mount_id: m for m in read_mountinfo(self._path)}
            if mount_id in self._mounts:
                return self._mounts[mount_id]
        raise OSError(errno.ENOENT, f"mount {mount_id} is not in {self._path}")


class MountTableWatcher:
    """Wait for the mount table of this process's mount namespace to change.

    The kernel wakes pollers of an open ``mountinfo`` file with ``POLLPRI | POLLERR``
    whenever a mount or unmount happens in the namespace (including mounts propagated
    in, e.g. through ``HostToContainer``). It re-arms inside ``poll()`` itself: the poll
    that reports a change records the namespace's event counter in the open file, so the
    next report needs a newer change, and nothing has to be read from the file. Several
    changes between two waits are reported once. The file is opened at construction,
    which is the baseline: a change after that and before :meth:`wait` is still reported.
    """

    _EVENTS = select.POLLPRI | select.POLLERR

    def __init__(self, path: str = PROC_MOUNTINFO) -> None:
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._poller = select.poll()
        self._poller.register(self._fd, self._EVENTS)

    def fileno(self) -> int:
        """The open ``mountinfo`` descriptor, for callers that poll several sources at once.

        Register it for ``POLLPRI`` (``select.select`` callers: in the *exceptional* set);
        ``POLLIN`` is always ready on it and means nothing.
        """
        if self._fd is None:
            raise ValueError("MountTableWatcher is closed")
        return self._fd

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if the mount table changed since the last report."""
        self.fileno()  # raises when closed
        # Round up: a sub-millisecond timeout must not turn into a busy zero-timeout poll.
        events = self._poller.poll(max(0, math.ceil(timeout * 1000)))
        return any(mask & self._EVENTS for _, mask in events)

    def close(self) -> None:
        """Close the descriptor; safe to call twice."""
        if self._fd is not None:
            self._poller.unregister(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> MountTableWatcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

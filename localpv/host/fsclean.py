"""Safe removal of everything inside a filesystem volume, keeping the volume's root.

A Released Filesystem PV is wiped by deleting the contents of its mount root (upstream:
``os.RemoveAll`` of each top-level entry). The contents were written by an untrusted pod,
so the walk must assume a hostile tree:

* it never follows a symlink: every step is ``openat``/``unlinkat`` relative to an open
  directory descriptor with ``O_NOFOLLOW | O_DIRECTORY``, and each opened directory is
  checked to be the inode that ``lstat`` saw, so a symlink swapped in mid-walk cannot
  redirect it outside the volume;
* it never enters another mount: a directory whose device differs from the root's, or
  whose mount id differs (a bind mount of the *same* filesystem, e.g. of ``/etc`` into a
  volume that is itself a directory on the root filesystem), is left untouched and fails
  the clean with a clear reason: a volume with foreign data inside is never offered;
* it is iterative and holds one directory descriptor at a time (it climbs back with
  ``..`` and checks it lands on the directory it came from), so a 5,000-level tree needs
  neither deep recursion nor thousands of descriptors.

Hidden files and ``lost+found`` are removed like everything else, as upstream does.
The truth is checked at the end: the clean succeeds only if the root is empty.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "CleanError",
    "CleanReport",
    "DirtyVolumeError",
    "UnsafePathError",
    "clean_directory",
    "is_within",
    "verify_empty",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RWX = stat.S_IRWXU
_MAX_PROBLEMS = 100  # kept for the error message; a pathological tree can produce millions
_DEFAULT_LIST_LIMIT = 10
_STOP_CHECK_EVERY = 256  # entries between two looks at the cancel flag and the deadline

_Ident = tuple[int, int]  # (st_dev, st_ino): what an inode is, independent of its path


class CleanError(Exception):
    """Cleaning a filesystem volume failed."""


class UnsafePathError(CleanError):
    """The path must not be cleaned (``/``, not a directory, a symlink) or changed under us."""


class DirtyVolumeError(CleanError):
    """Entries remain inside the volume after cleaning.

    ``remaining`` holds up to a limit of remaining top-level names, ``total`` their number,
    ``problems`` the reasons met on the way (a foreign mount, a permission error...).
    """

    def __init__(self, root: str, remaining: Sequence[str], total: int, problems: Sequence[str] = ()) -> None:
        self.root = root
        self.remaining = tuple(remaining)
        self.total = total
        self.problems = tuple(problems)
        shown = ", ".join(repr(n) for n in self.remaining)
        more = f" and {total - len(self.remaining)} more" if total > len(self.remaining) else ""
        message = f'volume "{root}" is not empty: {total} entries remain: {shown}{more}'
        if self.problems:
            message = "; ".join(self.problems) + ". " + message
        super().__init__(message)


@dataclass(frozen=True)
class CleanReport:
    """What a successful clean did. ``bytes_freed`` is approximate: allocated blocks of the
    removed inodes whose last link went away."""

    root: str
    files_removed: int
    dirs_removed: int
    bytes_freed: int
    seconds: float


def is_within(path: str, base: str) -> bool:
    """True if ``path`` resolves to a location strictly below ``base`` (both realpath'd).

    Used before cleaning to make sure a volume path lies inside its class's ``mountDir``
    (upstream compares string prefixes, which ``/mnt/disks-evil`` or ``/mnt/disks/../etc``
    defeat). ``path == base`` is False: cleaning the discovery directory itself is never
    meant. The final component is resolved too, so a filesystem volume that is a symlink
    to a directory elsewhere is outside; for a block volume, whose entry legitimately links
    into ``/dev``, check the directory holding the link instead.
    """
    real_path, real_base = os.path.realpath(path), os.path.realpath(base)
    return real_path != real_base and os.path.commonpath([real_path, real_base]) == real_base


def verify_empty(root: str, limit: int = _DEFAULT_LIST_LIMIT) -> None:
    """Raise :class:`DirtyVolumeError` listing up to ``limit`` entries if ``root`` is not empty."""
    _raise_if_dirty(root, limit, ())


def clean_directory(root: str, *, should_stop: Callable[[], str | None] | None = None) -> CleanReport:
    """Remove everything inside ``root``, keep ``root``, and check it is empty.

    ``should_stop`` is asked every few hundred entries; when it returns a reason (the
    cleanup was cancelled or ran out of time) the walk stops with :class:`CleanError`,
    leaving the volume partly cleaned - and so still not offered.

    Raises :class:`UnsafePathError` before touching anything if ``root`` is ``/``, not a
    directory, or a symlink, and during the walk if a directory it climbs back into is not
    the one it left (something moved directories under it). Raises
    :class:`DirtyVolumeError` if entries remain, with the reasons, e.g. ``filesystem
    mounted at X inside the volume; unmount it``.
    """
    started = time.monotonic()
    walk = _Walk(root, should_stop=should_stop)
    walk.run()
    _raise_if_dirty(root, _DEFAULT_LIST_LIMIT, walk.problems)
    return CleanReport(root, walk.files, walk.dirs, walk.bytes_freed, time.monotonic() - started)


def _raise_if_dirty(root: str, limit: int, problems: Sequence[str]) -> None:
    fd = _open_root(root)[0]
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    if names:
        raise DirtyVolumeError(root, sorted(names)[:limit], len(names), problems)


def _ident(st: os.stat_result) -> _Ident:
    return st.st_dev, st.st_ino


def _open_root(root: str) -> tuple[int, os.stat_result]:
    """Open the volume root without following a symlink, after the refusals."""
    if os.path.realpath(root) == "/":
        raise UnsafePathError(f'refusing to clean "{root}": it is the root directory')
    try:
        lst = os.lstat(root)
    except OSError as e:
        raise UnsafePathError(f'cannot clean "{root}": {e.strerror}') from e
    if stat.S_ISLNK(lst.st_mode):
        raise UnsafePathError(f'refusing to clean "{root}": it is a symlink')
    if not stat.S_ISDIR(lst.st_mode):
        raise UnsafePathError(f'refusing to clean "{root}": not a directory')
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as e:
        raise UnsafePathError(f'cannot open "{root}": {e.strerror}') from e
    st = os.fstat(fd)
    if _ident(st) != _ident(lst):
        os.close(fd)
        raise UnsafePathError(f'"{root}" was replaced while opening it')
    return fd, st


def _mount_id(fd: int) -> int:
    """The id of the mount an open descriptor belongs to (``mnt_id`` in ``/proc/self/fdinfo``).

    Unlike ``st_dev`` it tells apart two mounts of the same filesystem, i.e. a bind mount.
    """
    with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
        for line in f:
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    raise OSError(f"no mnt_id in /proc/self/fdinfo/{fd}")


def _foreign_mount(path: str) -> str:
    return f"filesystem mounted at {path} inside the volume; unmount it"


def _grant_owner_access(dir_fd: int, name: str, st: os.stat_result) -> None:
    """Add ``u+rwx`` to a directory so it can be listed and emptied without root's capabilities.

    Through an ``O_PATH`` descriptor (chmod via ``/proc/self/fd``), never by name, so a
    symlink swapped in cannot redirect the chmod. Failures are ignored here: if access is
    still missing, opening or emptying the directory fails and that failure is reported.
    """
    with contextlib.suppress(OSError):
        fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
        try:
            if _ident(os.fstat(fd)) == _ident(st):
                os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(st.st_mode) | _OWNER_RWX)
        finally:
            os.close(fd)


@dataclass
class _Frame:
    """A directory being emptied: its name in its parent, identity, and names left to do."""

    name: str
    ident: _Ident
    blocks: int
    pending: list[str]
    keep: bool = False  # something inside stays, so this directory cannot be removed


@dataclass
class _Walk:
    """The state of one clean: counters, problems, the stack of directories being emptied,
    and the one open descriptor (of the directory on top of the stack)."""

    root: str
    files: int = 0
    dirs: int = 0
    bytes_freed: int = 0
    problems: list[str] = field(default_factory=list)
    _stack: list[_Frame] = field(default_factory=list)
    _fd: int = -1
    _root_dev: int = 0
    _root_mount: int = 0
    #: Checked between entries; returns why to stop (cancelled, timed out) or None.
    should_stop: Callable[[], str | None] | None = None

    def run(self) -> None:
        self._fd, st = _open_root(self.root)
        try:
            try:
                self._root_dev, self._root_mount = st.st_dev, _mount_id(self._fd)
            except OSError as e:
                raise CleanError(f"cannot tell which mount {self.root} is (is /proc mounted?): {e}") from e
            self._stack.append(_Frame("", _ident(st), 0, os.listdir(self._fd)))
            self._loop()
        finally:
            os.close(self._fd)

    def _loop(self) -> None:
        """Depth-first, post-order, until the root's own entries are done."""
        checked = 0
        while True:
            checked += 1
            if self.should_stop is not None and checked % _STOP_CHECK_EVERY == 0:
                why = self.should_stop()
                if why:
                    raise CleanError(f"cleaning {self.root} stopped: {why}")
            frame = self._stack[-1]
            if frame.pending:
                self._visit(frame.pending.pop())
            elif len(self._stack) == 1:
                return
            else:
                self._stack.pop()
                self._climb(self._stack[-1])
                self._remove_dir(frame)

    def _path(self, name: str) -> str:
        """The path of ``name`` in the current directory, for messages only."""
        return os.path.join(self.root, *(f.name for f in self._stack[1:]), name)

    def _problem(self, message: str) -> None:
        """Record why something stays; the current directory then cannot be removed."""
        self._stack[-1].keep = True
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(message)

    def _visit(self, name: str) -> None:
        """Remove a non-directory, or descend into a directory."""
        try:
            st = os.lstat(name, dir_fd=self._fd)
        except FileNotFoundError:
            return  # removed by someone else meanwhile: fine
        except OSError as e:
            self._problem(f'cannot stat "{self._path(name)}": {e.strerror}')
            return
        if st.st_dev != self._root_dev:
            self._problem(_foreign_mount(self._path(name)))
        elif stat.S_ISDIR(st.st_mode):
            self._enter(name, st)
        else:
            self._unlink(name, st)

    def _unlink(self, name: str, st: os.stat_result) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except FileNotFoundError:
            return
        except OSError as e:
            self._problem(f'cannot remove "{self._path(name)}": {e.strerror}')
            return
        self.files += 1
        if st.st_nlink <= 1:
            self.bytes_freed += st.st_blocks * 512

    def _enter(self, name: str, st: os.stat_result) -> None:
        """Open a sub-directory (checking it is what lstat saw, on our mount) and make it current."""
        if st.st_mode & _OWNER_RWX != _OWNER_RWX:
            _grant_owner_access(self._fd, name, st)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self._fd)
        except FileNotFoundError:
            return
        except OSError as e:
            self._problem(f'cannot open directory "{self._path(name)}": {e.strerror}')
            return
        try:
            if _ident(os.fstat(fd)) != _ident(st):
                self._problem(f'"{self._path(name)}" was replaced during cleaning')
            elif _mount_id(fd) != self._root_mount:
                self._problem(_foreign_mount(self._path(name)))
            else:
                frame = _Frame(name, _ident(st), st.st_blocks, os.listdir(fd))
                os.close(self._fd)
                self._fd = fd
                self._stack.append(frame)
                return
        except OSError as e:
            self._problem(f'cannot read directory "{self._path(name)}": {e.strerror or e}')
        os.close(fd)

    def _climb(self, parent: _Frame) -> None:
        """Go back up through ``..`` and check it is the directory we came down from."""
        parent_fd = os.open("..", _DIR_FLAGS, dir_fd=self._fd)
        os.close(self._fd)
        self._fd = parent_fd
        if _ident(os.fstat(parent_fd)) != parent.ident:
            raise UnsafePathError(f'directories inside "{self.root}" were moved during cleaning; stopped for safety')

    def _remove_dir(self, frame: _Frame) -> None:
        """Remove an emptied sub-directory of the current one, unless something inside stayed."""
        if frame.keep:
            self._stack[-1].keep = True
            return
        try:
            os.rmdir(frame.name, dir_fd=self._fd)
        except FileNotFoundError:
            return
        except OSError as e:
            self._problem(f'cannot remove directory "{self._path(frame.name)}": {e.strerror}')
            return
        self.dirs += 1
        self.bytes_freed += frame.blocks * 512

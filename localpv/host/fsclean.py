"""Safe removal of everything inside a filesystem volume, keeping the volume's root.

A Released Filesystem PV is wiped by deleting the contents of its mount root (upstream:
``os.RemoveAll`` of each top-level entry). The contents were written by an untrusted pod,
so the walk must assume a hostile tree:

* it never follows a symlink: every step is ``openat``/``unlinkat`` relative to an open
  directory descriptor with ``O_NOFOLLOW | O_DIRECTORY``, and each opened directory is
  checked to be the inode that ``lstat`` saw, so a symlink swapped in mid-walk cannot
  redirect it outside the volume;
* it never enters nor changes another mount: a directory whose device differs from the
  root's, or whose mount id differs (a bind mount of the *same* filesystem, e.g. of ``/etc``
  into a volume that is itself a directory on the root filesystem), is left untouched - not
  even the mode bit that makes a directory removable is set before both are checked - and
  fails the clean with a clear reason: a volume with foreign data inside is never offered.
  A single file mounted over an entry cannot be unlinked (the kernel answers ``EBUSY``) and
  is reported as the mount it is;
* it is iterative and holds one directory descriptor at a time (it climbs back with
  ``..`` and checks it lands on the directory it came from), so a 5,000-level tree needs
  neither deep recursion nor thousands of descriptors.

It costs about what ``rm -rf`` costs (docs/benchmarks.md): per non-directory one
``unlinkat`` and no ``lstat``. That is safe because ``unlinkat(dir_fd, name, 0)`` on a
name read from ``dir_fd`` itself changes nothing but that directory entry, which is on the
volume's mount (the directory was checked before it was listed): it never follows a
symlink (the link goes), it refuses a directory of any kind, a mount point included, with
``EISDIR`` (Linux never unlinks a directory) - the entry is then looked at and walked as
a directory, with every check - and it refuses a file something is mounted on with
``EBUSY``, which is then reported as the mount it is. So the kernel answers the questions
the ``lstat`` asked, in the same call, without the window between the two. The freed
space is the filesystem's own count (``fstatvfs`` of the root before and after) rather
than a sum of ``st_blocks``, which needed that ``lstat``.

Hidden files and ``lost+found`` are removed like everything else, as upstream does.
The truth is checked at the end, on the directory that was cleaned (its descriptor, not
its path, which a mount stacked on it meanwhile would answer for): the clean succeeds
only if the root is empty.

A volume is a mount point: a plain directory where a volume should be means its disk is
not mounted, and its contents belong to the filesystem underneath (often the host's root
disk). :func:`clean_directory` refuses one unless told otherwise; :func:`mount_point_problem`
and :func:`directly_inside` let callers refuse a path before they start.

The walk waits on the volume's storage at every step, and storage can hang for ever (a
FUSE mount inside the volume whose daemon never answers): a thread stuck there can never
be taken back. So the agent runs :func:`clean_volume` in a child process,
``python -m localpv.host.fsclean``, which it kills at the timeout (see
:func:`localpv.agent.cleaning.filesystem_cleaner`). The child prints one last line,
``clean: <what was done>`` (exit 0) or ``NOT clean: <why>`` (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from localpv.host.statx import mount_id

__all__ = [
    "CleanError",
    "CleanReport",
    "DirtyVolumeError",
    "UnsafePathError",
    "clean_directory",
    "clean_volume",
    "directly_inside",
    "file_kind",
    "is_within",
    "mount_point_problem",
    "not_an_entry_problem",
    "verify_empty",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ANY_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
#: Reopening an O_PATH descriptor as ``.`` relative to itself: the lookup of ``.`` stays on
#: the very directory (mount and inode) already checked - unlike ``..`` or a name, it never
#: crosses into a mount - so nothing is looked up again. (Through the ``/proc/self/fd`` magic
#: link it is the same directory, at the price of a lookup in procfs per directory.)
_REOPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_EXPECT_MOUNT_POINT = "expected a mount point (a mounted volume), found"
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
    ``problems`` the reasons met on the way (a foreign mount, a permission error...). The
    message says how many entries remain and why, never their names: they are the
    tenant's, and the message travels to events, logs and ``/status``.
    """

    def __init__(self, root: str, remaining: Sequence[str], total: int, problems: Sequence[str] = ()) -> None:
        self.root = root
        self.remaining = tuple(remaining)
        self.total = total
        self.problems = tuple(problems)
        message = f'volume "{root}" is not empty: {total} {"entry remains" if total == 1 else "entries remain"}'
        if self.problems:
            message = "; ".join(_counted(self.problems)) + ". " + message
        super().__init__(message)


@dataclass(frozen=True)
class CleanReport:
    """What a successful clean did. ``bytes_freed`` is approximate: how much more free space
    the volume's filesystem reports than before (the blocks of a file still held open by some
    process are not freed yet; on a filesystem shared with others, their writes count too)."""

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


def directly_inside(path: str, base: str) -> bool:
    """True if the directory ``path`` is an entry of ``base`` itself: the same inode, not the same string.

    Volumes are the entries of a discovery directory, never deeper: ``base/vol`` is inside,
    ``base/vol/deeper``, ``base-evil/vol``, ``base/vol/..`` and ``base/link-elsewhere/vol``
    are not. The parent is the kernel's (``path/..``, which for a mount point is the
    directory it is mounted on), never a string operation: ``base/link/../vol`` is where the
    kernel finds it, not ``base/vol``. False when either cannot be reached, or ``path`` is
    not a directory (nor a symlink to one inside ``base``).
    """
    try:
        return _ident(os.stat(os.path.join(path, ".."))) == _ident(os.stat(base))
    except OSError:
        return False


def not_an_entry_problem(path: str, discovery_dirs: Sequence[str]) -> str:
    """What to say when ``path`` is an entry of none of ``discovery_dirs``."""
    return (f"expected a directory directly inside {' or '.join(discovery_dirs)}, "
            f"found one inside {os.path.dirname(os.path.abspath(path))}")


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, with its article, for "expected ..., found <kind>" messages."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISLNK, "a symlink"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "an unknown kind of file")


def mount_point_problem(path: str) -> str | None:
    """Why ``path`` is not a mounted volume ("expected ..., found ..."), or None if it is one.

    A mount point is decided by mount ids (``path`` and its ``..`` are on different mounts),
    so a directory bind-mounted onto itself counts and a plain directory of any filesystem
    does not, whatever the mount table's strings say. ``path`` itself must not be a symlink:
    a volume is cleaned where it is, never through a link.
    """
    try:
        lst = os.lstat(path)
    except OSError as e:
        return f"{_EXPECT_MOUNT_POINT} nothing there ({e.strerror})"
    if not stat.S_ISDIR(lst.st_mode):
        return f"{_EXPECT_MOUNT_POINT} {file_kind(lst.st_mode)}"
    if os.path.realpath(path) == "/":
        return f"{_EXPECT_MOUNT_POINT} the root directory"
    try:
        fd = os.open(path, _PATH_FLAGS)
    except OSError as e:
        return f"{_EXPECT_MOUNT_POINT} a directory that cannot be opened ({e.strerror})"
    try:
        if _ident(os.fstat(fd)) != _ident(lst):
            return f"{_EXPECT_MOUNT_POINT} a directory replaced while it was checked"
        if not _is_mount_root(fd):
            return f"{_EXPECT_MOUNT_POINT} a plain directory on the same mount as its parent"
    except OSError as e:
        return f"{_EXPECT_MOUNT_POINT} a directory whose mount cannot be told ({e.strerror or e}; is /proc mounted?)"
    finally:
        os.close(fd)
    return None


def verify_empty(root: str, limit: int = _DEFAULT_LIST_LIMIT) -> None:
    """Raise :class:`DirtyVolumeError` listing up to ``limit`` entries if ``root`` is not empty."""
    fd = _open_root(root, require_mount_point=False)[0]
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    _raise_if_dirty(root, names, limit, ())


def clean_directory(
    root: str,
    *,
    should_stop: Callable[[], str | None] | None = None,
    require_mount_point: bool = True,
    expect_identity: str = "",
) -> CleanReport:
    """Remove everything inside ``root``, keep ``root``, and check it is empty.

    ``should_stop`` is asked every few hundred entries; when it returns a reason (the
    cleanup was cancelled or ran out of time) the walk stops with :class:`CleanError`,
    leaving the volume partly cleaned - and so still not offered.

    Raises :class:`UnsafePathError` before touching anything if ``root`` is ``/``, not a
    directory, a symlink, or (unless ``require_mount_point`` is False) not a mount point,
    decided on the very directory it then cleans, or if that directory is not the volume
    ``expect_identity`` names (when given); and during the walk if a directory it
    climbs back into is not the one it left (something moved directories under it).
    Raises :class:`DirtyVolumeError` if entries remain, with the reasons, e.g.
    ``filesystem mounted at X inside the volume; unmount it``.
    """
    started = time.monotonic()
    walk = _Walk(root, should_stop=should_stop, require_mount_point=require_mount_point,
                 expect_identity=expect_identity)
    walk.run()
    _raise_if_dirty(root, walk.remaining, _DEFAULT_LIST_LIMIT, walk.problems)
    return CleanReport(root, walk.files, walk.dirs, walk.bytes_freed, time.monotonic() - started)


def _counted(problems: Sequence[str]) -> list[str]:
    """Each distinct problem once, with how often it was met."""
    counts: dict[str, int] = {}
    for problem in problems:
        counts[problem] = counts.get(problem, 0) + 1
    return [problem if n == 1 else f"{problem} ({n} times)" for problem, n in counts.items()]


def _raise_if_dirty(root: str, names: Sequence[str], limit: int, problems: Sequence[str]) -> None:
    if names:
        raise DirtyVolumeError(root, sorted(names)[:limit], len(names), problems)


def _ident(st: os.stat_result) -> _Ident:
    return st.st_dev, st.st_ino


def _open_root(root: str, *, require_mount_point: bool) -> tuple[int, os.stat_result]:
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
    try:
        st = os.fstat(fd)
        if _ident(st) != _ident(lst):
            raise UnsafePathError(f'"{root}" was replaced while opening it')
        if require_mount_point and not _is_mount_root(fd):
            raise UnsafePathError(
                f'refusing to clean "{root}": not a mount point (nothing is mounted there, so the directory '
                "belongs to the filesystem underneath: is the volume's disk unmounted?)")
    except OSError as e:
        os.close(fd)
        raise _unknown_mount(root, e) from e
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _check_identity(root: str, fd: int, st: os.stat_result, expected: str) -> None:
    """Refuse the volume open as ``fd`` unless it is the volume the cleanup was decided for.

    A cleanup Job may start minutes after the decision, and a cleaner after a restart: the disk
    at the path may have been swapped meanwhile. The identity is read from the very directory
    that is then cleaned (its descriptor), not from the path again.
    """
    from localpv.host.identity import default_identity_reader
    from localpv.host.mounts import FilesystemTypes

    try:
        found = default_identity_reader().filesystem(FilesystemTypes().mount_of_fd(fd), fd, st)
    except OSError as e:
        raise UnsafePathError(f'refusing to clean "{root}": cannot read its identity ({e.strerror or e}); '
                              f"it must be {expected}") from e
    if found.value != expected:
        what = found.value or found.error or found.how
        raise UnsafePathError(f'refusing to clean "{root}": it holds volume {what}, not the volume {expected} this '
                              "cleanup is for (disks renumbered or swapped since it was decided?)")


def _unknown_mount(root: str, error: OSError) -> CleanError:
    return CleanError(f"cannot tell which mount {root} is (is /proc mounted?): {error}")


def _is_mount_root(fd: int) -> bool:
    """True if the directory open as ``fd`` is the root of a mount: its ``..`` is on another one.

    (``..`` of a mount's root is looked up in the mount it is mounted on; of ``/``, in ``/``.)
    """
    parent = os.open("..", _PATH_FLAGS, dir_fd=fd)
    try:
        return mount_id(fd) != mount_id(parent)
    finally:
        os.close(parent)


def _foreign_mount(root: str) -> str:
    # Names of entries inside a volume are the tenant's: they appear in no message. The
    # operator finds the mount with findmnt.
    return f"a filesystem is mounted inside the volume; unmount it (findmnt -R {root} lists it)"


def _grant_owner_access(path_fd: int, st: os.stat_result) -> None:
    """Add ``u+rwx`` to a directory so it can be listed and emptied without root's capabilities.

    ``path_fd`` is an ``O_PATH`` descriptor the caller has already checked is the directory
    it means, on the volume's mount; the chmod goes through ``/proc/self/fd``, never by name,
    so nothing swapped in or mounted meanwhile can receive it. Failures are ignored here: if
    access is still missing, opening or emptying the directory fails and that is reported.
    """
    with contextlib.suppress(OSError):
        os.chmod(f"/proc/self/fd/{path_fd}", stat.S_IMODE(st.st_mode) | _OWNER_RWX)


def _pending(fd: int) -> list[str]:
    """The entries of a directory, to be popped off the end in the order the kernel listed them.

    That order (newest first on tmpfs) cost the kernel less to unlink in than the reverse,
    which the walk used to take: less system time in each of five measured pairs of runs
    over 500,000 files, by 0.07-0.7 s (docs/benchmarks.md). The reversal is one pass in C.
    """
    names = os.listdir(fd)
    names.reverse()
    return names


@dataclass
class _Frame:
    """A directory being emptied: its name in its parent, identity, and names left to do."""

    name: str
    ident: _Ident
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
    require_mount_point: bool = True
    #: The stable identity the volume must have (see :mod:`localpv.host.identity`), "" for any.
    expect_identity: str = ""
    #: What the root holds once the walk is over, listed through its descriptor.
    remaining: list[str] = field(default_factory=list)
    _until_stop_check: int = _STOP_CHECK_EVERY

    def run(self) -> None:
        self._fd, st = _open_root(self.root, require_mount_point=self.require_mount_point)
        try:
            try:
                self._root_dev, self._root_mount = st.st_dev, mount_id(self._fd)
            except OSError as e:
                raise _unknown_mount(self.root, e) from e
            if self.expect_identity:
                _check_identity(self.root, self._fd, st, self.expect_identity)
            before = os.fstatvfs(self._fd)
            self._stack.append(_Frame("", _ident(st), _pending(self._fd)))
            self._loop()
            self.remaining = os.listdir(self._fd)  # back at the root: _climb checked each step up
            after = os.fstatvfs(self._fd)
            self.bytes_freed = max(0, after.f_bfree - before.f_bfree) * after.f_frsize
        finally:
            os.close(self._fd)

    def _loop(self) -> None:
        """Depth-first, post-order, until the root's own entries are done."""
        while True:
            frame = self._stack[-1]
            if frame.pending:
                self._remove_entries(frame.pending)
            elif len(self._stack) == 1:
                return
            else:
                self._tick()
                self._stack.pop()
                self._climb(self._stack[-1])
                self._remove_dir(frame)

    def _tick(self) -> None:
        """Count one step; every ``_STOP_CHECK_EVERY`` steps, ask ``should_stop``."""
        self._until_stop_check -= 1
        if self._until_stop_check <= 0:
            self._ask_should_stop()

    def _ask_should_stop(self) -> None:
        self._until_stop_check = _STOP_CHECK_EVERY
        why = self.should_stop() if self.should_stop is not None else None
        if why:
            raise CleanError(f"cleaning {self.root} stopped: {why}")

    def _problem(self, message: str) -> None:
        """Record why something stays; the current directory then cannot be removed."""
        self._stack[-1].keep = True
        if len(self.problems) < _MAX_PROBLEMS:
            self.problems.append(message)

    def _remove_entries(self, pending: list[str]) -> None:
        """Unlink the current directory's entries until one is a directory, then descend into it.

        The hot loop: one ``unlinkat`` per non-directory, nothing else (see the module's
        docstring for why no ``lstat`` is needed). ``EISDIR`` means a directory, which
        :meth:`_visit_directory` checks and enters (or refuses); so may ``EPERM`` or
        ``EACCES``. Then the caller goes on with whichever directory is current.
        """
        fd, unlink, removed, countdown = self._fd, os.unlink, 0, self._until_stop_check
        try:
            while pending:
                countdown -= 1
                if countdown <= 0:
                    self._ask_should_stop()
                    countdown = self._until_stop_check
                name = pending.pop()
                try:
                    unlink(name, dir_fd=fd)
                except (IsADirectoryError, PermissionError):
                    # EISDIR: a directory. EPERM, EACCES: the kernel checks the permission
                    # to delete before the kind, so a directory it refuses (append-only,
                    # immutable...) says so; walked into all the same, as far as it lets us.
                    self._visit_directory(name)
                    return
                except FileNotFoundError:
                    continue  # removed by someone else meanwhile: fine
                except OSError as e:
                    self._removal_failed(name, e, "cannot remove")
                    continue
                removed += 1
        finally:
            self.files += removed
            self._until_stop_check = countdown

    def _visit_directory(self, name: str) -> None:
        """Descend into an entry ``unlinkat`` did not remove, if it is a directory of ours."""
        try:
            st = os.lstat(name, dir_fd=self._fd)
        except FileNotFoundError:
            return  # removed by someone else meanwhile: fine
        except OSError as e:
            self._problem(f"cannot stat an entry: {e.strerror}")
            return
        if st.st_dev != self._root_dev:
            self._problem(_foreign_mount(self.root))
        elif stat.S_ISDIR(st.st_mode):
            self._enter(name, st)
        else:
            self._unlink(name)  # refused, or replaced by a non-directory since: one more try

    def _unlink(self, name: str) -> None:
        """Remove a non-directory, once; whatever prevents it (a directory again) is a problem."""
        try:
            os.unlink(name, dir_fd=self._fd)
        except FileNotFoundError:
            return
        except OSError as e:
            self._removal_failed(name, e, "cannot remove")
            return
        self.files += 1

    def _enter(self, name: str, st: os.stat_result) -> None:
        """Make a sub-directory current, once it is proven to be what lstat saw, on our mount.

        The proof is made on an ``O_PATH`` descriptor, which touches nothing, before anything
        changes: the chmod that makes a locked directory removable must never reach a
        directory of another mount. The directory is then opened through that descriptor,
        so the one checked is the one entered.
        """
        try:
            path_fd = os.open(name, _PATH_FLAGS, dir_fd=self._fd)
        except FileNotFoundError:
            return
        except OSError as e:
            self._problem(f"cannot open a directory: {e.strerror}")
            return
        try:
            fd = self._open_if_ours(name, path_fd, st)
        finally:
            os.close(path_fd)
        if fd is None:
            return
        try:
            frame = _Frame(name, _ident(st), _pending(fd))
        except OSError as e:
            os.close(fd)
            self._problem(f"cannot read a directory: {e.strerror or e}")
            return
        os.close(self._fd)
        self._fd = fd
        self._stack.append(frame)

    def _open_if_ours(self, name: str, path_fd: int, st: os.stat_result) -> int | None:
        """Check ``path_fd`` is the inode ``st`` describes on the volume's mount; grant the owner
        access if it lacks it; return a readable descriptor of it, or None with the problem noted."""
        try:
            current = os.fstat(path_fd)
            if _ident(current) != _ident(st):
                self._problem("a directory was replaced during cleaning")
                return None
            if mount_id(path_fd) != self._root_mount:
                self._problem(_foreign_mount(self.root))
                return None
            if current.st_mode & _OWNER_RWX != _OWNER_RWX:
                _grant_owner_access(path_fd, current)
            return os.open(".", _REOPEN_FLAGS, dir_fd=path_fd)
        except OSError as e:
            self._problem(f"cannot open a directory: {e.strerror or e}")
            return None

    def _on_another_mount(self, name: str) -> bool:
        """True if ``name`` in the current directory is a mount point (of anything but our mount)."""
        try:
            fd = os.open(name, _ANY_PATH_FLAGS, dir_fd=self._fd)
        except OSError:
            return False
        try:
            return mount_id(fd) != self._root_mount
        except OSError:
            return False
        finally:
            os.close(fd)

    def _removal_failed(self, name: str, error: OSError, what: str) -> None:
        """Record why ``name`` could not be removed; ``EBUSY`` on a mount point names the mount."""
        if error.errno == errno.EBUSY and self._on_another_mount(name):
            self._problem(_foreign_mount(self.root))
        else:
            self._problem(f"{what} an entry: {error.strerror}")

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
            self._removal_failed(frame.name, e, "cannot remove directory")
            return
        self.dirs += 1


def clean_volume(
    root: str,
    within: str | None,
    *,
    require_mount_point: bool = True,
    should_stop: Callable[[], str | None] | None = None,
    expect_identity: str = "",
) -> tuple[bool, str]:
    """Empty the volume ``root``: (True, what was removed) or (False, why it is not clean).

    Refuses a ``root`` that is not an entry of ``within`` (compared as directories, not
    strings; None skips this, for a person who said so) and, unless ``require_mount_point``
    is False, one that is not a mount point. Never raises for what it finds on the volume.
    """
    if within is not None and not directly_inside(root, within):
        return False, f"refusing to clean {root}: {not_an_entry_problem(root, [within])}"
    try:
        report = clean_directory(root, should_stop=should_stop, require_mount_point=require_mount_point,
                                 expect_identity=expect_identity)
    except CleanError as err:
        return False, str(err)
    except OSError as err:
        return False, f"cleaning {root} failed: {err}"
    return True, f"removed {report.files_removed} files and {report.dirs_removed} directories in {report.seconds:.1f}s"


def already_empty(root: str, within: str | None, *, require_mount_point: bool = True,
                  expect_identity: str = "") -> bool:
    """The volume passes every check :func:`clean_volume` makes before it touches anything,
    and holds nothing: there is nothing to clean. False when it does not, or it cannot be
    told (the cleaner then runs and says why)."""
    if within is not None and not directly_inside(root, within):
        return False
    try:
        fd, st = _open_root(root, require_mount_point=require_mount_point)
    except (CleanError, OSError):
        return False
    try:
        if expect_identity:
            _check_identity(root, fd, st, expect_identity)
        return not os.listdir(fd)
    except (CleanError, OSError):
        return False
    finally:
        os.close(fd)


#: The environment variable naming the process that started a child cleaner (see :func:`main`).
PARENT_ENV = "LOCALPV_CLEANER_PARENT"
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when the thread that started it ends; False if
    that one is gone already. A cleaner must never go on deleting after its agent died: the
    next agent may offer the volume meanwhile."""
    expected = os.environ.get(PARENT_ENV)
    if expected is None:
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == int(expected)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m localpv.host.fsclean [--within DIR] [--any-directory] [--expect-identity ID] ROOT``."""
    parser = argparse.ArgumentParser(prog="python -m localpv.host.fsclean", description="Empty one filesystem volume.")
    parser.add_argument("root")
    parser.add_argument("--within", help="the discovery dir ROOT must be an entry of")
    parser.add_argument("--any-directory", action="store_true", help="accept a ROOT that is not a mount point")
    parser.add_argument("--expect-identity", default="", help="refuse ROOT unless it is this volume")
    args = parser.parse_args(argv)
    if not _die_with_parent():
        print("NOT clean: the process that started this cleaner is gone", flush=True)
        return 1
    ok, message = clean_volume(args.root, args.within, require_mount_point=not args.any_directory,
                               expect_identity=args.expect_identity)
    print(("clean: " if ok else "NOT clean: ") + message, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

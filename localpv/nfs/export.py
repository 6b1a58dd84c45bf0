"""Directory operations on the mounted export that cannot be steered outside it.

Every path is walked one component at a time from a file descriptor of the export root,
opening each component with ``O_NOFOLLOW | O_DIRECTORY`` and acting on the next one
relative to that descriptor (``mkdirat``, ``fchmod``, ``renameat``, fd-based ``rmtree``).
So a symbolic link a tenant planted anywhere on the way - as the leaf or as an
intermediate directory - is refused instead of followed, and a component swapped for a
link between two calls is caught by the next ``open``. Paths given here are already
validated segments (no ``..``, no ``.``, no empty parts; see :mod:`localpv.nfs.pathpattern`).

Small files (localpv's ownership records) are read and written the same way: opened with
``O_NOFOLLOW | O_NONBLOCK`` relative to their directory's descriptor and used only if they are
regular files, and replaced atomically (write a sibling, ``fsync``, ``renameat`` over the old).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from localpv.crashpoints import reached
from localpv.host.durable import write_all

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: Mode of intermediate directories before the umask, as ``MkdirAll(path, 0777)`` upstream.
INTERMEDIATE_MODE = 0o777

#: Mode of localpv's own directories and files: only the provisioner has any business there.
PRIVATE_MODE = 0o700
_FILE_MODE = 0o600
_FILE_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

#: Suffix of the sibling a file is written to before it is renamed into place.
TEMPORARY_SUFFIX = ".tmp"


class UnsafeDirectory(Exception):
    """A path component is a symbolic link or not a directory: the path is refused."""

    def __init__(self, index: int, name: str, what: str) -> None:
        super().__init__(f"path component {index + 1} ({name!a}) {what}; refusing to follow it")
        self.index = index
        self.name = name
        self.what = what


@dataclass
class _Walk:
    fds: list[int]
    created_leaf: bool = False


class Export:
    """The export as mounted in this pod (``--mount-dir``); all access goes through here."""

    def __init__(self, root: str, *, on_mkdir: Callable[[], None] | None = None) -> None:
        if not getattr(shutil, "_use_fd_functions", False) or not shutil.rmtree.avoids_symlink_attacks:
            raise RuntimeError("this platform lacks the fd-based rmtree that deletion relies on")
        self.root = root
        self._on_mkdir = on_mkdir

    # ------------------------------------------------------------------ public

    def make_directory(self, parts: Sequence[str], mode: int) -> bool:
        """Create the directory (and missing parents) or adopt an existing one.

        Only the leaf is chmod'ed to ``mode`` (through its descriptor, so the umask cannot
        narrow it and no link can redirect it). Returns True when the leaf was created now.
        """
        _require_plain(parts)
        with self._walk(parts, create=True) as walk:
            os.fchmod(walk.fds[-1], mode)
            return walk.created_leaf

    def exists(self, parts: Sequence[str]) -> bool:
        """True if the directory is there (refuses links on the way like every other call)."""
        _require_plain(parts)
        try:
            with self._walk(parts, create=False):
                return True
        except FileNotFoundError:
            return False

    def remove(self, parts: Sequence[str]) -> bool:
        """``rm -rf`` the directory without following links in it; False if it was already gone."""
        _require_plain(parts)
        try:
            with self._walk(parts[:-1], create=False) as walk:
                parent = walk.fds[-1]
                if not self._is_directory(parent, parts[-1], len(parts) - 1):
                    return False
                shutil.rmtree(parts[-1], dir_fd=parent)
                reached("nfs-volume:removed")
                return True
        except FileNotFoundError:
            return False

    def archive(self, parts: Sequence[str], names: Sequence[str]) -> str | None:
        """Move the directory to the export root under the first free name of ``names``.

        Returns the name used, or None if the directory was already gone. A name is taken
        by creating it as an empty directory first (atomic, and portable to NFS where
        ``RENAME_NOREPLACE`` is not), then renaming over that placeholder, which
        ``rename(2)`` only allows while it is still empty: nothing is ever overwritten.
        """
        _require_plain(parts)
        _require_plain(names)
        try:
            with self._walk(parts[:-1], create=False) as walk:
                root, parent = walk.fds[0], walk.fds[-1]
                if not self._is_directory(parent, parts[-1], len(parts) - 1):
                    return None
                for name in names:
                    if self._move_onto_placeholder(root, parent, parts[-1], name):
                        return name
        except FileNotFoundError:
            return None
        raise FileExistsError(errno.EEXIST, f"no free archive name among {len(names)} candidates", names[0])

    # ------------------------------------------------------------------ small private files

    def read_file(self, parts: Sequence[str], name: str, limit: int) -> bytes | None:
        """The content of regular file ``name`` in directory ``parts``; None if either is absent.

        A link, a FIFO or anything else that is not a regular file is refused (a FIFO would
        block, a link could point anywhere); so is a file larger than ``limit`` bytes.
        """
        _require_plain([*parts, name])
        try:
            with self._walk(parts, create=False) as walk:
                fd = _open_file(walk.fds[-1], name, len(parts), _FILE_READ_FLAGS)
                try:
                    return _read_bounded(fd, name, limit)
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return None

    def write_file(self, parts: Sequence[str], name: str, data: bytes) -> None:
        """Atomically replace file ``name`` in directory ``parts`` (made ``PRIVATE_MODE`` if missing).

        Readers see the old content or the new, never a part. localpv's own directories are not
        counted as volume directories (``on_mkdir``).
        """
        _require_plain([*parts, name])
        temporary = name + TEMPORARY_SUFFIX
        with self._walk(parts, create=True, mode=PRIVATE_MODE, count=False) as walk:
            directory = walk.fds[-1]
            fd = _open_file(directory, temporary, len(parts), _FILE_WRITE_FLAGS)
            try:
                write_all(fd, data)
                reached("nfs-record:written")
                os.fsync(fd)
                reached("nfs-record:flushed")
            finally:
                os.close(fd)
            os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
            reached("nfs-record:renamed")
            _fsync_directory(directory)
            reached("nfs-record:dir-flushed")

    def remove_file(self, parts: Sequence[str], name: str) -> bool:
        """Remove file ``name`` (and a temporary left by an interrupted write); False if absent."""
        _require_plain([*parts, name])
        try:
            with self._walk(parts, create=False) as walk:
                _unlink_if_present(walk.fds[-1], name + TEMPORARY_SUFFIX)
                return _unlink_if_present(walk.fds[-1], name)
        except FileNotFoundError:
            return False

    def find_files(self, parts: Sequence[str], name: str) -> list[tuple[str, ...]]:
        """Directories strictly below ``parts`` holding an entry ``name``, relative to ``parts``.

        Only that subtree is walked (fd-relative, entering no link), so the cost is what lies
        below ``parts``, not the size of the export. None if ``parts`` is absent.
        """
        _require_plain([*parts, name])
        try:
            with self._walk(parts, create=False) as walk:
                return sorted(_find(walk.fds[-1], name, (), len(parts)))
        except FileNotFoundError:
            return []

    def remove_empty_directory(self, parts: Sequence[str]) -> bool:
        """``rmdir`` (never recursive); False if the directory is not empty or already gone."""
        _require_plain(parts)
        try:
            with self._walk(parts[:-1], create=False) as walk:
                os.rmdir(parts[-1], dir_fd=walk.fds[-1])
                return True
        except FileNotFoundError:
            return False
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _walk(self, parts: Sequence[str], *, create: bool, mode: int = INTERMEDIATE_MODE,
              count: bool = True) -> Iterator[_Walk]:
        """Descriptors of the root and of each component in turn (closed on exit)."""
        walk = _Walk([os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)])
        try:
            for index, name in enumerate(parts):
                if create:
                    walk.created_leaf = self._mkdir(walk.fds[-1], name, mode, count)
                walk.fds.append(_open_child(walk.fds[-1], name, index))
            yield walk
        finally:
            for fd in reversed(walk.fds):
                os.close(fd)

    def _mkdir(self, parent: int, name: str, mode: int, count: bool) -> bool:
        try:
            os.mkdir(name, mode, dir_fd=parent)
        except FileExistsError:
            return False
        if count and self._on_mkdir is not None:
            self._on_mkdir()
        return True

    @staticmethod
    def _is_directory(parent: int, name: str, index: int) -> bool:
        """False if absent; raises for a link or a non-directory (never removed or moved)."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeDirectory(index, name, _kind(st.st_mode))
        return True

    @staticmethod
    def _move_onto_placeholder(root: int, parent: int, name: str, target: str) -> bool:
        try:
            os.mkdir(target, 0o700, dir_fd=root)
        except FileExistsError:
            return False
        reached("nfs-archive:placeholder")
        try:
            os.rename(name, target, src_dir_fd=parent, dst_dir_fd=root)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                return False  # someone filled or replaced the placeholder meanwhile: leave it alone
            os.rmdir(target, dir_fd=root)
            raise
        reached("nfs-archive:renamed")
        return True


def _require_plain(parts: Sequence[str]) -> None:
    """Callers pass validated segments; this is the second line of defence."""
    if not parts:
        raise UnsafeDirectory(0, "", "is missing: the export root itself is never a volume")
    for index, name in enumerate(parts):
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise UnsafeDirectory(index, name, "is not a plain directory name")


def _open_child(parent: int, name: str, index: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        raise UnsafeDirectory(index, name, _kind(mode)) from err


def _find(directory: int, name: str, here: tuple[str, ...], depth: int) -> Iterator[tuple[str, ...]]:
    """Subdirectories of ``directory`` (recursively, not following links) holding ``name``."""
    with os.scandir(directory) as entries:
        children = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    for child in children:
        try:
            fd = _open_child(directory, child, depth)
        except FileNotFoundError:
            continue  # removed since the listing
        try:
            path = (*here, child)
            if _has_entry(fd, name):
                yield path
            yield from _find(fd, name, path, depth + 1)
        finally:
            os.close(fd)


def _has_entry(directory: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _open_file(directory: int, name: str, index: int, flags: int) -> int:
    """Open ``name`` below ``directory`` without following a link; refuse anything but a regular file."""
    try:
        fd = os.open(name, flags, _FILE_MODE, dir_fd=directory)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        raise UnsafeDirectory(index, name, "is a symbolic link" if err.errno == errno.ELOOP
                              else "is not a regular file") from err
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeDirectory(index, name, "is not a regular file")
    return fd


def _read_bounded(fd: int, name: str, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, limit + 1 - size):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", name)
    return b"".join(chunks)


def _fsync_directory(fd: int) -> None:
    """Make a rename durable; some filesystems (and NFS clients) refuse ``fsync`` on a directory."""
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise


def _unlink_if_present(directory: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=directory)
    except FileNotFoundError:
        return False
    return True


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    return "is not a directory"

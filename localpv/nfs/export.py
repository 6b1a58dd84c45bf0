"""Directory operations on the mounted export that cannot be steered outside it.

Every path is walked one component at a time from a file descriptor of the export root,
opening each component with ``O_NOFOLLOW | O_DIRECTORY`` and acting on the next one
relative to that descriptor (``mkdirat``, ``fchmod``, ``renameat``, fd-based ``rmtree``).
So a symbolic link a tenant planted anywhere on the way - as the leaf or as an
intermediate directory - is refused instead of followed, and a component swapped for a
link between two calls is caught by the next ``open``. Paths given here are already
validated segments (no ``..``, no ``.``, no empty parts; see :mod:`localpv.nfs.pathpattern`).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: Mode of intermediate directories before the umask, as ``MkdirAll(path, 0777)`` upstream.
INTERMEDIATE_MODE = 0o777


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

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _walk(self, parts: Sequence[str], *, create: bool) -> Iterator[_Walk]:
        """Descriptors of the root and of each component in turn (closed on exit)."""
        walk = _Walk([os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)])
        try:
            for index, name in enumerate(parts):
                if create:
                    walk.created_leaf = self._mkdir(walk.fds[-1], name)
                walk.fds.append(_open_child(walk.fds[-1], name, index))
            yield walk
        finally:
            for fd in reversed(walk.fds):
                os.close(fd)

    def _mkdir(self, parent: int, name: str) -> bool:
        try:
            os.mkdir(name, INTERMEDIATE_MODE, dir_fd=parent)
        except FileExistsError:
            return False
        if self._on_mkdir is not None:
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
        try:
            os.rename(name, target, src_dir_fd=parent, dst_dir_fd=root)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                return False  # someone filled or replaced the placeholder meanwhile: leave it alone
            os.rmdir(target, dir_fd=root)
            raise
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


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    return "is not a directory"

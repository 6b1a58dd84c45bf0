"""Files that must survive a crash whole: the agent's cleanup journal, the image journal.

A journal decides whether a volume may be offered or an image removed, so a write must be
all or nothing across a power cut: the new content goes to a temporary file beside the old
one, is flushed to the disk, renamed over it (atomic within a directory), and then the
directory itself is flushed so that the rename is on disk too.
"""

from __future__ import annotations

import os
from pathlib import Path

from localpv.crashpoints import reached


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (``os.write`` may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def replace_durably(path: Path, data: bytes, *, mode: int = 0o600, point: str = "file") -> None:
    """Make ``path`` hold ``data``, or (after a crash at any point) what it held before.

    ``point`` names the write's crash points (:mod:`localpv.crashpoints`): ``<point>:written``,
    ``:flushed``, ``:renamed``, ``:dir-flushed``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data)
        reached(f"{point}:written")
        os.fsync(fd)
        reached(f"{point}:flushed")
    finally:
        os.close(fd)
    os.replace(tmp, path)
    reached(f"{point}:renamed")
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    reached(f"{point}:dir-flushed")

"""A real directory as the export, with a neighbour outside it that must never change."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

Snapshot = dict[str, tuple[str, int, int, str]]


def snapshot(root: Path) -> Snapshot:
    """Every entry below ``root`` (not following links): type, mode, mtime_ns and link target."""
    found: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
            target = os.readlink(path) if kind == "link" else ""
            found[os.path.relpath(path, root)] = (kind, stat.S_IMODE(st.st_mode), st.st_mtime_ns, target)
    return found


@dataclass
class Layout:
    """``export`` is the mounted export; ``outside`` is a sibling full of data to protect."""

    base: Path
    export: Path
    outside: Path

    def outside_snapshot(self) -> Snapshot:
        return snapshot(self.outside)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    export = tmp_path / "export"
    outside = tmp_path / "outside"
    export.mkdir()
    (outside / "secrets").mkdir(parents=True)
    (outside / "secrets" / "key").write_text("do not touch")
    (outside / "victim").mkdir()
    (outside / "victim" / "data").write_text("precious")
    os.chmod(outside / "victim", 0o700)
    return Layout(tmp_path, export, outside)

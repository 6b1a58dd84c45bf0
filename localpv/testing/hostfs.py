"""Real mounts and loop devices for tests and the demo, always torn down.

Used by the test suite's fixtures (tests/conftest.py) and by ``localpv demo``; nothing
here is used by the product itself.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localpv.host.mounts import mount_points

MiB = 1024 * 1024


def sh(*argv: str | os.PathLike[str]) -> str:
    """Run a command, return its stdout; on failure raise with its stderr in the message."""
    proc = subprocess.run([os.fspath(a) for a in argv], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def mounts_under(base: str) -> set[str]:
    return {m for m in mount_points() if m.startswith(base + "/")}


def loops_backed_by(base: str) -> set[str]:
    """Loop devices whose backing file lies under ``base`` (read from sysfs, no tools)."""
    found = set()
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip().startswith(base + "/"):
                found.add("/dev/" + backing.parent.parent.name)
        except OSError:
            continue  # detached meanwhile
    return found


def umount(target: str) -> None:
    try:
        sh("umount", target)
    except RuntimeError:
        sh("umount", "--lazy", target)


class Mounter:
    """Makes real mounts and unmounts them all (newest first) at teardown."""

    def __init__(self) -> None:
        self._targets: list[Path] = []

    def tmpfs(self, target: Path, size: int = 8 * MiB) -> Path:
        return self._mount(target, "-t", "tmpfs", "-o", f"size={size}", "localpv-test")

    def bind(self, source: Path, target: Path) -> Path:
        return self._mount(target, "--bind", str(source))

    def device(self, device: str, target: Path) -> Path:
        return self._mount(target, device)

    def _mount(self, target: Path, *args: str) -> Path:
        if not target.exists():  # an existing file is a valid target for a file bind mount
            target.mkdir(parents=True)
        sh("mount", *args, target)
        self._targets.append(target)
        return target

    def umount(self, target: Path) -> None:
        self._targets.remove(target)
        umount(str(target))

    def umount_all(self) -> None:
        while self._targets:
            umount(str(self._targets.pop()))


@dataclass(frozen=True)
class LoopDevice:
    path: str  # /dev/loopN
    backing: Path
    size: int


class LoopDevices:
    """Attaches loop devices on sparse files and always detaches them at teardown."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._attached: list[LoopDevice] = []

    def attach(self, size: int = 8 * MiB, *, ext4: bool = False) -> LoopDevice:
        backing = self._dir / f"loop{len(self._attached)}.img"
        with open(backing, "wb") as f:
            f.truncate(size)
        dev = LoopDevice(sh("losetup", "--find", "--show", backing).strip(), backing, size)
        self._attached.append(dev)
        if ext4:
            sh("mkfs.ext4", "-q", "-F", dev.path)
        return dev

    def detach_all(self) -> None:
        while self._attached:
            sh("losetup", "-d", self._attached.pop().path)

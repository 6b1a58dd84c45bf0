"""Fixtures for tests against the real host: tmpfs and bind mounts, loop devices, and a
private mount namespace. Everything they set up is torn down even when a test fails, and
an autouse guard fails any test that leaves a mount or loop device behind."""

from __future__ import annotations

import ctypes
import os
import pickle
import subprocess
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localpv.host.mounts import mount_points

MiB = 1024 * 1024

_CLONE_NEWNS = 0x00020000


def sh(*argv: str | os.PathLike[str]) -> str:
    """Run a command, return its stdout; on failure raise with its stderr in the message."""
    proc = subprocess.run([os.fspath(a) for a in argv], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def _mounts_under(base: str) -> set[str]:
    return {m for m in mount_points() if m.startswith(base + "/")}


def _loops_backed_by(base: str) -> set[str]:
    """Loop devices whose backing file lies under ``base`` (read from sysfs, no tools)."""
    found = set()
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip().startswith(base + "/"):
                found.add("/dev/" + backing.parent.parent.name)
        except OSError:
            continue  # detached meanwhile
    return found


def _umount(target: str) -> None:
    try:
        sh("umount", target)
    except RuntimeError:
        sh("umount", "--lazy", target)


@pytest.fixture(autouse=True)
def _no_leaks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail a test that leaves a mount or loop device under the test temp dir behind (and clean it)."""
    if os.geteuid() != 0:
        yield
        return
    base = str(tmp_path_factory.getbasetemp())
    yield
    mounts, loops = _mounts_under(base), _loops_backed_by(base)
    for target in sorted(mounts, key=len, reverse=True):
        _umount(target)
    for dev in loops:
        sh("losetup", "-d", dev)
    if mounts or loops:
        pytest.fail(f"test leaked mounts {sorted(mounts)} / loop devices {sorted(loops)}")


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
        _umount(str(target))

    def umount_all(self) -> None:
        while self._targets:
            _umount(str(self._targets.pop()))


@pytest.fixture
def mounter() -> Iterator[Mounter]:
    m = Mounter()
    try:
        yield m
    finally:
        m.umount_all()


@pytest.fixture
def tmpfs(tmp_path: Path, mounter: Mounter) -> Path:
    """An 8 MiB tmpfs mounted on a fresh directory."""
    return mounter.tmpfs(tmp_path / "tmpfs")


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


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[LoopDevices]:
    devices = LoopDevices(tmp_path)
    try:
        yield devices
    finally:
        devices.detach_all()


@pytest.fixture
def loop_device(loops: LoopDevices) -> LoopDevice:
    """An 8 MiB loop device with no filesystem."""
    return loops.attach()


@pytest.fixture
def ext4_loop(loops: LoopDevices) -> LoopDevice:
    """An 8 MiB loop device formatted ext4."""
    return loops.attach(ext4=True)


class ForkedNamespace:
    """A forked child that runs ``fn`` in a mount namespace of its own.

    Tests that must not see other people's mounts (another test run on the same machine
    mounting things wakes a mount-table watcher) run there. ``propagation`` is applied to
    ``/`` recursively after unsharing: "private" isolates completely, "slave" still
    receives mounts made in the parent under shared mounts, like a pod's
    ``HostToContainer`` volume. Mounts made in the child vanish with it.
    """

    def __init__(self, fn: Callable[[], Any], propagation: str = "private") -> None:
        self._read, write = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:  # child: never return into pytest
            os.close(self._read)
            try:
                _unshare_mount_namespace(propagation)
                outcome: tuple[str, Any] = ("ok", fn())
            except BaseException:
                outcome = ("error", traceback.format_exc())
            with os.fdopen(write, "wb") as f:
                pickle.dump(outcome, f)
            os._exit(0)
        os.close(write)

    def result(self) -> Any:
        """Wait for the child; return what ``fn`` returned or fail with its traceback."""
        with os.fdopen(self._read, "rb") as f:
            data = f.read()
        os.waitpid(self._pid, 0)
        status, value = pickle.loads(data) if data else ("error", "child died without a result")
        if status != "ok":
            pytest.fail(f"in the child mount namespace:\n{value}")
        return value


def _unshare_mount_namespace(propagation: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    sh("mount", f"--make-r{propagation}", "/")


@pytest.fixture
def in_private_mount_namespace() -> Callable[[Callable[[], Any]], Any]:
    """Run a function in a forked child with a private mount namespace; return its result."""
    return lambda fn: ForkedNamespace(fn).result()

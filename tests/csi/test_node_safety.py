"""The node service under what makes a plugin freeze or lose a promise (issue 23.3, 23.5, 23.7):
a slow ``e2fsck``, a retried call, ``fstrim`` on a thick volume, a loop device number taken by
someone else the instant an unstage freed it, a read-only publish when the filesystem grows.

Slowness is real: the tools run through a directory put first on PATH whose ``e2fsck`` (or
``umount``) is a small script that waits on a FIFO until the test releases it, then runs the
real tool - no sleeps.
"""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from localpv.csi import loop, mounting
from localpv.csi.images import FsType, Provisioning
from localpv.csi.node import SLOW_CALLS, NodeService
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.volume import FS_UUID, NODE, POOL, PROVISIONING
from tests.conftest import NEEDS_XFS, wait_for
from tests.csi.conftest import Client, PoolEnv, capability
from tests.csi.test_node_service import code_of, publish, stage, unpublish, unstage
from tests.support.hostfs import MiB, sh

pytestmark = pytest.mark.root


class Gate:
    """A tool that waits at a gate: ``<dir>/<tool>`` on PATH waits until :meth:`open`.

    The gate is a lock the test holds; each call of the tool notes that it arrived, then takes
    the lock shared (``flock -s``), so it waits while the test holds it and passes once the
    test lets go - every call, whenever it arrives, with no race and no polling.
    """

    def __init__(self, directory: Path, tool: str, *, after: str = "") -> None:
        self.lock = directory / f"{tool}.lock"
        self._fd: int | None = os.open(self.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        real = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True,
                              check=True).stdout.strip()
        self.arrived_file = directory / f"{tool}.arrived"
        script = directory / tool
        script.write_text(f'#!/bin/sh\necho "$$" >> {self.arrived_file}\nflock -s {self.lock} true\n'
                          f'{real} "$@"\nrc=$?\n{after}\nexit $rc\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def arrived(self) -> int:
        try:
            return len(self.arrived_file.read_text().split())
        except FileNotFoundError:
            return 0

    def open(self) -> None:
        """Let every call through, now and later."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@pytest.fixture
def gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Gate]]:
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", f"{directory}:{os.environ['PATH']}")
    gates: list[Gate] = []

    def make(tool: str, after: str = "") -> Gate:
        gate = Gate(directory, tool, after=after)
        gates.append(gate)
        return gate
    yield make
    for gate in gates:  # nothing is left waiting
        gate.open()


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as err:
            errors.append(err)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def probe(client: Client) -> bool:
    answer = client.call("/csi.v1.Identity/Probe", csi.ProbeRequest(), csi.ProbeResponse)
    return bool(answer.ready.value)  # type: ignore[attr-defined]


def test_a_slow_stage_never_freezes_the_plugin(plugin: tuple[Client, NodeService], pool_env: PoolEnv,
                                               tmp_path: Path, gated: Callable[..., Gate]) -> None:
    """More volumes in a slow e2fsck than the server used to have threads: a retry of one is
    answered ABORTED at once, and Probe, NodeGetInfo and another volume's stats still answer."""
    client, _ = plugin
    steady = "pvc-steady"
    stage(client, steady, tmp_path / steady, pool_env.image(steady, 16 * MiB))
    gate = gated("e2fsck")
    names = [f"pvc-slow-{i}" for i in range(5)]
    contexts = {name: pool_env.image(name, 8 * MiB) for name in names}
    threads = [in_thread(lambda name=name: stage(client, name, tmp_path / name, contexts[name]))  # type: ignore[misc]
               for name in names]
    try:
        wait_for(lambda: gate.arrived() == len(names), what="every stage to be in its e2fsck")
        # A retry of a stage in progress: ABORTED at once, not a thread held until the first ends.
        code, details = code_of(lambda: stage(client, names[0], tmp_path / names[0], contexts[names[0]]))
        assert code == grpc.StatusCode.ABORTED and "in progress" in details
        assert probe(client)
        assert client.node("NodeGetInfo", csi.NodeGetInfoRequest()).node_id  # type: ignore[attr-defined]
        stats = client.node("NodeGetVolumeStats", csi.NodeGetVolumeStatsRequest(volume_id=steady,
                                                                                volume_path=str(tmp_path / steady)))
        assert stats.volume_condition.abnormal is False  # type: ignore[attr-defined]
    finally:
        gate.open()
        for thread, _ in threads:
            thread.join(60)
        for name in [*names, steady]:
            unstage(client, name, tmp_path / name)
    assert [errors for _, errors in threads] == [[]] * len(names)


def test_slow_calls_beyond_the_bound_are_refused_at_once(plugin: tuple[Client, NodeService], pool_env: PoolEnv,
                                                         tmp_path: Path, gated: Callable[..., Gate]) -> None:
    client, _ = plugin
    gate = gated("e2fsck")
    names = [f"pvc-many-{i}" for i in range(SLOW_CALLS)]
    contexts = {name: pool_env.image(name, 4 * MiB) for name in [*names, "pvc-one-more"]}
    threads = [in_thread(lambda name=name: stage(client, name, tmp_path / name, contexts[name]))  # type: ignore[misc]
               for name in names]
    try:
        wait_for(lambda: gate.arrived() == len(names), what=f"{SLOW_CALLS} stages in their e2fsck")
        code, details = code_of(lambda: stage(client, "pvc-one-more", tmp_path / "one-more", contexts["pvc-one-more"]))
        assert code == grpc.StatusCode.ABORTED and f"{SLOW_CALLS} volumes" in details
        assert probe(client)
    finally:
        gate.open()
        for thread, _ in threads:
            thread.join(60)
        for name in names:
            unstage(client, name, tmp_path / name)
    assert [errors for _, errors in threads] == [[]] * len(names)


def thick_context(env: PoolEnv, name: str, size: int = 32 * MiB) -> dict[str, str]:
    fs_uuid = env.pool.images.create(name, size, fs=FsType.EXT4, provisioning=Provisioning.THICK)
    return {POOL: env.pool.name, FS_UUID: fs_uuid, NODE: "node-1", PROVISIONING: "thick"}


def allocated(env: PoolEnv, name: str) -> int:
    return os.stat(env.pool.images.image_path(name)).st_blocks * 512


def test_a_thick_volume_gets_back_what_a_discard_gave_away_and_refuses_the_discard_option(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    client, _ = plugin
    volume = "pvc-thick"
    context = thick_context(pool_env, volume)
    size = os.stat(pool_env.pool.images.image_path(volume)).st_size
    assert allocated(pool_env, volume) >= size
    staging = tmp_path / "staging"
    code, details = code_of(lambda: client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=volume, staging_target_path=str(staging), volume_context=context,
        volume_capability=capability(flags=("discard",)))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "discard" in details
    assert mounting.mount_at(str(staging)) is None
    code, details = code_of(lambda: client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=volume, staging_target_path=str(staging), volume_context=context,
        volume_capability=capability(flags=("noatime,discard",)))))  # one mountOptions entry, two options
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "discard" in details
    stage(client, volume, staging, context)
    (staging / "big").write_bytes(b"\x01" * (8 * MiB))
    os.sync()
    (staging / "big").unlink()
    sh("fstrim", staging)  # the tenant trims: the loop device punches holes into the image
    os.sync()
    trimmed = allocated(pool_env, volume)
    unstage(client, volume, staging)
    wait_for(lambda: not pool_env.pool.images.in_use(volume), what="the loop device to go")
    assert trimmed < size, "fstrim reached the image (else this test shows nothing)"
    stage(client, volume, staging, context)  # the pod comes back: the image is whole again
    try:
        assert allocated(pool_env, volume) >= size
    finally:
        unstage(client, volume, staging)


def test_an_unstage_never_detaches_a_loop_device_someone_took_after_the_unmount(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path, gated: Callable[..., Gate]) -> None:
    """The instant ``umount`` returns, the autoclear device is free and its number may be taken
    by another image; an unstage that then detached "its" device by number would detach that
    one. Here the one who takes it is the umount tool itself, right after unmounting."""
    client, _ = plugin
    volume = "pvc-unstaged"
    context = pool_env.image(volume)
    staging = tmp_path / "staging"
    stage(client, volume, staging, context)
    [device] = pool_env.pool.images.in_use(volume)
    other = tmp_path / "other.img"
    other.write_bytes(b"\0" * MiB)
    taken = tmp_path / "taken"
    gate = gated("umount", after=f"losetup {device.path} {other} 2>/dev/null && echo yes > {taken}")
    gate.open()  # the umount need not wait; it only acts after unmounting
    unstage(client, volume, staging)
    assert gate.arrived() == 1
    try:
        if taken.exists():  # another file got the device's number: it must still be bound to it
            assert loop.loops_of(other, named="/other.img") == [device]
    finally:
        for lp in loop.loops_of(other, named="/other.img"):
            loop.detach(lp)


@NEEDS_XFS
def test_an_xfs_volume_grows_through_its_staging_mount_when_the_pod_has_it_read_only(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    client, node = plugin
    grown: list[tuple[str, int]] = []
    node.on_expanded = lambda volume, size: grown.append((volume, size))
    volume = "pvc-xfs"
    context = pool_env.image(volume, 300 * MiB, fs=FsType.XFS)
    staging, target = tmp_path / "staging", tmp_path / "target"
    stage(client, volume, staging, context, "xfs")
    publish(client, volume, staging, target, readonly=True)
    before = os.statvfs(target)
    try:
        pool_env.pool.images.grow(volume, 400 * MiB, provisioning=Provisioning.THIN)
        answer = client.node("NodeExpandVolume", csi.NodeExpandVolumeRequest(
            volume_id=volume, volume_path=str(target), staging_target_path=str(staging),
            capacity_range=csi.CapacityRange(required_bytes=400 * MiB)))
        assert answer.capacity_bytes == 400 * MiB  # type: ignore[attr-defined]
        after = os.statvfs(target)
        assert (after.f_blocks - before.f_blocks) * after.f_frsize > 0.8 * (100 * MiB)
        assert grown == [(volume, 400 * MiB)]
    finally:
        unpublish(client, volume, target)
        unstage(client, volume, staging)


def test_a_staging_path_that_holds_another_volume_is_never_published_grown_or_unstaged_as_this_one(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    """Volume A staged at S; a publish (or expansion) of volume B naming S - a confused caller -
    must not bind A's data into B's pod."""
    client, _ = plugin
    context = pool_env.image("pvc-a")
    pool_env.image("pvc-b")
    staging, target = tmp_path / "staging", tmp_path / "target"
    stage(client, "pvc-a", staging, context)
    try:
        code, details = code_of(lambda: publish(client, "pvc-b", staging, target))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "another filesystem" in details
        assert mounting.mount_at(str(target)) is None
        code, details = code_of(lambda: client.node("NodeExpandVolume", csi.NodeExpandVolumeRequest(
            volume_id="pvc-b", volume_path=str(staging), capacity_range=csi.CapacityRange(required_bytes=MiB))))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "another filesystem" in details
        code, details = code_of(lambda: unstage(client, "pvc-b", staging))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "another volume's filesystem" in details
        assert mounting.mount_at(str(staging)) is not None, "volume a stays staged for its pods"
    finally:
        unstage(client, "pvc-a", staging)

"""The Node service over a real socket with a real client: real images, loop devices, mkfs,
mounts. Each call is what the kubelet sends; each answer is checked against the kernel."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from localpv.csi import loop, mounting
from localpv.csi.images import FsType, Provisioning
from localpv.csi.node import NodeService
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.volume import FS_UUID, TOPOLOGY_KEY
from tests.conftest import NEEDS_XFS, wait_for
from tests.csi.conftest import NODE_NAME, Client, PoolEnv, capability
from tests.support.hostfs import MiB, umount

pytestmark = pytest.mark.root
VOLUME = "pvc-0b1c2d3e-0000-4000-8000-000000000001"


def stage(client: Client, volume: str, staging: Path, context: dict[str, str], fs: str = "ext4") -> None:
    client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=volume, staging_target_path=str(staging), volume_capability=capability(fs), volume_context=context))


def publish(client: Client, volume: str, staging: Path, target: Path, *, readonly: bool = False) -> None:
    client.node("NodePublishVolume", csi.NodePublishVolumeRequest(
        volume_id=volume, staging_target_path=str(staging), target_path=str(target), readonly=readonly,
        volume_capability=capability()))


def unpublish(client: Client, volume: str, target: Path) -> None:
    client.node("NodeUnpublishVolume", csi.NodeUnpublishVolumeRequest(volume_id=volume, target_path=str(target)))


def unstage(client: Client, volume: str, staging: Path) -> None:
    client.node("NodeUnstageVolume", csi.NodeUnstageVolumeRequest(volume_id=volume,
                                                                  staging_target_path=str(staging)))


def code_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def fill(path: Path, size: int) -> int:
    """Write ``size`` bytes of data; returns how many were written before ENOSPC."""
    chunk = b"\xa5" * MiB
    written = 0
    with open(path, "wb") as f:
        try:
            while written < size:
                written += f.write(chunk[: min(len(chunk), size - written)])
                f.flush()
            os.fsync(f.fileno())
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
            return written
    return written


@pytest.mark.parametrize("fs", [FsType.EXT4, pytest.param(FsType.XFS, marks=NEEDS_XFS)])
def test_stage_publish_write_stats_and_tear_down(plugin: tuple[Client, NodeService], pool_env: PoolEnv,
                                                 tmp_path: Path, fs: FsType) -> None:
    client, _ = plugin
    size = 32 * MiB if fs is FsType.EXT4 else 320 * MiB
    context = pool_env.image(VOLUME, size, fs=fs)
    staging, target = tmp_path / "staging", tmp_path / "pods" / "uid" / "mount"
    stage(client, VOLUME, staging, context, fs.value)
    stage(client, VOLUME, staging, context, fs.value)  # the kubelet retries: idempotent
    [device] = pool_env.pool.images.in_use(VOLUME)
    publish(client, VOLUME, staging, target)
    publish(client, VOLUME, staging, target)
    assert mounting.mount_at(str(target)).major_minor == f"7:{device.number}"  # type: ignore[union-attr]
    (target / "hello").write_text("tenant data")
    assert (staging / "hello").read_text() == "tenant data"

    # The size asked for is enforced: writing past it fails with ENOSPC.
    written = fill(target / "big", 2 * size)
    assert written < size

    stats = client.node("NodeGetVolumeStats", csi.NodeGetVolumeStatsRequest(volume_id=VOLUME,
                                                                            volume_path=str(target)))
    by_unit = {u.unit: u for u in stats.usage}  # type: ignore[attr-defined]
    st = os.statvfs(target)
    assert by_unit[csi.VolumeUsage.BYTES].total == st.f_blocks * st.f_frsize <= size
    assert by_unit[csi.VolumeUsage.BYTES].used >= written
    assert by_unit[csi.VolumeUsage.INODES].total == st.f_files
    assert stats.volume_condition.abnormal is False  # type: ignore[attr-defined]

    unpublish(client, VOLUME, target)
    unpublish(client, VOLUME, target)
    assert not target.exists()
    unstage(client, VOLUME, staging)
    unstage(client, VOLUME, staging)
    assert mounting.mount_at(str(staging)) is None
    wait_for(lambda: not pool_env.pool.images.in_use(VOLUME), what="the loop device to go")
    # The data is in the image: staged again (a reboot), it is all there.
    stage(client, VOLUME, staging, context, fs.value)
    assert (staging / "hello").read_text() == "tenant data"
    unstage(client, VOLUME, staging)
    wait_for(lambda: not pool_env.pool.images.in_use(VOLUME), what="the loop device to go")


def test_readonly_publish_is_read_only(plugin: tuple[Client, NodeService], pool_env: PoolEnv,
                                       tmp_path: Path) -> None:
    client, _ = plugin
    context = pool_env.image(VOLUME)
    staging, target = tmp_path / "staging", tmp_path / "ro"
    stage(client, VOLUME, staging, context)
    try:
        publish(client, VOLUME, staging, target, readonly=True)
        with pytest.raises(OSError) as err:
            (target / "x").write_text("no")
        assert err.value.errno == errno.EROFS
        (staging / "y").write_text("the staging mount stays writable")
    finally:
        unpublish(client, VOLUME, target)
        unstage(client, VOLUME, staging)


def _has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)
    return False


@pytest.mark.parametrize("fs", [FsType.EXT4, pytest.param(FsType.XFS, marks=NEEDS_XFS)])
def test_expansion(plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path, fs: FsType) -> None:
    """Online when the kernel allows it (XFS always; ext4 with CAP_SYS_RESOURCE), else at the next stage."""
    client, node = plugin
    expanded: list[tuple[str, int]] = []
    node.on_expanded = lambda volume, size: expanded.append((volume, size))
    small, large = (32 * MiB, 64 * MiB) if fs is FsType.EXT4 else (300 * MiB, 400 * MiB)
    context = pool_env.image(VOLUME, small, fs=fs)
    staging, target = tmp_path / "staging", tmp_path / "target"
    request = csi.NodeExpandVolumeRequest(volume_id=VOLUME, volume_path=str(target),
                                          capacity_range=csi.CapacityRange(required_bytes=large))
    stage(client, VOLUME, staging, context, fs.value)
    publish(client, VOLUME, staging, target)
    try:
        before = os.statvfs(target).f_blocks * os.statvfs(target).f_frsize
        # The node service grows nothing the controller has not grown: asked too early, it says so.
        code, details = code_of(lambda: client.node("NodeExpandVolume", request))
        assert code == grpc.StatusCode.OUT_OF_RANGE and "grown by the agent's controller first" in details
        pool_env.pool.images.grow(VOLUME, large, provisioning=Provisioning.THIN)
        if fs is FsType.EXT4 and not _has_cap_sys_resource():
            code, details = code_of(lambda: client.node("NodeExpandVolume", request))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "needs CAP_SYS_RESOURCE" in details
            unpublish(client, VOLUME, target)
            unstage(client, VOLUME, staging)
            stage(client, VOLUME, staging, context, fs.value)  # the pod restarted: grown offline
            publish(client, VOLUME, staging, target)
        answer = client.node("NodeExpandVolume", request)
        assert answer.capacity_bytes == large  # type: ignore[attr-defined]
        after = os.statvfs(target).f_blocks * os.statvfs(target).f_frsize
        assert after - before > 0.8 * (large - small)
        assert expanded == [(VOLUME, large)]
        assert fill(target / "big", small) == small  # more than the old free space fits now
        assert client.node("NodeExpandVolume", request).capacity_bytes == large  # type: ignore[attr-defined]
    finally:
        unpublish(client, VOLUME, target)
        unstage(client, VOLUME, staging)


def test_a_missing_pool_fails_the_stage_and_creates_nothing(plugin: tuple[Client, NodeService],
                                                            pool_env: PoolEnv, tmp_path: Path) -> None:
    """After a reboot whose pool disk did not come back, the pool's directory is a bare
    directory of the root filesystem: the stage must fail, and write nothing there."""
    client, _ = plugin
    context = pool_env.image(VOLUME)
    umount(str(pool_env.root))  # the disk is gone (the fixture's unmount at teardown tolerates it)
    try:
        staging = tmp_path / "staging"
        code, details = code_of(lambda: stage(client, VOLUME, staging, context))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "pool fast: nothing is mounted at" in details and "its disk is missing" in details
        assert os.listdir(pool_env.root) == []
        assert mounting.mount_at(str(staging)) is None
    finally:
        mounting.mount(f"/dev/loop{_pool_loop(pool_env)}", str(pool_env.root), "ext4", [])


def _pool_loop(env: PoolEnv) -> int:
    import subprocess

    out = subprocess.run(["losetup", "-j", str(env.root.parent / "loop0.img")], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split(":", 1)[0].removeprefix("/dev/loop"))


def test_a_replaced_image_is_refused(plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    client, _ = plugin
    context = pool_env.image(VOLUME)
    pool_env.pool.images.create(VOLUME, 32 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)  # a new filesystem
    code, details = code_of(lambda: stage(client, VOLUME, tmp_path / "staging", context))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"the PV was made with {context[FS_UUID]}" in details
    assert not pool_env.pool.images.in_use(VOLUME)


def test_no_image_is_not_found_and_bad_names_are_invalid(plugin: tuple[Client, NodeService], pool_env: PoolEnv,
                                                         tmp_path: Path) -> None:
    client, _ = plugin
    context = pool_env.image("pvc-other")
    code, details = code_of(lambda: stage(client, VOLUME, tmp_path / "staging", context))
    assert code == grpc.StatusCode.NOT_FOUND and "nothing is created in its place" in details
    assert not (pool_env.root / VOLUME).exists()
    for bad in ("../pvc-other", "pvc-other/../../x", "..", "/etc"):
        code, _ = code_of(lambda bad=bad: stage(client, bad, tmp_path / "staging", context))  # type: ignore[misc]
        assert code == grpc.StatusCode.INVALID_ARGUMENT, bad


def test_the_image_path_cannot_escape_the_pool_through_a_symlink(plugin: tuple[Client, NodeService],
                                                                 pool_env: PoolEnv, tmp_path: Path) -> None:
    client, _ = plugin
    outside = tmp_path / "outside"
    outside.mkdir()
    context = pool_env.image("pvc-real")
    shutil.move(pool_env.root / "pvc-real", outside / "pvc-real")  # another filesystem: copied
    os.symlink(outside / "pvc-real", pool_env.root / VOLUME)
    code, details = code_of(lambda: stage(client, VOLUME, tmp_path / "staging", context))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a plain directory" in details
    assert not loop.loops_of(outside / "pvc-real" / "disk.img", named="/pvc-real/disk.img")


def test_stats_report_an_image_deleted_under_its_mount(plugin: tuple[Client, NodeService], pool_env: PoolEnv,
                                                       tmp_path: Path) -> None:
    client, _ = plugin
    context = pool_env.image(VOLUME)
    staging = tmp_path / "staging"
    stage(client, VOLUME, staging, context)
    try:
        os.unlink(pool_env.pool.images.image_path(VOLUME))
        stats = client.node("NodeGetVolumeStats", csi.NodeGetVolumeStatsRequest(volume_id=VOLUME,
                                                                                volume_path=str(staging)))
        assert stats.volume_condition.abnormal is True  # type: ignore[attr-defined]
        assert "was deleted while mounted" in stats.volume_condition.message  # type: ignore[attr-defined]
    finally:
        unstage(client, VOLUME, staging)
    code, _ = code_of(lambda: client.node("NodeGetVolumeStats", csi.NodeGetVolumeStatsRequest(
        volume_id=VOLUME, volume_path=str(staging))))
    assert code == grpc.StatusCode.NOT_FOUND


def test_a_filesystem_volume_as_a_raw_device_no_access_type_and_multi_node_access_are_refused(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    client, _ = plugin
    context = pool_env.image(VOLUME)
    block = csi.VolumeCapability(block=csi.VolumeCapability.BlockVolume(),
                                 access_mode=csi.VolumeCapability.AccessMode(mode=1))
    code, details = code_of(lambda: client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=VOLUME, staging_target_path=str(tmp_path / "s"), volume_capability=block, volume_context=context)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a Block image" in details, details
    assert not pool_env.pool.images.in_use(VOLUME)
    neither = csi.VolumeCapability(access_mode=csi.VolumeCapability.AccessMode(mode=1))
    code, details = code_of(lambda: client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=VOLUME, staging_target_path=str(tmp_path / "s"), volume_capability=neither, volume_context=context)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "access type" in details
    rwx = capability(mode=csi.VolumeCapability.AccessMode.MULTI_NODE_MULTI_WRITER)
    code, details = code_of(lambda: client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=VOLUME, staging_target_path=str(tmp_path / "s"), volume_capability=rwx, volume_context=context)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "MULTI_NODE_MULTI_WRITER" in details


def test_node_info_and_capabilities(plugin: tuple[Client, NodeService]) -> None:
    client, _ = plugin
    info = client.node("NodeGetInfo", csi.NodeGetInfoRequest())
    assert info.node_id == NODE_NAME  # type: ignore[attr-defined]
    assert dict(info.accessible_topology.segments) == {TOPOLOGY_KEY: NODE_NAME}  # type: ignore[attr-defined]
    caps = client.node("NodeGetCapabilities", csi.NodeGetCapabilitiesRequest())
    types = {c.rpc.type for c in caps.capabilities}  # type: ignore[attr-defined]
    rpc = csi.NodeServiceCapability.RPC
    assert types == {rpc.STAGE_UNSTAGE_VOLUME, rpc.GET_VOLUME_STATS, rpc.EXPAND_VOLUME, rpc.VOLUME_CONDITION}

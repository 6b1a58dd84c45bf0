"""Raw block dynamic volumes (``volumeMode: Block``) through the Node service: real Block
images, real loop devices, real bind mounts of device nodes, a real gRPC client. Each call is
what the kubelet sends for a ``volumeDevices`` pod; each answer is checked against the kernel."""

from __future__ import annotations

import fcntl
import os
import stat
import struct
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from localpv.csi import loop, mounting
from localpv.csi.images import BLOCK_XATTR, Provisioning
from localpv.csi.journal import BLOCK, FILESYSTEM
from localpv.csi.node import NodeService
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.volume import IMAGE_UUID, NODE, POOL, PROVISIONING
from tests.conftest import wait_for
from tests.csi.conftest import NODE_NAME, Client, PoolEnv, capability
from tests.csi.test_node_restart import REPO, kubelet_dir  # noqa: F401 - a fixture
from tests.csi.test_node_safety import Gate, gated, in_thread  # noqa: F401 - a fixture
from tests.csi.test_node_service import code_of
from tests.support.hostfs import MiB, sh

pytestmark = pytest.mark.root
VOLUME = "pvc-0b1c2d3e-0000-4000-8000-0000000000b1"
BLKGETSIZE64 = 0x80081272


def block_image(env: PoolEnv, name: str, size: int = 16 * MiB, *,
                provisioning: Provisioning = Provisioning.THIN) -> dict[str, str]:
    """Make a Block image as the controller would; returns its PV's volumeAttributes."""
    image_uuid = env.pool.images.create_block(name, size, provisioning=provisioning)
    return {POOL: env.pool.name, IMAGE_UUID: image_uuid, NODE: NODE_NAME, PROVISIONING: provisioning.value}


def block_capability(mode: int = csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER) -> csi.VolumeCapability:
    return csi.VolumeCapability(block=csi.VolumeCapability.BlockVolume(),
                                access_mode=csi.VolumeCapability.AccessMode(mode=mode))


def stage(client: Client, volume: str, staging: Path, context: dict[str, str]) -> None:
    client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=volume, staging_target_path=str(staging), volume_capability=block_capability(),
        volume_context=context))


def publish(client: Client, volume: str, staging: Path, target: Path, *, readonly: bool = False) -> None:
    client.node("NodePublishVolume", csi.NodePublishVolumeRequest(
        volume_id=volume, staging_target_path=str(staging), target_path=str(target), readonly=readonly,
        volume_capability=block_capability()))


def unpublish(client: Client, volume: str, target: Path) -> None:
    client.node("NodeUnpublishVolume", csi.NodeUnpublishVolumeRequest(volume_id=volume, target_path=str(target)))


def unstage(client: Client, volume: str, staging: Path) -> None:
    client.node("NodeUnstageVolume", csi.NodeUnstageVolumeRequest(volume_id=volume,
                                                                  staging_target_path=str(staging)))


def device_size(path: Path) -> int:
    """What a reader of the device file sees as its size (BLKGETSIZE64, as a pod's tools ask)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, BLKGETSIZE64, buf, True)
        return int(struct.unpack("=Q", buf)[0])
    finally:
        os.close(fd)


def write_at(path: Path, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        assert os.pwrite(fd, data, offset) == len(data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_at(path: Path, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def loops_of(env: PoolEnv, name: str) -> list[int]:
    return [d.number for d in env.pool.images.in_use(name)]


@pytest.fixture
def teardown(plugin: tuple[Client, NodeService]) -> Iterator[Callable[[str, Path, Path | None], None]]:
    """Unpublish and unstage whatever a test leaves staged, even when it fails."""
    client, _ = plugin
    left: list[tuple[str, Path, Path | None]] = []
    yield lambda volume, staging, target: left.append((volume, staging, target))
    for volume, staging, target in reversed(left):
        if target is not None:
            unpublish(client, volume, target)
        unstage(client, volume, staging)


def test_stage_publish_write_read_and_tear_down(plugin: tuple[Client, NodeService], pool_env: PoolEnv,
                                                tmp_path: Path) -> None:
    client, _ = plugin
    context = block_image(pool_env, VOLUME, 16 * MiB)
    staging = tmp_path / "staging" / VOLUME
    staging.mkdir(parents=True)  # the kubelet makes the staging directory
    target = tmp_path / "publish" / VOLUME / "pod-uid"  # a file path, made by the plugin
    stage(client, VOLUME, staging, context)
    stage(client, VOLUME, staging, context)  # the kubelet repeats it: idempotent
    [number] = loops_of(pool_env, VOLUME)
    staged_file = staging / VOLUME
    assert mounting.device_at(str(staged_file)) == (loop.LOOP_MAJOR, number)
    assert mounting.mount_at(str(staging)) is None, "nothing is mounted: no filesystem"
    assert not mounting.mounts_of_device(loop.LOOP_MAJOR, number)
    publish(client, VOLUME, staging, target)
    publish(client, VOLUME, staging, target)  # idempotent
    assert stat.S_ISBLK(os.lstat(target).st_mode) and mounting.device_at(str(target)) == (loop.LOOP_MAJOR, number)
    assert device_size(target) == 16 * MiB, "the device is exactly the size"
    write_at(target, 5 * MiB, b"raw tenant data")
    assert read_at(staged_file, 5 * MiB, 15) == b"raw tenant data"
    stats = client.node("NodeGetVolumeStats", csi.NodeGetVolumeStatsRequest(volume_id=VOLUME,
                                                                            volume_path=str(target)))
    assert [(u.unit, u.total, u.used, u.available) for u in stats.usage] == [  # type: ignore[attr-defined]
        (csi.VolumeUsage.BYTES, 16 * MiB, 0, 0)], "bytes total only: no filesystem, no inodes"
    assert stats.volume_condition.abnormal is False, stats.volume_condition.message  # type: ignore[attr-defined]
    # The image is never removed while its device is bound.
    assert pool_env.pool.images.in_use(VOLUME)
    unpublish(client, VOLUME, target)
    unpublish(client, VOLUME, target)  # nothing left to undo: still a success
    assert not target.exists(), "the target file the plugin made is removed"
    unstage(client, VOLUME, staging)
    unstage(client, VOLUME, staging)  # idempotent
    assert not staged_file.exists() and staging.is_dir()
    assert not loops_of(pool_env, VOLUME), "the loop device is detached"
    assert pool_env.pool.images.remove(VOLUME)


def test_data_survives_unpublish_unstage_stage_publish(plugin: tuple[Client, NodeService], pool_env: PoolEnv,
                                                       tmp_path: Path) -> None:
    client, _ = plugin
    context = block_image(pool_env, VOLUME, 8 * MiB, provisioning=Provisioning.THICK)
    image = pool_env.pool.images.image_path(VOLUME)
    assert os.stat(image).st_blocks * 512 >= 8 * MiB, "thick: allocated at once"
    staging, target = tmp_path / "staging", tmp_path / "pods" / "target"
    pattern = bytes(range(256)) * 4096  # 1 MiB
    stage(client, VOLUME, staging, context)
    publish(client, VOLUME, staging, target)
    write_at(target, 0, pattern)
    write_at(target, 7 * MiB, pattern)
    unpublish(client, VOLUME, target)
    unstage(client, VOLUME, staging)
    assert not loops_of(pool_env, VOLUME)
    stage(client, VOLUME, staging, context)
    publish(client, VOLUME, staging, target, readonly=True)
    try:
        assert read_at(target, 0, MiB) == pattern and read_at(target, 7 * MiB, MiB) == pattern
        info = mounting.mount_at(str(target))
        assert info is not None and "ro" in info.mount_options.split(",")
    finally:
        unpublish(client, VOLUME, target)
        unstage(client, VOLUME, staging)


def test_a_write_beyond_the_size_fails(plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path,
                                       teardown: Callable[[str, Path, Path | None], None]) -> None:
    client, _ = plugin
    context = block_image(pool_env, VOLUME, 4 * MiB)
    staging, target = tmp_path / "staging", tmp_path / "target"
    stage(client, VOLUME, staging, context)
    publish(client, VOLUME, staging, target)
    teardown(VOLUME, staging, target)
    write_at(target, 4 * MiB - 4096, b"\x01" * 4096)  # the last block is the tenant's
    fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)
    try:
        with pytest.raises(OSError) as err:
            os.pwrite(fd, b"\x02" * 4096, 4 * MiB)
        assert err.value.errno in (28, 27), err.value  # ENOSPC (or EFBIG)
    finally:
        os.close(fd)
    assert os.stat(pool_env.pool.images.image_path(VOLUME)).st_size == 4 * MiB, "the image did not grow"


def test_the_mode_an_image_was_made_for_is_the_mode_it_is_served_in(
        pool_env: PoolEnv, serve: Callable[..., Client], tmp_path: Path) -> None:
    records = {VOLUME: BLOCK, "pvc-fs": FILESYSTEM}
    node = NodeService(NODE_NAME, lambda: {pool_env.pool.name: pool_env.pool}, recorded_mode=records.get)
    client = serve(node.handler())
    context = block_image(pool_env, VOLUME)
    fs_context = pool_env.image("pvc-fs", 8 * MiB)
    staging = tmp_path / "staging"
    # A Block volume asked for as a filesystem (its PV changed or re-created): refused, nothing mounted.
    code, details = code_of(lambda: client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=VOLUME, staging_target_path=str(staging), volume_capability=capability(), volume_context=context)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "volumeMode Block" in details, details
    # ... also where no journal record says so: the image's mark does.
    records.clear()
    code, details = code_of(lambda: client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=VOLUME, staging_target_path=str(staging), volume_capability=capability(), volume_context=context)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "made for volumeMode Block" in details, details
    # ... also while it is staged as Block (its device bound, no filesystem mounted anywhere).
    stage(client, VOLUME, staging, context)
    code, details = code_of(lambda: client.node("NodeStageVolume", csi.NodeStageVolumeRequest(
        volume_id=VOLUME, staging_target_path=str(tmp_path / "fs"), volume_capability=capability(),
        volume_context=context)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "made for volumeMode Block" in details, details
    assert mounting.mount_at(str(tmp_path / "fs")) is None
    unstage(client, VOLUME, staging)
    # A filesystem image asked for as a raw device: refused.
    code, details = code_of(lambda: stage(client, "pvc-fs", staging, fs_context))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a Block image" in details, details
    records["pvc-fs"] = FILESYSTEM
    code, details = code_of(lambda: stage(client, "pvc-fs", staging, fs_context))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "volumeMode Filesystem" in details, details
    # Another image's identity, or none recorded in the PV: refused.
    code, details = code_of(lambda: stage(client, VOLUME, staging, {**context, IMAGE_UUID: str(uuid.uuid4())}))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "another volume's data" in details, details
    code, details = code_of(lambda: stage(client, VOLUME, staging, {k: v for k, v in context.items()
                                                                    if k != IMAGE_UUID}))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "no imageUUID" in details, details
    # A mark removed from the file (a copy without its attributes): not a Block image any more.
    os.removexattr(pool_env.pool.images.image_path(VOLUME), BLOCK_XATTR)
    code, details = code_of(lambda: stage(client, VOLUME, staging, context))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a Block image" in details, details
    assert not loops_of(pool_env, VOLUME) and not loops_of(pool_env, "pvc-fs")
    assert not mounting.mount_at(str(staging)) and not (staging / VOLUME).exists()


def test_an_image_is_staged_once_and_a_target_holding_another_device_is_refused(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path,
        teardown: Callable[[str, Path, Path | None], None]) -> None:
    client, _ = plugin
    context = block_image(pool_env, VOLUME)
    other_context = block_image(pool_env, "pvc-other")
    staging, other_staging = tmp_path / "staging", tmp_path / "other-staging"
    stage(client, VOLUME, staging, context)
    teardown(VOLUME, staging, None)
    code, details = code_of(lambda: stage(client, VOLUME, tmp_path / "second", context))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and str(staging / VOLUME) in details, details
    assert len(loops_of(pool_env, VOLUME)) == 1, "an image is never bound twice"
    stage(client, "pvc-other", other_staging, other_context)
    teardown("pvc-other", other_staging, None)
    target = tmp_path / "target"
    publish(client, "pvc-other", other_staging, target)
    teardown("pvc-other", other_staging, target)
    code, details = code_of(lambda: publish(client, VOLUME, staging, target))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "another device" in details, details
    assert mounting.device_at(str(target)) == loop.Loop(loops_of(pool_env, "pvc-other")[0]).rdev
    # A publish from a staging path where this volume is not staged: refused.
    code, details = code_of(lambda: publish(client, VOLUME, other_staging, tmp_path / "t2"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not staged" in details, details


def test_unstage_waits_for_the_last_publish_and_detaches_only_this_device(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path,
        teardown: Callable[[str, Path, Path | None], None]) -> None:
    client, _ = plugin
    context, other = block_image(pool_env, VOLUME), block_image(pool_env, "pvc-other")
    staging, target = tmp_path / "staging", tmp_path / "target"
    stage(client, "pvc-other", tmp_path / "other", other)
    teardown("pvc-other", tmp_path / "other", None)
    stage(client, VOLUME, staging, context)
    publish(client, VOLUME, staging, target)
    code, details = code_of(lambda: unstage(client, VOLUME, staging))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "still published" in details, details
    assert loops_of(pool_env, VOLUME) and mounting.mount_at(str(staging / VOLUME)) is not None
    unpublish(client, VOLUME, target)
    unstage(client, VOLUME, staging)
    assert not loops_of(pool_env, VOLUME)
    assert len(loops_of(pool_env, "pvc-other")) == 1, "another volume's device is untouched"


def test_a_device_left_by_an_interrupted_stage_is_taken_not_doubled_and_let_go_by_unstage(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    """An agent killed between its attach (no autoclear) and its bind leaves a device bound to
    the image that nothing refers to. Played by losetup."""
    client, _ = plugin
    context = block_image(pool_env, VOLUME)
    image = pool_env.pool.images.image_path(VOLUME)
    left = sh("losetup", "--find", "--show", image).strip()
    staging = tmp_path / "staging"
    stage(client, VOLUME, staging, context)
    assert [f"/dev/loop{n}" for n in loops_of(pool_env, VOLUME)] == [left], "the same device, not a second"
    unstage(client, VOLUME, staging)
    assert not loops_of(pool_env, VOLUME)
    # An unstage for a stage that never got as far as its bind lets the device go too.
    left = sh("losetup", "--find", "--show", image).strip()
    unstage(client, VOLUME, staging)
    assert not loops_of(pool_env, VOLUME)
    assert pool_env.pool.images.remove(VOLUME)


def test_a_device_someone_else_bound_with_autoclear_is_not_taken(plugin: tuple[Client, NodeService],
                                                                  pool_env: PoolEnv, tmp_path: Path) -> None:
    """Bound to the image with autoclear by another process (holding it open): it goes when
    that process lets go, so binding its number would hand out a name that outlives it."""
    client, _ = plugin
    context = block_image(pool_env, VOLUME)
    image = pool_env.pool.images.image_path(VOLUME)
    with pool_env.pool.images.open_image(VOLUME) as fd, loop.attach(fd, image) as theirs:
        staging = tmp_path / "staging"
        code, details = code_of(lambda: stage(client, VOLUME, staging, context))
        assert code == grpc.StatusCode.ABORTED and theirs.loop.path in details, details
        assert mounting.mount_at(str(staging / VOLUME)) is None
    wait_for(lambda: not loops_of(pool_env, VOLUME), what="their device to go")
    stage(client, VOLUME, staging, context)
    unstage(client, VOLUME, staging)
    assert not loops_of(pool_env, VOLUME)


def test_expansion_is_seen_by_a_reader_of_the_published_device(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path,
        teardown: Callable[[str, Path, Path | None], None]) -> None:
    client, node = plugin
    grown: list[tuple[str, int]] = []
    node.on_expanded = lambda volume, size: grown.append((volume, size))
    context = block_image(pool_env, VOLUME, 8 * MiB)
    staging, target = tmp_path / "staging", tmp_path / "target"
    stage(client, VOLUME, staging, context)
    publish(client, VOLUME, staging, target)
    teardown(VOLUME, staging, target)
    write_at(target, 8 * MiB - 512, b"end of the old size")
    pool_env.pool.images.grow(VOLUME, 24 * MiB, provisioning=Provisioning.THIN)  # the controller's part
    assert device_size(target) == 8 * MiB
    answer = client.node("NodeExpandVolume", csi.NodeExpandVolumeRequest(
        volume_id=VOLUME, volume_path=str(target), staging_target_path=str(staging),
        capacity_range=csi.CapacityRange(required_bytes=24 * MiB), volume_capability=block_capability()))
    assert answer.capacity_bytes == 24 * MiB  # type: ignore[attr-defined]
    assert device_size(target) == 24 * MiB
    assert read_at(target, 8 * MiB - 512, 19) == b"end of the old size"
    write_at(target, 20 * MiB, b"in the new part")
    assert read_at(target, 20 * MiB, 15) == b"in the new part"
    assert grown == [(VOLUME, 24 * MiB)]
    # Repeated, or without a capability (an older kubelet): the image's mark says Block.
    answer = client.node("NodeExpandVolume", csi.NodeExpandVolumeRequest(volume_id=VOLUME, volume_path=str(target)))
    assert answer.capacity_bytes == 24 * MiB  # type: ignore[attr-defined]
    code, _ = code_of(lambda: client.node("NodeExpandVolume", csi.NodeExpandVolumeRequest(
        volume_id=VOLUME, volume_path=str(target), capacity_range=csi.CapacityRange(required_bytes=32 * MiB))))
    assert code == grpc.StatusCode.OUT_OF_RANGE


def test_a_second_stage_of_a_volume_in_progress_is_aborted(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path, gated: Callable[..., Gate]) -> None:  # noqa: F811
    client, _ = plugin
    context = block_image(pool_env, VOLUME)
    staging = tmp_path / "staging"
    gate = gated("mount")
    thread, errors = in_thread(lambda: stage(client, VOLUME, staging, context))
    try:
        wait_for(lambda: gate.arrived() == 1, what="the stage to be in its bind mount")
        code, details = code_of(lambda: stage(client, VOLUME, staging, context))
        assert code == grpc.StatusCode.ABORTED and "in progress" in details, details
    finally:
        gate.open()
        thread.join(60)
    assert errors == []
    assert len(loops_of(pool_env, VOLUME)) == 1
    stage(client, VOLUME, staging, context)
    unstage(client, VOLUME, staging)
    assert not loops_of(pool_env, VOLUME)


_OLD_AGENT = textwrap.dedent("""
    import sys
    from localpv.config.dynamic import PoolConfig
    from localpv.csi.node import NodeService
    from localpv.csi.pools import Pool
    from localpv.csi.proto import csi_pb2 as csi
    pool_dir, volume, staging, target, context = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], dict(
        kv.split("=", 1) for kv in sys.argv[5:])
    pool = Pool(PoolConfig(name="fast", host_dir=pool_dir, mount_dir=pool_dir))
    node = NodeService("node-1", lambda: {"fast": pool})
    capability = csi.VolumeCapability(block=csi.VolumeCapability.BlockVolume(),
                                      access_mode=csi.VolumeCapability.AccessMode(mode=1))
    node.stage(csi.NodeStageVolumeRequest(volume_id=volume, staging_target_path=staging, volume_context=context,
                                          volume_capability=capability))
    node.publish(csi.NodePublishVolumeRequest(volume_id=volume, staging_target_path=staging, target_path=target,
                                              volume_context=context, volume_capability=capability))
""")


def test_a_staged_and_published_block_volume_is_known_after_the_agent_restarts_in_a_new_namespace(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path, kubelet_dir: Path,  # noqa: F811
) -> None:
    client, _ = plugin
    context = block_image(pool_env, VOLUME, 8 * MiB)
    bystander = block_image(pool_env, "pvc-bystander", 8 * MiB)
    stage(client, "pvc-bystander", kubelet_dir / "bystander", bystander)
    staging = kubelet_dir / "volumeDevices" / "staging" / VOLUME
    target = kubelet_dir / "volumeDevices" / "publish" / VOLUME / "pod-uid"
    staging.mkdir(parents=True)
    view = tmp_path / "old-agent-view"
    view.mkdir()
    script = f"mount --bind {pool_env.root} {view} && exec {sys.executable} -c \"$0\" \"$@\""
    proc = subprocess.run(["unshare", "-m", "--propagation", "unchanged", "--", "sh", "-c", script, _OLD_AGENT,
                           str(view), VOLUME, str(staging), str(target), *(f"{k}={v}" for k, v in context.items())],
                          capture_output=True, text=True, check=False, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert not os.listdir(view), "the old agent's view of the pool was its own"
    [number] = loops_of(pool_env, VOLUME)
    assert loop.backing_file(loop.Loop(number)) == f"/{VOLUME}/disk.img", "the path of a namespace that is gone"
    assert mounting.device_at(str(target)) == (loop.LOOP_MAJOR, number), "the binds reach this namespace"
    write_at(target, 0, b"written before the restart")
    try:
        stage(client, VOLUME, staging, context)  # the kubelet repeats both after its restart
        publish(client, VOLUME, staging, target)
        assert loops_of(pool_env, VOLUME) == [number]
        code, details = code_of(lambda: stage(client, VOLUME, kubelet_dir / "elsewhere", context))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and str(staging / VOLUME) in details, details
        assert not (kubelet_dir / "elsewhere" / VOLUME).exists() or \
            mounting.mount_at(str(kubelet_dir / "elsewhere" / VOLUME)) is None
        stats = client.node("NodeGetVolumeStats", csi.NodeGetVolumeStatsRequest(volume_id=VOLUME,
                                                                                volume_path=str(target)))
        assert stats.volume_condition.abnormal is False, stats.volume_condition.message  # type: ignore[attr-defined]
        assert read_at(target, 0, 26) == b"written before the restart"
    finally:
        unpublish(client, VOLUME, target)
        unstage(client, VOLUME, staging)
    assert not loops_of(pool_env, VOLUME), "this volume's device is detached"
    assert len(loops_of(pool_env, "pvc-bystander")) == 1, "only this one"
    unstage(client, "pvc-bystander", kubelet_dir / "bystander")
    wait_for(lambda: not loops_of(pool_env, "pvc-bystander"), what="the bystander's device to go")

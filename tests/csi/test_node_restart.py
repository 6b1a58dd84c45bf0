"""An agent restart never blinds the node plugin (issue 23.1).

The agent runs in a container: each incarnation has a mount namespace of its own, which sees
the pools through its own mounts. A loop device attached by one incarnation reports its
backing file (``/sys/block/loopN/loop/backing_file``) as a path of that incarnation's
namespace; once it is gone, the path resolves nowhere (here: ``/<volume>/disk.img``). The
restarted agent must still know each staged image - by what the kernel holds for the loop
device (the backing file's device and inode), never by that path.

Each test stages a volume from a real child process in a new mount namespace (``unshare -m``)
that sees the pool at a path of its own, with the staging directory on a shared mount (the
kubelet's directory is Bidirectional), then lets that namespace die, and calls the node
service of "the restarted agent" (this process) over its real gRPC socket.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from localpv.csi import loop, mounting
from localpv.csi.images import ImageError
from localpv.csi.node import NodeService
from localpv.csi.proto import csi_pb2 as csi
from tests.conftest import wait_for
from tests.csi.conftest import Client, PoolEnv
from tests.csi.test_node_service import code_of, stage, unstage
from tests.support.hostfs import MiB, Mounter, sh

pytestmark = pytest.mark.root
VOLUME = "pvc-0b1c2d3e-0000-4000-8000-0000000000aa"
REPO = Path(__file__).resolve().parents[2]

_OLD_AGENT = textwrap.dedent("""
    import sys
    from localpv.config.dynamic import PoolConfig
    from localpv.csi.node import NodeService
    from localpv.csi.pools import Pool
    from localpv.csi.proto import csi_pb2 as csi
    pool_dir, volume, staging, context = sys.argv[1], sys.argv[2], sys.argv[3], dict(
        kv.split("=", 1) for kv in sys.argv[4:])
    pool = Pool(PoolConfig(name="fast", host_dir=pool_dir, mount_dir=pool_dir))
    node = NodeService("node-1", lambda: {"fast": pool})
    node.stage(csi.NodeStageVolumeRequest(
        volume_id=volume, staging_target_path=staging, volume_context=context,
        volume_capability=csi.VolumeCapability(
            mount=csi.VolumeCapability.MountVolume(fs_type="ext4"),
            access_mode=csi.VolumeCapability.AccessMode(mode=1))))
""")


@pytest.fixture
def kubelet_dir(tmp_path: Path, mounter: Mounter) -> Iterator[Path]:
    """A directory on a shared mount, as the kubelet's root dir is for a Bidirectional plugin."""
    path = tmp_path / "kubelet"
    path.mkdir()
    mounter.bind(path, path)
    sh("mount", "--make-rshared", path)
    yield path
    for point in sorted((m for m in mounting.read_mountinfo() if m.mount_point.startswith(f"{path}/")),
                        key=lambda m: -len(m.mount_point)):
        subprocess.run(["umount", "-l", point.mount_point], check=False)


def stage_from_a_dead_namespace(pool_env: PoolEnv, tmp_path: Path, staging: Path, context: dict[str, str]) -> None:
    """Stage ``VOLUME`` the way an earlier agent container did, then let its namespace die."""
    view = tmp_path / "old-agent-view"
    view.mkdir()
    script = f"mount --bind {pool_env.root} {view} && exec {sys.executable} -c \"$0\" \"$@\""
    argv = ["unshare", "-m", "--propagation", "unchanged", "--", "sh", "-c", script, _OLD_AGENT,
            str(view), VOLUME, str(staging), *(f"{k}={v}" for k, v in context.items())]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert mounting.mount_at(str(staging)) is not None, "the staging mount reaches this namespace"
    assert not os.listdir(view), "the old agent's view of the pool was its own"
    [device] = [int(p.parent.parent.name[4:]) for p in Path("/sys/block").glob("loop*/loop/backing_file")
                if p.read_text().strip() == f"/{VOLUME}/disk.img"]
    assert loop.backing_file(loop.Loop(device)) == f"/{VOLUME}/disk.img", "the path of a namespace that is gone"


def test_a_staged_volume_is_known_after_the_agent_restarts_in_a_new_namespace(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path, kubelet_dir: Path) -> None:
    client, _ = plugin
    context = pool_env.image(VOLUME, 32 * MiB)
    staging = kubelet_dir / "pv" / VOLUME / "globalmount"
    stage_from_a_dead_namespace(pool_env, tmp_path, staging, context)
    (staging / "data").write_text("tenant data")
    try:
        # The kubelet repeats NodeStageVolume after its own restart: it is done, so it succeeds.
        stage(client, VOLUME, staging, context)
        # A stage at another path is refused: one ext4 mounted read-write twice is corrupted.
        other = kubelet_dir / "pv" / VOLUME / "second"
        code, details = code_of(lambda: stage(client, VOLUME, other, context))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and str(staging) in details, details
        assert mounting.mount_at(str(other)) is None
        # The image is not removed while it is staged.
        with pytest.raises(ImageError, match="in use"):
            pool_env.pool.images.remove(VOLUME)
        assert pool_env.pool.images.in_use(VOLUME)
        stats = client.node("NodeGetVolumeStats", csi.NodeGetVolumeStatsRequest(volume_id=VOLUME,
                                                                                volume_path=str(staging)))
        assert stats.volume_condition.abnormal is False, stats.volume_condition.message  # type: ignore[attr-defined]
        assert (staging / "data").read_text() == "tenant data"
    finally:
        unstage(client, VOLUME, staging)
    assert mounting.mount_at(str(staging)) is None
    wait_for(lambda: not pool_env.pool.images.in_use(VOLUME), what="the loop device to go")
    assert pool_env.pool.images.remove(VOLUME)


def test_another_images_loop_device_is_never_taken_for_this_ones(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path, kubelet_dir: Path) -> None:
    """Two images staged by a dead namespace: each staging path is recognised as its own image's."""
    client, _ = plugin
    context = pool_env.image(VOLUME, 32 * MiB)
    other_context = pool_env.image("pvc-other", 32 * MiB)
    staging = kubelet_dir / "pv" / VOLUME / "globalmount"
    stage_from_a_dead_namespace(pool_env, tmp_path, staging, context)
    try:
        code, details = code_of(lambda: stage(client, "pvc-other", staging, other_context))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "another filesystem" in details, details
    finally:
        unstage(client, VOLUME, staging)


def test_an_image_still_held_by_an_earlier_stages_tool_is_not_staged_a_second_time(
        plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    """An agent killed during a stage's e2fsck leaves the e2fsck running on its loop device (a
    child is not killed with its parent). The kubelet's repeated stage must wait for it - a
    second loop device would have two tools write one filesystem - and succeed once it is free.
    (Found by the dynamic campaign.) The earlier tool is played by a process holding a loop
    device bound to the image."""
    client, _ = plugin
    context = pool_env.image(VOLUME, 32 * MiB)
    image = pool_env.pool.images.image_path(VOLUME)
    device = sh("losetup", "--find", "--show", image).strip()
    staging = tmp_path / "staging"
    try:
        code, details = code_of(lambda: stage(client, VOLUME, staging, context))
        assert code == grpc.StatusCode.ABORTED and device in details, details
        assert mounting.mount_at(str(staging)) is None
        assert [lp.path for lp in pool_env.pool.images.in_use(VOLUME)] == [device]
    finally:
        sh("losetup", "-d", device)
    wait_for(lambda: not pool_env.pool.images.in_use(VOLUME), what="the earlier device to go")
    stage(client, VOLUME, staging, context)
    unstage(client, VOLUME, staging)

"""Dynamic volumes' health (issue 23.4): the pure rules, then the watch on real images, loop
devices, mounts and a thin pool filled by its tenants, reporting through the API emulator."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localpv.config.dynamic import PoolConfig
from localpv.csi.health import ImageLook, Looks, MountLook, PoolRisk, assess
from localpv.csi.images import FsType, Provisioning
from localpv.csi.node import NodeService
from localpv.csi.pools import Pool
from localpv.csi.volume import FS_UUID, NODE, POOL, PROVISIONING
from localpv.csi.watch import HealthWatch
from localpv.kube.api import KubeApi
from localpv.kube.events import EventRecorder
from localpv.kube.objects import Obj
from localpv.kube.volumehealth import Condition
from localpv_emulator.apiserver import ApiServer
from tests.conftest import wait_for
from tests.csi.conftest import Client, PoolEnv
from tests.csi.test_node_service import stage, unstage
from tests.support.hostfs import LoopDevices, MiB, Mounter, sh

UUID = "0b1c2d3e-0000-4000-8000-000000000001"


def pv(name: str, *, phase: str = "Bound", pool: str = "fast", provisioning: str = "thin", fs_uuid: str = UUID,
       uid: str = "u1") -> Obj:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "uid": uid},
            "spec": {"claimRef": {"namespace": "default", "name": f"claim-{name}", "uid": f"c-{name}"},
                     "csi": {"driver": "local.csi.localpv.dev", "volumeHandle": name,
                             "volumeAttributes": {POOL: pool, FS_UUID: fs_uuid, NODE: "node-1",
                                                  PROVISIONING: provisioning}}},
            "status": {"phase": phase}}


def conditions(pvs: list[Obj], images: dict[str, ImageLook], risks: dict[str, PoolRisk] | None = None,
               baselines: dict[str, int] | None = None) -> dict[str, set[Condition]]:
    found = assess(pvs, Looks(images, risks or {}), baselines or {})
    return {name: set(health.conditions) for name, health in found.volumes.items()}


STAGED = "/k/plugins/kubernetes.io/csi/pv/a/globalmount"


@pytest.mark.parametrize(("look", "expected"), [
    (ImageLook(fs_uuid=UUID, size=10, allocated=10), set()),
    (ImageLook(fs_uuid=UUID, loops=(3,), mounts=(MountLook(STAGED, False),), staged_at=STAGED), set()),
    (ImageLook(present=False), {Condition.MISSING}),
    (ImageLook(present=False, deleted_loops=(3,), staged_at=STAGED), {Condition.MISSING}),
    (ImageLook(fs_uuid="another"), {Condition.IDENTITY_CHANGED}),
    (ImageLook(fs_uuid=UUID, staged_at=STAGED), {Condition.DEVICE_MISSING}),
    (ImageLook(fs_uuid=UUID, loops=(3,), staged_at=STAGED), {Condition.NOT_MOUNTED}),
    (ImageLook(fs_uuid=UUID, loops=(3,), mounts=(MountLook(STAGED, True),), staged_at=STAGED), {Condition.READ_ONLY}),
    (ImageLook(pool_problem="pool fast: nothing is mounted at /p"), {Condition.POOL_UNAVAILABLE}),
    (ImageLook(fs_uuid=UUID, allocation_problem="no room"), {Condition.ALLOCATION_LOST}),
])
def test_what_an_image_shows_is_its_conditions(look: ImageLook, expected: set[Condition]) -> None:
    assert conditions([pv("a")], {"a": look}) == {"a": expected}


def test_only_bound_and_available_volumes_are_watched_and_only_those_looked_at() -> None:
    pvs = [pv("a", phase="Released"), pv("b", phase="Available"), pv("c"), pv("d")]
    looks = {"a": ImageLook(present=False), "b": ImageLook(present=False), "c": ImageLook(present=False)}
    assert conditions(pvs, looks) == {"b": {Condition.MISSING}, "c": {Condition.MISSING}}


def test_a_pool_at_risk_is_said_on_the_thin_volumes_that_may_still_write_and_no_other() -> None:
    risk = PoolRisk("fast", free=10 * MiB, unwritten=50 * MiB, unbacked=40 * MiB)
    pvs = [pv("thin-unwritten"), pv("thin-full"), pv("thick", provisioning="thick"), pv("other", pool="slow")]
    looks = {"thin-unwritten": ImageLook(fs_uuid=UUID, size=64 * MiB, allocated=14 * MiB),
             "thin-full": ImageLook(fs_uuid=UUID, size=64 * MiB, allocated=64 * MiB),
             "thick": ImageLook(fs_uuid=UUID, size=64 * MiB, allocated=64 * MiB),
             "other": ImageLook(fs_uuid=UUID, size=64 * MiB, allocated=0)}
    found = conditions(pvs, looks, {"fast": risk})
    assert found == {"thin-unwritten": {Condition.POOL_OVERCOMMITTED}, "thin-full": set(), "thick": set(),
                     "other": set()}
    message = assess(pvs, Looks(looks, {"fast": risk}), {}).volumes["thin-unwritten"].message()
    assert "pool fast has 10 MiB free for 50 MiB" in message and "40 MiB" in message


def test_filesystem_errors_count_from_the_first_look_and_a_reset_is_the_new_baseline() -> None:
    look = ImageLook(fs_uuid=UUID, loops=(3,), mounts=(MountLook(STAGED, False),), staged_at=STAGED, fs_errors=2)
    first = assess([pv("a")], Looks({"a": look}), {})
    assert not first.volumes["a"].conditions and first.baselines == {"u1": 2}
    grown = assess([pv("a")], Looks({"a": ImageLook(**{**look.__dict__, "fs_errors": 5})}), first.baselines)
    assert set(grown.volumes["a"].conditions) == {Condition.FILESYSTEM_ERRORS}
    reset = assess([pv("a")], Looks({"a": ImageLook(**{**look.__dict__, "fs_errors": 0})}), grown.baselines)
    assert not reset.volumes["a"].conditions and reset.baselines == {"u1": 0}


# ---------------------------------------------------------------- the watch, for real


class Watched:
    """A watch over a real pool's images, reporting to the emulator."""

    def __init__(self, server: ApiServer, kube: KubeApi, pool: Pool, node: NodeService) -> None:
        self.server = server
        self.pool = pool
        self.volumes: list[Obj] = []
        self.recorder = EventRecorder(kube, component="local.csi.localpv.dev_node-1")
        self.recorder.start()
        self.node_obj = server.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})
        self.watch = HealthWatch(node=lambda: self.node_obj, pvs=lambda: self.volumes, pools=lambda: {pool.name: pool},
                                 staged=node.staged, risks=self.risks, recorder=self.recorder)
        self.pool_risks: dict[str, PoolRisk] = {}

    def risks(self) -> dict[str, PoolRisk]:
        return self.pool_risks

    def add(self, name: str, context: dict[str, str], **kw: Any) -> Obj:
        volume = pv(name, fs_uuid=context[FS_UUID], uid=f"uid-{name}", **kw)
        self.volumes.append(volume)
        return volume

    def events(self, kind: str, name: str, reason: str) -> list[str]:
        self.recorder.flush(5)
        return [str(e.get("message")) for e in self.server.list("v1", "Event")
                if e.get("reason") == reason and (e.get("involvedObject") or {}).get("kind") == kind
                and (e.get("involvedObject") or {}).get("name") == name]

    def conditions(self, name: str) -> list[str]:
        self.watch.look_once()
        return self.watch.reporter.of(name)


@pytest.fixture
def watched(apiserver: ApiServer, kube: KubeApi, pool_env: PoolEnv,
            plugin: tuple[Client, NodeService]) -> Iterator[Watched]:
    w = Watched(apiserver, kube, pool_env.pool, plugin[1])
    yield w
    w.recorder.stop()


pytestmark_root = pytest.mark.root


@pytest.mark.root
def test_a_staged_volume_whose_mount_or_image_goes_is_abnormal_on_its_claim_and_pv(
        watched: Watched, plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    client, _ = plugin
    context = pool_env.image("pvc-a")
    watched.add("pvc-a", context)
    staging = tmp_path / "staging"
    stage(client, "pvc-a", staging, context)
    try:
        assert watched.conditions("pvc-a") == []
        sh("mount", "-o", "remount,ro", staging)
        assert watched.conditions("pvc-a") == ["ReadOnly"]
        claim_events = watched.events("PersistentVolumeClaim", "claim-pvc-a", "VolumeConditionAbnormal")
        assert claim_events and "read-only" in claim_events[0]
        assert watched.events("PersistentVolume", "pvc-a", "VolumeConditionAbnormal")
        sh("mount", "-o", "remount,rw", staging)
        assert watched.conditions("pvc-a") == []
        assert watched.events("PersistentVolumeClaim", "claim-pvc-a", "VolumeConditionNormal")
        os.unlink(pool_env.pool.images.image_path("pvc-a"))  # the image deleted under its mount
        assert watched.conditions("pvc-a") == ["Missing"]
        assert any("deleted while in use" in message
                   for message in watched.events("PersistentVolume", "pvc-a", "VolumeConditionAbnormal"))
    finally:
        unstage(client, "pvc-a", staging)


@pytest.mark.root
def test_a_staging_mount_taken_away_behind_the_plugins_back_is_not_mounted(
        watched: Watched, plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    client, _ = plugin
    context = pool_env.image("pvc-b")
    watched.add("pvc-b", context)
    staging = tmp_path / "staging"
    stage(client, "pvc-b", staging, context)
    sh("umount", staging)  # someone unmounted it; the kubelet still thinks it is staged
    assert watched.conditions("pvc-b") in (["DeviceMissing"], ["NotMounted"])
    unstage(client, "pvc-b", staging)
    assert watched.conditions("pvc-b") == []


@pytest.mark.root
def test_a_thick_volume_trimmed_while_staged_gets_its_blocks_back_at_the_next_look(
        watched: Watched, plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    client, _ = plugin
    fs_uuid = pool_env.pool.images.create("pvc-thick", 32 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THICK)
    context = {POOL: pool_env.pool.name, FS_UUID: fs_uuid, NODE: "node-1", PROVISIONING: "thick"}
    watched.add("pvc-thick", context, provisioning="thick")
    staging = tmp_path / "staging"
    stage(client, "pvc-thick", staging, context)
    image = Path(pool_env.pool.images.image_path("pvc-thick"))
    try:
        (staging / "x").write_bytes(b"\1" * 8 * MiB)
        os.sync()
        (staging / "x").unlink()
        sh("fstrim", staging)
        assert image.stat().st_blocks * 512 < image.stat().st_size
        assert watched.conditions("pvc-thick") == []
        assert image.stat().st_blocks * 512 >= image.stat().st_size
    finally:
        unstage(client, "pvc-thick", staging)


@pytest.mark.root
def test_a_thin_pool_filled_by_its_tenants_is_said_before_and_when_it_fails(
        apiserver: ApiServer, kube: KubeApi, loops: LoopDevices, mounter: Mounter, tmp_path: Path,
        socket_dir: Path) -> None:
    """A 48 MiB pool promising twice its size: two thin volumes of 40 MiB. Promised beyond its
    size by design, the pool is not at risk while it is empty; once the first tenant's writes
    fill it past its high-water mark, with less free space than the other may still write: a
    Warning on the claims that may fail and on the Node, before any write fails."""
    from localpv.config import ProvisionerConfig
    from localpv.config.dynamic import DynamicClass
    from localpv.csi.app import DynamicVolumes

    disk = loops.attach(48 * MiB, ext4=True)
    root = mounter.device(disk.path, tmp_path / "pool")
    config = ProvisionerConfig(
        dynamic_pools={"small": PoolConfig(name="small", host_dir=str(root), mount_dir=str(root), overcommit=2,
                                           high_water=0.7)},
        dynamic_classes={"thin": DynamicClass("thin", "small")})
    apiserver.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})
    dynamic = DynamicVolumes(kube, node_name="node-1", config=lambda: config, state_dir=str(tmp_path / "state"),
                             kubelet_dir=str(socket_dir / "k"))
    pool = dynamic.pools()["small"]
    from localpv.csi.journal import ImageRecord, ImageState

    staged = {}
    for name in ("pvc-one", "pvc-two"):
        fs_uuid = pool.images.create(name, 40 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
        dynamic.journal.put(ImageRecord(volume=name, pool="small", size=40 * MiB, fs_type="ext4",
                                        provisioning="thin", claim_uid=f"c-{name}", claim=f"default/claim-{name}",
                                        state=ImageState.READY, since=0.0, fs_uuid=fs_uuid))
        staged[name] = {POOL: "small", FS_UUID: fs_uuid, NODE: "node-1"}
    volumes = [pv(name, pool="small", fs_uuid=ctx[FS_UUID], uid=f"uid-{name}") for name, ctx in staged.items()]
    dynamic.watch.pvs = lambda: volumes
    dynamic.recorder.start()
    client = None
    try:
        assert dynamic.pool_risks() == {}
        dynamic.watch.look_once()
        assert dynamic.watch.reporter.of("pvc-one") == []
        from localpv.csi.rpc import UnixServer

        server = UnixServer(str(socket_dir / "csi.sock"), [dynamic.node.handler()])
        server.start()
        client = Client(server.path)
        stage(client, "pvc-one", tmp_path / "one", staged["pvc-one"])
        with open(tmp_path / "one" / "data", "wb") as f:  # the first tenant writes 30 MiB of its 40
            for _ in range(30):
                f.write(os.urandom(MiB))
            f.flush()
            os.fsync(f.fileno())
        risks = dynamic.pool_risks()
        assert set(risks) == {"small"} and risks["small"].unbacked > 0
        dynamic.watch.look_once()
        assert dynamic.watch.reporter.of("pvc-two") == ["PoolOvercommitted"]
        dynamic.recorder.flush(5)
        events = [e for e in apiserver.list("v1", "Event") if e.get("reason") in ("VolumeConditionAbnormal",
                                                                                  "PoolOvercommitted")]
        targets = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events}
        assert ("PersistentVolumeClaim", "claim-pvc-two") in targets and ("Node", "node-1") in targets
        status = dynamic.status()
        assert status["pools"][0]["risk"]  # type: ignore[index]
        unstage(client, "pvc-one", tmp_path / "one")
        server.stop()
    finally:
        if client is not None:
            client.close()
        dynamic.recorder.stop()
    wait_for(lambda: not pool.images.in_use("pvc-one"), what="the loop device to go")


@pytest.mark.root
def test_a_block_volume_is_watched_through_its_device_files(
        watched: Watched, plugin: tuple[Client, NodeService], pool_env: PoolEnv, tmp_path: Path) -> None:
    """Staged and published, a Block volume is healthy (its staging file is its 'mount'); its
    staging bind taken away, or its image's mark changed, is said; a thick one that a pod's
    blkdiscard punched holes into gets its blocks back at the next look."""
    from tests.csi.test_node_block import block_image, publish
    from tests.csi.test_node_block import stage as stage_block
    from tests.csi.test_node_block import unpublish as unpublish_block
    from tests.csi.test_node_block import unstage as unstage_block

    client, _ = plugin
    context = block_image(pool_env, "pvc-raw", 16 * MiB, provisioning=Provisioning.THICK)
    volume = pv("pvc-raw", uid="uid-raw", provisioning="thick")
    volume["spec"]["csi"]["volumeAttributes"] = context
    watched.volumes.append(volume)
    staging, target = tmp_path / "staging", tmp_path / "target"
    stage_block(client, "pvc-raw", staging, context)
    publish(client, "pvc-raw", staging, target)
    image = Path(pool_env.pool.images.image_path("pvc-raw"))
    try:
        assert watched.conditions("pvc-raw") == []
        sh("blkdiscard", "-o", "0", "-l", str(8 * MiB), target)  # the tenant discards: holes in the image
        os.sync()
        assert image.stat().st_blocks * 512 < image.stat().st_size, "the discard reached the image"
        assert watched.conditions("pvc-raw") == []
        assert image.stat().st_blocks * 512 >= image.stat().st_size, "allocated again by the look"
        os.setxattr(image, "user.localpv.block", b"0b1c2d3e-0000-4000-8000-0000000000ff")
        assert watched.conditions("pvc-raw") == ["IdentityChanged"]
        os.setxattr(image, "user.localpv.block", context["localpv.dev/imageUUID"].encode())
        sh("umount", staging / "pvc-raw")  # someone took the staging bind away
        assert watched.conditions("pvc-raw") == ["NotMounted"]
    finally:
        unpublish_block(client, "pvc-raw", target)
        unstage_block(client, "pvc-raw", staging)
    assert watched.conditions("pvc-raw") == []

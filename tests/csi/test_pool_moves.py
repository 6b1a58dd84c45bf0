"""A pool whose directory changes on a node (a ``nodes`` override, a Node label) while images
recorded in it live at the old one is refused, not used empty (issue 25.5): its images would
be "missing" to every stage, a release would drop their records and leave their data behind,
and the account would promise their room again. Real ext4 pools on loop devices."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from localpv.config import ProvisionerConfig
from localpv.config.dynamic import DynamicClass, PoolConfig
from localpv.csi.app import DynamicVolumes
from localpv.csi.images import FsType, ImageStore, Provisioning
from localpv.csi.journal import ImageJournal, ImageRecord, ImageState
from localpv.csi.pools import PoolState, move_refusal
from localpv.kube.api import KubeApi
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node
from tests.support.hostfs import LoopDevices, MiB, Mounter


def test_the_rule_on_data() -> None:
    assert move_refusal("p", None, "/b", ["v1"], []) == ""  # never recorded (a journal from before): learnt
    assert move_refusal("p", "/a", "/a", ["v1"], []) == ""
    assert move_refusal("p", "/a", "/b", [], []) == ""  # nothing recorded in it: the pool may go anywhere
    assert move_refusal("p", "/a", "/b", ["v1", "v2"], ["v1", "v2"]) == ""  # its images went with it
    why = move_refusal("p", "/a", "/b", ["v1", "v2", "v3", "v4", "v5"], ["v2"])
    assert why.startswith("pool p: this node's configuration puts it at /b, but 5 image(s) recorded in it were made "
                          "at /a and 4 are not at /b (v1, v3, v4 and 1 more)"), why


def config_at(pool_dir: Path) -> ProvisionerConfig:
    pool = PoolConfig(name="fast", host_dir=str(pool_dir), mount_dir=str(pool_dir))
    return ProvisionerConfig(dynamic_pools={"fast": pool}, dynamic_classes={"dyn": DynamicClass("dyn", "fast")})


def record(volume: str, fs_uuid: str) -> ImageRecord:
    return ImageRecord(volume=volume, pool="fast", size=32 * MiB, fs_type="ext4", provisioning="thin",
                       claim_uid="u1", claim="default/c1", state=ImageState.READY, since=time.time(), fs_uuid=fs_uuid)


@pytest.mark.root
def test_a_pool_moved_away_from_its_images_is_refused_until_they_are_there(
        apiserver: ApiServer, kube: KubeApi, loops: LoopDevices, mounter: Mounter, tmp_path: Path) -> None:
    apiserver.create(node("node-1"))
    old = mounter.device(loops.attach(256 * MiB, ext4=True).path, tmp_path / "old")
    new = mounter.device(loops.attach(256 * MiB, ext4=True).path, tmp_path / "new")
    current = {"config": config_at(old)}
    state = tmp_path / "state"

    def volumes() -> DynamicVolumes:
        return DynamicVolumes(kube, node_name="node-1", config=lambda: current["config"], state_dir=str(state),
                              kubelet_dir=str(tmp_path / "kubelet"), registry=CollectorRegistry())

    dynamic = volumes()
    assert dynamic.pools()["fast"].state() == (PoolState.READY, "")
    fs_uuid = ImageStore(str(old)).create("pvc-1", 32 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    dynamic.journal.put(record("pvc-1", fs_uuid))
    assert dynamic.journal.pool_dir("fast") == str(old)

    current["config"] = config_at(new)  # this node's override now says another directory
    state_now, why = dynamic.pools()["fast"].state()
    assert state_now is PoolState.MOVED, why
    assert f"made at {old} and 1 are not at {new} (pvc-1)" in why
    assert "fast" not in dynamic.pool_risks()
    # The controller's answer for a release: the image is kept, its record too.
    assert dynamic.controller.deleter.remove_image("fast", "pvc-1", None) is False
    assert dynamic.journal.get("pvc-1") is not None and (old / "pvc-1").is_dir()

    # A restart with the new directory knows where the images are: it is in the image journal.
    assert ImageJournal(state / "csi-images.json").pool_dir("fast") == str(old)
    dynamic = volumes()
    assert dynamic.pools()["fast"].state()[0] is PoolState.MOVED

    # Another image of that name at the new directory is not the recorded one (another UUID).
    ImageStore(str(new)).create("pvc-1", 32 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    assert dynamic.pools()["fast"].state()[0] is PoolState.MOVED
    # The recorded image itself at the new directory (its disk moved there): the record follows.
    shutil.rmtree(new / "pvc-1")
    shutil.copytree(old / "pvc-1", new / "pvc-1")
    assert dynamic.pools()["fast"].state() == (PoolState.READY, "")
    assert ImageJournal(state / "csi-images.json").pool_dir("fast") == str(new)

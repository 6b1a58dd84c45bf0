"""Block claims (``volumeMode: Block``) through the provisioning protocol, against the API
emulator with real pools: a Block image (no mkfs) and a Block PV, thin and thick, reused after
a crash, grown and finished without a filesystem step, deleted once unstaged, adopted."""

from __future__ import annotations

import pytest

from localpv.config import ProvisionerConfig
from localpv.config.dynamic import DynamicClass
from localpv.csi import loop
from localpv.csi import provisioner as rules
from localpv.csi.images import Provisioning
from localpv.csi.journal import BLOCK, ImageRecord, ImageState
from localpv.csi.volume import IMAGE_UUID, NODE, POOL
from localpv_emulator.objects import claim, storage_class
from tests.conftest import wait_for
from tests.csi.test_controller import DRIVER, NODE_NAME, Env, env  # noqa: F401 - a fixture
from tests.support.hostfs import MiB

pytestmark = pytest.mark.root


@pytest.mark.parametrize("provisioning", ["thin", "thick"])
def test_a_block_claim_gets_a_block_image_and_a_block_pv(env: Env, provisioning: str) -> None:  # noqa: F811
    sc = storage_class("raw", provisioner=DRIVER, parameters={"pool": "fast", "provisioning": provisioning,
                                                              "mkfsOptions": "-m 0"})
    sc["mountOptions"] = ["noatime"]
    env.server.create(sc)
    env.config = ProvisionerConfig(dynamic_pools=env.config.dynamic_pools, dynamic_classes={
        "raw": DynamicClass("raw", "fast", fs_type="xfs", provisioning=provisioning, mkfs_options="-m 0")})
    env.start()
    made = env.server.create(claim("raw", "raw", size="3Mi", mode="Block", selected_node=NODE_NAME))
    pv = wait_for(lambda: env.bound_pv("raw"), what="the claim to be Bound")
    volume = f"pvc-{made['metadata']['uid']}"
    images = env.pool_env.pool.images
    assert pv["spec"]["volumeMode"] == "Block"
    assert "fsType" not in pv["spec"]["csi"] and "mountOptions" not in pv["spec"], "nothing is mounted"
    assert pv["spec"]["csi"]["volumeAttributes"] == {POOL: "fast", IMAGE_UUID: images.block_uuid(volume),
                                                     NODE: NODE_NAME, "localpv.dev/provisioning": provisioning}
    assert pv["spec"]["capacity"]["storage"] == "3Mi", "whole MiB, below XFS's 300 MiB: no filesystem"
    usage = images.usage(volume)
    assert usage.size == 3 * MiB and images.fs_uuid(volume) is None, "no mkfs"
    assert (usage.allocated >= 3 * MiB) if provisioning == "thick" else usage.allocated == 0
    record = wait_for(lambda: (r := env.journal().get(volume)) is not None and r.pv_uid and r, what="the PV uid")
    assert (record.volume_mode, record.image_uuid, record.fs_uuid, record.fs_type) == (
        BLOCK, images.block_uuid(volume), "", "")


def test_a_crash_after_the_block_image_before_the_pv_reuses_it(env: Env) -> None:  # noqa: F811
    made = env.claim("raw", size="8Mi", mode="Block")
    volume = f"pvc-{made['metadata']['uid']}"
    images = env.pool_env.pool.images
    image_uuid = images.create_block(volume, 8 * MiB, provisioning=Provisioning.THIN)
    env.journal().put(ImageRecord(volume=volume, pool="fast", size=8 * MiB, fs_type="", provisioning="thin",
                                  claim_uid=made["metadata"]["uid"], claim="default/raw", state=ImageState.READY,
                                  since=1.0, volume_mode=BLOCK, image_uuid=image_uuid))
    env.start()
    pv = wait_for(lambda: env.bound_pv("raw"), what="the claim to be Bound")
    assert pv["spec"]["csi"]["volumeAttributes"][IMAGE_UUID] == image_uuid == images.block_uuid(volume)


def test_a_block_volume_grows_and_its_claim_is_finished_without_a_node_step(env: Env) -> None:  # noqa: F811
    env.start()
    env.claim("raw", size="8Mi", mode="Block")
    pv = wait_for(lambda: env.bound_pv("raw"), what="the claim to be Bound")
    volume = pv["metadata"]["name"]
    images = env.pool_env.pool.images
    with images.open_image(volume) as fd, loop.attach(fd, images.image_path(volume)) as staged:  # staged
        claim_now = env.pvc("raw")
        claim_now["spec"]["resources"]["requests"]["storage"] = "24Mi"
        env.server.update(claim_now)
        wait_for(lambda: any(r == "VolumeResizeSuccessful" for r, _ in env.reasons("raw")), what="the resize")
        assert staged.loop.size() == 24 * MiB, "the staged device sees the new size"
    assert images.usage(volume).size == 24 * MiB
    assert env.server.get("v1", "PersistentVolume", volume)["spec"]["capacity"]["storage"] == "24Mi"  # type: ignore[index]
    assert env.pvc("raw")["status"]["capacity"]["storage"] == "24Mi"
    assert not env.pvc("raw")["status"].get("conditions"), "no FileSystemResizePending: no filesystem"
    assert env.pvc("raw")["status"].get("allocatedResources") == {"storage": "24Mi"}
    assert not env.pvc("raw")["status"].get("allocatedResourceStatuses"), "done: no resize in progress"
    assert "FileSystemResizeRequired" not in [r for r, _ in env.reasons("raw")]


def test_a_released_block_volume_loses_its_image_once_unstaged(env: Env) -> None:  # noqa: F811
    env.start()
    env.claim("raw", mode="Block")
    pv = wait_for(lambda: env.bound_pv("raw"), what="the claim to be Bound")
    volume = pv["metadata"]["name"]
    images = env.pool_env.pool.images
    with images.open_image(volume) as fd:
        staged = loop.attach(fd, images.image_path(volume), autoclear=False)  # as the node stages it
    try:
        env.server.delete("v1", "PersistentVolumeClaim", "raw", "default")
        wait_for(lambda: any(r == "VolumeFailedDelete" and "not removed while staged" in m
                             for r, m in env.reasons(volume)), what="the refusal while staged")
        assert images.exists(volume)
    finally:
        staged.detach()
        staged.release()
    wait_for(lambda: env.server.get("v1", "PersistentVolume", volume) is None, timeout=30, what="the PV to go")
    assert not images.exists(volume)


def test_the_volume_mode_of_a_claim() -> None:
    """The API server refuses any other volumeMode; a claim that came past it is refused too."""
    assert rules.volume_mode({"spec": {}}) == "Filesystem"
    assert rules.volume_mode({"spec": {"volumeMode": "Block"}}) == "Block"
    with pytest.raises(rules.Refused, match="volumeMode: expected Filesystem or Block, got 'Raw'"):
        rules.volume_mode({"spec": {"volumeMode": "Raw"}})
    assert rules.image_size(1, None) == MiB and rules.image_size(MiB + 1, None) == 2 * MiB


def test_a_lost_journal_adopts_a_block_image_as_block(env: Env) -> None:  # noqa: F811
    env.start()
    env.claim("raw", size="8Mi", mode="Block")
    pv = wait_for(lambda: env.bound_pv("raw"), what="Bound")
    env.stop()
    env.journal_path.unlink()
    env.start()
    record = env.journal().get(pv["metadata"]["name"])
    assert record is not None and record.state is ImageState.READY and record.block
    assert record.image_uuid == pv["spec"]["csi"]["volumeAttributes"][IMAGE_UUID] and record.fs_type == ""

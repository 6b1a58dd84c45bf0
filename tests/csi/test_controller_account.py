"""The pool's account in the provisioning controller (issue 23.2, 23.6): thin and thick
claims on one real pool, parallel claims, failed allocations, a failed thick expansion, and
claims that must be refused with one event and nothing held - against the API emulator."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from localpv.config import ProvisionerConfig
from localpv.config.dynamic import DynamicClass, PoolConfig
from localpv.csi.images import FsType, ImageError, Provisioning
from localpv.csi.journal import ImageState
from localpv.csi.pools import Pool
from localpv.kube.api import KubeApi
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node, storage_class
from tests.conftest import wait_for
from tests.csi.conftest import PoolEnv
from tests.csi.test_controller import CLASS, DRIVER, NODE_NAME, Env
from tests.support.hostfs import LoopDevices, MiB, Mounter, sh

pytestmark = pytest.mark.root
THICK = "dyn-thick"


def make_env(apiserver: ApiServer, kube: KubeApi, pool_env: PoolEnv, tmp_path: Path, **pool: object) -> Env:
    apiserver.create(node(NODE_NAME))
    for name, provisioning in ((CLASS, "thin"), (THICK, "thick")):
        sc = storage_class(name, provisioner=DRIVER, parameters={"pool": "fast", "provisioning": provisioning})
        sc["allowVolumeExpansion"] = True
        apiserver.create(sc)
    config = PoolConfig(name="fast", host_dir=str(pool_env.root), mount_dir=str(pool_env.root), **pool)  # type: ignore[arg-type]
    pool_env.pool = Pool(config)
    settings = ProvisionerConfig(dynamic_pools={"fast": config}, dynamic_classes={
        CLASS: DynamicClass(CLASS, "fast"), THICK: DynamicClass(THICK, "fast", provisioning="thick")})
    return Env(apiserver, kube, pool_env, tmp_path / "state" / "csi-images.json", settings)


@pytest.fixture
def env(apiserver: ApiServer, kube: KubeApi, pool_env: PoolEnv, tmp_path: Path) -> Iterator[Env]:
    environment = make_env(apiserver, kube, pool_env, tmp_path)
    yield environment
    environment.close()


def rescheduled(env: Env, name: str) -> str | None:
    """The ProvisioningFailed message that rescheduled the claim, once it was."""
    pvc = env.pvc(name)
    if "volume.kubernetes.io/selected-node" in (pvc["metadata"].get("annotations") or {}):
        return None
    return next((m for r, m in env.reasons(name) if r == "ProvisioningFailed" and "rescheduling" in m), None)


def promised(env: Env) -> int:
    return sum(r.size for r in env.journal().snapshot().values())


def test_a_thick_claim_must_fit_what_a_thin_claim_was_promised(env: Env) -> None:
    """512 MiB pool: a thin claim of 300 MiB takes almost no blocks; a thick claim of 250 MiB
    would fit the free space, but not next to what the thin tenant was promised."""
    env.start()
    env.claim("thin", size="300Mi")
    wait_for(lambda: env.bound_pv("thin"), what="the thin claim to be Bound")
    env.server.create(_claim("thick", THICK, "250Mi"))
    message = wait_for(lambda: rescheduled(env, "thick"), what="the thick claim to be rescheduled")
    assert "does not fit" in message
    assert env.bound_pv("thick") is None and promised(env) == 300 * MiB


def test_parallel_claims_never_promise_more_than_the_pool_holds(env: Env) -> None:
    """A StatefulSet's burst: six thick claims of 120 MiB at once on a 512 MiB pool; the
    controller's four workers look at the pool together. At most three fit."""
    env.start()
    names = [f"burst-{i}" for i in range(6)]
    for name in names:
        env.server.create(_claim(name, THICK, "120Mi"))
    wait_for(lambda: all(env.bound_pv(n) or rescheduled(env, n) for n in names), timeout=60,
             what="every claim to be Bound or rescheduled")
    bound = [n for n in names if env.bound_pv(n)]
    st = os.statvfs(env.pool_env.root)
    assert len(bound) * 120 * MiB <= st.f_blocks * st.f_frsize
    assert 1 <= len(bound) <= 3 and promised(env) == len(bound) * 120 * MiB
    for volume in env.journal().snapshot().values():
        assert volume.state is ImageState.READY  # nothing half-made left holding room


def test_a_size_no_file_of_the_pool_can_have_is_refused_once_with_nothing_held(
        apiserver: ApiServer, kube: KubeApi, loops: LoopDevices, mounter: Mounter, tmp_path: Path) -> None:
    """A pool on ext2 with 1 KiB blocks holds files of at most 16 GiB; over-committed 100 times,
    its account may promise a 20 GiB thin image - which no file there can be (EFBIG). One
    ProvisioningFailed, no record, no remains, and no rescheduling: no node's pool of that kind
    would do better."""
    disk = loops.attach(512 * MiB)
    sh("mkfs.ext2", "-q", "-F", "-b", "1024", disk.path)
    root = mounter.device(disk.path, tmp_path / "pool")
    env = make_env(apiserver, kube, PoolEnv(root, Pool(PoolConfig(name="fast", host_dir=str(root),
                                                                  mount_dir=str(root)))), tmp_path, overcommit=100)
    try:
        env.start()
        env.claim("vast", size="20Gi")
        failed = wait_for(lambda: [m for r, m in env.reasons("vast") if r == "ProvisioningFailed"],
                          what="the claim refused")
        assert "larger than the pool's filesystem allows for one file" in failed[0]
        assert "rescheduling" not in failed[0]
        assert "volume.kubernetes.io/selected-node" in env.pvc("vast")["metadata"]["annotations"]
        assert env.journal().snapshot() == {} and env.pool_env.pool.images.names() == []
    finally:
        env.close()


def test_a_failed_allocation_drops_its_record_and_reschedules(
        apiserver: ApiServer, kube: KubeApi, pool_env: PoolEnv, tmp_path: Path) -> None:
    """The account said yes, then making the image failed (here its mkfs: options written past
    `config check`): its record and its remains go and the claim is rescheduled - never a
    record left to hold room and skip the account on every retry."""
    env = make_env(apiserver, kube, pool_env, tmp_path)
    env.config = ProvisionerConfig(dynamic_pools=env.config.dynamic_pools, dynamic_classes={
        **env.config.dynamic_classes, CLASS: DynamicClass(CLASS, "fast", mkfs_options="-E offset=4096")})
    try:
        env.start()
        env.claim("bad", size="64Mi")
        message = wait_for(lambda: rescheduled(env, "bad"), what="the claim to be rescheduled")
        assert "image truncated" in message, message
        assert env.journal().snapshot() == {} and env.pool_env.pool.images.names() == []
    finally:
        env.close()


def _claim(name: str, storage_class_name: str, size: str, **kw: object) -> dict[str, object]:
    from localpv_emulator.objects import claim

    return claim(name, storage_class_name, size=size, selected_node=NODE_NAME, **kw)  # type: ignore[arg-type]


def test_read_only_many_and_discard_on_thick_are_refused_with_one_event_and_nothing_held(
        apiserver: ApiServer, kube: KubeApi, pool_env: PoolEnv, tmp_path: Path) -> None:
    env = make_env(apiserver, kube, pool_env, tmp_path)
    sc = storage_class("thick-discard", provisioner=DRIVER, parameters={"pool": "fast", "provisioning": "thick"},
                       mount_options=["discard"])
    apiserver.create(sc)
    env.config = ProvisionerConfig(dynamic_pools=env.config.dynamic_pools, dynamic_classes={
        **env.config.dynamic_classes, "thick-discard": DynamicClass("thick-discard", "fast", provisioning="thick")})
    try:
        env.start()
        env.server.create(_claim("rox", CLASS, "64Mi", access_modes=("ReadOnlyMany",)))
        env.server.create(_claim("discard", "thick-discard", "64Mi"))
        for name, words in (("rox", "ReadOnlyMany"), ("discard", "'discard'")):
            failed = wait_for(lambda name=name: [m for r, m in env.reasons(name) if r == "ProvisioningFailed"],  # type: ignore[misc]
                              what=f"{name} refused")
            assert words in failed[0]
        assert env.journal().snapshot() == {} and env.pool_env.pool.images.names() == []
    finally:
        env.close()


def test_a_failed_thick_growth_is_rolled_back(pool_env: PoolEnv) -> None:
    """A thick image asked to grow by more than the pool can allocate: the file is truncated
    back to its old size (a half-allocated tail would take the pool's room for nothing), and
    the error says why in one line."""
    images = pool_env.pool.images
    images.create("pvc-grow", 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THICK)
    before = images.usage("pvc-grow")
    with pytest.raises(ImageError, match="the pool is full") as err:
        images.grow("pvc-grow", 4096 * MiB, provisioning=Provisioning.THICK)
    assert err.value.errno == errno.ENOSPC
    after = images.usage("pvc-grow")
    assert after.size == before.size and after.allocated <= before.allocated


def test_a_lost_image_journal_adopts_the_images_found_in_the_pool(env: Env) -> None:
    """The state dir was wiped with the pool disk kept: the images are recorded again - one a
    PV names as ready, one no PV names as orphaned - with an event each on the Node, so the
    account does not start from zero (issue 23.7)."""
    env.start()
    env.claim("kept", size="100Mi")
    pv = wait_for(lambda: env.bound_pv("kept"), what="Bound")
    env.stop()
    env.journal_path.unlink()
    stray_uuid = env.pool_env.pool.images.create("pvc-stray", 32 * MiB, fs=FsType.EXT4,
                                                 provisioning=Provisioning.THICK)
    env.start()
    records = env.journal().snapshot()
    kept, stray = records[pv["metadata"]["name"]], records["pvc-stray"]
    assert (kept.state, kept.pv_uid, kept.claim, kept.size) == (ImageState.READY, pv["metadata"]["uid"],
                                                                 "default/kept", 100 * MiB)
    assert (stray.state, stray.provisioning, stray.fs_uuid, stray.size) == (ImageState.ORPHANED, "thick", stray_uuid,
                                                                            32 * MiB)
    adopted = wait_for(lambda: (found := [m for r, m in env.reasons(NODE_NAME) if r == "ImageAdopted"]) and
                       len(found) >= 2 and found, what="the Node's two events (the recorder thread writes them)")
    assert len(adopted) == 2 and any("recorded as orphaned" in m for m in adopted)
    assert promised(env) == 132 * MiB


@pytest.mark.parametrize("state", [ImageState.CREATING, ImageState.READY])
def test_an_image_begun_for_a_claim_that_goes_holds_no_room_past_its_deletion(env: Env, state: ImageState) -> None:
    """An interrupted attempt's record (being made, or made before its PV was) whose claim is
    deleted: it is undone when the claim goes, not at the next resync (an hour here) - its room
    was held for nobody."""
    made = env.claim("waiting", node_name=None)
    volume = f"pvc-{made['metadata']['uid']}"
    env.pool_env.pool.images.create(volume, 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    from localpv.csi.journal import ImageJournal, ImageRecord

    ImageJournal(env.journal_path).put(ImageRecord(
        volume=volume, pool="fast", size=64 * MiB, fs_type="ext4", provisioning="thin",
        claim_uid=made["metadata"]["uid"], claim="default/waiting", state=state, since=1.0))
    env.start()
    assert env.journal().get(volume) is not None  # its claim still waits: the attempt is finished later
    env.server.delete("v1", "PersistentVolumeClaim", "waiting", "default")
    wait_for(lambda: env.journal().get(volume) is None, what="the record of the deleted claim's image to go")
    assert env.pool_env.pool.images.names() == []


def test_a_claim_whose_volume_has_an_orphaned_image_never_gets_it_made_again(env: Env) -> None:
    """An orphaned image (its PV deleted by hand) may hold its tenant's data: a pending claim of
    the same uid gets one ProvisioningFailed, never a new image made over it."""
    made = env.claim("again")
    volume = f"pvc-{made['metadata']['uid']}"
    images = env.pool_env.pool.images
    fs_uuid = images.create(volume, 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    from localpv.csi.journal import ImageJournal, ImageRecord

    ImageJournal(env.journal_path).put(ImageRecord(
        volume=volume, pool="fast", size=64 * MiB, fs_type="ext4", provisioning="thin",
        claim_uid=made["metadata"]["uid"],
        claim="default/again", state=ImageState.ORPHANED, since=1.0, fs_uuid=fs_uuid, pv_uid="gone"))
    env.start()
    failed = wait_for(lambda: [m for r, m in env.reasons("again") if r == "ProvisioningFailed"], what="refused")
    assert "recorded as orphaned" in failed[0]
    assert images.fs_uuid(volume) == fs_uuid and env.journal().get(volume).state is ImageState.ORPHANED  # type: ignore[union-attr]
    assert env.bound_pv("again") is None

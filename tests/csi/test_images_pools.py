"""Images, pools and the journal on real filesystems: sizes, thin vs thick, room, path safety."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from localpv.config.dynamic import PoolConfig
from localpv.csi.images import (
    BLOCK_XATTR,
    FsType,
    ImageError,
    ImageStore,
    Provisioning,
    Usage,
    check_name,
    ext4_size,
    mkfs_result_problem,
)
from localpv.csi.journal import BLOCK, ImageJournal, ImageJournalError, ImageRecord, ImageState
from localpv.csi.pools import Pool, PoolState
from tests.conftest import NEEDS_XFS
from tests.csi.conftest import PoolEnv
from tests.support.hostfs import LoopDevices, MiB, Mounter, sh


@pytest.mark.root
def test_thin_images_are_sparse_and_thick_ones_allocated(pool_env: PoolEnv) -> None:
    images = pool_env.pool.images
    images.create("pvc-thin", 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    images.create("pvc-thick", 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THICK)
    thin, thick = images.usage("pvc-thin"), images.usage("pvc-thick")
    assert thin.size == thick.size == 64 * MiB
    assert thin.allocated < 16 * MiB
    assert thick.allocated >= 64 * MiB, "mkfs must not punch holes into a thick image"
    assert images.grow("pvc-thick", 96 * MiB, provisioning=Provisioning.THICK) == 96 * MiB
    assert images.usage("pvc-thick").allocated >= 96 * MiB
    assert images.grow("pvc-thick", 32 * MiB, provisioning=Provisioning.THICK) == 96 * MiB, "never shrinks"
    with images.open_image("pvc-thin", writable=False) as fd:
        assert ext4_size(fd) == 64 * MiB


@pytest.mark.root
@NEEDS_XFS
def test_the_filesystem_uuid_is_the_one_chosen(pool_env: PoolEnv) -> None:
    images = pool_env.pool.images
    chosen = images.create("pvc-a", 320 * MiB, fs=FsType.XFS, provisioning=Provisioning.THIN,
                           fs_uuid="0b1c2d3e-0000-4000-8000-000000000009")
    assert chosen == images.fs_uuid("pvc-a") == "0b1c2d3e-0000-4000-8000-000000000009"


@pytest.mark.root
@pytest.mark.parametrize(("fs", "options", "size"), [
    (FsType.EXT4, "-n", 16 * MiB),                # mke2fs's dry run: exit 0, nothing written
    (FsType.EXT4, "-V", 16 * MiB),                # prints its version, exit 0, nothing written
    (FsType.EXT4, "-E offset=1048576", 16 * MiB),  # a filesystem, but 1 MiB into the image
    (FsType.EXT4, "-O journal_dev", 16 * MiB),    # an external journal: a superblock, no filesystem
    pytest.param(FsType.XFS, "-N", 320 * MiB, marks=NEEDS_XFS),  # mkfs.xfs's dry run
    pytest.param(FsType.XFS, "-V", 320 * MiB, marks=NEEDS_XFS),
])
def test_mkfs_that_made_no_filesystem_fails_the_create(pool_env: PoolEnv, fs: FsType, options: str,
                                                       size: int) -> None:
    """mkfs exited 0, yet the image does not hold the filesystem its PV would name: the create
    fails, and the image is truncated (nothing in it is anyone's data)."""
    images = pool_env.pool.images
    with pytest.raises(ImageError, match=rf"volume pvc-a: mkfs.{fs.value} exited 0 but the image holds no "
                                         rf"{fs.value} filesystem \(mkfsOptions \"{options}\"\); image truncated"):
        images.create("pvc-a", size, fs=fs, provisioning=Provisioning.THIN, mkfs_options=options,
                      fs_uuid="0b1c2d3e-0000-4000-8000-00000000000a")
    assert images.usage("pvc-a") == Usage(0, 0)


@pytest.mark.root
@pytest.mark.parametrize(("provisioning", "options"), [
    (Provisioning.THICK, "-E root_owner=1000:1000"),
    (Provisioning.THIN, "-E root_owner=1000:1000 -E lazy_itable_init=1"),
])
def test_every_extended_option_of_a_class_reaches_mke2fs(pool_env: PoolEnv, provisioning: Provisioning,
                                                         options: str) -> None:
    """mke2fs keeps only the last -E it is given: a thick class's options were replaced by the
    nodiscard localpv adds, and a class's own second -E replaced its first."""
    images = pool_env.pool.images
    images.create("pvc-a", 16 * MiB, fs=FsType.EXT4, provisioning=provisioning, mkfs_options=options)
    root = sh("debugfs", "-R", "stat /", images.image_path("pvc-a"))
    assert re.search(r"User:\s+1000\s+Group:\s+1000", root), root
    if provisioning is Provisioning.THICK:
        assert images.usage("pvc-a").allocated >= 16 * MiB, "nodiscard is still given: no hole punched"


def test_what_mkfs_left_is_judged_against_what_was_chosen() -> None:
    chosen = "0b1c2d3e-0000-4000-8000-00000000000a"
    assert mkfs_result_problem(FsType.EXT4, chosen, (FsType.EXT4, chosen)) is None
    assert mkfs_result_problem(FsType.EXT4, chosen, None) == "holds no ext4 filesystem"
    assert mkfs_result_problem(FsType.XFS, chosen, (FsType.EXT4, chosen)) == "holds ext4, not xfs"
    assert mkfs_result_problem(FsType.EXT4, chosen, (FsType.EXT4, "0b1c2d3e-0000-4000-8000-00000000000b")) == (
        f"holds filesystem UUID 0b1c2d3e-0000-4000-8000-00000000000b, not the {chosen} chosen for it")


@pytest.mark.root
def test_remove_refuses_an_attached_image(pool_env: PoolEnv) -> None:
    from localpv.csi import loop

    images = pool_env.pool.images
    images.create("pvc-a", 16 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    with images.open_image("pvc-a") as fd, loop.attach(fd, images.image_path("pvc-a")):
        with pytest.raises(ImageError, match="in use by /dev/loop"):
            images.remove("pvc-a")
        assert images.exists("pvc-a")
    assert images.remove("pvc-a") is True
    assert images.remove("pvc-a") is False
    assert not (pool_env.root / "pvc-a").exists()


def test_names_cannot_leave_the_pool(tmp_path: Path) -> None:
    for bad in ("..", ".", "../x", "a/b", "", "A", "-x", "x" * 254, "a..b"):
        with pytest.raises(ImageError):
            check_name(bad)
    assert check_name("pvc-0b1c2d3e-0000-4000-8000-000000000001")
    pool, outside = tmp_path / "pool", tmp_path / "outside"
    pool.mkdir()
    (outside / "pvc-x").mkdir(parents=True)
    (outside / "pvc-x" / "disk.img").write_bytes(b"secret")
    os.symlink(outside / "pvc-x", pool / "pvc-x")
    store = ImageStore(str(pool))
    with pytest.raises(ImageError, match="not a plain directory"):
        store.create("pvc-x", 16 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    with pytest.raises(ImageError, match="not a plain directory"):
        store.remove("pvc-x")
    (pool / "pvc-y").mkdir()
    os.symlink(outside / "pvc-x" / "disk.img", pool / "pvc-y" / "disk.img")
    with pytest.raises(ImageError, match="cannot be opened"):
        store.grow("pvc-y", 32 * MiB, provisioning=Provisioning.THIN)
    assert (outside / "pvc-x" / "disk.img").read_bytes() == b"secret"


def _pool(tmp_path: Path, **settings: object) -> Pool:
    return Pool(PoolConfig(name="p", host_dir=str(tmp_path), mount_dir=str(tmp_path), **settings))  # type: ignore[arg-type]


def test_pool_state_missing_and_not_mounted(tmp_path: Path) -> None:
    assert _pool(tmp_path / "nowhere").state()[0] is PoolState.MISSING
    state, why = _pool(tmp_path).state()  # a plain directory (tmp_path is not a mount point)
    assert state is PoolState.NOT_MOUNTED and "requireMount: false" in why
    assert _pool(tmp_path, require_mount=False).state() == (PoolState.READY, "")


@pytest.mark.root
def test_a_mounted_pool_is_ready(pool_env: PoolEnv) -> None:
    assert pool_env.pool.state() == (PoolState.READY, "")


@pytest.mark.root
@pytest.mark.parametrize("fs_type", ["tmpfs", "ramfs"])
@pytest.mark.parametrize("require_mount", [True, False])
def test_a_pool_in_memory_is_refused(tmp_path: Path, mounter: Mounter, fs_type: str, require_mount: bool) -> None:
    """A pool on tmpfs or ramfs would lose every image at the next reboot, its tenants' data with
    it: no image is made or staged there, whether the memory filesystem is mounted at the pool
    (requireMount) or the pool is a directory inside one."""
    memory = mounter.device("localpv-test", tmp_path / "memory", "-t", fs_type)
    root = memory / "pool" if not require_mount else memory
    root.mkdir(exist_ok=True)
    pool = Pool(PoolConfig(name="fast", host_dir="/mnt/fast", mount_dir=str(root), require_mount=require_mount))
    assert pool.state() == (PoolState.VOLATILE, (
        f"pool fast: /mnt/fast is on {fs_type}, which is memory: its images and their data would vanish at the next "
        "reboot; give the pool a directory on a disk's filesystem"))


@pytest.mark.root
def test_an_image_is_never_made_in_the_directory_a_pool_disk_left(tmp_path: Path, loops: LoopDevices,
                                                                  mounter: Mounter) -> None:
    """The pool's state is looked at, then the image made: a disk unmounted in between must
    not turn into an image on the node's root filesystem (what the directory is on then)."""
    root = mounter.device(loops.attach(64 * MiB, ext4=True).path, tmp_path / "pool")
    pool = Pool(PoolConfig(name="fast", host_dir=str(root), mount_dir=str(root)))
    assert pool.state() == (PoolState.READY, "")
    mounter.umount(root)
    with pytest.raises(ImageError, match="nothing is mounted at"):
        pool.images.create("pvc-a", 16 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    assert os.listdir(root) == []
    loose = Pool(PoolConfig(name="dir", host_dir=str(root), mount_dir=str(root), require_mount=False))
    loose.images.create("pvc-a", 16 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    assert loose.images.exists("pvc-a"), "a pool that is a plain directory on purpose still works"


def _record(volume: str, state: ImageState = ImageState.CREATING, size: int = MiB) -> ImageRecord:
    return ImageRecord(volume=volume, pool="p", size=size, fs_type="ext4", provisioning="thin", claim_uid="u-1",
                       claim="ns/c", state=state, since=1.0)


def test_journal_survives_restarts_and_counts_committed_bytes(tmp_path: Path) -> None:
    path = tmp_path / "state" / "csi-images.json"
    journal = ImageJournal(path)
    journal.put(_record("pvc-a", size=3 * MiB))
    journal.put(_record("pvc-b", ImageState.READY, size=5 * MiB).moved(ImageState.READY, 2.0, fs_uuid="x"))
    again = ImageJournal(path)
    assert again.snapshot() == journal.snapshot()
    assert again.get("pvc-b").fs_uuid == "x"  # type: ignore[union-attr]
    assert again.committed("p") == 8 * MiB and again.committed("other") == 0
    again.drop("pvc-a")
    assert set(ImageJournal(path).snapshot()) == {"pvc-b"}


def test_an_unreadable_journal_stops_rather_than_guesses(tmp_path: Path) -> None:
    path = tmp_path / "csi-images.json"
    path.write_text('{"version": 1, "images": {"pvc-a": {"state": "bogus"}}}')
    with pytest.raises(ImageJournalError, match=r"unreadable image journal.*Do not delete it"):
        ImageJournal(path)


@pytest.mark.root
@pytest.mark.parametrize("provisioning", [Provisioning.THIN, Provisioning.THICK])
def test_a_block_image_has_no_filesystem_and_is_marked_with_its_uuid(pool_env: PoolEnv,
                                                                     provisioning: Provisioning) -> None:
    images = pool_env.pool.images
    image_uuid = images.create_block("pvc-block", 5 * MiB, provisioning=provisioning)
    usage = images.usage("pvc-block")
    assert usage.size == 5 * MiB
    assert (usage.allocated >= 5 * MiB) if provisioning is Provisioning.THICK else (usage.allocated == 0)
    assert images.block_uuid("pvc-block") == image_uuid
    assert os.getxattr(images.image_path("pvc-block"), BLOCK_XATTR) == image_uuid.encode()
    assert images.fs_uuid("pvc-block") is None and images.fs_type("pvc-block") is None, "no mkfs"
    # Made again (an interrupted create retried) with its chosen UUID: the same mark.
    assert images.create_block("pvc-block", 5 * MiB, provisioning=provisioning, image_uuid=image_uuid) == image_uuid
    with pytest.raises(ImageError, match="at least 1 MiB"):
        images.create_block("pvc-tiny", 4096, provisioning=provisioning)
    # An image made with a filesystem over it (never for the same claim, but never marked Block).
    images.create("pvc-block", 8 * MiB, fs=FsType.EXT4, provisioning=provisioning)
    assert images.block_uuid("pvc-block") is None


@pytest.mark.root
def test_a_block_image_on_a_filesystem_without_extended_attributes_is_refused(tmp_path: Path,
                                                                              mounter: Mounter) -> None:
    root = mounter.ramfs(tmp_path / "pool")  # ramfs keeps no user extended attributes
    images = ImageStore(str(root))
    with pytest.raises(ImageError, match=r"keeps no extended attributes.*image truncated"):
        images.create_block("pvc-block", 2 * MiB, provisioning=Provisioning.THIN)
    assert images.usage("pvc-block").size == 0


def test_a_journal_without_block_images_reads_as_before_and_block_records_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "csi-images.json"
    journal = ImageJournal(path)
    fs = ImageRecord(volume="pvc-a", pool="fast", size=MiB, fs_type="ext4", provisioning="thin", claim_uid="u1",
                     claim="ns/a", state=ImageState.READY, since=1.0, fs_uuid="f")
    journal.put(fs)
    stored = path.read_text()
    assert "volume_mode" not in stored and "image_uuid" not in stored, "an older agent reads it"
    block = ImageRecord(volume="pvc-b", pool="fast", size=MiB, fs_type="", provisioning="thick", claim_uid="u2",
                        claim="ns/b", state=ImageState.READY, since=1.0, volume_mode=BLOCK, image_uuid="i")
    journal.put(block)
    again = ImageJournal(path)
    assert again.get("pvc-a") == fs and not fs.block
    assert again.get("pvc-b") == block and block.block

"""scan_directory on real discovery directories: mounts, loop devices, and everything else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localpv.host.identity import Identity
from localpv.host.mounts import mount_points
from localpv.host.scan import Entry, EntryKind, ScanError, look_again, same_volume, scan_directory

from .conftest import LoopDevices, MiB, Mounter


def by_name(entries: list[Entry]) -> dict[str, Entry]:
    return {e.name: e for e in entries}


@pytest.mark.root
def test_classifies_every_kind_of_entry(tmp_path: Path, mounter: Mounter, loops: LoopDevices) -> None:
    disc = tmp_path / "disks"
    disc.mkdir()
    mp = mounter.tmpfs(disc / "mp", size=4 * MiB)
    backing = mounter.tmpfs(tmp_path / "backing", size=2 * MiB)
    (backing / "vol").mkdir()
    bound = mounter.bind(backing / "vol", disc / "bound")
    dev = loops.attach(size=3 * MiB)
    (disc / "blk").symlink_to(dev.path)
    (disc / "plain").mkdir()
    (disc / "file").write_text("x")
    os.mkfifo(disc / "fifo")
    (disc / "dangling").symlink_to(tmp_path / "nowhere")
    (disc / "chardev").symlink_to("/dev/null")

    entries = scan_directory(str(disc), mount_points())

    assert [e.name for e in entries] == sorted(os.listdir(disc))
    got = by_name(entries)
    mp_st, bound_st, blk_rdev = os.stat(mp), os.stat(bound), os.stat(dev.path).st_rdev
    tmpfs = Identity("", "volatile: tmpfs has no device to identify it by")
    assert got["mp"] == Entry("mp", str(mp), EntryKind.MOUNTPOINT, 4 * MiB, None, mp_st.st_dev,
                              ident=f"fs:{mp_st.st_dev}:{mp_st.st_ino}", identity=tmpfs)
    # A bind mount is the directory it binds: its identity is the backing directory's.
    assert got["bound"] == Entry("bound", str(bound), EntryKind.MOUNTPOINT, 2 * MiB, None, os.stat(backing).st_dev,
                                 ident=f"fs:{bound_st.st_dev}:{bound_st.st_ino}", identity=tmpfs)
    assert bound_st.st_ino == os.stat(backing / "vol").st_ino
    assert got["blk"] == Entry("blk", str(disc / "blk"), EntryKind.BLOCK, 3 * MiB, None, blk_rdev,
                               ident=f"blk:{os.major(blk_rdev)}:{os.minor(blk_rdev)}",
                               identity=Identity(f"blk:loop={dev.backing}:ino={os.stat(dev.backing).st_ino}",
                                                 "loop device backing file"))
    assert got["plain"].kind is EntryKind.DIRECTORY
    assert got["plain"].reason == f'path "{disc}/plain" is not a valid mount point'
    for name in ("file", "fifo", "chardev"):
        assert got[name].kind is EntryKind.OTHER, name
        assert "neither a directory nor a block device" in str(got[name].reason)
    assert got["dangling"].kind is EntryKind.BROKEN
    assert "No such file or directory" in str(got["dangling"].reason)
    for name in ("plain", "file", "fifo", "chardev", "dangling"):
        assert (got[name].capacity, got[name].device) == (None, None), name


@pytest.mark.root
def test_mount_point_found_through_a_symlinked_discovery_dir(tmp_path: Path, mounter: Mounter) -> None:
    real = tmp_path / "real"
    mounter.tmpfs(real / "vol", size=1 * MiB)
    (tmp_path / "alias").symlink_to(real)
    (entry,) = scan_directory(str(tmp_path / "alias"), mount_points())
    assert (entry.path, entry.kind, entry.capacity) == (str(tmp_path / "alias" / "vol"), EntryKind.MOUNTPOINT, MiB)


@pytest.mark.root
def test_a_mount_gone_since_the_table_was_read_is_not_a_volume(tmp_path: Path, mounter: Mounter) -> None:
    """The mount table is read once per pass; a volume unmounted after that (an operator
    remounting disks one by one) must not be classified from the directory left behind: its
    capacity and identity would be those of the filesystem under it (the node's root), and a
    PV would be created over it."""
    disc = tmp_path / "disks"
    under = mounter.tmpfs(tmp_path / "under", size=6 * MiB)  # the filesystem the directory is on
    disc.symlink_to(under)
    mounter.tmpfs(under / "v3", size=2 * MiB)
    mounter.tmpfs(under / "v4", size=3 * MiB)
    table = mount_points()
    mounter.umount(under / "v3")  # gone before the scan looks at it
    mounter.umount(under / "v4")
    mounter.tmpfs(under / "v4", size=1 * MiB)  # another volume there now: it is the one looked at

    got = by_name(scan_directory(str(disc), table))

    assert got["v3"].kind is EntryKind.DIRECTORY
    assert got["v3"].reason == f'path "{disc}/v3" is not a valid mount point'
    assert (got["v3"].capacity, got["v3"].identity.value) == (None, "")
    assert (got["v4"].kind, got["v4"].capacity) == (EntryKind.MOUNTPOINT, 1 * MiB)


@pytest.mark.root
def test_looking_again_tells_whether_the_path_still_shows_the_same_volume(
    tmp_path: Path, mounter: Mounter, loops: LoopDevices
) -> None:
    disc = tmp_path / "disks"
    disk_x, disk_y = loops.attach(size=16 * MiB, ext4=True), loops.attach(size=16 * MiB, ext4=True)
    mounter.device(disk_x.path, disc / "a")
    (before,) = scan_directory(str(disc), mount_points())
    assert same_volume(before, look_again(before))
    mounter.umount(disc / "a")
    assert not same_volume(before, look_again(before)), "unmounted: the directory underneath"
    mounter.device(disk_y.path, disc / "a")
    assert not same_volume(before, look_again(before)), "another disk (same size, same root inode)"
    mounter.umount(disc / "a")
    mounter.device(disk_x.path, disc / "a")
    assert same_volume(before, look_again(before)), "the same disk mounted again"


def test_plain_directories_are_not_mount_points_without_the_table(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (entry,) = scan_directory(str(tmp_path), frozenset())
    assert entry.kind is EntryKind.DIRECTORY


def test_odd_names_do_not_break_the_scan(tmp_path: Path) -> None:
    names = [" lead space", "new\nline", "tab\t", "ünïcødé 🚀", "x" * 255, "-dash", ".hidden", "back\\slash"]
    for name in names:
        (tmp_path / name).mkdir()
    raw = os.fsdecode(b"latin1-\xe9")
    (tmp_path / raw).write_text("x")
    entries = scan_directory(str(tmp_path), frozenset())
    assert [e.name for e in entries] == sorted([*names, raw])
    assert {e.kind for e in entries if e.name != raw} == {EntryKind.DIRECTORY}
    assert by_name(entries)[raw].kind is EntryKind.OTHER
    assert all(e.path == os.path.join(tmp_path, e.name) for e in entries)


def test_empty_directory(tmp_path: Path) -> None:
    assert scan_directory(str(tmp_path), frozenset()) == []


@pytest.mark.parametrize("make", ["missing", "file"])
def test_unlistable_discovery_dir_raises_scan_error(tmp_path: Path, make: str) -> None:
    path = tmp_path / "disks"
    if make == "file":
        path.write_text("x")
    with pytest.raises(ScanError, match="disks") as exc:
        scan_directory(str(path), frozenset())
    assert exc.value.path == str(path)
    assert isinstance(exc.value.error, OSError)

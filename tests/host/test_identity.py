"""Stable identities on real devices: ext4 and xfs on loop devices, partitions, bind mounts.

The point of an identity is that it follows the disk, not the number the kernel gave it:
each test that renumbers detaches images and attaches them again on chosen loop devices,
as a reboot that enumerates disks in another order does, and checks the identity read at
a device number is the identity of the image now behind it - with the same reader, whose
cache must not hand out the old answer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localpv.host.identity import Identity, IdentityReader, read_udev_properties
from localpv.host.mounts import MountInfo, read_mountinfo
from tests.conftest import NEEDS_XFS, needs_tools, wait_for
from tests.support.hostfs import LoopDevice, LoopDevices, Mounter, mkfs, sh

pytestmark = pytest.mark.root

MiB = 1024 * 1024


def blkid(device: str, tag: str) -> str:
    return sh("blkid", "-p", "-o", "value", "-s", tag, device).strip()


def mount_of(path: Path) -> MountInfo:
    real = os.path.realpath(path)
    return next(m for m in reversed(read_mountinfo()) if m.mount_point == real)


def fs_identity(reader: IdentityReader, path: Path) -> Identity:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        return reader.filesystem(mount_of(path), fd, os.fstat(fd))
    finally:
        os.close(fd)


def block_identity(reader: IdentityReader, device: str) -> Identity:
    return reader.block(os.stat(device).st_rdev)


@pytest.mark.parametrize("fs", ["ext4", pytest.param("xfs", marks=NEEDS_XFS)])
def test_a_filesystem_is_known_by_its_uuid_as_libblkid_reads_it(
    fs: str, loops: LoopDevices, mounter: Mounter, tmp_path: Path
) -> None:
    dev = loops.attach(size=320 * MiB if fs == "xfs" else 16 * MiB, fs=fs)
    mounted = mounter.device(dev.path, tmp_path / "mnt")
    identity = fs_identity(IdentityReader(str(tmp_path / "no-udev")), mounted)
    assert identity == Identity(f"fs:uuid={blkid(dev.path, 'UUID')}", "filesystem UUID (libblkid)")
    assert not identity.volatile


def test_renumbered_disks_keep_their_identities_and_the_cache_does_not_lie(
    loops: LoopDevices, mounter: Mounter, tmp_path: Path
) -> None:
    reader = IdentityReader(str(tmp_path / "no-udev"))
    a, b = loops.attach(size=16 * MiB, ext4=True), loops.attach(size=16 * MiB, ext4=True)
    uuid_a, uuid_b = blkid(a.path, "UUID"), blkid(b.path, "UUID")
    assert uuid_a != uuid_b
    first = mounter.device(a.path, tmp_path / "first")
    assert fs_identity(reader, first).value == f"fs:uuid={uuid_a}"
    assert block_identity(reader, a.path).value == f"blk:loop={a.backing}:ino={a.backing.stat().st_ino}"
    mounter.umount(first)
    # "Reboot": both disks come back on each other's device number.
    numbers = (a.path, b.path)
    loops.detach(a)
    loops.detach(b)
    b2 = loops.attach_image(b.backing, numbers[0])
    a2 = loops.attach_image(a.backing, numbers[1])
    assert b2.path == a.path
    first = mounter.device(b2.path, tmp_path / "first")  # mounted by device name, as fstab did
    assert fs_identity(reader, first).value == f"fs:uuid={uuid_b}"
    assert block_identity(reader, a2.path).value == f"blk:loop={a.backing}:ino={a.backing.stat().st_ino}"
    assert block_identity(reader, b2.path).value.startswith(f"blk:loop={b.backing}:")


def test_a_disk_reformatted_in_place_is_another_volume(loops: LoopDevices, mounter: Mounter, tmp_path: Path) -> None:
    reader = IdentityReader(str(tmp_path / "no-udev"))
    dev = loops.attach(size=16 * MiB, ext4=True)
    target = tmp_path / "mnt"
    before = fs_identity(reader, mounter.device(dev.path, target))
    mounter.umount(target)
    mkfs("ext4", dev.path)
    after = fs_identity(reader, mounter.device(dev.path, target))
    assert before.value != after.value and after.value == f"fs:uuid={blkid(dev.path, 'UUID')}"


def test_a_bind_mounted_directory_is_the_filesystem_plus_its_inode_and_generation(
    ext4_loop: LoopDevice, mounter: Mounter, tmp_path: Path
) -> None:
    reader = IdentityReader(str(tmp_path / "no-udev"))
    whole = mounter.device(ext4_loop.path, tmp_path / "whole")
    (whole / "vol").mkdir()
    bound = mounter.bind(whole / "vol", tmp_path / "bound")
    identity = fs_identity(reader, bound)
    uuid = blkid(ext4_loop.path, "UUID")
    ino = os.stat(whole / "vol").st_ino
    assert identity.value.startswith(f"fs:uuid={uuid}:ino={ino}:gen=")
    assert identity.value != fs_identity(reader, whole).value
    # The directory deleted and made again (its inode number may well be reused) is another volume.
    mounter.umount(bound)
    (whole / "vol").rmdir()
    (whole / "vol").mkdir()
    again = fs_identity(reader, mounter.bind(whole / "vol", tmp_path / "bound"))
    assert again.value != identity.value


@needs_tools("sfdisk")
def test_a_partition_is_known_by_its_partition_uuid(loops: LoopDevices, tmp_path: Path) -> None:
    reader = IdentityReader(str(tmp_path / "no-udev"))
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(32 * MiB)
    sh("sh", "-c", f"printf 'label: gpt\\n,8M\\n,8M\\n' | sfdisk -q {image}")
    disk = loops.attach_image(image)
    # partx, not losetup --partscan: this kernel's loop driver scans no partitions itself.
    # -u also replaces partitions a previous user of this loop device may have left behind.
    sh("partx", "-u", disk.path)
    try:
        parts = [f"{disk.path}p1", f"{disk.path}p2"]
        wait_for(lambda: all(os.path.exists(p) for p in parts), timeout=10, what="the partitions' device nodes")
        ids = [block_identity(reader, p) for p in parts]
        expected = [f"blk:partuuid={blkid(p, 'PART_ENTRY_UUID')}" for p in parts]
    finally:
        sh("partx", "-d", disk.path)
    assert [i.value for i in ids] == expected and ids[0].value != ids[1].value
    assert ids[0].how == "partition UUID (libblkid)"


def test_tmpfs_has_no_identity_and_says_so(tmpfs: Path, tmp_path: Path) -> None:
    identity = fs_identity(IdentityReader(str(tmp_path / "no-udev")), tmpfs)
    assert identity.volatile and identity.value == ""
    assert "tmpfs" in identity.how


def test_udev_properties_come_first_for_hardware_identities(loop_device: LoopDevice, tmp_path: Path) -> None:
    """On a node with udev, its database names the disk's WWN or serial (this machine has no
    udev, so the test writes a database entry in udev's own format for a real device)."""
    rdev = os.stat(loop_device.path).st_rdev
    data = tmp_path / "udev" / "data"
    data.mkdir(parents=True)
    entry = data / f"b{os.major(rdev)}:{os.minor(rdev)}"
    entry.write_text("S:disk/by-id/wwn-0x5000c500a1b2c3d4\nI:1234\nE:ID_SERIAL=ST4000NM_ZC12345\n"
                     "E:ID_WWN=0x5000c500a1b2c3d4\nG:systemd\n")
    assert read_udev_properties(os.major(rdev), os.minor(rdev), str(tmp_path / "udev"))["ID_WWN"] == \
        "0x5000c500a1b2c3d4"
    reader = IdentityReader(str(tmp_path / "udev"))
    assert reader.block(rdev) == Identity("blk:wwn=0x5000c500a1b2c3d4", "WWN (udev)")
    entry.write_text("E:ID_SERIAL=ST4000NM_ZC12345\n")
    assert IdentityReader(str(tmp_path / "udev")).block(rdev) == Identity("blk:serial=ST4000NM_ZC12345",
                                                                          "serial (udev)")


def test_a_mounts_identity_is_read_once_and_a_new_mount_is_read_again(
    ext4_loop: LoopDevice, mounter: Mounter, tmp_path: Path
) -> None:
    """Cached by the mount's unique id (Linux 6.8+), which no later mount gets: the same disk
    mounted again, or reformatted and mounted again, is read afresh."""
    from localpv.host.statx import unique_mount_id

    reader = IdentityReader(str(tmp_path / "no-udev"))
    target = mounter.device(ext4_loop.path, tmp_path / "mnt")
    fd = os.open(target, os.O_PATH | os.O_CLOEXEC)
    try:
        if unique_mount_id(fd) is None:
            pytest.skip("this kernel has no unique mount ids (before 6.8): nothing is cached")
    finally:
        os.close(fd)
    first = fs_identity(reader, target)
    assert fs_identity(reader, target) == first and reader.reads == 1
    mounter.umount(target)
    mkfs("ext4", ext4_loop.path)
    again = fs_identity(reader, mounter.device(ext4_loop.path, tmp_path / "mnt"))
    assert reader.reads == 2 and again.value != first.value


def test_a_loop_devices_identity_is_the_same_from_any_mount_namespace(tmp_path: Path) -> None:
    """A loop device attached in another mount namespace (an earlier agent container) through a
    path only that namespace has: its identity, read here after that namespace is gone, is the
    one read there (sysfs now renders its backing file relative to a mount that is gone)."""
    import subprocess
    import sys
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="lpv-", dir="/tmp"))  # lo_file_name holds 63 bytes
    try:
        image = tmp_path / "disk.img"
        image.write_bytes(b"\0" * MiB)
        view = short / "view"
        view.mkdir()
        read = ("import os, sys; from localpv.host.identity import IdentityReader; "
                "print(sys.argv[1], IdentityReader('/nonexistent').block(os.stat(sys.argv[1]).st_rdev).value)")
        script = (f"mount --bind {tmp_path} {view} && dev=$(losetup --find --show {view}/disk.img) && "
                  f"{sys.executable} -c \"{read}\" $dev")
        proc = subprocess.run(["unshare", "-m", "--propagation", "unchanged", "--", "sh", "-c", script],
                              capture_output=True, text=True, check=False, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        assert proc.returncode == 0, proc.stderr
        device, there = proc.stdout.split()
        try:
            backing = Path(f"/sys/block/{device[5:]}/loop/backing_file").read_text().strip()
            assert backing == "/disk.img", "rendered through a mount that is gone"
            assert there == f"blk:loop={view}/disk.img:ino={image.stat().st_ino}"
            assert IdentityReader(str(tmp_path / "no-udev")).block(os.stat(device).st_rdev).value == there
        finally:
            sh("losetup", "-d", device)
    finally:
        os.rmdir(short / "view")
        os.rmdir(short)

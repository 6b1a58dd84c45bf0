"""What may be wiped at all (issue 11, finding 6), on real mounts and loop devices.

A filesystem volume is a mount point directly inside its discovery directory; a plain
directory there means the volume's disk is not mounted, and wiping it would wipe the
filesystem underneath (the host's root disk). A block volume is a block device nothing
else uses: mounted, holding a mounted partition, or claimed by swap or device-mapper, it
is somebody's live disk. These are the checks; the cleaners and the CLI use them.
"""

from __future__ import annotations

import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from localpv.host.cleaner import block_device_problem
from localpv.host.fsclean import directly_inside, mount_point_problem
from tests.conftest import wait_for
from tests.support.hostfs import LoopDevice, Mounter, sh

pytestmark = pytest.mark.root

SECTOR = 512


def write_one_partition_table(image: Path, size: int) -> None:
    """An MBR with one Linux partition from sector 2048 to the end (no sfdisk needed)."""
    start = 2048
    entry = struct.pack("<B3sB3sII", 0, b"\0\0\0", 0x83, b"\0\0\0", start, size // SECTOR - start)
    with open(image, "wb") as f:
        f.truncate(size)
        f.seek(446)
        f.write(entry)
        f.seek(510)
        f.write(b"\x55\xaa")


@pytest.fixture
def partitioned_loop(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A loop device with one partition: (whole disk, partition)."""
    image = tmp_path / "disk.img"
    write_one_partition_table(image, 16 * 1024 * 1024)
    dev = sh("losetup", "--find", "--show", "--partscan", image).strip()
    part = f"{dev}p1"
    try:
        if not os.path.exists(part):
            subprocess.run(["partx", "-a", dev], capture_output=True, check=False)
        wait_for(lambda: os.path.exists(part), timeout=5, what=f"{part} to appear")
        yield dev, part
    finally:
        subprocess.run(["partx", "-d", dev], capture_output=True, check=False)
        sh("losetup", "-d", dev)


# ---------------------------------------------------------------- block devices


def test_a_free_block_device_is_accepted(loop_device: LoopDevice, tmp_path: Path) -> None:
    assert block_device_problem(loop_device.path) is None
    link = tmp_path / "by-id-style"
    link.symlink_to(loop_device.path)
    assert block_device_problem(str(link)) is None, "block volumes are symlinks into /dev"


def test_what_is_not_a_block_device_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    assert block_device_problem(str(tmp_path / "file")) == "expected a block device, found a regular file"
    assert block_device_problem(str(tmp_path / "dir")) == "expected a block device, found a directory"
    assert block_device_problem("/dev/null") == "expected a block device, found a character device"
    assert block_device_problem(str(tmp_path / "missing")) == (
        "expected a block device, found nothing there (No such file or directory)")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert block_device_problem(str(tmp_path / "fifo")) == "expected a block device, found a FIFO"


def test_a_mounted_device_is_in_use(ext4_loop: LoopDevice, tmp_path: Path, mounter: Mounter) -> None:
    mounter.device(ext4_loop.path, tmp_path / "mnt")
    problem = block_device_problem(ext4_loop.path)
    assert problem is not None and problem.startswith("expected a block device that nothing uses, found it busy")


def test_a_disk_holding_a_mounted_partition_is_in_use(partitioned_loop: tuple[str, str], tmp_path: Path) -> None:
    disk, part = partitioned_loop
    sh("mkfs.ext4", "-q", "-F", part)
    assert block_device_problem(disk) is None
    target = tmp_path / "mnt"
    target.mkdir()
    sh("mount", part, target)
    try:
        assert "found it busy" in str(block_device_problem(disk))
        assert "found it busy" in str(block_device_problem(part))
    finally:
        sh("umount", target)
    assert block_device_problem(disk) is None


def test_a_device_claimed_by_the_kernel_is_in_use(loop_device: LoopDevice) -> None:
    """Swap claims its device exclusively, as device-mapper and md do (no dm here to test)."""
    sh("mkswap", "-q", loop_device.path)
    sh("swapon", loop_device.path)
    try:
        assert "found it busy" in str(block_device_problem(loop_device.path))
    finally:
        sh("swapoff", loop_device.path)


# ---------------------------------------------------------------- filesystem volumes


def test_mount_points_and_what_is_not(tmp_path: Path, mounter: Mounter) -> None:
    vol = mounter.tmpfs(tmp_path / "vol")
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(vol)
    (tmp_path / "self").mkdir()
    mounter.bind(tmp_path / "self", tmp_path / "self")
    assert mount_point_problem(str(vol)) is None
    assert mount_point_problem(str(tmp_path / "self")) is None, "a same-filesystem bind is a mount too"
    expected = "expected a mount point (a mounted volume), found"
    assert mount_point_problem(str(tmp_path / "plain")) == (
        f"{expected} a plain directory on the same mount as its parent")
    assert mount_point_problem(str(tmp_path / "file")) == f"{expected} a regular file"
    assert mount_point_problem(str(tmp_path / "link")) == f"{expected} a symlink"
    assert mount_point_problem(str(tmp_path / "missing")) == f"{expected} nothing there (No such file or directory)"
    assert mount_point_problem("/") == f"{expected} the root directory"


def test_directly_inside_compares_directories_not_strings(tmp_path: Path) -> None:
    base = tmp_path / "disks"
    (base / "vol" / "deeper").mkdir(parents=True)
    (tmp_path / "disks-evil" / "vol").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(base)
    (base / "escape").symlink_to(tmp_path / "disks-evil")
    (base / "deep-escape").symlink_to(tmp_path / "disks-evil" / "vol")
    assert directly_inside(str(base / "vol"), str(base))
    assert directly_inside(str(tmp_path / "alias" / "vol"), str(base))
    assert directly_inside(str(base / "vol"), str(tmp_path / "alias"))
    assert not directly_inside(str(base / "vol" / "deeper"), str(base))
    assert not directly_inside(str(tmp_path / "disks-evil" / "vol"), str(base))
    assert not directly_inside(str(base / "escape" / "vol"), str(base))
    assert not directly_inside(f"{base}/deep-escape/../vol", str(base)), "the kernel's '..', not a string's"
    assert not directly_inside(str(base / "escape"), str(base)), "a symlink to a directory elsewhere"
    assert not directly_inside(str(base / "vol" / ".."), str(base))
    assert not directly_inside(str(base), str(base))
    assert not directly_inside(str(base / "vol"), str(tmp_path / "missing"))

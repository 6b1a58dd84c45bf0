"""The agent's in-process cleaners refuse what must not be wiped (issue 11, finding 6).

A plain directory where a filesystem volume should be mounted means its disk is not
mounted: the directory belongs to the filesystem underneath (the host's root disk). A
block device that is mounted, holds a mounted partition or is claimed by the kernel is
somebody's live disk. Both cleanups fail with the reason, so they are retried later and
the volume is not reported clean; nothing is touched, and a block cleaner command is not
even started.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from localpv.agent.cleaning import block_cleaner, filesystem_cleaner
from tests.support.hostfs import LoopDevice, LoopDevices, Mounter

pytestmark = pytest.mark.root


def marker_command(marker: Path) -> list[str]:
    """A cleaner that only proves it ran."""
    return ["sh", "-c", f'echo "$LOCAL_PV_BLKDEVICE" > "{marker}"']


def test_block_cleaner_refuses_a_mounted_device(ext4_loop: LoopDevice, tmp_path: Path, mounter: Mounter) -> None:
    mounter.device(ext4_loop.path, tmp_path / "mnt")
    marker = tmp_path / "cleaner-ran"
    outcome = block_cleaner(ext4_loop.path, marker_command(marker), timeout=10)(threading.Event())
    assert not outcome.ok
    assert outcome.message.startswith(f"refusing to clean {ext4_loop.path}: expected a block device that nothing")
    assert not marker.exists(), "the cleaner command must not run on a device in use"


def test_block_cleaner_refuses_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("keep")
    marker = tmp_path / "cleaner-ran"
    outcome = block_cleaner(str(tmp_path / "file"), marker_command(marker), timeout=10)(threading.Event())
    assert (outcome.ok, outcome.message) == (
        False, f"refusing to clean {tmp_path / 'file'}: expected a block device, found a regular file")
    assert not marker.exists()


def test_block_cleaner_runs_on_a_free_device(loop_device: LoopDevice, tmp_path: Path) -> None:
    marker = tmp_path / "cleaner-ran"
    outcome = block_cleaner(loop_device.path, marker_command(marker), timeout=10)(threading.Event())
    assert outcome.ok, outcome.message
    assert marker.read_text().strip() == loop_device.path


def test_filesystem_cleaner_refuses_an_unmounted_volume(tmp_path: Path) -> None:
    """The disk under mountDir/vol1 was unmounted: the directory left there is the host's."""
    mount_dir = tmp_path / "disks"
    (mount_dir / "vol1" / "etc").mkdir(parents=True)
    (mount_dir / "vol1" / "etc" / "host-file").write_text("host data")
    outcome = filesystem_cleaner(str(mount_dir / "vol1"), str(mount_dir))(threading.Event())
    assert not outcome.ok
    assert "not a mount point" in outcome.message and str(mount_dir / "vol1") in outcome.message
    assert (mount_dir / "vol1" / "etc" / "host-file").read_text() == "host data"


def test_filesystem_cleaner_refuses_a_mount_not_directly_inside(tmp_path: Path, mounter: Mounter) -> None:
    mount_dir = tmp_path / "disks"
    vol = mounter.tmpfs(mount_dir / "nested" / "vol1")
    (vol / "f").write_text("x")
    outcome = filesystem_cleaner(str(vol), str(mount_dir))(threading.Event())
    assert (outcome.ok, outcome.message) == (
        False, f"refusing to clean {vol}: expected a directory directly inside {mount_dir}, "
               f"found one inside {mount_dir / 'nested'}")
    assert (vol / "f").exists()


def test_filesystem_cleaner_cleans_a_mounted_volume(tmp_path: Path, mounter: Mounter) -> None:
    mount_dir = tmp_path / "disks"
    vol = mounter.tmpfs(mount_dir / "vol1")
    (vol / "d").mkdir()
    (vol / "d" / "f").write_text("x")
    outcome = filesystem_cleaner(str(vol), str(mount_dir))(threading.Event())
    assert outcome.ok, outcome.message
    assert os.listdir(vol) == []




def test_an_empty_volume_needs_no_cleaner_process_but_every_check_still_holds(
    tmp_path: Path, mounter: Mounter, loops: LoopDevices, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every volume of a first start is cleaned before it is offered, and is usually empty: a
    Python child per volume cost ~85 ms of CPU each. An empty volume is told clean without
    one, but only after the same refusals (not a mount point, not directly inside, another
    disk than the one the cleanup was decided for); anything else still goes to the child."""
    from localpv.agent import cleaning

    monkeypatch.setattr(cleaning, "_FS_CLEANER", ("/nonexistent/cleaner",))  # a child would fail
    mount_dir = tmp_path / "disks"
    vol = mounter.tmpfs(mount_dir / "vol1")
    outcome = filesystem_cleaner(str(vol), str(mount_dir))(threading.Event())
    assert (outcome.ok, outcome.message) == (True, "removed 0 files and 0 directories in 0.0s (it was empty)")
    refused = [
        filesystem_cleaner(str(mount_dir / "plain"), str(mount_dir)),  # not a mount point
        filesystem_cleaner(str(vol), str(tmp_path)),  # not directly inside mountDir
    ]
    (mount_dir / "plain").mkdir()
    disk = loops.attach(size=16 * 1024 * 1024, ext4=True)
    ext4 = mounter.device(disk.path, mount_dir / "vol2")
    for name in os.listdir(ext4):  # lost+found: an empty filesystem
        os.rmdir(ext4 / name)
    refused.append(filesystem_cleaner(str(ext4), str(mount_dir), expect_identity="fs:uuid=not-this-one"))
    for clean in refused:
        outcome = clean(threading.Event())
        assert not outcome.ok and "/nonexistent/cleaner" in outcome.message, "went to the child, which refuses"
    (vol / "f").write_text("x")
    assert not filesystem_cleaner(str(vol), str(mount_dir))(threading.Event()).ok, "not empty: the child"
    assert (vol / "f").exists()

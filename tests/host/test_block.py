"""Block device size and type on real loop devices; kernel uevents through the monitor."""

from __future__ import annotations

import errno
import os
import select
import time
from pathlib import Path

import pytest

from localpv.host.block import BlockDeviceMonitor, block_device_size, is_block_device
from localpv.host.capacity import filesystem_capacity

from .conftest import LoopDevice, LoopDevices, MiB, Mounter, sh


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.root
def test_size_of_a_loop_device_is_its_file_size(loops: LoopDevices) -> None:
    dev = loops.attach(size=5 * MiB + 4096)
    assert block_device_size(dev.path) == 5 * MiB + 4096 == os.path.getsize(dev.backing)


@pytest.mark.root
def test_size_through_a_symlink(tmp_path: Path, loop_device: LoopDevice) -> None:
    link = tmp_path / "by-id-like"
    link.symlink_to(loop_device.path)
    assert block_device_size(str(link)) == loop_device.size


def test_size_of_a_regular_file_fails_with_the_path(tmp_path: Path) -> None:
    f = tmp_path / "not a device"
    f.write_bytes(b"x" * 4096)
    before = open_fds()
    with pytest.raises(OSError, match="BLKGETSIZE64") as exc:
        block_device_size(str(f))
    assert (exc.value.errno, exc.value.filename) == (errno.ENOTTY, str(f))
    assert open_fds() == before, "descriptor leaked on failure"


def test_size_of_a_missing_path_fails_with_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as exc:
        block_device_size(str(tmp_path / "gone"))
    assert exc.value.filename == str(tmp_path / "gone")


@pytest.mark.root
def test_is_block_device(tmp_path: Path, loop_device: LoopDevice) -> None:
    (tmp_path / "link").symlink_to(loop_device.path)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    assert is_block_device(loop_device.path)
    assert is_block_device(str(tmp_path / "link"))
    assert not is_block_device(str(tmp_path / "dangling"))
    assert not is_block_device(str(tmp_path / "file"))
    assert not is_block_device(str(tmp_path))
    assert not is_block_device("/dev/null")


@pytest.mark.root
def test_filesystem_capacity_is_total_size(
    tmpfs: Path, ext4_loop: LoopDevice, tmp_path: Path, mounter: Mounter
) -> None:
    assert filesystem_capacity(str(tmpfs)) == 8 * MiB
    target = mounter.device(ext4_loop.path, tmp_path / "ext4")
    blocks, block_size = map(int, sh("stat", "-f", "-c", "%b %S", target).split())
    assert filesystem_capacity(str(target)) == blocks * block_size
    assert 0 < filesystem_capacity(str(target)) < ext4_loop.size, "ext4 metadata is not counted"


def wait_for_events(monitor: BlockDeviceMonitor, node: str, timeout: float) -> list[tuple[str, str]]:
    """Poll the monitor until an event for ``node`` arrives or the deadline passes."""
    poller = select.poll()
    poller.register(monitor.fileno(), select.POLLIN)
    deadline = time.monotonic() + timeout
    seen: list[tuple[str, str]] = []
    while (remaining := deadline - time.monotonic()) > 0:
        if poller.poll(remaining * 1000):
            seen += monitor.drain()
            if any(dev == node for _, dev in seen):
                break
    return seen


@pytest.mark.root
def test_monitor_reports_an_attached_loop_device(loops: LoopDevices) -> None:
    with BlockDeviceMonitor() as monitor:
        monitor.drain()  # whatever else happened on the machine meanwhile
        dev = loops.attach()
        events = wait_for_events(monitor, dev.path, 5.0)
    assert any(action in ("add", "change") and node == dev.path for action, node in events), events


@pytest.mark.root
def test_monitor_drain_does_not_block_and_close_releases_the_socket() -> None:
    before = open_fds()
    monitor = BlockDeviceMonitor()
    assert open_fds() == before + 1
    t0 = time.monotonic()
    monitor.drain()
    assert time.monotonic() - t0 < 0.5
    monitor.close()
    monitor.close()
    assert open_fds() == before
    with pytest.raises(ValueError, match="closed"):
        monitor.fileno()

"""The shipped cleaner scripts, run the way the agent runs them (run_cleaner), on real loop
devices and real directory trees; the device is read back afterwards."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from localpv.host.cleaner import CleanerResult, run_cleaner
from tests.conftest import require_tools

from .conftest import LoopDevice, Mounter

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SECRET = b"LOCALPV-SECRET-DATA!"
EXT4_MAGIC_OFFSET = 1024 + 0x38


def clean(script: str, *args: str, **env: str) -> CleanerResult:
    lines: list[str] = []
    result = run_cleaner([str(SCRIPTS / script), *args], env, timeout=60, on_line=lines.append)
    assert result.error is None, result.error
    return result


def fill_with_secret(dev: LoopDevice) -> None:
    with open(dev.path, "r+b") as f:
        f.write(SECRET * (dev.size // len(SECRET)))
        f.flush()
        os.fsync(f.fileno())


def read_device(dev: LoopDevice) -> bytes:
    with open(dev.path, "rb") as f:
        return f.read()


def blkid_finds_a_signature(dev: LoopDevice) -> bool:
    """Low-level probe of the device itself (no cache): exit 0 found something, 2 found nothing."""
    probe = subprocess.run(["blkid", "-p", dev.path], check=False, capture_output=True, text=True)
    assert probe.returncode in (0, 2), probe.stderr
    return probe.returncode == 0


def test_scripts_are_executable_and_shellcheck_clean() -> None:
    scripts = sorted(SCRIPTS.glob("*.sh"))
    assert {s.name for s in scripts} >= {
        "common.sh",
        "quick_reset.sh",
        "shred.sh",
        "dd_zero.sh",
        "blkdiscard.sh",
        "fsclean.sh",
    }
    assert all(os.access(s, os.X_OK) for s in scripts)
    require_tools("shellcheck")
    proc = subprocess.run(["shellcheck", "-x", *map(str, scripts)], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.root
@pytest.mark.parametrize(
    ("script", "args"),
    [("shred.sh", ()), ("shred.sh", ("1",)), ("dd_zero.sh", ()), ("dd_zero.sh", ("2",)), ("blkdiscard.sh", ())],
)
def test_block_cleaner_leaves_only_zeros(loop_device: LoopDevice, script: str, args: tuple[str, ...]) -> None:
    fill_with_secret(loop_device)
    assert SECRET in read_device(loop_device)
    result = clean(script, *args, LOCAL_PV_BLKDEVICE=loop_device.path)
    assert result.succeeded, result.tail
    data = read_device(loop_device)
    assert len(data) == loop_device.size
    assert data.count(0) == len(data), f"{script} left non-zero bytes"


@pytest.mark.root
def test_block_cleaner_through_a_by_id_style_symlink(tmp_path: Path, loop_device: LoopDevice) -> None:
    fill_with_secret(loop_device)
    link = tmp_path / "disk-by-id-link"
    link.symlink_to(loop_device.path)
    assert clean("dd_zero.sh", LOCAL_PV_BLKDEVICE=str(link)).succeeded
    assert SECRET not in read_device(loop_device)


@pytest.mark.root
def test_quick_reset_wipes_filesystem_signatures(ext4_loop: LoopDevice) -> None:
    assert blkid_finds_a_signature(ext4_loop)
    result = clean("quick_reset.sh", LOCAL_PV_BLKDEVICE=ext4_loop.path)
    assert result.succeeded, result.tail
    assert not blkid_finds_a_signature(ext4_loop)
    assert read_device(ext4_loop)[EXT4_MAGIC_OFFSET : EXT4_MAGIC_OFFSET + 2] == b"\0\0"


@pytest.mark.root
@pytest.mark.parametrize("script", ["quick_reset.sh", "shred.sh", "dd_zero.sh", "blkdiscard.sh"])
def test_block_cleaners_refuse_a_mounted_device(ext4_loop: LoopDevice, tmp_path: Path, mounter: Mounter,
                                                script: str) -> None:
    # Cleanup Jobs run these scripts directly (upstream's format): the check must be theirs.
    mounted = mounter.device(ext4_loop.path, tmp_path / "in-use")
    (mounted / "keep").write_bytes(b"node data" * 100_000)
    os.sync()
    result = clean(script, LOCAL_PV_BLKDEVICE=ext4_loop.path)
    assert not result.succeeded
    assert any("in use" in line for line in result.tail), result.tail
    mounter.umount(mounted)
    assert blkid_finds_a_signature(ext4_loop)
    mounter.device(ext4_loop.path, mounted)
    assert (mounted / "keep").read_bytes() == b"node data" * 100_000


@pytest.mark.parametrize("script", ["quick_reset.sh", "shred.sh", "dd_zero.sh", "blkdiscard.sh"])
def test_block_cleaner_refuses_without_a_block_device(tmp_path: Path, script: str) -> None:
    missing = clean(script)
    assert missing.exit_code == 1
    assert any("LOCAL_PV_BLKDEVICE is not set" in line for line in missing.tail)
    (tmp_path / "file").write_bytes(SECRET)
    not_a_device = clean(script, LOCAL_PV_BLKDEVICE=str(tmp_path / "file"))
    assert not_a_device.exit_code == 1
    assert any("is not a block device" in line for line in not_a_device.tail)
    assert (tmp_path / "file").read_bytes() == SECRET


@pytest.mark.root
@pytest.mark.parametrize("script", ["shred.sh", "dd_zero.sh"])
@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", "2 3"])
def test_iterations_must_be_a_number(loop_device: LoopDevice, script: str, bad: str) -> None:
    fill_with_secret(loop_device)
    result = clean(script, bad, LOCAL_PV_BLKDEVICE=loop_device.path)
    assert result.exit_code == 1
    assert any("must be a non-negative integer" in line for line in result.tail)
    assert SECRET in read_device(loop_device), "nothing may be written on a usage error"


def make_tree(root: Path, outside: Path) -> None:
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "file").write_text("keep")
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "file with spaces").write_text("x")
    (root / ".hidden").write_text("x")
    (root / "lost+found").mkdir()
    (root / "link-out").symlink_to(outside / "precious")
    (root / "a" / "link-file").symlink_to(outside / "precious" / "file")
    ro = root / "read-only"
    (ro / "inner").mkdir(parents=True)
    ro.chmod(0o555)


@pytest.mark.root
def test_fsclean_empties_the_volume_without_following_symlinks(tmp_path: Path) -> None:
    vol, outside = tmp_path / "vol", tmp_path / "outside"
    make_tree(vol, outside)
    result = clean("fsclean.sh", LOCAL_PV_FILESYSTEM=str(vol))
    assert result.succeeded, result.tail
    assert vol.is_dir() and os.listdir(vol) == []
    assert (outside / "precious" / "file").read_text() == "keep"


@pytest.mark.root
def test_fsclean_fails_on_a_foreign_mount_and_leaves_it_alone(tmp_path: Path, mounter: Mounter) -> None:
    vol = tmp_path / "vol with space"
    (vol / "keep").mkdir(parents=True)
    foreign = mounter.tmpfs(vol / "keep" / "mnt", size=1024 * 1024)
    (foreign / "theirs").write_text("not ours")
    result = clean("fsclean.sh", LOCAL_PV_FILESYSTEM=str(vol))
    assert result.exit_code == 1
    assert any(f"a filesystem is mounted inside the volume; unmount it (findmnt -R {vol} lists it)" in line
               for line in result.tail)
    assert not any("keep" in line for line in result.tail), "tenant names appear in no message"
    assert (foreign / "theirs").read_text() == "not ours"


def test_fsclean_refuses_a_symlink_and_a_missing_dir(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "data").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert clean("fsclean.sh", LOCAL_PV_FILESYSTEM=str(tmp_path / "link")).exit_code == 1
    assert (tmp_path / "real" / "data").exists()
    assert clean("fsclean.sh", LOCAL_PV_FILESYSTEM=str(tmp_path / "missing")).exit_code == 1
    assert clean("fsclean.sh").exit_code == 1

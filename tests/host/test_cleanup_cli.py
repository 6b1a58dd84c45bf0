"""`localpv cleanup` wipes only a volume (issue 11, finding 6), run as the cleanup Job runs it.

``--dir`` must name a mount point directly inside a discovery dir given explicitly
(``--discovery-dir``, or the Filesystem classes of ``--config``); ``--device`` must name
a block device nothing uses. A refusal is one line on stderr naming the flag, what was
expected and what was found, with exit status 2 and nothing touched. Real processes,
mounts and loop devices.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from localpv.agent.jobs import build_cleanup_job
from localpv.agent.model import StartCleanup
from localpv.config import ClassConfig, ProvisionerConfig
from tests.support.hostfs import LoopDevice, Mounter

pytestmark = pytest.mark.root


def localpv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localpv", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def assert_refused(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit 2, one line, no traceback, every fragment in it."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def tenant_files(vol: Path) -> None:
    (vol / "d").mkdir()
    (vol / "d" / "f").write_text("hi")


# ---------------------------------------------------------------- --dir


def test_a_plain_directory_is_refused(tmp_path: Path) -> None:
    """The report's reproduction: mkdir -p /tmp/x/d; echo hi > /tmp/x/d/f; cleanup --dir /tmp/x."""
    x = tmp_path / "x"
    x.mkdir()
    tenant_files(x)
    proc = localpv("cleanup", "--dir", str(x))
    assert_refused(proc, f"--dir {x}", "expected a mount point", "found a plain directory")
    assert (x / "d" / "f").read_text() == "hi"
    proc = localpv("cleanup", "--dir", str(x), "--discovery-dir", str(tmp_path))
    assert_refused(proc, f"--dir {x}", "expected a mount point", "found a plain directory")
    assert (x / "d" / "f").read_text() == "hi"


def test_no_discovery_dir_is_refused(tmp_path: Path, mounter: Mounter) -> None:
    vol = mounter.tmpfs(tmp_path / "disks" / "vol1")
    tenant_files(vol)
    proc = localpv("cleanup", "--dir", str(vol))
    assert_refused(proc, f"--dir {vol}", "--discovery-dir", "--config", "--unsafe-any-directory")
    assert (vol / "d" / "f").exists()


def test_a_mount_outside_the_discovery_dir_is_refused(tmp_path: Path, mounter: Mounter) -> None:
    (tmp_path / "disks").mkdir()
    vol = mounter.tmpfs(tmp_path / "elsewhere" / "vol1")
    tenant_files(vol)
    proc = localpv("cleanup", "--dir", str(vol), "--discovery-dir", str(tmp_path / "disks"))
    assert_refused(proc, f"--dir {vol}", f"expected a directory directly inside {tmp_path / 'disks'}",
                   f"found one inside {tmp_path / 'elsewhere'}")
    assert (vol / "d" / "f").exists()


def test_a_missing_discovery_dir_is_refused(tmp_path: Path, mounter: Mounter) -> None:
    vol = mounter.tmpfs(tmp_path / "disks" / "vol1")
    proc = localpv("cleanup", "--dir", str(vol), "--discovery-dir", str(tmp_path / "nope"))
    assert_refused(proc, f"--discovery-dir {tmp_path / 'nope'}", "expected a directory", "found nothing")


def test_a_volume_in_its_discovery_dir_is_cleaned(tmp_path: Path, mounter: Mounter) -> None:
    vol = mounter.tmpfs(tmp_path / "disks" / "vol1")
    tenant_files(vol)
    (tmp_path / "other").mkdir()
    proc = localpv("cleanup", "--dir", str(vol), "--discovery-dir", str(tmp_path / "other"),
                   "--discovery-dir", str(tmp_path / "disks"))
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(vol) == []


def test_the_discovery_dirs_can_come_from_the_config(tmp_path: Path, mounter: Mounter) -> None:
    vol = mounter.tmpfs(tmp_path / "disks" / "vol1")
    tenant_files(vol)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"storageClassMap": {
        "fast": {"hostDir": "/mnt/fast", "mountDir": str(tmp_path / "blk"), "volumeMode": "Block"},
        "local": {"hostDir": "/mnt/disks", "mountDir": str(tmp_path / "disks")}}}))
    proc = localpv("cleanup", "--dir", str(vol), "--config", str(config))
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(vol) == []
    block_vol = mounter.tmpfs(tmp_path / "blk" / "vol2")
    tenant_files(block_vol)
    proc = localpv("cleanup", "--dir", str(block_vol), "--config", str(config))
    assert_refused(proc, f"--dir {block_vol}", f"expected a directory directly inside {tmp_path / 'disks'}")
    assert (block_vol / "d" / "f").exists(), "a Block class's directory holds no filesystem volumes"


def test_the_override_cleans_any_directory_and_says_so(tmp_path: Path) -> None:
    x = tmp_path / "x"
    x.mkdir()
    tenant_files(x)
    proc = localpv("cleanup", "--dir", str(x), "--unsafe-any-directory")
    assert proc.returncode == 0, proc.stderr
    assert "--unsafe-any-directory" in proc.stderr
    assert os.listdir(x) == []


def test_the_override_still_refuses_the_root_directory() -> None:
    proc = localpv("cleanup", "--dir", "/", "--unsafe-any-directory")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "root directory" in proc.stderr


# ---------------------------------------------------------------- --device


def test_a_regular_file_is_refused_as_a_device(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep")
    marker = tmp_path / "cleaner-ran"
    proc = localpv("cleanup", "--device", str(target), "--command", f"touch {marker}")
    assert_refused(proc, f"--device {target}", "expected a block device", "found a regular file")
    assert not marker.exists()


def test_a_mounted_device_is_refused(ext4_loop: LoopDevice, tmp_path: Path, mounter: Mounter) -> None:
    mounter.device(ext4_loop.path, tmp_path / "mnt")
    marker = tmp_path / "cleaner-ran"
    proc = localpv("cleanup", "--device", ext4_loop.path, "--command", f"touch {marker}")
    assert_refused(proc, f"--device {ext4_loop.path}", "expected a block device that nothing uses", "found it busy")
    assert not marker.exists(), "the cleaner command must not run on a mounted device"


def test_a_free_device_is_cleaned(loop_device: LoopDevice, tmp_path: Path) -> None:
    marker = tmp_path / "cleaner-ran"
    proc = localpv("cleanup", "--device", loop_device.path, "--command", f"touch {marker}")
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()


# ---------------------------------------------------------------- the cleanup Job's own command line


def job_command(mount_dir: Path, volume: Path) -> list[str]:
    """The command of the Job the agent would create for ``volume``, runnable here."""
    cls = ClassConfig(name="local", host_dir="/mnt/disks", mount_dir=str(mount_dir))
    cleanup = StartCleanup(pv_name="local-pv-1", host_path="/mnt/disks/vol1", container_path=str(volume), cls=cls,
                           block=False, reason="released")
    job = build_cleanup_job(cleanup, node_name="n1", namespace="ns", image="localpv:test",
                            config=ProvisionerConfig(), now=0.0)
    command: list[str] = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[0] == "localpv"
    return [sys.executable, "-m", "localpv", *command[1:]]


def test_the_job_cleans_its_volume(tmp_path: Path, mounter: Mounter) -> None:
    vol = mounter.tmpfs(tmp_path / "disks" / "vol1")
    tenant_files(vol)
    proc = subprocess.run(job_command(tmp_path / "disks", vol), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(vol) == []


def test_the_job_refuses_an_unmounted_volume(tmp_path: Path) -> None:
    vol = tmp_path / "disks" / "vol1"
    vol.mkdir(parents=True)
    tenant_files(vol)
    proc = subprocess.run(job_command(tmp_path / "disks", vol), capture_output=True, text=True, timeout=60,
                          check=False)
    assert_refused(proc, f"--dir {vol}", "expected a mount point")
    assert (vol / "d" / "f").read_text() == "hi"

"""Released volumes are cleaned before they are offered again - with real data on real mounts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from localpv.naming import cleanup_job_name
from localpv_emulator.objects import claim
from tests.agent.conftest import AgentEnv
from tests.conftest import wait_for
from tests.support.hostfs import LoopDevices, Mounter

pytestmark = pytest.mark.root


def bind_and_release(env: AgentEnv, host_path: str, sc: str, write: Any = None, mode: str = "Filesystem") -> str:
    """Claim the volume, run ``write`` while bound, delete the claim; return the old PV uid."""
    pv = wait_for(lambda: env.phase(host_path) == "Available" and env.pv_for(host_path), timeout=5,
                  what=f"{host_path} Available")
    env.apiserver.create(claim("c1", sc, mode=mode))
    wait_for(lambda: env.phase(host_path) == "Bound", timeout=5, what=f"{host_path} Bound")
    if write is not None:
        write()
    env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    return str(pv["metadata"]["uid"])


def recreated(env: AgentEnv, host_path: str, old_uid: str) -> dict[str, Any] | None:
    pv = env.pv_for(host_path)
    if pv and pv["metadata"]["uid"] != old_uid and pv.get("status", {}).get("phase") == "Available":
        return pv
    return None


def test_filesystem_volume_is_wiped_then_offered_again(agent_env: AgentEnv, mounter: Mounter) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent_env.start_agent()

    def write() -> None:
        (vol / "secret.txt").write_text("tenant data")
        (vol / ".hidden").mkdir()
        (vol / ".hidden" / "x").write_text("more")

    old = bind_and_release(agent_env, "/mnt/disks/vol1", "local-fs", write)
    wait_for(lambda: recreated(agent_env, "/mnt/disks/vol1", old), timeout=10, what="PV recreated")
    assert os.listdir(vol) == []
    assert os.path.ismount(vol)


def test_cleanup_never_follows_symlinks_and_refuses_foreign_mounts(
    agent_env: AgentEnv, mounter: Mounter, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent = agent_env.start_agent(discovery_period=0.3)
    nested: list[Path] = []

    def write() -> None:
        (vol / "link").symlink_to(outside)
        (vol / "dirlink").symlink_to(outside / "precious")
        nested.append(mounter.tmpfs(vol / "nested"))
        (vol / "nested" / "foreign").write_text("other filesystem")

    old = bind_and_release(agent_env, "/mnt/disks/vol1", "local-fs", write)
    wait_for(lambda: any(e.reason == "VolumeFailedDelete" for e in agent.recorder.history), timeout=10,
             what="cleanup failure reported")
    assert agent_env.phase("/mnt/disks/vol1") == "Released"
    assert (outside / "precious").read_text() == "keep me"
    assert (vol / "nested" / "foreign").read_text() == "other filesystem"
    assert not (vol / "link").exists() and not (vol / "link").is_symlink()
    failure = next(e for e in agent.recorder.history if e.reason == "VolumeFailedDelete")
    assert "mounted inside the volume" in failure.message and "unmount" in failure.message
    # The tenant's names ("nested", "foreign", "link") appear in no event: counts and reasons only.
    assert not any(name in failure.message for name in ("nested", "foreign", "dirlink", "link\"", "/link"))
    # Once the admin unmounts it, the retry succeeds and the volume comes back clean.
    mounter.umount(nested[0])
    wait_for(lambda: recreated(agent_env, "/mnt/disks/vol1", old), timeout=15, what="PV recreated after retry")
    assert os.listdir(vol) == []
    assert (outside / "precious").read_text() == "keep me"


def test_block_volume_is_zeroed_before_it_is_offered_again(agent_env: AgentEnv, loops: LoopDevices) -> None:
    dev = loops.attach(size=4 * 1024 * 1024)
    (agent_env.block_dir / "disk1").symlink_to(dev.path)
    config = agent_env.config(storageClassMap={
        "fast": {"hostDir": "/mnt/fast", "mountDir": str(agent_env.block_dir), "volumeMode": "Block",
                 "blockCleanerCommand": ["/scripts/dd_zero.sh", "1"]}})
    agent_env.start_agent(config)

    def write() -> None:
        with open(dev.path, "r+b") as f:
            f.write(b"\xab" * 4096)
            f.seek(3 * 1024 * 1024)
            f.write(b"\xcd" * 4096)

    old = bind_and_release(agent_env, "/mnt/fast/disk1", "fast", write, mode="Block")
    wait_for(lambda: recreated(agent_env, "/mnt/fast/disk1", old), timeout=20, what="block PV recreated")
    with open(dev.path, "rb") as f:
        assert f.read() == b"\0" * dev.size


def test_failing_cleaner_is_retried_with_backoff_and_the_pv_kept(agent_env: AgentEnv, loops: LoopDevices,
                                                                 tmp_path: Path) -> None:
    dev = loops.attach()
    (agent_env.block_dir / "disk1").symlink_to(dev.path)
    attempts = tmp_path / "attempts"
    script = tmp_path / "cleaner.sh"
    script.write_text(f'#!/bin/sh\necho "attempt on $LOCAL_PV_BLKDEVICE" >> {attempts}\nexit 10\n')
    script.chmod(0o755)
    config = agent_env.config(storageClassMap={
        "fast": {"hostDir": "/mnt/fast", "mountDir": str(agent_env.block_dir), "volumeMode": "Block",
                 "blockCleanerCommand": [str(script)]}})
    agent = agent_env.start_agent(config, discovery_period=0.2)
    bind_and_release(agent_env, "/mnt/fast/disk1", "fast", mode="Block")
    wait_for(lambda: attempts.exists() and len(attempts.read_text().splitlines()) >= 3, timeout=15,
             what="three cleaner attempts")
    assert agent_env.phase("/mnt/fast/disk1") == "Released"
    assert f"attempt on {agent_env.block_dir}/disk1" in attempts.read_text()
    name = agent_env.pv_for("/mnt/fast/disk1")["metadata"]["name"]  # type: ignore[index]
    status = wait_for(lambda: (s := agent.procs.status(name)) is not None and s.state == "failed"
                      and s.attempts >= 3 and s, timeout=5, what="third attempt recorded as failed")
    assert "exited with 10" in status.message
    assert status.retry_at is not None and status.retry_at > status.finished  # type: ignore[operator]


def test_pv_deleted_mid_clean_is_not_rediscovered_until_clean(agent_env: AgentEnv, loops: LoopDevices,
                                                              tmp_path: Path) -> None:
    dev = loops.attach()
    (agent_env.block_dir / "disk1").symlink_to(dev.path)
    gate, started = tmp_path / "gate", tmp_path / "started"
    script = tmp_path / "slow.sh"
    script.write_text(f"#!/bin/sh\ntouch {started}\nwhile [ ! -e {gate} ]; do sleep 0.02; done\n"
                      f'dd if=/dev/zero of="$LOCAL_PV_BLKDEVICE" bs=1M 2>/dev/null; exit 0\n')
    script.chmod(0o755)
    config = agent_env.config(storageClassMap={
        "fast": {"hostDir": "/mnt/fast", "mountDir": str(agent_env.block_dir), "volumeMode": "Block",
                 "blockCleanerCommand": [str(script)]}})
    agent = agent_env.start_agent(config, discovery_period=0.1)
    old = bind_and_release(agent_env, "/mnt/fast/disk1", "fast", mode="Block")
    wait_for(started.exists, timeout=10, what="cleaner started")
    name = agent_env.pv_for("/mnt/fast/disk1")["metadata"]["name"]  # type: ignore[index]
    agent_env.apiserver.delete("v1", "PersistentVolume", name)
    passes = agent.passes
    wait_for(lambda: agent.passes >= passes + 5, timeout=10, what="several passes")
    assert agent_env.pv_for("/mnt/fast/disk1") is None, "a volume being cleaned must not be offered"
    gate.touch()
    pv = wait_for(lambda: recreated(agent_env, "/mnt/fast/disk1", old), timeout=10, what="offered after clean")
    assert pv["metadata"]["name"] == name


def test_job_mode_cleans_through_a_job_and_retries_failed_jobs(agent_env: AgentEnv, loops: LoopDevices) -> None:
    dev = loops.attach()
    (agent_env.block_dir / "disk1").symlink_to(dev.path)
    config = agent_env.config(useJobForCleaning=True, jobTolerations=[{"key": "k", "operator": "Exists"}])
    agent = agent_env.start_agent(config, discovery_period=0.2, job_image="localpv:test")
    assert agent.jobs is not None
    old = bind_and_release(agent_env, "/mnt/fast/disk1", "fast", mode="Block")
    pv_name = agent_env.pv_for("/mnt/fast/disk1")["metadata"]["name"]  # type: ignore[index]
    job_name = cleanup_job_name(pv_name)
    job = wait_for(lambda: agent_env.apiserver.get("batch/v1", "Job", job_name, "default"), timeout=5)
    labels = job["metadata"]["labels"]
    assert labels["pv"] == pv_name and labels["kubernetes.io/hostname"] == "node-1" and labels["pvuuid"] == old
    assert job["metadata"]["annotations"]["device"] == f"{agent_env.block_dir}/disk1"
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "node-1"}
    assert pod["tolerations"] == [{"key": "k", "operator": "Exists"}]
    container = pod["containers"][0]
    # The class's command, run by our entrypoint once it has checked the device is the recorded one.
    assert container["image"] == "localpv:test"
    assert container["command"] == ["localpv", "cleanup", "--device", f"{agent_env.block_dir}/disk1", "--command",
                                    "/scripts/quick_reset.sh", "--timeout", f"{int(config.cleanup_timeout)}s"]
    assert {"name": "LOCAL_PV_BLKDEVICE", "value": f"{agent_env.block_dir}/disk1"} in container["env"]
    assert {"name": "LOCALPV_EXPECT_IDENTITY", "value": f"blk:loop={dev.backing}:ino={dev.backing.stat().st_ino}"} \
        in container["env"]
    agent_env.apiserver.complete_job("default", job_name, succeeded=False)
    wait_for(lambda: any(e.reason == "VolumeFailedDelete" and "failed" in e.message
                         for e in agent.recorder.history), timeout=5, what="failure event")
    assert agent_env.phase("/mnt/fast/disk1") == "Released"

    def retried() -> bool:
        j = agent_env.apiserver.get("batch/v1", "Job", job_name, "default")
        return bool(j) and j["metadata"]["annotations"].get("localpv.dev/attempt") == "2"

    wait_for(retried, timeout=10, what="a second Job after the failure")
    agent_env.apiserver.complete_job("default", job_name, succeeded=True)
    wait_for(lambda: recreated(agent_env, "/mnt/fast/disk1", old), timeout=10, what="PV recreated")
    assert agent_env.apiserver.get("batch/v1", "Job", job_name, "default") is None

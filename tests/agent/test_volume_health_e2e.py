"""Volume health while in use, on real mounts (issue 17, part 3).

A volume handed out keeps being watched: remounted read-only, unmounted, hung, ext4 errors,
another disk in its place. Each abnormal condition is said where the tenant and the operator
look - a ``VolumeConditionAbnormal`` event on the claim (the reason Kubernetes' own health
monitor uses) and on the PV, the ``localpv_volume_condition`` gauge, ``localpv status`` - and
its end too. Reporting never acts on the volume: every test also checks nothing was cleaned,
deleted or re-created.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from localpv.agent.node import NodeAgent
from tests.agent.conftest import AgentEnv
from tests.agent.test_renumbering_e2e import reboot
from tests.conftest import wait_for
from tests.support.agentenv import bound_claim
from tests.support.hostfs import HungFuse, LoopDevice, LoopDevices, Mounter, sh

pytestmark = pytest.mark.root

Obj = dict[str, Any]
MiB = 1024 * 1024


def claim_events(env: AgentEnv, reason: str, claim: str = "tenant") -> list[Obj]:
    return [e for e in env.apiserver.list("v1", "Event", "default")
            if e.get("reason") == reason and e["involvedObject"]["kind"] == "PersistentVolumeClaim"
            and e["involvedObject"]["name"] == claim]


def pv_events(env: AgentEnv, reason: str, pv: Obj) -> list[Obj]:
    return [e for e in env.apiserver.list("v1", "Event", "default")
            if e.get("reason") == reason and e["involvedObject"]["name"] == pv["metadata"]["name"]]


def condition(agent: NodeAgent, pv: Obj, name: str) -> float | None:
    return agent.metrics.registry.get_sample_value(
        "localpv_volume_condition", {"persistentvolume": pv["metadata"]["name"], "condition": name})


def in_use(env: AgentEnv, mounter: Mounter, disk: LoopDevice, options: str = "") -> tuple[NodeAgent, Obj, Path]:
    path = mounter.device(disk.path, env.fs_dir / "vol", *(("-o", options) if options else ()))
    agent = env.start_agent()
    pv = bound_claim(env, "tenant", "/mnt/disks/vol")
    (path / "data").write_text("the tenant's")
    return agent, pv, path


def untouched(env: AgentEnv, pv: Obj, path: Path | None = None) -> None:
    now = env.pv_for("/mnt/disks/vol")
    assert now is not None and now["metadata"]["uid"] == pv["metadata"]["uid"], "the PV was deleted or re-created"
    assert now["status"]["phase"] == "Bound"
    if path is not None:
        assert (path / "data").read_text() == "the tenant's"


def test_remounted_read_only_is_abnormal_on_the_claim_and_normal_again_after(
    agent_env: AgentEnv, mounter: Mounter, ext4_loop: LoopDevice
) -> None:
    agent, pv, path = in_use(agent_env, mounter, ext4_loop)
    assert condition(agent, pv, "ReadOnly") is None
    sh("mount", "-o", "remount,ro", str(path))  # a mount-table change: the agent looks at once
    [event] = wait_for(lambda: claim_events(agent_env, "VolumeConditionAbnormal"), timeout=10,
                       what="VolumeConditionAbnormal on the claim")
    assert event["type"] == "Warning" and "ReadOnly" in event["message"] and "/mnt/disks/vol" in event["message"]
    assert pv_events(agent_env, "VolumeConditionAbnormal", pv)
    assert condition(agent, pv, "ReadOnly") == 1
    status = {v["path"]: v for v in agent.status()["volumes"]}
    assert status["/mnt/disks/vol"]["health"] == ["ReadOnly"]
    sh("mount", "-o", "remount,rw", str(path))
    [back] = wait_for(lambda: claim_events(agent_env, "VolumeConditionNormal"), timeout=10, what="back to normal")
    assert back["type"] == "Normal"
    assert condition(agent, pv, "ReadOnly") is None, "the gauge is cleared"
    untouched(agent_env, pv, path)


def test_unmounted_under_a_bound_pv_says_writes_go_to_the_root_filesystem(
    agent_env: AgentEnv, mounter: Mounter, ext4_loop: LoopDevice
) -> None:
    agent, pv, path = in_use(agent_env, mounter, ext4_loop)
    mounter.umount(path)
    [event] = wait_for(lambda: claim_events(agent_env, "VolumeConditionAbnormal"), timeout=10,
                       what="VolumeConditionAbnormal on the claim")
    assert "NotMounted" in event["message"] and "node's own filesystem" in event["message"]
    assert condition(agent, pv, "NotMounted") == 1
    for _ in range(2):
        agent.reconcile_once()
    untouched(agent_env, pv)
    said = [e for e in agent.recorder.history if e.reason == "VolumeConditionAbnormal" and e.object_name == "tenant"]
    assert len(said) == 1, "said once, not at every pass"


def test_ext4_errors_are_abnormal_while_the_count_grows(
    agent_env: AgentEnv, mounter: Mounter, ext4_loop: LoopDevice
) -> None:
    agent, pv, path = in_use(agent_env, mounter, ext4_loop, options="errors=continue")
    agent.reconcile_once()  # the count seen first is the baseline
    name = os.path.basename(ext4_loop.path)
    Path(f"/sys/fs/ext4/{name}/trigger_fs_error").write_text("1")
    agent.reconcile_once()  # no mount-table change: the periodic look (volume_health_period) finds it
    [event] = wait_for(lambda: claim_events(agent_env, "VolumeConditionAbnormal"), timeout=10,
                       what="VolumeConditionAbnormal on the claim")
    assert "FilesystemErrors" in event["message"] and "1 new error" in event["message"]
    assert condition(agent, pv, "FilesystemErrors") == 1
    untouched(agent_env, pv, path)


def test_a_hung_mount_under_a_bound_pv_is_unresponsive_and_the_agent_goes_on(
    agent_env: AgentEnv, mounter: Mounter, ext4_loop: LoopDevice, hung_fuse: HungFuse, tmp_path: Path
) -> None:
    agent, pv, _ = in_use(agent_env, mounter, ext4_loop)
    hung_fuse.mount(agent_env.fs_dir / "vol")  # stacked on the volume: every look at it blocks
    [event] = wait_for(lambda: claim_events(agent_env, "VolumeConditionAbnormal"), timeout=15,
                       what="VolumeConditionAbnormal on the claim")
    assert "Unresponsive" in event["message"]
    assert condition(agent, pv, "Unresponsive") == 1
    healthy, why = agent.healthy()
    assert healthy, why  # one hung volume does not make the agent unhealthy
    hung_fuse.release(agent_env.fs_dir / "vol")
    wait_for(lambda: claim_events(agent_env, "VolumeConditionNormal"), timeout=15, what="back to normal")
    untouched(agent_env, pv)


def test_another_disk_swapped_in_under_a_bound_pv_is_reported_on_the_claim(
    agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices
) -> None:
    disk, other = loops.attach(size=16 * MiB, ext4=True), loops.attach(size=16 * MiB, ext4=True)
    path = agent_env.fs_dir / "vol"
    mounter.device(disk.path, path)
    agent = agent_env.start_agent()
    pv = bound_claim(agent_env, "tenant", "/mnt/disks/vol")
    reboot(loops, mounter, {path: disk}, {path: other})
    # A pass may look between the unmount and the mount (NotMounted, true then); the swap follows.
    wait_for(lambda: [e for e in claim_events(agent_env, "VolumeConditionAbnormal")
                      if "IdentityChanged" in e["message"]], timeout=10, what="IdentityChanged on the claim")
    assert condition(agent, pv, "IdentityChanged") == 1
    untouched(agent_env, pv)

"""A node's override gives a static class another directory while a tenant's disk is in use
(issue 25.5): the records follow the disk by its identity (DESIGN: safety means identity), the
claim's PV is never cleaned nor deleted under it, and the disk is cleaned at its new path before
it is offered there. Real ext4 on a loop device, the ConfigMap reloaded from a file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from localpv.agent.journal import Journal
from tests.agent.conftest import NODE, AgentEnv
from tests.agent.test_identity_e2e import events, never_offered_dirty, offered_again, use
from tests.conftest import wait_for
from tests.support.hostfs import LoopDevices, Mounter, sh

pytestmark = pytest.mark.root


def test_a_class_moved_by_an_override_keeps_its_tenants_disk_safe(
        agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices, tmp_path: Path) -> None:
    old_dir, new_dir = tmp_path / "a", tmp_path / "b"
    new_dir.mkdir()
    disk = mounter.device(loops.attach(ext4=True).path, old_dir / "x")
    config_file = tmp_path / "config.yaml"
    base = {"storageClassMap": {"local-fs": {"hostDir": "/mnt/a", "mountDir": str(old_dir)}}}
    config_file.write_text(yaml.safe_dump(base))
    agent_env.start_agent(agent_env.config(**base), config_path=str(config_file), discovery_period=0.2)
    tenant = disk / "data"
    old = use(agent_env, "/mnt/a/x", "local-fs", lambda: tenant.write_text("tenant a"))

    # The operator gives this node the class at another directory, and moves the disk there.
    moved = {"storageClassMap": {"local-fs": {**base["storageClassMap"]["local-fs"], "nodes": [
        {"name": NODE, "hostDir": "/mnt/b", "mountDir": str(new_dir)}]}}}
    (new_dir / "x").mkdir()
    sh("mount", "--move", str(old_dir / "x"), str(new_dir / "x"))
    try:
        tenant = new_dir / "x" / "data"
        config_file.write_text(yaml.safe_dump(moved))
        with never_offered_dirty(agent_env, "/mnt/b/x", tenant.exists):
            # A live claim's PV still names the old path: both are held, and said.
            wait_for(lambda: events(agent_env, "VolumeIdentityMismatch"), timeout=15, what="the mismatch said")
            assert agent_env.phase("/mnt/a/x") == "Bound" and tenant.read_text() == "tenant a"
            record = Journal(agent_env.state_dir / "journal.json").get("/mnt/a/x")
            assert record is not None and record.state == "used"
            # The claim goes: its PV (naming a path its disk left) is deleted, the record follows the disk,
            # and the disk is cleaned at its new path before it is offered there.
            agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
            fresh = wait_for(lambda: offered_again(agent_env, "/mnt/b/x", set()), timeout=30,
                             what="the disk offered at its new path once clean")
        assert agent_env.pv_for("/mnt/a/x") is None
        assert fresh["metadata"]["uid"] != old["metadata"]["uid"] and fresh["spec"]["local"]["path"] == "/mnt/b/x"
        assert not tenant.exists()
    finally:
        agent_env.stop_agents()
        sh("mount", "--move", str(new_dir / "x"), str(old_dir / "x"))  # where the fixture unmounts it


def test_a_label_that_selects_clashing_overrides_keeps_the_previous_configuration(
        agent_env: AgentEnv, mounter: Mounter) -> None:
    """Node labels are the cluster's to change; one that selects an override putting a pool inside
    a class's discovery directory is refused as a bad ConfigMap is: said on the Node, nothing
    changed. A label that selects a good override is taken up (no restart)."""
    mounter.tmpfs(agent_env.fs_dir / "vol1")
    config = agent_env.config(dynamicPools={"p": {"hostDir": "/mnt/pool", "requireMount": False, "nodes": [
        {"matchLabels": {"pool": "inside"}, "hostDir": "/mnt/disks/p"},
        {"matchLabels": {"pool": "elsewhere"}, "hostDir": "/mnt/elsewhere"}]}})
    agent = agent_env.start_agent(config, discovery_period=0.2)
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Available", timeout=15, what="vol1 offered")

    def relabel(value: str) -> None:
        found = agent_env.apiserver.get("v1", "Node", NODE)
        assert found is not None
        found["metadata"]["labels"]["pool"] = value
        agent_env.apiserver.update(found)

    relabel("inside")
    [rejected] = wait_for(lambda: events(agent_env, "ConfigRejected"), timeout=15, what="the refusal said")
    assert rejected["involvedObject"]["kind"] == "Node"
    assert "dynamicPools.p.hostDir: expected a directory apart from every static class's" in rejected["message"]
    assert "(node node-1, with dynamicPools.p.nodes[0] (matchLabels pool=inside))" in rejected["message"]
    assert agent.config.current.dynamic_pools["p"].host_dir == "/mnt/pool"
    relabel("elsewhere")
    wait_for(lambda: agent.config.current.dynamic_pools["p"].host_dir == "/mnt/elsewhere", timeout=15,
             what="the good override taken up")
    assert agent.config.last_error is None

"""Never wedged while saying healthy (issue 12): what /healthz reports when the agent's
loops die, its passes keep failing, its state dir goes read-only; the Node's identity
followed when the Node is re-created; metrics that mean what upstream's mean."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from localpv_emulator.objects import claim, node
from tests.agent.conftest import NODE, AgentEnv
from tests.conftest import wait_for
from tests.support.hostfs import Mounter

pytestmark = pytest.mark.root


def test_a_config_that_crashes_the_parser_does_not_stop_later_reloads(agent_env: AgentEnv, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    good = {"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks", "mountDir": str(agent_env.fs_dir)}}}
    path.write_text(yaml.safe_dump(good))
    agent = agent_env.start_agent(config_path=str(path))
    assert agent.metrics.registry.get_sample_value("localpv_config_last_reload_success") == 1.0, \
        "a valid configuration is in use from the first scrape"
    # JSON is YAML: labelsForPV holding 2,000 levels of nested lists.
    prefix = json.dumps(good)[:-1]
    path.write_text(prefix + ', "labelsForPV": {"deep": ' + "[" * 2000 + '"x"' + "]" * 2000 + "}}")
    wait_for(lambda: agent.metrics.registry.get_sample_value("localpv_config_reload_failures_total") == 1.0,
             timeout=10, what="the deep config rejected and counted")
    assert agent.metrics.registry.get_sample_value("localpv_config_last_reload_success") == 0.0
    path.write_text(yaml.safe_dump(dict(good, labelsForPV={"team": "a"})))
    wait_for(lambda: dict(agent.config.current.labels_for_pv) == {"team": "a"}, timeout=10,
             what="a later good config applied")
    assert agent.healthy()[0]


def test_a_rejected_config_is_counted_once_per_problem_not_per_check(agent_env: AgentEnv, tmp_path: Path) -> None:
    """The counter grew by one every 5 s check while a bad ConfigMap stayed on disk: it
    counts rejected configurations, so increase() over a day means something."""
    path = tmp_path / "config.yaml"
    good = {"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks", "mountDir": str(agent_env.fs_dir)}}}
    path.write_text(yaml.safe_dump(good))
    agent = agent_env.start_agent(config_path=str(path))

    def failures() -> float | None:
        return agent.metrics.registry.get_sample_value("localpv_config_reload_failures_total")

    path.write_text(yaml.safe_dump(dict(good, useJobForCleaning="maybe")))
    for _ in range(5):
        assert agent.reload_config() is None
    assert failures() == 1.0
    path.write_text(yaml.safe_dump(dict(good, cleanupWorkers="many")))
    for _ in range(5):
        assert agent.reload_config() is None
    assert failures() == 2.0, "another problem is another rejection"
    assert agent.metrics.registry.get_sample_value("localpv_config_last_reload_success") == 0.0
    path.write_text(yaml.safe_dump(good))
    assert agent.reload_config() is not None
    assert agent.metrics.registry.get_sample_value("localpv_config_last_reload_success") == 1.0


def test_a_dead_cache_thread_makes_the_agent_unhealthy(agent_env: AgentEnv) -> None:
    agent = agent_env.start_agent()
    wait_for(lambda: agent.passes >= 1, timeout=10)
    assert agent.healthy()[0]
    assert agent.pvs is not None
    agent.pvs.stop()
    ok, why = agent.healthy()
    assert not ok and "pv-informer is not running" in why


def test_no_first_pass_is_not_starting_forever(agent_env: AgentEnv) -> None:
    agent = agent_env.start_agent(discovery_period=10.0)
    wait_for(lambda: agent.passes >= 1, timeout=10)
    agent.passes = 0  # as if the first pass never completed (hung storage, a failing journal)
    assert agent.healthy()[0], "within the start-up allowance"
    assert agent._started_at is not None
    agent._started_at -= 61.0
    ok, why = agent.healthy()
    assert not ok and "no pass completed" in why


def test_read_only_state_dir_makes_the_agent_unhealthy(agent_env: AgentEnv, mounter: Mounter) -> None:
    state = mounter.tmpfs(agent_env.state_dir)
    from localpv.agent.journal import Journal

    Journal.initialise(state / "journal.json")
    agent = agent_env.start_agent()
    wait_for(lambda: agent.passes >= 1, timeout=10)
    assert agent.healthy()[0]
    subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
    mounter.tmpfs(agent_env.fs_dir / "vol1")  # a pass now needs a journal write, which fails
    wait_for(lambda: not agent.healthy()[0], timeout=10, what="unhealthy")
    assert "not writable" in agent.healthy()[1]
    wait_for(lambda: agent._failed_passes >= 1, timeout=10, what="the pass that cannot write fails")
    assert agent_env.pv_for("/mnt/disks/vol1") is None, "nothing offered without a journal record"


def test_a_recreated_node_gets_pvs_owned_by_the_new_node(agent_env: AgentEnv, mounter: Mounter) -> None:
    mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent = agent_env.start_agent(agent_env.config(setPVOwnerRef=True))
    first = wait_for(lambda: agent_env.pv_for("/mnt/disks/vol1"), timeout=10, what="PV")
    old_uid = first["metadata"]["ownerReferences"][0]["uid"]
    agent_env.apiserver.delete("v1", "Node", NODE)
    new_node = agent_env.apiserver.create(node(NODE))
    assert new_node["metadata"]["uid"] != old_uid
    # The garbage collector deletes the PV owned by the old Node; the agent cleans the
    # volume (its PV vanished) and offers it again, owned by the new Node.
    pv = wait_for(lambda: (p := agent_env.pv_for("/mnt/disks/vol1")) and
                  p["metadata"]["ownerReferences"][0]["uid"] == new_node["metadata"]["uid"] and p,
                  timeout=15, what="a PV owned by the new Node")
    assert pv["metadata"]["uid"] != first["metadata"]["uid"]
    assert agent.node is not None and agent.node.uid == new_node["metadata"]["uid"]


def test_with_its_node_deleted_the_agent_does_not_fight_node_cleanup(agent_env: AgentEnv, mounter: Mounter) -> None:
    """The Node object deleted (the node is being removed): node-cleanup deletes the node's
    PVs; the agent used to clean and re-create them every pass. It now waits, not ready,
    and resumes when the Node is back."""
    mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent = agent_env.start_agent()
    first = wait_for(lambda: agent_env.pv_for("/mnt/disks/vol1"), timeout=10, what="PV")
    agent_env.apiserver.delete("v1", "Node", NODE)
    wait_for(lambda: not agent.readiness()[0] and "was deleted" in agent.readiness()[1], timeout=10,
             what="not ready: the Node was deleted")
    agent_env.apiserver.delete("v1", "PersistentVolume", first["metadata"]["name"])  # what node-cleanup does
    passes = agent.passes
    wait_for(lambda: (agent.trigger("test"), agent.passes >= passes + 2)[1], timeout=10,
             what="two passes after the PV was deleted")
    assert agent_env.pv_for("/mnt/disks/vol1") is None, "no PV is created for a deleted Node"
    assert agent.healthy()[0], "waiting for its Node is not being wedged"
    agent_env.apiserver.create(node(NODE))
    wait_for(lambda: agent_env.pv_for("/mnt/disks/vol1"), timeout=15, what="the PV back with the Node")
    wait_for(lambda: agent.readiness()[0], timeout=10, what="ready again")


def test_each_failed_cleanup_is_counted_like_upstream(agent_env: AgentEnv, mounter: Mounter) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent = agent_env.start_agent()
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Available", timeout=10)
    agent_env.apiserver.create(claim("c1", "local-fs"))
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Bound", timeout=10)
    inner = mounter.tmpfs(vol / "foreign")  # a mount inside the volume fails every clean
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")

    def failures() -> float:
        return agent.metrics.registry.get_sample_value(
            "local_volume_provisioner_persistentvolume_delete_failed_total",
            {"mode": "Filesystem", "type": "process"}) or 0.0

    wait_for(lambda: failures() >= 3, timeout=20, what="three failed cleanups counted")
    mounter.umount(inner)

"""The agent against the emulator over real HTTP, with real tmpfs mounts and loop devices."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from localpv.agent.node import AgentError
from localpv.kube.resources import PERSISTENT_VOLUMES
from localpv.naming import NODE_LABEL_KEY, PROVISIONED_BY_ANNOTATION, pv_name
from localpv_emulator.objects import storage_class
from tests.agent.conftest import NODE, AgentEnv
from tests.conftest import wait_for
from tests.support.hostfs import LoopDevices, Mounter

pytestmark = pytest.mark.root


def test_mount_appearing_while_running_becomes_a_pv_without_waiting_for_the_period(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    agent = agent_env.start_agent(discovery_period=3600)  # only events can trigger passes
    passes_before = agent.passes
    mounter.tmpfs(agent_env.fs_dir / "vol1", size=16 * 1024 * 1024)
    pv = wait_for(lambda: agent_env.pv_for("/mnt/disks/vol1"), timeout=5, what="PV for vol1")
    assert pv["metadata"]["name"] == pv_name("vol1", NODE, "local-fs")
    assert pv["spec"]["capacity"]["storage"] == "16Mi"
    assert pv["metadata"]["labels"][NODE_LABEL_KEY] == NODE
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Available", timeout=5)
    assert agent.passes > passes_before


def test_second_pass_creates_nothing_and_restart_makes_no_duplicates(agent_env: AgentEnv, mounter: Mounter) -> None:
    for i in range(3):
        mounter.tmpfs(agent_env.fs_dir / f"vol{i}")
    agent = agent_env.start_agent()
    wait_for(lambda: len(agent_env.pvs()) == 3, timeout=5, what="3 PVs")
    creates = agent_env.apiserver.requests.count(verb="create", resource="persistentvolumes")
    result = agent.reconcile_once()
    assert result.creates == []
    agent_env.stop_agents()
    agent = agent_env.start_agent()
    wait_for(lambda: agent.passes >= 1, timeout=5)
    agent.reconcile_once()
    assert len(agent_env.pvs()) == 3
    assert agent_env.apiserver.requests.count(verb="create", resource="persistentvolumes") == creates


def test_plain_directory_is_skipped_with_the_upstream_reason_and_not_ready(agent_env: AgentEnv) -> None:
    (agent_env.fs_dir / "notbindmount").mkdir()
    agent = agent_env.start_agent()
    wait_for(lambda: agent.last_plan is not None, timeout=5)
    ok, message = agent.readiness()
    assert not ok
    assert f'path "{agent_env.fs_dir}/notbindmount" is not a valid mount point' in message
    assert agent_env.pvs() == []


def test_block_device_symlink_becomes_a_block_pv(agent_env: AgentEnv, loops: LoopDevices) -> None:
    dev = loops.attach(size=12 * 1024 * 1024)
    (agent_env.block_dir / "disk-a").symlink_to(dev.path)
    agent_env.start_agent()
    pv = wait_for(lambda: agent_env.pv_for("/mnt/fast/disk-a"), timeout=5)
    assert pv["spec"]["volumeMode"] == "Block"
    assert pv["spec"]["capacity"]["storage"] == "12Mi"
    assert "mountOptions" not in pv["spec"]


def test_two_classes_sharing_a_host_dir_yield_one_pv(agent_env: AgentEnv, mounter: Mounter) -> None:
    mounter.tmpfs(agent_env.fs_dir / "shared")
    config = agent_env.config(storageClassMap={
        "local-fs": {"hostDir": "/mnt/disks", "mountDir": str(agent_env.fs_dir)},
        "other": {"hostDir": "/mnt/disks", "mountDir": str(agent_env.fs_dir)},
    })
    agent_env.apiserver.create(storage_class("other", binding="Immediate"))
    agent = agent_env.start_agent(config)
    wait_for(lambda: agent_env.pv_for("/mnt/disks/shared"), timeout=5)
    for _ in range(3):
        agent.reconcile_once()
    assert len(agent_env.pvs()) == 1


def test_upstream_pv_is_adopted_by_label_without_churn(agent_env: AgentEnv, mounter: Mounter) -> None:
    mounter.tmpfs(agent_env.fs_dir / "old")
    node = agent_env.apiserver.get("v1", "Node", NODE)
    assert node is not None
    name = pv_name("old", NODE, "local-fs")
    upstream = {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {
            PROVISIONED_BY_ANNOTATION: f"local-volume-provisioner-{NODE}-{node['metadata']['uid']}"}},
        "spec": {"capacity": {"storage": "8Mi"}, "local": {"path": "/mnt/disks/old"},
                 "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                 "persistentVolumeReclaimPolicy": "Delete",
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}},
    }
    created = agent_env.apiserver.create(upstream)
    agent = agent_env.start_agent()
    wait_for(lambda: (agent_env.pv_for("/mnt/disks/old") or {}).get("metadata", {}).get("labels", {})
             .get(NODE_LABEL_KEY) == NODE, timeout=5, what="adoption label")
    agent.reconcile_once()
    after = agent_env.pv_for("/mnt/disks/old")
    assert after is not None
    assert after["metadata"]["uid"] == created["metadata"]["uid"]  # same object: no churn
    assert agent.pvs is not None and agent.pvs.get(name) is not None


def test_name_collision_gives_one_event_and_no_create_loop(agent_env: AgentEnv, mounter: Mounter) -> None:
    mounter.tmpfs(agent_env.fs_dir / "victim")
    name = pv_name("victim", NODE, "local-fs")
    agent_env.apiserver.create({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {NODE_LABEL_KEY: "node-2"}},
        "spec": {"capacity": {"storage": "1Gi"}, "local": {"path": "/mnt/elsewhere/x"},
                 "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-2"]}]}]}}},
    })
    agent = agent_env.start_agent()
    wait_for(lambda: name in agent.collisions, timeout=5, what="collision noticed")
    for _ in range(5):
        agent.reconcile_once()
    assert agent_env.apiserver.requests.count(verb="create", resource="persistentvolumes") == 1
    agent.recorder.flush()
    events = [e for e in agent_env.apiserver.list("v1", "Event", "default") if e["reason"] == "PVNameCollision"]
    assert len(events) == 1
    assert "/mnt/elsewhere/x" in events[0]["message"] and "/mnt/disks/victim" in events[0]["message"]
    assert not agent.readiness()[0]


def test_config_reload_adds_and_removes_classes(agent_env: AgentEnv, mounter: Mounter, tmp_path: Path) -> None:
    mounter.tmpfs(agent_env.fs_dir / "a")
    other_dir = tmp_path / "other"
    mounter.tmpfs(other_dir / "b")
    agent_env.apiserver.create(storage_class("other", binding="Immediate"))
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump({"storageClassMap": {
        "local-fs": {"hostDir": "/mnt/disks", "mountDir": str(agent_env.fs_dir)}}}))
    from localpv.config import load_config

    agent = agent_env.start_agent(load_config(cfg_file).config, config_path=str(cfg_file))
    wait_for(lambda: agent_env.pv_for("/mnt/disks/a"), timeout=5)
    cfg_file.write_text(yaml.safe_dump({"storageClassMap": {
        "other": {"hostDir": "/mnt/other", "mountDir": str(other_dir)}}}))
    wait_for(lambda: agent_env.pv_for("/mnt/other/b"), timeout=5, what="PV of the added class")
    assert set(agent.config.current.classes) == {"other"}
    # A broken file keeps the last good configuration and says why.
    cfg_file.write_text("storageClassMap:\n  other:\n    hostDir: relative\n")
    wait_for(lambda: agent.config.last_error is not None, timeout=5)
    assert "storageClassMap.other.hostDir" in (agent.config.last_error or "")
    assert set(agent.config.current.classes) == {"other"}
    assert agent.metrics.config_reload_failures._value.get() >= 1


def test_pv_api_failures_are_retried_not_lost(agent_env: AgentEnv, mounter: Mounter) -> None:
    agent_env.apiserver.faults.error_rate("create", 1.0, code=500)
    mounter.tmpfs(agent_env.fs_dir / "flaky")
    agent = agent_env.start_agent(discovery_period=0.2)
    wait_for(lambda: agent.passes >= 2, timeout=5)
    assert agent_env.pv_for("/mnt/disks/flaky") is None
    agent_env.apiserver.faults.error_rate("create", 0.0)
    wait_for(lambda: agent_env.pv_for("/mnt/disks/flaky"), timeout=5)
    assert len(agent_env.pvs()) == 1


def test_pvs_of_other_nodes_never_reach_the_cache(agent_env: AgentEnv) -> None:
    for i in range(20):
        agent_env.apiserver.create({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"other-{i}", "labels": {NODE_LABEL_KEY: "node-2"}},
            "spec": {"capacity": {"storage": "1Gi"}, "local": {"path": f"/mnt/disks/o{i}"},
                     "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-2"]}]}]}}},
        })
    agent = agent_env.start_agent(watch_host=False)
    assert agent.pvs is not None
    assert len(agent.pvs) == 0
    watches = [r for r in agent_env.apiserver.requests.records()
               if r.resource == "persistentvolumes" and r.verb in ("list", "watch") and "labelSelector" in r.query]
    assert watches, "the PV informer must select on the server"
    assert PERSISTENT_VOLUMES.plural == "persistentvolumes"


def test_startup_taint_is_removed_once_discovery_is_ready(agent_env: AgentEnv, mounter: Mounter) -> None:
    key = "localpv.dev/agent-not-ready"
    node = agent_env.apiserver.get("v1", "Node", NODE)
    assert node is not None
    taints = [{"key": key, "effect": "NoSchedule"}, {"key": "other", "effect": "NoSchedule"}]
    node.setdefault("spec", {})["taints"] = taints
    agent_env.apiserver.update(node)
    (agent_env.fs_dir / "plain").mkdir()  # not ready while this is here
    agent = agent_env.start_agent(agent_env.config(removeNodeNotReadyTaint=True,
                                                   provisionerNotReadyNodeTaintKey=key))
    wait_for(lambda: agent.passes >= 1, timeout=5)
    assert [t["key"] for t in agent_env.apiserver.get("v1", "Node", NODE)["spec"]["taints"]] == [key, "other"]
    (agent_env.fs_dir / "plain").rmdir()
    agent.reconcile_once()
    taints = agent_env.apiserver.get("v1", "Node", NODE)["spec"]["taints"]  # type: ignore[index]
    assert [t["key"] for t in taints] == ["other"]


def test_the_adoption_scan_reads_only_pvs_no_agent_has_labelled(agent_env: AgentEnv, mounter: Mounter) -> None:
    """1,000 PVs of other nodes labelled by their agents: the first start reads none of them
    (the scan's pages would otherwise queue behind the agent's 5 QPS limit before its own
    volumes are offered), and still adopts the unlabelled upstream PV of this node."""
    node = agent_env.apiserver.get("v1", "Node", NODE)
    assert node is not None
    for i in range(1000):
        agent_env.apiserver.create({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"other-{i}", "labels": {NODE_LABEL_KEY: f"node-{i % 50}"}},
            "spec": {"capacity": {"storage": "1Gi"}, "local": {"path": f"/mnt/disks/v{i}"},
                     "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": [f"node-{i % 50}"]}]}]}}}})
    mounter.tmpfs(agent_env.fs_dir / "old")
    name = pv_name("old", NODE, "local-fs")
    agent_env.apiserver.create({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {
            PROVISIONED_BY_ANNOTATION: f"local-volume-provisioner-{NODE}-{node['metadata']['uid']}"}},
        "spec": {"capacity": {"storage": "8Mi"}, "local": {"path": "/mnt/disks/old"},
                 "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}})
    agent_env.start_agent()
    wait_for(lambda: (agent_env.pv_for("/mnt/disks/old") or {}).get("metadata", {}).get("labels", {})
             .get(NODE_LABEL_KEY) == NODE, timeout=5, what="adoption label")
    # One page for the scan, one list for the label-filtered informer: 1,000 PVs would be 2 more pages.
    assert agent_env.apiserver.requests.count(verb="list", resource="persistentvolumes") == 2


def test_a_scan_for_upstream_pvs_cut_short_does_not_let_the_first_pass_offer_their_volumes(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    """The adoption scan's continue token expires between two pages (etcd compacted: 410).
    The upstream PV of this node on a later page was then unseen by the label-filtered cache,
    so its volume - bound to a tenant - looked free and was offered again under a PV of our
    own (or cleaned first, on a node without a journal). The scan starts over and finds it."""
    node = agent_env.apiserver.get("v1", "Node", NODE)
    assert node is not None
    for i in range(600):  # upstream PVs of other nodes, unlabelled, sorted before ours: 2 pages
        agent_env.apiserver.create({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"a-other-{i:04d}"},
            "spec": {"capacity": {"storage": "1Gi"}, "local": {"path": f"/mnt/disks/v{i}"},
                     "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-9"]}]}]}}}})
    volume = agent_env.fs_dir / "tenant"
    mounter.tmpfs(volume)
    (volume / "data").write_text("a tenant's data")
    name = "local-pv-made-by-upstream"  # not our deterministic name: its class was renamed since
    claim = agent_env.apiserver.create({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "tenant", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs", "volumeName": name,
                 "resources": {"requests": {"storage": "8Mi"}}}})
    agent_env.apiserver.create({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {
            PROVISIONED_BY_ANNOTATION: f"local-volume-provisioner-{NODE}-{node['metadata']['uid']}"}},
        "spec": {"capacity": {"storage": "8Mi"}, "local": {"path": "/mnt/disks/tenant"},
                 "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                 "persistentVolumeReclaimPolicy": "Delete",
                 "claimRef": {"namespace": "default", "name": "tenant", "uid": claim["metadata"]["uid"]},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}})
    wait_for(lambda: (agent_env.pv_for("/mnt/disks/tenant") or {}).get("status", {}).get("phase") == "Bound",
             timeout=5, what="the tenant's claim bound")
    pages = []

    def compact_after_the_first_page(verb: str, resource: str, seconds: float, error: object) -> None:
        if verb == "list" and resource == "persistentvolumes":
            pages.append(error)
            if len(pages) == 1:  # a write, then etcd compacts past the scan's snapshot
                agent_env.apiserver.create(storage_class("later", binding="Immediate"))
                agent_env.apiserver.faults.forget_history()

    agent = agent_env.start_agent(observer=compact_after_the_first_page, discovery_period=3600)
    agent.reconcile_once()
    # The volume is the tenant's: not cleaned, and not offered again under a PV of its own.
    assert [pv["metadata"]["name"] for pv in agent_env.pvs()
            if pv["spec"]["local"]["path"] == "/mnt/disks/tenant"] == [name]
    assert [v["cleanup"] for v in agent.status()["volumes"] if v["path"] == "/mnt/disks/tenant"] == [""]
    assert (volume / "data").read_text() == "a tenant's data"
    # page 1, page 2 (410), the scan again (2 pages), the informer's list
    assert agent_env.apiserver.requests.count(verb="list", resource="persistentvolumes") == 5
    adopted = agent_env.pv_for("/mnt/disks/tenant")
    assert adopted is not None and adopted["metadata"]["labels"][NODE_LABEL_KEY] == NODE


def test_an_upstream_pv_that_cannot_be_labelled_stops_the_start_before_any_pass(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    """Adopting is labelling: a PV the label could not be put on stays invisible to the
    label-filtered cache, so the agent must not go on to offer its volume as free."""
    node = agent_env.apiserver.get("v1", "Node", NODE)
    assert node is not None
    mounter.tmpfs(agent_env.fs_dir / "old")
    agent_env.apiserver.create({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "local-pv-made-by-upstream", "annotations": {
            PROVISIONED_BY_ANNOTATION: f"local-volume-provisioner-{NODE}-{node['metadata']['uid']}"}},
        "spec": {"capacity": {"storage": "8Mi"}, "local": {"path": "/mnt/disks/old"},
                 "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}})
    agent_env.apiserver.faults.error_rate("patch", 1.0, code=403)
    with pytest.raises(AgentError, match="scan for upstream PVs"):
        agent_env.start_agent()
    assert [pv["metadata"]["name"] for pv in agent_env.pvs()] == ["local-pv-made-by-upstream"]
    assert agent_env.apiserver.requests.count(verb="create", resource="persistentvolumes") == 0


def test_released_dynamic_pvs_are_left_to_the_csi_side(agent_env: AgentEnv) -> None:
    """Dynamic (CSI) PVs carry the same node label, so the static agent's cache sees them; a
    Released one is the CSI controller's to reclaim, not a local volume the static side could
    not clean (it said so with a VolumeFailedDelete warning on every pass)."""
    pv = agent_env.apiserver.create({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pvc-dynamic", "labels": {NODE_LABEL_KEY: NODE}},
        "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "dyn",
                 "persistentVolumeReclaimPolicy": "Delete",
                 "csi": {"driver": "local.csi.localpv.dev", "volumeHandle": "pvc-dynamic", "fsType": "ext4"},
                 "claimRef": {"namespace": "default", "name": "gone", "uid": "u-gone"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}})
    wait_for(lambda: (agent_env.apiserver.get("v1", "PersistentVolume", "pvc-dynamic") or {})
             .get("status", {}).get("phase") == "Released", timeout=5, what="the dynamic PV Released")
    agent = agent_env.start_agent(discovery_period=3600)
    wait_for(lambda: agent.pvs is not None and agent.pvs.get("pvc-dynamic") is not None, timeout=5,
             what="the dynamic PV in the agent's cache")
    agent.reconcile_once()
    agent.recorder.flush()
    assert [e["reason"] for e in agent_env.apiserver.list("v1", "Event", "default")
            if e["involvedObject"]["name"] == "pvc-dynamic"] == []
    assert agent_env.apiserver.get("v1", "PersistentVolume", "pvc-dynamic")["metadata"]["uid"] == pv["metadata"]["uid"]


def test_the_first_start_spends_no_request_on_fetching_the_node_twice(agent_env: AgentEnv, mounter: Mounter) -> None:
    """At start every request waits for the agent's rate limit (5/s after a burst of 10) before
    its volumes are offered: the Node comes from the cache that follows it, not a GET too."""
    mounter.tmpfs(agent_env.fs_dir / "vol")
    agent_env.start_agent()
    wait_for(lambda: agent_env.pv_for("/mnt/disks/vol"), timeout=5, what="the PV")
    assert agent_env.apiserver.requests.count(verb="get", resource="nodes") == 0
    assert agent_env.apiserver.requests.count(verb="list", resource="nodes") == 1


def test_a_node_name_that_names_no_node_stops_the_start_with_what_to_fix(agent_env: AgentEnv) -> None:
    agent_env.apiserver.delete("v1", "Node", NODE)
    with pytest.raises(AgentError, match=f"Node {NODE} not found: --node"):
        agent_env.start_agent()

"""Two nodes (issue 25.6): what a fleet needs, shown on a real cluster with a second kubelet node.

- One DaemonSet, an agent on each node, where both nodes share one host filesystem (realk8s
  runs both kubelets on one machine): each agent on its own journal and its own kubelet's root
  dir, through `$(NODE_NAME)` in ``agent.stateDir`` and ``dynamic.kubeletDir``; each node's
  CSINode lists the driver with its own node ID.
- A pod on the second node writes a pattern on a raw block dynamic volume; the next pod there
  reads it back.
- node-cleanup on a Node really deleted (its kubelet stopped, the Node object deleted): the
  claim of a StatefulSet's static volume there is released (``ReferencedNodeDeleted``, then
  deleted), the PV deleted, and the StatefulSet's pod comes back on the first node with a new,
  empty volume. Local storage cannot move data: the old volume's contents stay on the lost node.

Skipped, with the reason, on a cluster with one Ready node. The second node is
``LOCALPV_E2E_SECOND_NODE`` or else the first other Ready node; the node-loss test needs
``LOCALPV_E2E_SECOND_NODE_STOP`` and ``LOCALPV_E2E_SECOND_NODE_START`` (shell commands, run on this
host, that stop that node's kubelet and runtime and start them again: .ci/e2e gives realk8s's
node-down.sh and node-up.sh), and puts the node back at its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localpv.agent.statedir import LOCK_FILE
from localpv.kube.discovery import served_resource
from localpv.kube.resources import (
    CSI_STORAGE_CAPACITIES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    Resource,
)
from localpv.naming import parse_quantity
from tests.e2e.cluster import CHART, Cluster, Obj, wait_for
from tests.e2e.conftest import Release
from tests.e2e.test_dynamic import (
    CSI_NODES,
    DRIVER,
    FS_GROUP,
    KUBELET_DIR,
    MiB,
    block_pod,
    bound_pv,
    claim,
    pool_disk,
)

pytestmark = pytest.mark.e2e
STATEFUL_SETS = Resource("apps", "v1", "statefulsets", "StatefulSet", True)
TOPOLOGY_KEY = "topology.localpv.dev/node"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
#: The kubelet's root dir with the node's name as `$(NODE_NAME)` (realk8s: DATA/nodes/$(NODE_NAME)/kubelet);
#: default: the same dir on every node (LOCALPV_E2E_KUBELET_DIR), as on nodes that are hosts of their own.
KUBELET_DIR_OF_NODE = os.environ.get("LOCALPV_E2E_KUBELET_DIR_OF_NODE") or KUBELET_DIR
SECOND_NODE_STOP = os.environ.get("LOCALPV_E2E_SECOND_NODE_STOP") or ""
SECOND_NODE_START = os.environ.get("LOCALPV_E2E_SECOND_NODE_START") or ""


def ready(node: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


@pytest.fixture(scope="module")
def second(cluster: Cluster) -> Obj:
    """The second node's Node object (Ready), or the module is skipped."""
    wanted = os.environ.get("LOCALPV_E2E_SECOND_NODE")
    others = [n for n in cluster.list(NODES) if n["metadata"]["name"] != cluster.node and ready(n)
              and (not wanted or n["metadata"]["name"] == wanted)]
    if not others:
        pytest.skip(f"e2e: two nodes: the cluster has no Ready node besides {cluster.node}"
                    + (f" named {wanted} (LOCALPV_E2E_SECOND_NODE)" if wanted else ""))
    return others[0]


def hostname_of(node: Obj) -> str:
    return str(node["metadata"]["labels"].get("kubernetes.io/hostname") or node["metadata"]["name"])


# ---------------------------------------------------------------- one DaemonSet on both nodes


def chart_has_node_overrides() -> bool:
    """Whether this checkout's chart takes per-node overrides of a pool (issue 25.5)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    pool = schema["properties"]["dynamic"]["properties"]["pools"]["items"]["properties"]
    return "nodes" in pool


NODE_OVERRIDES = chart_has_node_overrides()
needs_node_overrides = pytest.mark.skipif(not NODE_OVERRIDES, reason="needs per-node pool directories "
                                          "(dynamic.pools[].nodes, issue 25.5)")
#: The pools' sizes: the first node's small, the second's large (each an ext4 on a loop device).
FIRST_POOL, SECOND_POOL = 160 * MiB, 768 * MiB


class Fleet:
    def __init__(self, rel: Release, thin_class: str, first_pool: Path, second_pool: Path) -> None:
        self.rel = rel
        self.thin_class = thin_class
        self.first_pool = first_pool
        self.second_pool = second_pool


@pytest.fixture(scope="module")
def fleet(release_factory: Callable[..., Release], cluster: Cluster, second: Obj) -> Iterator[Fleet]:
    """A release whose agent runs on every node, with the journal and the kubelet dir named by
    node, and one thin class whose pool is a small disk on the first node and a large one on the
    second (a per-node override, issue 25.5). A chart without overrides gets one pool directory
    for both agents (this host's), where only the second node makes images here."""
    rel = release_factory("fleet", storage_class=False)
    disks = [pool_disk(rel.host.root, "pool1", FIRST_POOL)]
    pool: dict[str, Any] = {"name": "fleet", "hostDir": str(disks[0][0])}
    if NODE_OVERRIDES:
        disks.append(pool_disk(rel.host.root, "pool2", SECOND_POOL))
        pool["nodes"] = [{"name": second["metadata"]["name"], "hostDir": str(disks[1][0])}]
    thin_class = f"{rel.storage_class}-thin"
    rel.install({"image": cluster.image, "imagePullPolicy": "IfNotPresent",
                 "agent": {"stateDir": f"{rel.host.state}/$(NODE_NAME)"}, "classes": [],
                 "dynamic": {"driverName": DRIVER, "kubeletDir": KUBELET_DIR_OF_NODE, "pools": [pool],
                             "classes": [{"name": thin_class, "pool": "fleet"}],
                             # on the node that stays: the claims of a StatefulSet re-created after
                             # node 2 is lost must be labelled for node 1's agent to see them
                             "claimLabeller": {"nodeSelector": {"kubernetes.io/hostname": cluster.hostname}}},
                 # the dynamic class opted in to node loss, the out-of-service taint too, quickly
                 "nodeCleanup": {"enabled": True, "storageClassNames": [thin_class], "outOfServiceTaint": True,
                                 "outOfServiceDelay": "3s", "pvcDeletionDelay": "3s",
                                 "nodeSelector": {"kubernetes.io/hostname": cluster.hostname}}})
    try:
        yield Fleet(rel, thin_class, disks[0][0], disks[-1][0])
    finally:
        ns = rel.namespace
        with contextlib.suppress(AssertionError):
            cluster.delete_workload_pods(ns)
        for pvc in cluster.list(PERSISTENT_VOLUME_CLAIMS, ns):
            cluster.delete(PERSISTENT_VOLUME_CLAIMS, pvc["metadata"]["name"], ns)

        def ours() -> list[Obj]:
            return [pv for pv in cluster.list(PERSISTENT_VOLUMES) if pv["spec"].get("storageClassName") == thin_class]
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not ours() or None, 120, "the dynamic PVs to be deleted by the agent")
        for pv in ours():
            cluster.delete(PERSISTENT_VOLUMES, pv["metadata"]["name"])
        for path, device in disks:
            subprocess.run(["umount", "-l", str(path)], check=False)
            subprocess.run(["losetup", "-d", device], check=False)


def agents_by_node(cluster: Cluster, namespace: str) -> dict[str, Obj]:
    pods = cluster.list(PODS, namespace, label_selector="app.kubernetes.io/component=agent")
    return {str(p["spec"].get("nodeName")): p for p in pods if ready(p)}


def test_each_node_runs_an_agent_on_its_own_journal_and_its_own_kubelet(cluster: Cluster, fleet: Fleet,
                                                                         second: Obj) -> None:
    """Both agents Ready and never restarted (a second agent on one journal exits at start),
    each registered with its own node's kubelet (the registration socket in that kubelet's
    plugins_registry: the node ID the kubelet got is its own node's)."""
    nodes = [cluster.node, second["metadata"]["name"]]

    def one_on_each() -> dict[str, Obj] | None:
        agents = agents_by_node(cluster, fleet.rel.namespace)
        return agents if all(n in agents for n in nodes) else None
    agents = wait_for(one_on_each, 180, f"a Ready agent on each of {nodes}", interval=0.5)
    for node in nodes:
        statuses = (agents[node].get("status") or {}).get("containerStatuses") or []
        assert [s["restartCount"] for s in statuses] == [0], f"the agent on {node} restarted: {statuses}"

        def registered(node: str = node) -> Obj | None:
            csinode = cluster.get(CSI_NODES, node) or {}
            return next((d for d in (csinode.get("spec") or {}).get("drivers") or [] if d.get("name") == DRIVER),
                        None)
        driver = wait_for(registered, 90, f"{DRIVER} in CSINode {node}")
        assert driver["nodeID"] == node
    # On this host: the first node's journal in its own directory below the one the chart
    # mounts (realk8s: the second's beside it), and no directory named by an unexpanded variable.
    names = sorted(p.name for p in fleet.rel.host.state.iterdir())
    assert (fleet.rel.host.state / cluster.node / LOCK_FILE).exists(), names
    assert not [n for n in names if "$" in n], names


def test_a_pod_on_the_second_node_writes_and_reads_a_raw_block_volume(cluster: Cluster, fleet: Fleet,
                                                                      second: Obj) -> None:
    """Issue 25.4 on the second node: its agent makes the image and stages and publishes it to
    its own kubelet; the pattern one pod writes, the next reads."""
    ns, host = fleet.rel.namespace, hostname_of(second)
    cluster.create(PERSISTENT_VOLUME_CLAIMS, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                              "metadata": {"name": "raw2"},
                                              "spec": {"storageClassName": fleet.thin_class, "volumeMode": "Block",
                                                       "accessModes": ["ReadWriteOnce"],
                                                       "resources": {"requests": {"storage": "16Mi"}}}}, ns)
    phase, log = block_pod(cluster, ns, "raw2-writer", "raw2",
                           "echo localpv-second-node-pattern > /tmp/p && "
                           "dd if=/tmp/p of=/dev/xvda bs=4096 seek=77 conv=fsync,sync 2>&1; echo written",
                           hostname=host)
    assert phase == "Succeeded" and "written" in log, log
    pv = bound_pv(cluster, ns, "raw2")
    assert pv["spec"]["volumeMode"] == "Block"
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert [e["values"] for t in terms for e in t["matchExpressions"]] == [[second["metadata"]["name"]]], terms
    writer = cluster.get(PODS, "raw2-writer", ns) or {}
    assert writer["spec"]["nodeName"] == second["metadata"]["name"]
    assert (fleet.second_pool / pv["metadata"]["name"] / "disk.img").stat().st_size == 16 * MiB
    cluster.delete_and_wait(PODS, "raw2-writer", ns)
    phase, log = block_pod(cluster, ns, "raw2-reader", "raw2",
                           "dd if=/dev/xvda bs=4096 skip=77 count=1 2>/dev/null | tr -d '\\000'", hostname=host)
    assert phase == "Succeeded", log
    assert log.startswith("localpv-second-node-pattern"), log
    cluster.delete_and_wait(PODS, "raw2-reader", ns)
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, "raw2", ns)
    wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, pv["metadata"]["name"]) is None, 120, "the PV to be deleted")


# ---------------------------------------------------------------- capacity tracking (issue 25.1)


def capacities(cluster: Cluster, namespace: str, storage_class: str) -> dict[str, int]:
    """The CSIStorageCapacity objects the agents published for a class: node name to bytes."""
    # At the version the cluster serves (1.20: v1alpha1, switched on by .ci/e2e), as the agents find it.
    served = served_resource(cluster.api, CSI_STORAGE_CAPACITIES)
    assert served is not None, "the cluster serves no CSIStorageCapacity version"
    out = {}
    for obj in cluster.list(served, namespace):
        node = ((obj.get("nodeTopology") or {}).get("matchLabels") or {}).get(TOPOLOGY_KEY)
        if obj.get("storageClassName") == storage_class and node and obj.get("capacity") is not None:
            out[str(node)] = int(parse_quantity(str(obj["capacity"])))
    return out


def published(cluster: Cluster, fleet: Fleet, nodes: list[str], rule: Callable[[dict[str, int]], bool],
              what: str) -> dict[str, int]:
    def check() -> dict[str, int] | None:
        found = capacities(cluster, fleet.rel.namespace, fleet.thin_class)
        return found if all(n in found for n in nodes) and rule(found) else None
    return wait_for(check, 120, f"capacity objects of {fleet.thin_class} where {what}", interval=0.5)


def unpinned_pod(cluster: Cluster, namespace: str, name: str, claim_name: str, script: str) -> None:
    """A pod with no node selector: where it runs is the scheduler's choice."""
    cluster.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "securityContext": {"fsGroup": FS_GROUP},
        "containers": [{"name": "work", "image": cluster.image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", script], "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]}}, namespace)


def reasons_on(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [str(e.get("reason")) for e in cluster.events(namespace)
            if (e.get("involvedObject") or {}).get("name") == name]


@needs_node_overrides
def test_claims_that_fit_only_the_second_node_are_provisioned_there_at_the_first_try(
        cluster: Cluster, fleet: Fleet, second: Obj) -> None:
    """Each agent publishes its node's room for the class; the scheduler places pods that need
    more than the first node's pool has on the second node at once: no claim is ever refused by
    an agent and rescheduled (which, placing blind, half of them would be)."""
    ns, node2 = fleet.rel.namespace, second["metadata"]["name"]
    size = 200 * MiB
    nodes = [cluster.node, node2]
    before = published(cluster, fleet, nodes, lambda c: c[cluster.node] < size and c[node2] >= 2 * size,
                       f"only {node2} has room for two claims of {size >> 20} MiB")
    for name in ("fits2-a", "fits2-b"):
        claim(cluster, ns, name, fleet.thin_class, f"{size >> 20}Mi")
        unpinned_pod(cluster, ns, f"{name}-user", name, "echo kept > /data/f && cat /data/f")
    for name in ("fits2-a", "fits2-b"):
        pod = wait_for(lambda n=name: (p := cluster.get(PODS, f"{n}-user", ns)) and
                       (p.get("status") or {}).get("phase") in ("Succeeded", "Failed") and p, 180,
                       f"pod {name}-user to finish")
        assert pod["status"]["phase"] == "Succeeded", cluster.pod_log(f"{name}-user", ns)
        assert pod["spec"]["nodeName"] == node2
        pv = bound_pv(cluster, ns, name)
        terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert [e["values"] for t in terms for e in t["matchExpressions"]] == [[node2]], terms
        assert (fleet.second_pool / pv["metadata"]["name"] / "disk.img").exists()
        reasons = reasons_on(cluster, ns, name)
        assert "ProvisioningFailed" not in reasons and "ProvisioningSucceeded" in reasons, reasons
    # The second node's figure went down by both claims' promises (thin, overcommit 1); by more
    # than one claim's, since the figure read before may lag an earlier release by a little.
    published(cluster, fleet, nodes, lambda c: c[node2] <= before[node2] - 3 * size // 2,
              f"{node2}'s room less the two claims")


@needs_node_overrides
def test_a_claim_that_fits_no_node_waits_with_the_schedulers_reason(cluster: Cluster, fleet: Fleet,
                                                                   second: Obj) -> None:
    """Both pools too full for the claim: the scheduler says so on the pod and leaves the claim
    alone (no node is selected, no agent is asked)."""
    ns, node2 = fleet.rel.namespace, second["metadata"]["name"]
    room = published(cluster, fleet, [cluster.node, node2], lambda c: True, "both nodes have a figure")
    size = max(room.values()) + 64 * MiB
    claim(cluster, ns, "too-big", fleet.thin_class, f"{size >> 20}Mi")
    unpinned_pod(cluster, ns, "too-big-user", "too-big", "true")
    event = wait_for(lambda: [e for e in cluster.events(ns) if e.get("reason") == "FailedScheduling"
                              and (e.get("involvedObject") or {}).get("name") == "too-big-user"] or None, 120,
                     "a FailedScheduling event on the pod")
    assert "2 node(s) did not have enough free storage" in event[-1]["message"], event[-1]["message"]
    pod = cluster.get(PODS, "too-big-user", ns) or {}
    assert (pod.get("status") or {}).get("phase") == "Pending" and not pod["spec"].get("nodeName")
    pvc = cluster.get(PERSISTENT_VOLUME_CLAIMS, "too-big", ns) or {}
    assert "volume.kubernetes.io/selected-node" not in (pvc["metadata"].get("annotations") or {})
    assert "ProvisioningFailed" not in reasons_on(cluster, ns, "too-big")
    cluster.delete_and_wait(PODS, "too-big-user", ns)
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, "too-big", ns)


# ---------------------------------------------------------------- the second node lost


def sts_pod(cluster: Cluster, namespace: str, name: str) -> Obj | None:
    return cluster.get(PODS, f"{name}-0", namespace)


def running_on(cluster: Cluster, namespace: str, name: str, node: str) -> Obj:
    return wait_for(lambda: (p := sts_pod(cluster, namespace, name)) and p["spec"].get("nodeName") == node
                    and (p.get("status") or {}).get("phase") == "Running" and p, 240,
                    f"StatefulSet {name}'s pod to run on {node}", interval=1)


def what_it_found(cluster: Cluster, namespace: str, pod: str) -> str:
    """A StatefulSet's pod's first line (see statefulset): whether its volume was empty."""
    return wait_for(lambda: (log := cluster.pod_log(pod, namespace)) and "was:" in log and log, 60, f"{pod}'s log")


def set_unschedulable(cluster: Cluster, node: str, value: bool) -> None:
    cluster.api.patch(NODES, node, {"spec": {"unschedulable": value or None}})


class Lost:
    """The second node, lost with a StatefulSet's pod on a static volume and another's on a
    dynamic volume; the claims they had, the static volume kept for the first node."""

    def __init__(self, node: str, static: Release, lost_path: Path, lost_pv: Obj, kept_pv: Obj,
                 static_claim: Obj, dynamic_claim: Obj) -> None:
        self.node = node
        self.static = static
        self.lost_path = lost_path
        self.lost_pv = lost_pv
        self.kept_pv = kept_pv
        self.static_claim = static_claim
        self.dynamic_claim = dynamic_claim


@pytest.fixture(scope="module")
def lost(release_factory: Callable[..., Release], cluster: Cluster, second: Obj, fleet: Fleet) -> Iterator[Lost]:
    """Two StatefulSets with their pods on the second node, which is then stopped (kubelet and
    containers: the machine is off); it is started again at the end, its Node re-registered."""
    if not (SECOND_NODE_STOP and SECOND_NODE_START):
        pytest.skip("LOCALPV_E2E_SECOND_NODE_STOP and LOCALPV_E2E_SECOND_NODE_START (commands that stop and "
                    "start the second node) are not set")
    node2, host2 = second["metadata"]["name"], hostname_of(second)
    # One static class, a discovery dir on each node: a release per node (a class's dir per
    # node is issue 25.5's; this keeps to what node cleanup of deleted Nodes always did),
    # node cleanup in the first node's release, for that class and deleted Nodes only.
    static = release_factory("loss1")
    other = release_factory("loss2", storage_class=False)
    other.storage_class = static.storage_class
    sc = static.storage_class
    static.install(static.values(nodeCleanup={"enabled": True, "storageClassNames": [sc], "pvcDeletionDelay": "3s",
                                              "stalePVDiscoveryInterval": "2s",
                                              "nodeSelector": {"kubernetes.io/hostname": cluster.hostname}}))
    other.install(other.values(nodeSelector={"kubernetes.io/hostname": host2}))
    # At first only the second node has a static volume: the pod goes there.
    lost_path = other.host.mount_volume("lost")
    lost_pv = cluster.available_pv(lost_path)
    cluster.create(STATEFUL_SETS, statefulset(cluster, "keeper", sc), static.namespace)
    # The dynamic one is placed while the first node is cordoned.
    set_unschedulable(cluster, cluster.node, True)
    try:
        cluster.create(STATEFUL_SETS, statefulset(cluster, "dkeeper", fleet.thin_class, "64Mi"), fleet.rel.namespace)
        running_on(cluster, fleet.rel.namespace, "dkeeper", node2)
    finally:
        set_unschedulable(cluster, cluster.node, False)
    running_on(cluster, static.namespace, "keeper", node2)
    static_claim = cluster.get(PERSISTENT_VOLUME_CLAIMS, "data-keeper-0", static.namespace) or {}
    assert static_claim["spec"]["volumeName"] == lost_pv["metadata"]["name"]
    dynamic_claim = cluster.get(PERSISTENT_VOLUME_CLAIMS, "data-dkeeper-0", fleet.rel.namespace) or {}
    for ns, name in ((static.namespace, "keeper"), (fleet.rel.namespace, "dkeeper")):
        assert "was: empty" in what_it_found(cluster, ns, f"{name}-0")
    kept_pv = cluster.available_pv(static.host.mount_volume("kept"))
    subprocess.run(["sh", "-c", SECOND_NODE_STOP], check=True, timeout=180, capture_output=True)
    try:
        yield Lost(node2, static, lost_path, lost_pv, kept_pv, static_claim, dynamic_claim)
    finally:
        for ns, name in ((static.namespace, "keeper"), (fleet.rel.namespace, "dkeeper")):
            cluster.delete(STATEFUL_SETS, name, ns)
            cluster.force_delete_pod(f"{name}-0", ns)
        subprocess.run(["sh", "-c", SECOND_NODE_START], check=True, timeout=300, capture_output=True)
        node = wait_for(lambda: (n := cluster.get(NODES, node2)) and ready(n) and n, 180, f"{node2} Ready again")
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != OUT_OF_SERVICE]
        cluster.api.patch(NODES, node2, {"spec": {"taints": taints or None}})


def test_a_statefulsets_dynamic_volume_on_a_node_out_of_service_comes_back_empty_on_the_first_node(
        cluster: Cluster, fleet: Fleet, lost: Lost) -> None:
    """Issue 25.3: the second node is off and someone says so (the out-of-service taint, the
    non-graceful shutdown signal). Node cleanup (dynamic class opted in) deletes the claim and
    the pods waiting on it; the StatefulSet makes a new pod and claim, provisioned on the first
    node: empty (local storage cannot move data). Nothing else is done here."""
    ns = fleet.rel.namespace
    cluster.api.patch(NODES, lost.node, {"spec": {"taints": [
        {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}]}})
    pod = running_on(cluster, ns, "dkeeper", cluster.node)
    claim_now = cluster.get(PERSISTENT_VOLUME_CLAIMS, "data-dkeeper-0", ns) or {}
    assert claim_now["metadata"]["uid"] != lost.dynamic_claim["metadata"]["uid"]
    pv = bound_pv(cluster, ns, "data-dkeeper-0")
    assert (fleet.first_pool / pv["metadata"]["name"] / "disk.img").exists()
    assert "was: empty" in what_it_found(cluster, ns, "dkeeper-0")
    reasons = [(e["reason"], e["involvedObject"].get("uid")) for e in cluster.events(ns)]
    assert ("ReferencedNodeOutOfService", lost.dynamic_claim["metadata"]["uid"]) in reasons, reasons
    assert any(r == "PodDeletedForLostNode" for r, _ in reasons), reasons
    assert pod["metadata"]["uid"]


def test_a_deleted_nodes_static_claim_is_released_and_the_statefulset_comes_back_on_the_first_node(
        cluster: Cluster, lost: Lost) -> None:
    """Node cleanup of static volumes on a Node really deleted (its machine retired): the claim
    is warned (ReferencedNodeDeleted) and deleted, the pod on the lost node and the one that
    waits on the deleted claim are deleted, and the StatefulSet's pod comes back on the first
    node with a new claim on that node's volume, empty; the lost volume's PV is deleted, its
    data left where it is."""
    ns = lost.static.namespace
    cluster.delete(NODES, lost.node)
    pod = running_on(cluster, ns, "keeper", cluster.node)
    claim_now = cluster.get(PERSISTENT_VOLUME_CLAIMS, "data-keeper-0", ns) or {}
    assert claim_now["metadata"]["uid"] != lost.static_claim["metadata"]["uid"]
    assert claim_now["spec"]["volumeName"] == lost.kept_pv["metadata"]["name"]
    assert "was: empty" in what_it_found(cluster, ns, "keeper-0")
    event = [e for e in cluster.events(ns) if e.get("reason") == "ReferencedNodeDeleted"
             and e["involvedObject"].get("uid") == lost.static_claim["metadata"]["uid"]]
    assert event and event[0]["type"] == "Warning", [e.get("reason") for e in cluster.events(ns)]
    # The stale PV path: the lost node's volume, released, goes too; its data stays on the disk.
    wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, lost.lost_pv["metadata"]["name"]) is None, 120,
             f"the lost node's PV {lost.lost_pv['metadata']['name']} to be deleted")
    assert (lost.lost_path / "mark").exists(), "node cleanup touches no data"
    assert pod["spec"]["nodeName"] == cluster.node


def statefulset(cluster: Cluster, name: str, storage_class: str, size: str = "1Mi") -> dict[str, Any]:
    """One replica whose pod says whether its volume was empty, marks it, and stays."""
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name}, "spec": {
        "serviceName": name, "replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "terminationGracePeriodSeconds": 1, "securityContext": {"fsGroup": FS_GROUP},
            "containers": [{"name": "work", "image": cluster.image, "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", "if [ -e /data/mark ]; then echo 'was: marked'; "
                                                    "else echo 'was: empty'; fi; touch /data/mark; sleep 3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
            "storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}}}}]}}

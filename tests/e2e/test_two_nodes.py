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
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from localpv.agent.statedir import LOCK_FILE
from localpv.kube.resources import NODES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS, Resource
from tests.e2e.cluster import Cluster, Obj, wait_for
from tests.e2e.conftest import Release
from tests.e2e.test_dynamic import CSI_NODES, DRIVER, KUBELET_DIR, MiB, block_pod, bound_pv, pool_disk

pytestmark = pytest.mark.e2e
STATEFUL_SETS = Resource("apps", "v1", "statefulsets", "StatefulSet", True)
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


class Fleet:
    def __init__(self, rel: Release, block_class: str) -> None:
        self.rel = rel
        self.block_class = block_class


@pytest.fixture(scope="module")
def fleet(release_factory: Callable[..., Release], cluster: Cluster, second: Obj) -> Iterator[Fleet]:
    """A release whose agent runs on every node, with the journal and the kubelet dir named by
    node. Its pool is one directory of this host for both agents until pools can differ per node
    (issue 25.5); only the second node makes images in it here."""
    rel = release_factory("fleet", storage_class=False)
    pool, device = pool_disk(rel.host.root, "pool", 512 * MiB)
    block_class = f"{rel.storage_class}-block"
    rel.install({"image": cluster.image, "imagePullPolicy": "IfNotPresent",
                 "agent": {"stateDir": f"{rel.host.state}/$(NODE_NAME)"}, "classes": [],
                 "dynamic": {"driverName": DRIVER, "kubeletDir": KUBELET_DIR_OF_NODE,
                             "pools": [{"name": "fleet", "hostDir": str(pool)}],
                             "classes": [{"name": block_class, "pool": "fleet"}]}})
    try:
        yield Fleet(rel, block_class)
    finally:
        ns = rel.namespace
        for pod in cluster.list(PODS, ns):
            if (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/component") != "agent":
                with contextlib.suppress(AssertionError):
                    cluster.delete_and_wait(PODS, pod["metadata"]["name"], ns, timeout=90)
        for pvc in cluster.list(PERSISTENT_VOLUME_CLAIMS, ns):
            cluster.delete(PERSISTENT_VOLUME_CLAIMS, pvc["metadata"]["name"], ns)

        def ours() -> list[Obj]:
            return [pv for pv in cluster.list(PERSISTENT_VOLUMES) if pv["spec"].get("storageClassName") == block_class]
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not ours() or None, 120, "the dynamic PVs to be deleted by the agent")
        for pv in ours():
            cluster.delete(PERSISTENT_VOLUMES, pv["metadata"]["name"])
        subprocess.run(["umount", "-l", str(pool)], check=False)
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
                                              "spec": {"storageClassName": fleet.block_class, "volumeMode": "Block",
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
    cluster.delete_and_wait(PODS, "raw2-writer", ns)
    phase, log = block_pod(cluster, ns, "raw2-reader", "raw2",
                           "dd if=/dev/xvda bs=4096 skip=77 count=1 2>/dev/null | tr -d '\\000'", hostname=host)
    assert phase == "Succeeded", log
    assert log.startswith("localpv-second-node-pattern"), log
    cluster.delete_and_wait(PODS, "raw2-reader", ns)
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, "raw2", ns)
    wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, pv["metadata"]["name"]) is None, 120, "the PV to be deleted")


# ---------------------------------------------------------------- a Node deleted for good


def sts_pod(cluster: Cluster, namespace: str) -> Obj | None:
    return cluster.get(PODS, "keeper-0", namespace)


@pytest.mark.skipif(not (SECOND_NODE_STOP and SECOND_NODE_START),
                    reason="LOCALPV_E2E_SECOND_NODE_STOP and LOCALPV_E2E_SECOND_NODE_START (commands that stop "
                           "and start the second node) are not set")
def test_a_deleted_nodes_static_claim_is_released_and_the_statefulset_comes_back_on_the_first_node(
        release_factory: Callable[..., Release], cluster: Cluster, second: Obj) -> None:
    """The existing node-cleanup (static volumes of a deleted Node) on a Node really gone: its
    kubelet and containers stopped, then the Node deleted, as when a machine is retired."""
    node2, host2 = second["metadata"]["name"], hostname_of(second)
    # One class, a discovery dir for each node: a release per node (until a class's dir can
    # differ per node, issue 25.5), node-cleanup in the first node's release.
    first = release_factory("loss1")
    other = release_factory("loss2", storage_class=False)
    other.storage_class = first.storage_class
    sc, ns = first.storage_class, first.namespace
    first.install(first.values(nodeCleanup={"enabled": True, "storageClassNames": [sc], "pvcDeletionDelay": "3s",
                                            "stalePVDiscoveryInterval": "2s",
                                            "nodeSelector": {"kubernetes.io/hostname": cluster.hostname}}))
    other.install(other.values(nodeSelector={"kubernetes.io/hostname": host2}))
    # At first only the second node has a volume: the StatefulSet's pod goes there.
    lost = other.host.mount_volume("lost")
    lost_pv = cluster.available_pv(lost)
    cluster.create(STATEFUL_SETS, statefulset(cluster, sc), ns)
    pod = wait_for(lambda: (p := sts_pod(cluster, ns)) and (p.get("status") or {}).get("phase") == "Running" and p,
                   180, "the StatefulSet's pod to run")
    assert pod["spec"]["nodeName"] == node2
    old_claim = cluster.get(PERSISTENT_VOLUME_CLAIMS, "data-keeper-0", ns) or {}
    assert old_claim["spec"]["volumeName"] == lost_pv["metadata"]["name"]
    assert "was: empty" in cluster.pod_log("keeper-0", ns)
    kept = first.host.mount_volume("kept")
    kept_pv = cluster.available_pv(kept)

    subprocess.run(["sh", "-c", SECOND_NODE_STOP], check=True, timeout=180, capture_output=True)
    try:
        cluster.delete(NODES, node2)
        event = wait_for(lambda: [e for e in cluster.events(ns) if e.get("reason") == "ReferencedNodeDeleted"
                                  and e["involvedObject"].get("uid") == old_claim["metadata"]["uid"]] or None,
                         120, "a ReferencedNodeDeleted event on the claim")
        assert event[0]["type"] == "Warning"

        def back_on_the_first_node() -> Obj | None:
            # The pod on the lost node waits for nobody (no kubelet will confirm it gone): it is
            # deleted at once, as the operator does (issue 25.3's node loss does it by itself), and
            # so is a pod recreated before its claim was gone (it names a claim being deleted).
            p = sts_pod(cluster, ns)
            if p is None:
                return None
            claim = cluster.get(PERSISTENT_VOLUME_CLAIMS, "data-keeper-0", ns)
            if p["spec"].get("nodeName") == node2 or (not p["spec"].get("nodeName") and (
                    claim is None or claim["metadata"].get("deletionTimestamp")
                    or claim["metadata"]["uid"] == old_claim["metadata"]["uid"])):
                if claim is not None and claim["metadata"]["uid"] == old_claim["metadata"]["uid"] \
                        and not claim["metadata"].get("deletionTimestamp"):
                    return None  # node-cleanup has not released the claim yet
                cluster.force_delete_pod("keeper-0", ns)
                return None
            return p if (p.get("status") or {}).get("phase") == "Running" else None
        pod = wait_for(back_on_the_first_node, 240, "the StatefulSet's pod to run on the first node", interval=1)
        assert pod["spec"]["nodeName"] == cluster.node
        claim = cluster.get(PERSISTENT_VOLUME_CLAIMS, "data-keeper-0", ns) or {}
        assert claim["metadata"]["uid"] != old_claim["metadata"]["uid"]
        assert claim["spec"]["volumeName"] == kept_pv["metadata"]["name"]
        assert "was: empty" in wait_for(lambda: (log := cluster.pod_log("keeper-0", ns)) and "was:" in log and log,
                                        60, "the new pod's log")
        # The stale PV path: the lost node's volume, released, goes too.
        wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, lost_pv["metadata"]["name"]) is None, 120,
                 f"the lost node's PV {lost_pv['metadata']['name']} to be deleted")
        assert (lost / "mark").exists(), "node-cleanup touches no data"
    finally:
        cluster.delete(STATEFUL_SETS, "keeper", ns)
        with contextlib.suppress(AssertionError):
            cluster.delete_and_wait(PODS, "keeper-0", ns, timeout=60)
        subprocess.run(["sh", "-c", SECOND_NODE_START], check=True, timeout=300, capture_output=True)
        wait_for(lambda: (n := cluster.get(NODES, node2)) and ready(n), 180, f"{node2} Ready again")


def statefulset(cluster: Cluster, storage_class: str) -> dict[str, Any]:
    """One replica whose pod says whether its volume was empty, marks it, and stays."""
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "keeper"}, "spec": {
        "serviceName": "keeper", "replicas": 1, "selector": {"matchLabels": {"app": "keeper"}},
        "template": {"metadata": {"labels": {"app": "keeper"}}, "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "work", "image": cluster.image, "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", "if [ -e /data/mark ]; then echo 'was: marked'; "
                                                    "else echo 'was: empty'; fi; touch /data/mark; sleep 3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
            "storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Mi"}}}}]}}

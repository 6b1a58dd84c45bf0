"""Dynamic volumes on a real cluster (issue 18): the agent as the CSI node plugin of a real
kubelet (1.20 on realk8s), its registration in the Node's CSINode, pods writing through
dynamic claims with the size enforced, online expansion seen by a running pod, the kubelet's
stats summary, an agent restart under a running pod, and a deleted claim's image removed.

The pool is an ext4 filesystem on a loop device, mounted on the node's host before the chart
is installed. ``LOCALPV_E2E_KUBELET_DIR`` names the kubelet's root directory (default
/var/lib/kubelet; realk8s: DATA/nodes/NAME/kubelet). Expansion uses an XFS class: growing a
mounted ext4 needs CAP_SYS_RESOURCE, which some hosts (realk8s's VM) give no process.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS, Resource
from tests.e2e.cluster import Cluster, Obj, run, wait_for
from tests.e2e.conftest import Release

pytestmark = pytest.mark.e2e
DRIVER = "local.csi.localpv.dev"
CSI_NODES = Resource("storage.k8s.io", "v1", "csinodes", "CSINode", False)
MiB = 1 << 20


class Dynamic:
    def __init__(self, rel: Release, pool: Path, device: str) -> None:
        self.rel = rel
        self.pool = pool
        self.device = device
        self.ext4 = f"{rel.storage_class}-ext4"
        self.xfs = f"{rel.storage_class}-xfs"


@pytest.fixture(scope="module")
def dyn(release_factory: Callable[..., Release], cluster: Cluster) -> Iterator[Dynamic]:
    rel = release_factory("dyn")
    image = rel.host.root / "pool.img"
    with open(image, "wb") as f:
        f.truncate(2 << 30)
    run("mkfs.ext4", "-q", "-F", str(image))
    device = run("losetup", "--find", "--show", str(image)).strip()
    pool = rel.host.root / "pool"
    pool.mkdir()
    run("mount", device, str(pool))
    # The agent sees the pool through a HostToContainer volume: containerd requires a
    # shared or slave source mount (on most nodes systemd makes every mount shared).
    run("mount", "--make-shared", str(pool))
    kubelet_dir = os.environ.get("LOCALPV_E2E_KUBELET_DIR") or "/var/lib/kubelet"
    rel.install(rel.values(dynamic={
        "driverName": DRIVER, "kubeletDir": kubelet_dir,
        "pools": [{"name": "e2e", "hostDir": str(pool)}],
        "classes": [{"name": f"{rel.storage_class}-ext4", "pool": "e2e", "allowVolumeExpansion": True},
                    {"name": f"{rel.storage_class}-xfs", "pool": "e2e", "fsType": "xfs",
                     "allowVolumeExpansion": True}]}))
    dynamic = Dynamic(rel, pool, device)
    try:
        yield dynamic
    finally:
        # While the agent still runs: pods go (volumes unpublished, unstaged), claims go, the
        # agent removes images and PVs; whatever is left is removed by hand.
        ns, classes = rel.namespace, (dynamic.ext4, dynamic.xfs)
        for pod in cluster.list(PODS, ns):
            with contextlib.suppress(AssertionError):
                cluster.delete_and_wait(PODS, pod["metadata"]["name"], ns, timeout=90)
        for pvc in cluster.list(PERSISTENT_VOLUME_CLAIMS, ns):
            cluster.delete(PERSISTENT_VOLUME_CLAIMS, pvc["metadata"]["name"], ns)

        def ours() -> list[Obj]:
            return [pv for pv in cluster.list(PERSISTENT_VOLUMES) if pv["spec"].get("storageClassName") in classes]
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not ours() or None, 120, "the dynamic PVs to be deleted by the agent")
        for pv in ours():
            cluster.delete(PERSISTENT_VOLUMES, pv["metadata"]["name"])
        subprocess.run(["umount", "-l", str(pool)], check=False)
        subprocess.run(["losetup", "-d", device], check=False)


def claim(cluster: Cluster, namespace: str, name: str, storage_class: str, size: str) -> None:
    cluster.create(PERSISTENT_VOLUME_CLAIMS, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                              "metadata": {"name": name},
                                              "spec": {"storageClassName": storage_class,
                                                       "accessModes": ["ReadWriteOnce"],
                                                       "resources": {"requests": {"storage": size}}}}, namespace)


#: The test image runs as 10001:10001. A new filesystem's root belongs to root (as mkfs leaves
#: it); the kubelet gives a CSI volume with an fsType to the pod's fsGroup, as for any CSI driver.
FS_GROUP = 10001


def long_pod(cluster: Cluster, namespace: str, name: str, claim_name: str, script: str) -> Obj:
    cluster.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": cluster.hostname}, "terminationGracePeriodSeconds": 1,
        "securityContext": {"fsGroup": FS_GROUP},
        "containers": [{"name": "work", "image": cluster.image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", script], "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]}}, namespace)

    def running() -> Obj | None:
        pod = cluster.get(PODS, name, namespace) or {}
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None
    return wait_for(running, 180, f"pod {name} to run")


def bound_pv(cluster: Cluster, namespace: str, name: str) -> Obj:
    def check() -> Obj | None:
        pvc = cluster.get(PERSISTENT_VOLUME_CLAIMS, name, namespace) or {}
        if (pvc.get("status") or {}).get("phase") != "Bound":
            return None
        return cluster.get(PERSISTENT_VOLUMES, pvc["spec"]["volumeName"])
    return wait_for(check, 120, f"claim {name} to be Bound")


def test_the_plugin_shows_in_the_nodes_csinode(cluster: Cluster, dyn: Dynamic) -> None:
    cluster.agent_pod(dyn.rel.namespace)

    def registered() -> Obj | None:
        node = cluster.get(CSI_NODES, cluster.node) or {}
        return next((d for d in (node.get("spec") or {}).get("drivers") or [] if d.get("name") == DRIVER), None)
    driver = wait_for(registered, 90, f"{DRIVER} in CSINode {cluster.node}")
    assert driver["nodeID"] == cluster.node
    assert driver.get("topologyKeys") == ["topology.localpv.dev/node"]


def test_a_pod_writes_and_writing_past_the_size_is_enospc(cluster: Cluster, dyn: Dynamic) -> None:
    ns = dyn.rel.namespace
    claim(cluster, ns, "small", dyn.ext4, "64Mi")
    phase, log = cluster.run_pod(ns, "writer", "small", "echo kept > /data/kept && "
                                 "dd if=/dev/zero of=/data/big bs=1M count=128 2>&1; sync; cat /data/kept", timeout=180,
                                 fs_group=FS_GROUP)
    assert phase == "Succeeded", log
    assert "No space left on device" in log and log.rstrip().endswith("kept")
    pv = bound_pv(cluster, ns, "small")
    assert pv["spec"]["csi"]["driver"] == DRIVER and pv["spec"]["capacity"]["storage"] == "64Mi"
    image = dyn.pool / pv["metadata"]["name"] / "disk.img"
    assert image.stat().st_size == 64 * MiB


def test_expansion_is_seen_by_the_running_pod_and_stats_show_usage(cluster: Cluster, dyn: Dynamic) -> None:
    ns = dyn.rel.namespace
    claim(cluster, ns, "grow", dyn.xfs, "300Mi")
    long_pod(cluster, ns, "grower", "grow", "dd if=/dev/zero of=/data/used bs=1M count=20; sync; sleep 3600")
    pv = bound_pv(cluster, ns, "grow")

    def size_kib() -> int:
        out = cluster.exec("grower", ns, ["df", "-k", "/data"]).splitlines()[-1].split()
        return int(out[1])
    before = size_kib()
    cluster.api.patch(PERSISTENT_VOLUME_CLAIMS, "grow", {"spec": {"resources": {"requests": {"storage": "400Mi"}}}},
                      ns)
    wait_for(lambda: ((cluster.get(PERSISTENT_VOLUME_CLAIMS, "grow", ns) or {}).get("status") or {})
             .get("capacity", {}).get("storage") == "400Mi", 180, "the claim's capacity to be 400Mi")
    wait_for(lambda: size_kib() > before + 80 * 1024, 60, "the pod to see the larger filesystem")
    # The kubelet's stats summary shows the volume's usage (NodeGetVolumeStats).
    from kubernetes import client

    def used() -> int | None:
        resp = client.CoreV1Api(cluster.client).connect_get_node_proxy_with_path(
            cluster.node, "stats/summary", _preload_content=False)
        summary = json.loads(resp.data)
        for pod in summary.get("pods") or []:
            for volume in pod.get("volume") or []:
                if (volume.get("pvcRef") or {}).get("name") == "grow" and volume.get("usedBytes"):
                    return int(volume["usedBytes"])
        return None
    # The kubelet refreshes volume stats on its own period: wait for a figure taken after the write.
    assert wait_for(lambda: (u := used()) is not None and u >= 20 * MiB and u, 180,
                    "the volume's usage in the kubelet's stats summary") >= 20 * MiB
    assert pv["spec"]["csi"]["fsType"] == "xfs"


def test_restarting_the_agent_does_not_disturb_a_pod_using_a_volume(cluster: Cluster, dyn: Dynamic) -> None:
    ns = dyn.rel.namespace
    claim(cluster, ns, "steady", dyn.ext4, "64Mi")
    long_pod(cluster, ns, "steady", "steady", "echo before > /data/f; sleep 3600")
    agent = cluster.agent_pod(ns)
    cluster.delete(PODS, agent["metadata"]["name"], ns)
    wait_for(lambda: (p := cluster.agent_pod(ns)) and p["metadata"]["uid"] != agent["metadata"]["uid"] and p, 180,
             "a new agent pod")
    out = cluster.exec("steady", ns, ["sh", "-c", "cat /data/f && echo after >> /data/f && cat /data/f"])
    assert out.split() == ["before", "before", "after"]


def test_deleting_the_claim_removes_the_image(cluster: Cluster, dyn: Dynamic) -> None:
    ns = dyn.rel.namespace
    claim(cluster, ns, "gone", dyn.ext4, "64Mi")
    phase, _ = cluster.run_pod(ns, "once", "gone", "echo x > /data/x", fs_group=FS_GROUP)
    assert phase == "Succeeded"
    pv = bound_pv(cluster, ns, "gone")
    volume_dir = dyn.pool / pv["metadata"]["name"]
    assert (volume_dir / "disk.img").exists()
    cluster.delete_and_wait(PODS, "once", ns)
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, "gone", ns)
    wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, pv["metadata"]["name"]) is None, 120, "the PV to be deleted")
    assert not volume_dir.exists()

"""Dynamic volumes on a real cluster (issue 18): the agent as the CSI node plugin of a real
kubelet (1.20 on realk8s), its registration in the Node's CSINode, pods writing through
dynamic claims with the size enforced, online expansion seen by a running pod, the kubelet's
stats summary, an agent restart under a running pod, a deleted claim's image removed, and a
raw block claim (issue 25.4) whose pattern one pod writes and the next reads.

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
from typing import Any

import pytest

from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS, Resource
from tests.e2e.cluster import Cluster, Obj, run, wait_for
from tests.e2e.conftest import Release

pytestmark = pytest.mark.e2e
DRIVER = "local.csi.localpv.dev"
CSI_NODES = Resource("storage.k8s.io", "v1", "csinodes", "CSINode", False)
MiB = 1 << 20
KUBELET_DIR = os.environ.get("LOCALPV_E2E_KUBELET_DIR") or "/var/lib/kubelet"
#: A command that restarts the node's kubelet (SIGKILL and start again), run on its host.
KUBELET_RESTART = os.environ.get("LOCALPV_E2E_KUBELET_RESTART") or ""


class Dynamic:
    def __init__(self, rel: Release, pool: Path, device: str, small: Path, small_device: str) -> None:
        self.rel = rel
        self.pool = pool
        self.device = device
        self.small = small
        self.small_device = small_device
        self.ext4 = f"{rel.storage_class}-ext4"
        self.xfs = f"{rel.storage_class}-xfs"
        self.thick = f"{rel.storage_class}-thick"
        #: A thin class on a small pool that promises twice its size.
        self.over = f"{rel.storage_class}-over"
        self.classes = (self.ext4, self.xfs, self.thick, self.over)


def pool_disk(root: Path, name: str, size: int) -> tuple[Path, str]:
    """An ext4 filesystem on a loop device, mounted at ROOT/NAME on a shared mount."""
    image = root / f"{name}.img"
    with open(image, "wb") as f:
        f.truncate(size)
    run("mkfs.ext4", "-q", "-F", str(image))
    device = run("losetup", "--find", "--show", str(image)).strip()
    pool = root / name
    pool.mkdir()
    run("mount", device, str(pool))
    # The agent sees the pool through a HostToContainer volume: containerd requires a
    # shared or slave source mount (on most nodes systemd makes every mount shared).
    run("mount", "--make-shared", str(pool))
    return pool, device


@pytest.fixture(scope="module")
def dyn(release_factory: Callable[..., Release], cluster: Cluster) -> Iterator[Dynamic]:
    rel = release_factory("dyn")
    pool, device = pool_disk(rel.host.root, "pool", 2 << 30)
    small, small_device = pool_disk(rel.host.root, "small", 256 * MiB)
    # Capacity tracking off: with it, the scheduler would not place the claims that the tests
    # of the agent's own account (thick after thin promises) need it to refuse and reschedule,
    # as it must when the scheduler placed on figures that were out of date.
    # test_two_nodes.py shows capacity tracking.
    rel.install(rel.values(dynamic={
        "driverName": DRIVER, "kubeletDir": KUBELET_DIR, "storageCapacity": False,
        "pools": [{"name": "e2e", "hostDir": str(pool)},
                  {"name": "small", "hostDir": str(small), "overcommit": 2}],
        "classes": [{"name": f"{rel.storage_class}-ext4", "pool": "e2e", "allowVolumeExpansion": True},
                    {"name": f"{rel.storage_class}-xfs", "pool": "e2e", "fsType": "xfs",
                     "allowVolumeExpansion": True},
                    {"name": f"{rel.storage_class}-thick", "pool": "e2e", "provisioning": "thick"},
                    {"name": f"{rel.storage_class}-over", "pool": "small"}]}))
    dynamic = Dynamic(rel, pool, device, small, small_device)
    try:
        yield dynamic
    finally:
        # While the agent still runs: pods go (volumes unpublished, unstaged), claims go, the
        # agent removes images and PVs; whatever is left is removed by hand.
        ns, classes = rel.namespace, dynamic.classes
        with contextlib.suppress(AssertionError):
            cluster.delete_workload_pods(ns)
        for pvc in cluster.list(PERSISTENT_VOLUME_CLAIMS, ns):
            cluster.delete(PERSISTENT_VOLUME_CLAIMS, pvc["metadata"]["name"], ns)

        def ours() -> list[Obj]:
            return [pv for pv in cluster.list(PERSISTENT_VOLUMES) if pv["spec"].get("storageClassName") in classes]
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not ours() or None, 120, "the dynamic PVs to be deleted by the agent")
        for pv in ours():
            cluster.delete(PERSISTENT_VOLUMES, pv["metadata"]["name"])
        for path, disk in ((pool, device), (small, small_device)):
            subprocess.run(["umount", "-l", str(path)], check=False)
            subprocess.run(["losetup", "-d", disk], check=False)


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


def block_pod(cluster: Cluster, namespace: str, name: str, claim_name: str, script: str,
              hostname: str | None = None) -> tuple[str, str]:
    """Run ``script`` as root in a pod with the claim as the raw device /dev/xvda (a device
    node belongs to root: the kubelet gives no fsGroup to a raw device), on the suite's node
    or the one whose hostname label is ``hostname``; (phase, log)."""
    cluster.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "securityContext": {"runAsUser": 0},
        "nodeSelector": {"kubernetes.io/hostname": hostname or cluster.hostname}, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "work", "image": cluster.image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", script],
                        "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]}}, namespace)

    def ended() -> str | None:
        phase = ((cluster.get(PODS, name, namespace) or {}).get("status") or {}).get("phase")
        return str(phase) if phase in ("Succeeded", "Failed") else None
    return wait_for(ended, 180, f"pod {name} to finish"), cluster.pod_log(name, namespace)


def test_a_raw_block_volume_keeps_a_pattern_from_one_pod_to_the_next(cluster: Cluster, dyn: Dynamic) -> None:
    """Issue 25.4: a volumeMode Block claim (of an ext4 class: its fsType does not apply) is a
    device of exactly its size; what one pod writes on it, the next reads back; its image goes
    with the claim."""
    ns = dyn.rel.namespace
    cluster.create(PERSISTENT_VOLUME_CLAIMS, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                              "metadata": {"name": "raw"},
                                              "spec": {"storageClassName": dyn.ext4, "volumeMode": "Block",
                                                       "accessModes": ["ReadWriteOnce"],
                                                       "resources": {"requests": {"storage": "16Mi"}}}}, ns)
    phase, log = block_pod(cluster, ns, "raw-writer", "raw",
                           "echo localpv-raw-block-pattern > /tmp/p && "
                           "dd if=/tmp/p of=/dev/xvda bs=4096 seek=1000 conv=fsync,sync 2>&1 && "
                           "dd if=/dev/zero of=/dev/xvda bs=1M seek=16 count=1 2>&1; echo written")
    assert phase == "Succeeded", log
    assert "No space left on device" in log, f"a write past 16 MiB must fail: {log}"
    pv = bound_pv(cluster, ns, "raw")
    assert pv["spec"]["volumeMode"] == "Block" and "fsType" not in pv["spec"]["csi"]
    image = dyn.pool / pv["metadata"]["name"] / "disk.img"
    assert image.stat().st_size == 16 * MiB
    cluster.delete_and_wait(PODS, "raw-writer", ns)
    phase, log = block_pod(cluster, ns, "raw-reader", "raw",
                           "dd if=/dev/xvda bs=4096 skip=1000 count=1 2>/dev/null | tr -d '\\000'")
    assert phase == "Succeeded", log
    assert log.startswith("localpv-raw-block-pattern"), log
    cluster.delete_and_wait(PODS, "raw-reader", ns)
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, "raw", ns)
    wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, pv["metadata"]["name"]) is None, 120, "the PV to be deleted")
    assert not image.parent.exists()


def csi_call(method: str, request: Any, answer: type[Any]) -> tuple[str, str]:
    """Call the agent's CSI socket on the host as the kubelet does: (status code, details)."""
    import grpc

    from localpv.csi.rpc import unary_call

    with grpc.insecure_channel(f"unix://{KUBELET_DIR}/plugins/{DRIVER}/csi.sock") as channel:
        try:
            unary_call(channel, f"/csi.v1.Node/{method}", request, answer, timeout=60)
        except grpc.RpcError as err:
            return err.code().name, err.details() or ""  # type: ignore[attr-defined]
    return "OK", ""


def stage_request(pv: Obj, staging: Path) -> Any:
    from localpv.csi.proto import csi_pb2 as csi

    return csi.NodeStageVolumeRequest(
        volume_id=pv["metadata"]["name"], staging_target_path=str(staging),
        volume_context=pv["spec"]["csi"]["volumeAttributes"],
        volume_capability=csi.VolumeCapability(
            mount=csi.VolumeCapability.MountVolume(fs_type=pv["spec"]["csi"]["fsType"]),
            access_mode=csi.VolumeCapability.AccessMode(mode=csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)))


def node_ready(cluster: Cluster) -> bool:
    from localpv.kube.resources import NODES

    node = cluster.get(NODES, cluster.node) or {}
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


@pytest.mark.skipif(not KUBELET_RESTART, reason="LOCALPV_E2E_KUBELET_RESTART (a command that restarts the "
                                                "node's kubelet) is not set")
def test_agent_and_kubelet_killed_under_a_running_pod_its_data_stays_and_a_second_stage_is_refused(
        cluster: Cluster, dyn: Dynamic) -> None:
    """Issue 23.1: a restarted agent container sees the loop devices its predecessor attached
    with backing paths of a dead mount namespace; it must still know each staged image."""
    from localpv.csi.proto import csi_pb2 as csi

    ns = dyn.rel.namespace
    claim(cluster, ns, "held", dyn.ext4, "64Mi")
    long_pod(cluster, ns, "holder", "held", "echo before > /data/f; sync; sleep 3600")
    pv = bound_pv(cluster, ns, "held")
    name = pv["metadata"]["name"]
    staging = Path(KUBELET_DIR) / "plugins" / "kubernetes.io" / "csi" / "pv" / name / "globalmount"
    wait_for(lambda: staging.is_dir() and os.path.ismount(staging), 60, f"{name} staged at {staging}")

    agent = cluster.agent_pod(ns)
    cluster.delete(PODS, agent["metadata"]["name"], ns)
    wait_for(lambda: (p := cluster.agent_pod(ns)) and p["metadata"]["uid"] != agent["metadata"]["uid"] and p, 180,
             "a new agent pod")
    subprocess.run(["sh", "-c", KUBELET_RESTART], check=True, timeout=120)
    wait_for(lambda: node_ready(cluster) or None, 120, f"node {cluster.node} Ready after its kubelet's restart")

    # The kubelet's own repeated stage (after its restart) succeeds; a stage elsewhere is refused.
    assert csi_call("NodeStageVolume", stage_request(pv, staging), csi.NodeStageVolumeResponse) == ("OK", "")
    other = staging.parent / "second"
    code, details = csi_call("NodeStageVolume", stage_request(pv, other), csi.NodeStageVolumeResponse)
    with contextlib.suppress(OSError):
        other.rmdir()
    assert code == "FAILED_PRECONDITION" and str(staging) in details, (code, details)
    assert not os.path.ismount(other)
    out = cluster.exec("holder", ns, ["sh", "-c", "cat /data/f && echo after >> /data/f && sync && cat /data/f"])
    assert out.split() == ["before", "before", "after"]
    assert (dyn.pool / name / "disk.img").exists()
    cluster.delete_and_wait(PODS, "holder", ns, timeout=120)
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, "held", ns)
    wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, name) is None, 120, "the PV to be deleted")
    assert not (dyn.pool / name).exists()


def events_of(cluster: Cluster, namespace: str, name: str, reason: str) -> list[Obj]:
    return [e for e in cluster.events(namespace)
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name]


def test_a_thick_claim_that_does_not_fit_what_thin_claims_were_promised_is_rescheduled(
        cluster: Cluster, dyn: Dynamic) -> None:
    """Issue 23.2: thin promises and thick allocations share one account (the pool is 2 GiB
    with no over-commit: a thin 1200 MiB claim leaves no room for a thick 1200 MiB one, though
    the thin image has taken almost nothing of the disk yet)."""
    ns = dyn.rel.namespace
    claim(cluster, ns, "thin", dyn.ext4, "1200Mi")
    phase, log = cluster.run_pod(ns, "thin-user", "thin", "echo ok", fs_group=FS_GROUP)
    assert phase == "Succeeded", log
    thin_pv = bound_pv(cluster, ns, "thin")
    claim(cluster, ns, "thick", dyn.thick, "1200Mi")
    cluster.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "thick-user"}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": cluster.hostname}, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "work", "image": cluster.image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "sleep 3600"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "thick"}}]}}, ns)
    failed = wait_for(lambda: [e for e in events_of(cluster, ns, "thick", "ProvisioningFailed")
                               if "rescheduling" in e.get("message", "")] or None, 120,
                      "a ProvisioningFailed event that reschedules the thick claim")
    assert "does not fit" in failed[0]["message"] or "needs" in failed[0]["message"], failed[0]["message"]
    pvc = cluster.get(PERSISTENT_VOLUME_CLAIMS, "thick", ns) or {}
    assert (pvc.get("status") or {}).get("phase") == "Pending"
    assert not [p for p in dyn.pool.iterdir() if p.name.startswith("pvc-") and p.name != thin_pv["metadata"]["name"]
                and p.name == f"pvc-{pvc['metadata']['uid']}"]
    cluster.delete_and_wait(PODS, "thick-user", ns, timeout=60)
    cluster.delete_and_wait(PODS, "thin-user", ns, timeout=60)
    for name in ("thick", "thin"):
        cluster.delete(PERSISTENT_VOLUME_CLAIMS, name, ns)
    wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, thin_pv["metadata"]["name"]) is None, 120,
             "the thin PV to be deleted")


def test_a_thin_pool_filled_by_two_tenants_is_said_on_their_claims_and_the_other_keeps_its_data(
        cluster: Cluster, dyn: Dynamic) -> None:
    """Issue 23.4: a 256 MiB pool that promises twice its size; two tenants of 200 MiB each write
    until it is full. A Warning on the claims within 2 minutes; the first tenant's data reads back."""
    ns = dyn.rel.namespace
    for name in ("tenant-a", "tenant-b"):
        claim(cluster, ns, name, dyn.over, "200Mi")
    phase, log = cluster.run_pod(ns, "writer-a", "tenant-a", "dd if=/dev/urandom of=/data/a bs=1M count=120 "
                                 "2>/dev/null && sync && md5sum /data/a > /data/a.md5 && sync && cat /data/a.md5",
                                 timeout=180, fs_group=FS_GROUP)
    assert phase == "Succeeded", log
    digest = log.split()[0]
    phase, log = cluster.run_pod(ns, "writer-b", "tenant-b", "dd if=/dev/urandom of=/data/b bs=1M count=190; sync; "
                                 "echo done", timeout=180, fs_group=FS_GROUP)
    assert log.rstrip().endswith("done"), log
    warned = wait_for(lambda: [e for name in ("tenant-a", "tenant-b")
                               for e in events_of(cluster, ns, name, "VolumeConditionAbnormal")] or None, 120,
                      "a VolumeConditionAbnormal Warning on a claim of the full pool")
    assert "pool small" in warned[0]["message"], warned[0]["message"]
    phase, log = cluster.run_pod(ns, "reader-a", "tenant-a", "md5sum /data/a", timeout=180, fs_group=FS_GROUP)
    assert phase == "Succeeded" and log.split()[0] == digest, log
    for pod in ("writer-a", "writer-b", "reader-a"):
        cluster.delete_and_wait(PODS, pod, ns, timeout=60)
    for name in ("tenant-a", "tenant-b"):
        cluster.delete(PERSISTENT_VOLUME_CLAIMS, name, ns)

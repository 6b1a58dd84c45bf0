"""The chart with its defaults on a real cluster: discovery of real mounts, a pod writing
through a WaitForFirstConsumer claim placed by the real scheduler, release → clean (the
agent's worker thread) → the same PV name offered again, empty; node cleanup running; every
component under exactly the chart's RBAC.

The only values set are where the chart touches this host (the class's hostDir, the
journal's stateDir) and the image; ``nodeCleanup.enabled`` adds that component.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS
from tests.e2e.cluster import Cluster, Obj, forbidden_in_log, run, wait_for
from tests.e2e.conftest import Release

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def rel(release_factory: Callable[[str], Release]) -> Release:
    rel = release_factory("life")
    rel.host.mount_volume("vol1", "16m")
    rel.host.mount_volume("vol2", "24m")
    rel.install(rel.values(nodeCleanup={"enabled": True}))
    return rel


def test_agent_runs_ready_and_logs_at_info(cluster: Cluster, rel: Release) -> None:
    pod = cluster.agent_pod(rel.namespace)
    [c] = pod["spec"]["containers"]
    assert c["image"] == cluster.image

    def started() -> str | None:
        text = cluster.pod_log(pod["metadata"]["name"], rel.namespace)
        return text if "agent running on node" in text else None

    log = wait_for(started, 30, "the agent's start in its log")
    assert "INFO" in log


def test_mounts_under_the_discovery_dir_become_pvs(cluster: Cluster, rel: Release) -> None:
    cluster.agent_pod(rel.namespace)
    for name, size in (("vol1", 16 << 20), ("vol2", 24 << 20)):
        pv = cluster.available_pv(rel.host.disks / name)
        assert pv["spec"]["storageClassName"] == rel.storage_class
        assert pv["spec"]["capacity"]["storage"] in (str(size), f"{size >> 20}Mi")
        terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == [cluster.hostname]
    # a mount made after the agent started appears too (HostToContainer propagation)
    rel.host.mount_volume("vol3", "8m")
    cluster.available_pv(rel.host.disks / "vol3", timeout=30)


def test_a_pod_writes_released_volume_is_cleaned_and_offered_again_empty(cluster: Cluster, rel: Release) -> None:
    cluster.agent_pod(rel.namespace)
    for name in ("vol1", "vol2", "vol3"):
        cluster.available_pv(rel.host.disks / name)
    ns = rel.namespace
    cluster.claim(ns, "data", rel.storage_class)
    phase, log = cluster.run_pod(ns, "writer", "data", "echo secret > /data/file && mkdir -p /data/d/e && "
                                 "echo more > /data/d/e/f && ls -A /data")
    assert phase == "Succeeded", log
    claim = cluster.get(PERSISTENT_VOLUME_CLAIMS, "data", ns)
    assert claim is not None and claim["status"]["phase"] == "Bound"
    pv_name = claim["spec"]["volumeName"]
    pv = cluster.get(PERSISTENT_VOLUMES, pv_name)
    assert pv is not None
    host_path = pv["spec"]["local"]["path"]
    with open(f"{host_path}/file", encoding="utf-8") as f:  # what the pod wrote, seen on the host
        assert f.read() == "secret\n"
    old_uid = pv["metadata"]["uid"]

    cluster.delete_and_wait(PODS, "writer", ns)
    cluster.delete_and_wait(PERSISTENT_VOLUME_CLAIMS, "data", ns)
    again = cluster.available_pv(rel.host.disks / host_path.rsplit("/", 1)[-1], timeout=90, not_uid=old_uid)
    assert again["metadata"]["name"] == pv_name, "the same volume is offered under the same PV name"
    assert os.listdir(host_path) == [], "the volume was offered again before it was emptied"

    # read back through a new pod bound to that PV
    cluster.claim(ns, "again", rel.storage_class, volume_name=pv_name)
    phase, log = cluster.run_pod(ns, "reader", "again", 'ls -A /data; test -z "$(ls -A /data)" && echo EMPTY')
    assert phase == "Succeeded" and "EMPTY" in log, log
    if cluster.audit_log:
        assert len(cluster.deletes_of(ns, pv_name)) == 1, "the agent deleted the released PV more than once"
    cluster.delete_and_wait(PODS, "reader", ns)
    cluster.delete_and_wait(PERSISTENT_VOLUME_CLAIMS, "again", ns)


def test_doctor_in_the_agent_pod_finds_nothing_wrong(cluster: Cluster, rel: Release) -> None:
    """`localpv doctor` checks the discovery dir, mount propagation, the StorageClass, the
    Node label and the agent's RBAC (SelfSubjectAccessReviews) from inside the pod."""
    pod = cluster.agent_pod(rel.namespace)
    out = cluster.exec(pod["metadata"]["name"], rel.namespace, ["localpv", "doctor"])
    assert out.strip() and "ERROR" not in out, out


def test_node_cleanup_runs_under_its_own_account(cluster: Cluster, rel: Release) -> None:
    [pod, *_] = cluster.ready_pods(rel.namespace, "node-cleanup")
    assert pod["spec"]["serviceAccountName"] != cluster.agent_pod(rel.namespace)["spec"]["serviceAccountName"]


def test_no_component_was_refused_anything(cluster: Cluster, rel: Release) -> None:
    """Exactly the chart's RBAC: no 403 for any of the release's service accounts."""
    assert cluster.forbidden(rel.namespace) == []
    for component in ("agent", "node-cleanup"):
        for pod in cluster.list(PODS, rel.namespace, label_selector=f"app.kubernetes.io/component={component}"):
            assert forbidden_in_log(cluster.pod_log(pod["metadata"]["name"], rel.namespace)) == [], component


def test_a_released_pv_put_on_offer_by_hand_while_its_cleanup_fails_is_taken_back(
        cluster: Cluster, rel: Release) -> None:
    """An operator removes the claimRef of a Released PV whose cleanup keeps failing, to
    "unstick" it. The real PV controller makes it Available over the previous tenant's
    files; the agent retracts it (a DELETE with uid and resourceVersion preconditions, which
    the real API server must honour), and offers a fresh PV only once a cleanup succeeded."""
    ns = rel.namespace
    vol = rel.host.mount_volume("vol4", "8m")
    pv = cluster.available_pv(vol)
    cluster.claim(ns, "stuck", rel.storage_class, volume_name=pv["metadata"]["name"])
    phase, log = cluster.run_pod(ns, "stuck-writer", "stuck", "echo secret > /data/file")
    assert phase == "Succeeded", log
    inner = vol / "inner"
    inner.mkdir()
    run("mount", "-t", "tmpfs", "-o", "size=1m", "localpv-e2e-inner", str(inner))  # every clean fails
    try:
        cluster.delete_and_wait(PODS, "stuck-writer", ns)
        cluster.delete_and_wait(PERSISTENT_VOLUME_CLAIMS, "stuck", ns)
        name, uid = pv["metadata"]["name"], pv["metadata"]["uid"]
        wait_for(lambda: any(e.get("reason") == "VolumeFailedDelete"
                             and (e.get("involvedObject") or {}).get("name") == name
                             for e in cluster.events("default")), 90, "a failed cleanup of the released PV")
        cluster.api.patch(PERSISTENT_VOLUMES, name, {"spec": {"claimRef": None}})
        wait_for(lambda: (cluster.get(PERSISTENT_VOLUMES, name) or {}).get("metadata", {}).get("uid") != uid,
                 30, "the PV put on offer over dirty data retracted")
        assert any(e.get("reason") == "VolumeRetracted" and (e.get("involvedObject") or {}).get("name") == name
                   for e in cluster.events("default"))
        assert cluster.pv_for(vol) is None, "no fresh PV while a cleanup cannot succeed"
    finally:
        run("umount", str(inner))
    fresh = cluster.available_pv(vol, timeout=120, not_uid=uid)
    assert fresh["metadata"]["name"] == name and os.listdir(vol) == [], "offered again only once empty"


def test_a_volume_unmounted_under_a_running_pod_is_abnormal_on_its_claim(cluster: Cluster, rel: Release) -> None:
    """Volume health on the real cluster: the disk of a volume a running pod uses is unmounted
    on the node (the pod keeps its own bind mount; what it writes next would go to the node's
    directory). The claim gets VolumeConditionAbnormal, as Kubernetes' health monitor posts it
    for CSI volumes, and VolumeConditionNormal once the same disk is mounted there again."""
    cluster.agent_pod(rel.namespace)
    path = rel.host.mount_volume("watched", "8m")
    pv = cluster.available_pv(path, timeout=30)
    ns = rel.namespace
    cluster.claim(ns, "watched", rel.storage_class, volume_name=pv["metadata"]["name"])
    cluster.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "user"}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": cluster.hostname}, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "work", "image": cluster.image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "echo data > /data/file; sleep 3600"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "watched"}}]}}, ns)
    wait_for(lambda: (cluster.get(PODS, "user", ns) or {}).get("status", {}).get("phase") == "Running" or None,
             120, "the pod running")

    def said(reason: str) -> Obj | None:
        return next((e for e in cluster.events(ns) if e.get("reason") == reason
                     and e["involvedObject"]["kind"] == "PersistentVolumeClaim"
                     and e["involvedObject"]["name"] == "watched"), None)

    # The same filesystem must come back (a new tmpfs would be another volume: held, not healthy),
    # so a second mount of it is kept aside while it is away from its path.
    aside = rel.host.root / "aside"
    aside.mkdir()
    run("mount", "--bind", str(path), str(aside))
    run("umount", str(path))
    event = wait_for(lambda: said("VolumeConditionAbnormal"), 60, "VolumeConditionAbnormal on the claim")
    assert event["type"] == "Warning" and "NotMounted" in event["message"], event
    assert (cluster.get(PODS, "user", ns) or {}).get("status", {}).get("phase") == "Running", "reporting only"
    run("mount", "--bind", str(aside), str(path))
    run("umount", str(aside))
    back = wait_for(lambda: said("VolumeConditionNormal"), 60, "VolumeConditionNormal on the claim")
    assert back["type"] == "Normal"
    cluster.delete_and_wait(PODS, "user", ns)
    cluster.delete_and_wait(PERSISTENT_VOLUME_CLAIMS, "watched", ns)

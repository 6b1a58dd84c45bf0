"""Claim → PV Bound → claim deleted → directory archived, retained or deleted: the emulator
(real HTTP, real client, its PV binder) and a real directory as the export."""

from __future__ import annotations

import os
import stat

import pytest

from localpv.naming import PROVISIONED_BY_ANNOTATION
from tests.conftest import wait_for
from tests.nfs.conftest import (
    NFS_PATH,
    PROVISIONER,
    SERVER,
    Cluster,
    Layout,
    Replicas,
    history,
    metric,
    records,
    volume_entries,
)


def dir_of(pv: dict[str, object], layout: Layout) -> str:
    path = str(pv["spec"]["nfs"]["path"])  # type: ignore[index]
    return os.path.join(str(layout.export), path[len(NFS_PATH) + 1:])


def test_a_claim_gets_a_bound_pv_with_the_nfs_source_and_a_0777_directory(cluster: Cluster, replicas: Replicas,
                                                                          layout: Layout) -> None:
    cluster.storage_class(reclaim="Retain", mount_options=["nfsvers=4.1", "hard"])
    claim = cluster.claim("data", "team-a", size="5Gi", modes=("ReadWriteOnce", "ReadOnlyMany"))
    replica = replicas.start()

    pv = wait_for(lambda: cluster.bound_pv("data", "team-a"), what="claim bound")

    uid = claim["metadata"]["uid"]
    dirname = f"team-a-data-pvc-{uid}"
    assert pv["metadata"]["name"] == f"pvc-{uid}"
    assert pv["metadata"]["annotations"][PROVISIONED_BY_ANNOTATION] == PROVISIONER
    assert pv["spec"]["claimRef"]["uid"] == uid
    assert (pv["spec"]["claimRef"]["namespace"], pv["spec"]["claimRef"]["name"]) == ("team-a", "data")
    assert pv["spec"]["storageClassName"] == "nfs"
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["mountOptions"] == ["nfsvers=4.1", "hard"]
    assert pv["spec"]["capacity"] == {"storage": "5Gi"}
    assert pv["spec"]["accessModes"] == ["ReadWriteOnce", "ReadOnlyMany"]
    assert pv["spec"]["nfs"] == {"server": SERVER, "path": f"{NFS_PATH}/{dirname}", "readOnly": False}
    assert stat.S_IMODE(os.stat(layout.export / dirname).st_mode) == 0o777
    def reasons() -> list[str]:
        replica.recorder.flush()
        return [e["reason"] for e in cluster.events() if e["involvedObject"].get("uid") == uid]

    wait_for(lambda: {"Provisioning", "ProvisioningSucceeded"} <= set(reasons()), what="events in the API")
    wait_for(lambda: metric(replica, "controller_persistentvolumeclaim_provision_total", **{"class": "nfs"}) == 1,
             what="provision counted")
    assert metric(replica, "localpv_nfs_directories_created_total") == 1

    # Retain: the claim goes, the PV stays Released and the directory stays.
    cluster.delete_claim("data", "team-a")
    wait_for(lambda: (cluster.pv(pv["metadata"]["name"]) or {}).get("status", {}).get("phase") == "Released",
             what="PV released")
    assert (layout.export / dirname).is_dir()


@pytest.mark.parametrize(
    ("parameters", "outcome"),
    [
        ({"archiveOnDelete": "false"}, "deleted"),
        ({}, "archived"),  # absent archiveOnDelete archives, as upstream
        ({"archiveOnDelete": "true"}, "archived"),
        ({"onDelete": "retain"}, "kept"),
        ({"onDelete": "delete", "archiveOnDelete": "true"}, "deleted"),
    ],
)
def test_released_directory_is_deleted_archived_or_retained(cluster: Cluster, replicas: Replicas, layout: Layout,
                                                             parameters: dict[str, str], outcome: str) -> None:
    cluster.storage_class(**parameters)
    cluster.claim("web")
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("web"), what="claim bound")
    path = dir_of(pv, layout)
    with open(os.path.join(path, "file"), "w") as f:
        f.write("tenant data")

    cluster.delete_claim("web")
    wait_for(lambda: cluster.pv(pv["metadata"]["name"]) is None, what="PV deleted")

    base = os.path.basename(path)
    entries = volume_entries(layout.export)
    expected = {"deleted": [], "archived": [f"archived-{base}"], "kept": [base]}[outcome]
    assert entries == expected
    if outcome != "deleted":
        with open(os.path.join(layout.export, entries[0], "file")) as f:
            assert f.read() == "tenant data"
    wait_for(lambda: metric(replica, "controller_persistentvolume_delete_total", **{"class": "nfs"}) == 1,
             what="delete counted")


def test_wait_for_first_consumer_waits_for_the_selected_node(cluster: Cluster, replicas: Replicas,
                                                             layout: Layout) -> None:
    cluster.storage_class(binding="WaitForFirstConsumer")
    cluster.claim("late")
    replica = replicas.start()
    wait_for(lambda: replica.controller is not None and replica.controller.synced.is_set(), what="synced")
    claim = cluster.pvc("late")
    assert claim is not None
    # The binder asks no provisioner before a node is chosen, and we do not act on our own.
    replica.controller.resync()  # type: ignore[union-attr]
    wait_for(replica.controller.idle, what="queues drained")  # type: ignore[union-attr]
    assert cluster.pvs() == [] and os.listdir(layout.export) == []

    claim["metadata"].setdefault("annotations", {})["volume.kubernetes.io/selected-node"] = "node-1"
    cluster.server.update(claim)
    wait_for(lambda: cluster.bound_pv("late"), what="bound after node selection")


def test_the_claims_class_must_name_us(cluster: Cluster, replicas: Replicas, layout: Layout) -> None:
    cluster.storage_class("other", provisioner="example.com/someone-else")
    cluster.storage_class()
    cluster.claim("theirs", storage_class="other")
    cluster.claim("ours")
    replica = replicas.start()
    wait_for(lambda: cluster.bound_pv("ours"), what="our claim bound")
    replica.controller.resync()  # type: ignore[union-attr]
    wait_for(replica.controller.idle, what="queues drained")  # type: ignore[union-attr]
    assert len(cluster.pvs()) == 1
    assert history(replica, "ProvisioningFailed") == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"volumeMode": "Block"}, "does not support block volume provisioning"),
        ({"selector": {"matchLabels": {"a": "b"}}}, "claim Selector is not supported"),
        # A VolumeAttributesClass (Kubernetes 1.29+) asks for attributes nothing could apply to
        # a directory: refused, as dynamic classes refuse it (before: provisioned as if unnamed).
        ({"volumeAttributesClassName": "gold"}, "volumeAttributesClassName 'gold': volume attributes classes are "
                                                "not supported"),
    ],
)
def test_block_and_selector_claims_are_refused_with_an_event(cluster: Cluster, replicas: Replicas, layout: Layout,
                                                             spec: dict[str, object], message: str) -> None:
    cluster.storage_class()
    cluster.claim("odd", **spec)
    replica = replicas.start()
    event = wait_for(lambda: history(replica, "ProvisioningFailed"), what="ProvisioningFailed")
    assert message in event[0].message
    assert cluster.pvs() == [] and os.listdir(layout.export) == []


def test_directory_gone_at_delete_time_still_deletes_the_pv(cluster: Cluster, replicas: Replicas,
                                                            layout: Layout) -> None:
    cluster.storage_class(archiveOnDelete="false")
    cluster.claim("gone")
    replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("gone"), what="bound")
    os.rmdir(dir_of(pv, layout))
    cluster.delete_claim("gone")
    wait_for(lambda: cluster.pv(pv["metadata"]["name"]) is None, what="PV deleted anyway")


def test_missing_class_at_delete_time_retries_with_events_until_it_is_back(cluster: Cluster, replicas: Replicas,
                                                                           layout: Layout) -> None:
    cluster.storage_class(archiveOnDelete="false")
    cluster.claim("orphan")
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("orphan"), what="bound")
    cluster.server.delete("storage.k8s.io/v1", "StorageClass", "nfs")
    cluster.delete_claim("orphan")

    wait_for(lambda: len(history(replica, "VolumeFailedDelete")) >= 2, what="retried with events")
    assert "storage class 'nfs' not found" in history(replica, "VolumeFailedDelete")[0].message
    assert os.path.isdir(dir_of(pv, layout)) and cluster.pv(pv["metadata"]["name"]) is not None

    cluster.storage_class(archiveOnDelete="false")
    wait_for(lambda: cluster.pv(pv["metadata"]["name"]) is None, what="deleted once the class is back")
    assert volume_entries(layout.export) == records(layout.export) == []


def test_same_name_in_two_namespaces_archives_twice_without_failing(cluster: Cluster, replicas: Replicas,
                                                                    layout: Layout) -> None:
    """Upstream renames both to ``archived-db`` and the second fails forever (research A.7)."""
    cluster.storage_class(pathPattern="${.PVC.namespace}/${.PVC.name}")
    for ns in ("a", "b"):
        cluster.claim("db", ns)
    replicas.start()
    pvs = [wait_for(lambda ns=ns: cluster.bound_pv("db", ns), what=f"bound in {ns}") for ns in ("a", "b")]
    for ns in ("a", "b"):
        cluster.delete_claim("db", ns)
    for pv in pvs:
        wait_for(lambda pv=pv: cluster.pv(pv["metadata"]["name"]) is None, what="archived and deleted")
    archived = sorted(e for e in os.listdir(layout.export) if e.startswith("archived-"))
    assert archived[0] == "archived-db" and len(archived) == 2
    assert sorted(os.listdir(layout.export / "a") + os.listdir(layout.export / "b")) == []


def test_a_shared_directory_is_warned_about_and_kept_while_another_pv_uses_it(cluster: Cluster, replicas: Replicas,
                                                                             layout: Layout) -> None:
    """Only a class that opts in shares (tests/nfs/test_ownership.py); the last one out, owner or
    not, disposes of the directory."""
    cluster.storage_class(pathPattern="shared/${.PVC.annotations.dir}", onDelete="delete",
                          allowSharedDirectories="true")
    cluster.claim("first", annotations={"dir": "team"})
    replica = replicas.start()
    first = wait_for(lambda: cluster.bound_pv("first"), what="first bound")
    with open(os.path.join(dir_of(first, layout), "file"), "w") as f:
        f.write("shared")
    cluster.claim("second", annotations={"dir": "team"})
    second = wait_for(lambda: cluster.bound_pv("second"), what="second bound")
    assert second["spec"]["nfs"]["path"] == first["spec"]["nfs"]["path"]
    warning = wait_for(lambda: history(replica, "DirectoryShared"), what="shared warning")
    assert first["metadata"]["name"] in warning[0].message

    cluster.delete_claim("first")
    wait_for(lambda: cluster.pv(first["metadata"]["name"]) is None, what="first PV deleted")
    assert os.path.exists(os.path.join(dir_of(second, layout), "file"))
    retained = history(replica, "DirectoryRetained")
    assert retained and second["metadata"]["name"] in retained[0].message

    cluster.delete_claim("second")
    wait_for(lambda: cluster.pv(second["metadata"]["name"]) is None, what="second PV deleted")
    assert os.listdir(layout.export / "shared") == []
    assert records(layout.export) == []

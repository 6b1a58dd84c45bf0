"""Hostile claims and tampered volumes: refused with a clear event, nothing touched outside
the export (the tree next to it and ``/`` are compared before and after)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import wait_for
from tests.nfs.conftest import NFS_PATH, Cluster, Layout, Replicas, history, metric, snapshot

NESTED = "${.PVC.namespace}/${.PVC.annotations.nfs.io/storage-path}"
ALONE = "${.PVC.annotations.nfs.io/storage-path}"
ANNOTATION = "annotations.nfs.io/storage-path"


@pytest.fixture
def untouched(layout: Layout) -> Iterator[Callable[[], None]]:
    """Call it to plant things first; the check runs at teardown... and on demand."""
    state: dict[str, object] = {}

    def remember() -> None:
        state["outside"] = layout.outside_snapshot()
        state["export"] = snapshot(layout.export)
        state["root"] = sorted(os.listdir("/"))

    yield remember
    assert layout.outside_snapshot() == state["outside"]
    assert snapshot(layout.export) == state["export"]
    assert sorted(os.listdir("/")) == state["root"]


@pytest.mark.parametrize(
    ("pattern", "value"),
    [
        (NESTED, ".."),
        (NESTED, "../.."),
        (NESTED, "a/../../b"),
        (NESTED, "."),
        (NESTED, "../outside/victim"),
        (NESTED, "//etc"),
        (ALONE, "/etc"),
        (ALONE, ".."),
        (ALONE, "."),
        (ALONE, "/"),
        (ALONE, "ok\x00/etc"),
    ],
)
def test_traversal_through_an_annotation_is_refused_naming_it(cluster: Cluster, replicas: Replicas,
                                                              untouched: Callable[[], None], pattern: str,
                                                              value: str) -> None:
    untouched()
    cluster.storage_class(pathPattern=pattern)
    cluster.claim("evil", "tenant", annotations={"nfs.io/storage-path": value})
    replica = replicas.start()

    failed = wait_for(lambda: history(replica, "ProvisioningFailed"), what="ProvisioningFailed")
    assert ANNOTATION in failed[0].message
    assert cluster.pvs() == []
    assert metric(replica, "localpv_nfs_path_rejections_total", operation="provision") >= 1


def test_the_refusal_reaches_the_api_as_an_event_on_the_claim(cluster: Cluster, replicas: Replicas,
                                                              untouched: Callable[[], None]) -> None:
    untouched()
    cluster.storage_class(pathPattern=NESTED)
    claim = cluster.claim("evil", "tenant", annotations={"nfs.io/storage-path": "../.."})
    replica = replicas.start()
    wait_for(lambda: history(replica, "ProvisioningFailed"), what="ProvisioningFailed")
    replica.recorder.flush()
    events = [e for e in cluster.events("ProvisioningFailed") if e["involvedObject"]["uid"] == claim["metadata"]["uid"]]
    assert events and events[0]["type"] == "Warning"
    assert f"{ANNOTATION}: '..' is not allowed as a path segment" in events[0]["message"]


def test_a_missing_label_does_not_collapse_to_a_shared_parent(cluster: Cluster, replicas: Replicas,
                                                              untouched: Callable[[], None]) -> None:
    untouched()
    cluster.storage_class(pathPattern="${.PVC.namespace}/${.PVC.labels.app}")
    cluster.claim("nolabel", "tenant")
    replica = replicas.start()
    failed = wait_for(lambda: history(replica, "ProvisioningFailed"), what="ProvisioningFailed")
    assert "labels.app: renders an empty path segment" in failed[0].message


@pytest.mark.parametrize(
    ("plant", "pattern", "labels"),
    [
        ("leaf-to-root", "${.PVC.labels.dir}", {"dir": "evil"}),
        ("leaf-to-outside", "${.PVC.labels.dir}", {"dir": "evil"}),
        ("intermediate-to-root", "${.PVC.labels.dir}/tmp", {"dir": "evil"}),
        ("intermediate-to-outside", "${.PVC.labels.dir}/${.PVC.name}", {"dir": "evil"}),
        ("deep-intermediate", "team/${.PVC.labels.dir}/${.PVC.name}", {"dir": "evil"}),
    ],
)
def test_a_symlink_planted_in_the_export_is_never_followed(cluster: Cluster, replicas: Replicas, layout: Layout,
                                                           untouched: Callable[[], None], plant: str, pattern: str,
                                                           labels: dict[str, str]) -> None:
    target = "/" if plant.endswith("root") else str(layout.outside / "victim")
    where = layout.export / "team" if plant == "deep-intermediate" else layout.export
    where.mkdir(exist_ok=True)
    os.symlink(target, where / "evil")
    untouched()
    cluster.storage_class(pathPattern=pattern)
    cluster.claim("victim", "tenant", labels=labels)
    replica = replicas.start()

    failed = wait_for(lambda: history(replica, "ProvisioningFailed"), what="ProvisioningFailed")
    assert "labels.dir" in failed[0].message and "is a symbolic link" in failed[0].message
    assert cluster.pvs() == []


# ---------------------------------------------------------------- tampered volumes at delete time


@pytest.mark.parametrize(
    ("path", "plant"),
    [
        ("/etc", None),
        (f"{NFS_PATH}/../outside/victim", None),
        (f"{NFS_PATH}/victim/..", None),
        (NFS_PATH, None),
        (f"{NFS_PATH}/", None),
        (f"{NFS_PATH}/link/victim", "intermediate"),
        (f"{NFS_PATH}/leaf", "leaf"),
    ],
)
@pytest.mark.parametrize("on_delete", ["delete", "archive"])
def test_a_tampered_volume_path_is_refused_at_delete(cluster: Cluster, replicas: Replicas, layout: Layout,
                                                     untouched: Callable[[], None], path: str, plant: str | None,
                                                     on_delete: str) -> None:
    if plant == "intermediate":
        os.symlink(layout.outside, layout.export / "link")
    elif plant == "leaf":
        os.symlink(layout.outside / "victim", layout.export / "leaf")
    (layout.export / "victim").mkdir()  # a tenant's directory the export-root path would destroy
    untouched()
    params = {"onDelete": "delete"} if on_delete == "delete" else {"archiveOnDelete": "true"}
    cluster.storage_class(**params)
    name = cluster.released_pv(path)
    replica = replicas.start()

    failed = wait_for(lambda: history(replica, "VolumeFailedDelete"), what="VolumeFailedDelete")
    assert "refusing to touch the directory" in failed[0].message
    assert cluster.pv(name) is not None
    assert metric(replica, "localpv_nfs_path_rejections_total", operation="delete") >= 1


def test_a_volume_on_another_server_is_not_ours_to_delete(cluster: Cluster, replicas: Replicas, layout: Layout,
                                                          untouched: Callable[[], None]) -> None:
    (layout.export / "data").mkdir()
    untouched()
    cluster.storage_class(onDelete="delete")
    name = cluster.released_pv(f"{NFS_PATH}/data", server="other.example.com")
    replica = replicas.start()
    wait_for(lambda: replica.controller is not None and replica.controller.synced.is_set(), what="synced")
    wait_for(replica.controller.idle, what="queues drained")  # type: ignore[union-attr]
    assert cluster.pv(name) is not None
    assert history(replica, "VolumeFailedDelete") == []

"""Deletion: finalizers, preconditions, propagation policies, owner-reference garbage collection
and namespace termination."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localpv_emulator.apiserver import ApiServer
from tests.emulator.conftest import Collector, configmap, node, pv, wait_for

Collect = Callable[..., Collector]


def owned_by(obj: dict[str, object], owner: dict[str, object]) -> dict[str, object]:
    meta = owner["metadata"]
    obj["metadata"]["ownerReferences"] = [{  # type: ignore[index]
        "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}]  # type: ignore[index]
    return obj


def test_a_finalizer_holds_the_object_until_it_is_removed(srv: ApiServer, core: client.CoreV1Api,
                                                          collect: Collect) -> None:
    held = pv("pv-a")
    held["metadata"]["finalizers"] = ["example.com/cleanup"]
    srv.create(held)
    srv.settle()
    rv = core.list_persistent_volume().metadata.resource_version
    watch = collect(core.list_persistent_volume, resource_version=rv)

    answer = core.delete_persistent_volume("pv-a")
    assert answer.metadata.deletion_timestamp is not None
    still = core.read_persistent_volume("pv-a")
    assert still.metadata.deletion_timestamp is not None and still.metadata.deletion_grace_period_seconds == 0
    modified = watch.next()
    assert modified["type"] == "MODIFIED" and modified["raw_object"]["metadata"]["deletionTimestamp"]

    with pytest.raises(ApiException) as exc:  # no new finalizers on an object being deleted
        core.patch_persistent_volume("pv-a", {"metadata": {"finalizers": ["example.com/cleanup", "example.com/x"]}})
    assert exc.value.status == 422
    core.patch_persistent_volume("pv-a", {"metadata": {"finalizers": None}})
    assert watch.next()["type"] == "DELETED"
    with pytest.raises(ApiException) as exc:
        core.read_persistent_volume("pv-a")
    assert exc.value.status == 404


def test_recreating_an_object_that_is_being_deleted_is_409(srv: ApiServer, core: client.CoreV1Api) -> None:
    held = configmap("cm")
    held["metadata"]["finalizers"] = ["example.com/x"]
    srv.create(held)
    core.delete_namespaced_config_map("cm", "default")
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("default", configmap("cm"))
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["message"] == 'object is being deleted: configmaps "cm" already exists'


def test_uid_and_version_preconditions(srv: ApiServer, core: client.CoreV1Api) -> None:
    created = srv.create(configmap("cm"))
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_config_map("cm", "default", body={"preconditions": {"uid": "not-the-uid"}})
    assert exc.value.status == 409
    assert json.loads(exc.value.body)["message"] == (
        f'Operation cannot be fulfilled on configmaps "cm": Precondition failed: UID in precondition: '
        f'not-the-uid, UID in object meta: {created["metadata"]["uid"]}')
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_config_map("cm", "default", body={"preconditions": {"resourceVersion": "1"}})
    assert exc.value.status == 409
    core.delete_namespaced_config_map("cm", "default", body={"preconditions": {"uid": created["metadata"]["uid"]}})
    assert srv.get("v1", "ConfigMap", "cm", "default") is None


def test_deleting_a_node_collects_its_persistent_volumes(srv: ApiServer, core: client.CoreV1Api) -> None:
    owner = srv.create(node("n1"))
    srv.create(owned_by(pv("pv-a", node="n1"), owner))
    srv.create(owned_by(pv("pv-b", node="n1"), owner))
    srv.create(pv("pv-free"))
    core.delete_node("n1")
    wait_for(lambda: [p["metadata"]["name"] for p in srv.list("v1", "PersistentVolume")] == ["pv-free"],
             what="the node's PVs to be collected")


def test_an_object_created_with_a_missing_owner_is_collected(srv: ApiServer) -> None:
    srv.create(owned_by(configmap("orphan"), {"apiVersion": "v1", "kind": "Node",
                                              "metadata": {"name": "gone", "uid": "no-such-uid"}}))
    wait_for(lambda: srv.get("v1", "ConfigMap", "orphan", "default") is None, what="collection")


def test_foreground_deletion_waits_for_the_dependents(srv: ApiServer, core: client.CoreV1Api) -> None:
    owner = srv.create(configmap("owner"))
    held = owned_by(configmap("dependent"), owner)
    held["metadata"]["finalizers"] = ["example.com/slow"]
    srv.create(held)
    core.delete_namespaced_config_map("owner", "default", propagation_policy="Foreground")
    srv.settle()
    owner_now = srv.get("v1", "ConfigMap", "owner", "default")
    assert owner_now is not None and owner_now["metadata"]["finalizers"] == ["foregroundDeletion"]
    dependent = srv.get("v1", "ConfigMap", "dependent", "default")
    assert dependent is not None and dependent["metadata"].get("deletionTimestamp")
    core.patch_namespaced_config_map("dependent", "default", {"metadata": {"finalizers": None}})
    wait_for(lambda: srv.get("v1", "ConfigMap", "owner", "default") is None, what="the owner to go")


def test_orphan_deletion_keeps_the_dependents(srv: ApiServer, core: client.CoreV1Api) -> None:
    owner = srv.create(configmap("owner"))
    srv.create(owned_by(configmap("dependent"), owner))
    core.delete_namespaced_config_map("owner", "default", propagation_policy="Orphan")
    wait_for(lambda: srv.get("v1", "ConfigMap", "owner", "default") is None, what="the owner to go")
    srv.settle()
    dependent = srv.get("v1", "ConfigMap", "dependent", "default")
    assert dependent is not None and "ownerReferences" not in dependent["metadata"]


def test_a_deleted_namespace_terminates_then_disappears(srv: ApiServer, core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team"}})
    held = configmap("cm", "team")
    held["metadata"]["finalizers"] = ["example.com/x"]
    srv.create(held)
    core.delete_namespace("team")
    srv.settle()
    assert core.read_namespace("team").status.phase == "Terminating"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("team", configmap("new", "team"))
    assert exc.value.status == 403
    core.patch_namespaced_config_map("cm", "team", {"metadata": {"finalizers": None}})
    wait_for(lambda: srv.get("v1", "Namespace", "team") is None, what="the namespace to go")


def test_delete_collection_honours_selectors(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create({**configmap("a"), "metadata": {"name": "a", "labels": {"app": "x"}}})
    srv.create(configmap("b"))
    core.delete_collection_namespaced_config_map("default", label_selector="app=x")
    assert [c["metadata"]["name"] for c in srv.list("v1", "ConfigMap", "default")] == ["b"]

"""Lists: label and field selectors, paging with continue tokens, resourceVersion semantics."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localpv_emulator.apiserver import ApiServer
from tests.emulator.conftest import configmap, pv


def names(items: list[object]) -> list[str]:
    return sorted(item.metadata.name for item in items)  # type: ignore[attr-defined]


@pytest.fixture
def labelled(srv: ApiServer) -> None:
    srv.create(pv("pv-a", labels={"tier": "fast", "node": "n1"}))
    srv.create(pv("pv-b", labels={"tier": "slow", "node": "n1"}))
    srv.create(pv("pv-c", labels={"tier": "fast"}))
    srv.create(pv("pv-d"))


@pytest.mark.usefixtures("labelled")
@pytest.mark.parametrize(("selector", "expected"), [
    ("tier=fast", ["pv-a", "pv-c"]),
    ("tier==fast", ["pv-a", "pv-c"]),
    ("tier!=fast", ["pv-b", "pv-d"]),
    ("tier in (fast, slow)", ["pv-a", "pv-b", "pv-c"]),
    ("tier notin (fast)", ["pv-b", "pv-d"]),
    ("node", ["pv-a", "pv-b"]),
    ("!node", ["pv-c", "pv-d"]),
    ("tier=fast,node", ["pv-a"]),
    ("", ["pv-a", "pv-b", "pv-c", "pv-d"]),
])
def test_label_selectors(core: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    assert names(core.list_persistent_volume(label_selector=selector).items) == expected


@pytest.mark.parametrize("selector", ["tier in ()", "tier=fast,", "=x", "tier=no spaces allowed", "a/b/c=x"])
def test_bad_label_selectors_are_400(core: client.CoreV1Api, selector: str) -> None:
    with pytest.raises(ApiException) as exc:
        core.list_persistent_volume(label_selector=selector)
    assert exc.value.status == 400 and json.loads(exc.value.body)["reason"] == "BadRequest"


def test_field_selectors_per_kind(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create(pv("pv-a"))
    srv.create(pv("pv-b"))
    assert names(core.list_persistent_volume(field_selector="metadata.name=pv-b").items) == ["pv-b"]
    assert names(core.list_persistent_volume(field_selector="metadata.name!=pv-b").items) == ["pv-a"]
    for name, node_name, phase in (("p1", "n1", "Running"), ("p2", "n2", "Running"), ("p3", "n1", None)):
        srv.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "i"}]}})
        if phase:
            srv.update({**srv.get("v1", "Pod", name, "default"), "status": {"phase": phase}},  # type: ignore[dict-item]
                       subresource="status")
    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1,status.phase=Running")
    assert names(pods.items) == ["p1"]
    assert names(core.list_namespaced_pod("default", field_selector="metadata.namespace=default").items) == [
        "p1", "p2", "p3"]


def test_event_and_secret_field_selectors(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "pv-a.17a", "namespace": "default"},
                "involvedObject": {"kind": "PersistentVolume", "name": "pv-a", "uid": "u1"},
                "reason": "Provisioned", "type": "Normal", "source": {"component": "localpv"}})
    srv.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls"}, "type": "kubernetes.io/tls",
                "data": {"tls.crt": "", "tls.key": ""}})
    events = core.list_namespaced_event("default", field_selector="involvedObject.kind=PersistentVolume,"
                                                                  "involvedObject.name=pv-a,source=localpv")
    assert names(events.items) == ["pv-a.17a"]
    assert names(core.list_namespaced_secret("default", field_selector="type=kubernetes.io/tls").items) == ["tls"]


@pytest.mark.parametrize(("lister", "selector"), [
    ("list_persistent_volume", "status.phase=Bound"),  # PVs have no status.phase field label
    ("list_persistent_volume", "metadata.namespace=default"),  # cluster-scoped
    ("list_namespaced_config_map", "data.a=1"),
])
def test_unsupported_field_labels_are_400(core: client.CoreV1Api, lister: str, selector: str) -> None:
    args = ("default",) if "namespaced" in lister else ()
    with pytest.raises(ApiException) as exc:
        getattr(core, lister)(*args, field_selector=selector)
    assert exc.value.status == 400
    assert json.loads(exc.value.body)["message"] == f"field label not supported: {selector.split('=', maxsplit=1)[0]}"


def test_list_items_carry_no_kind_but_the_list_does(srv: ApiServer, api: client.ApiClient) -> None:
    srv.create(pv("pv-a"))
    srv.settle()
    before = srv.store.rv
    response = api.rest_client.pool_manager.request("GET", srv.url + "/api/v1/persistentvolumes")
    after = srv.store.rv
    body = json.loads(response.data)
    assert (body["kind"], body["apiVersion"]) == ("PersistentVolumeList", "v1")
    # The store's version when the list was taken: the emulator's own controllers (the PV's
    # phase) may write in between, so it lies between the two reads (CI saw one such write).
    assert before <= int(body["metadata"]["resourceVersion"]) <= after
    assert int(body["metadata"]["resourceVersion"]) >= int(body["items"][0]["metadata"]["resourceVersion"])
    assert "kind" not in body["items"][0] and "apiVersion" not in body["items"][0]


def test_paging_with_limit_and_continue_is_a_consistent_snapshot(srv: ApiServer, core: client.CoreV1Api) -> None:
    for i in range(7):
        srv.create(configmap(f"cm-{i}"))
    first = core.list_namespaced_config_map("default", limit=3)
    assert names(first.items) == ["cm-0", "cm-1", "cm-2"]
    assert first.metadata.remaining_item_count == 4
    srv.delete("v1", "ConfigMap", "cm-4", "default")  # changes after the first page are not seen
    srv.create(configmap("cm-9"))
    second = core.list_namespaced_config_map("default", limit=3, _continue=first.metadata._continue)
    third = core.list_namespaced_config_map("default", limit=3, _continue=second.metadata._continue)
    assert names(second.items) == ["cm-3", "cm-4", "cm-5"]
    assert names(third.items) == ["cm-6"]
    assert third.metadata._continue is None
    assert second.metadata.resource_version == first.metadata.resource_version


def test_a_continue_token_expires_with_the_history(srv: ApiServer, core: client.CoreV1Api) -> None:
    for i in range(3):
        srv.create(configmap(f"cm-{i}"))
    first = core.list_namespaced_config_map("default", limit=1)
    srv.create(configmap("later"))
    srv.faults.forget_history()
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map("default", limit=1, _continue=first.metadata._continue)
    assert exc.value.status == 410
    assert json.loads(exc.value.body)["reason"] == "Expired"


def test_exact_resource_version_lists_the_past(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create(configmap("old"))
    then = core.list_namespaced_config_map("default").metadata.resource_version
    srv.create(configmap("new"))
    past = core.list_namespaced_config_map("default", resource_version=then, resource_version_match="Exact")
    assert names(past.items) == ["old"]
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map("default", resource_version_match="Exact")
    assert exc.value.status == 422
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map("default", resource_version=str(srv.store.rv + 100))
    assert exc.value.status == 504


def test_listing_across_namespaces(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    srv.create(configmap("a", "team"))
    srv.create(configmap("b"))
    everywhere = core.list_config_map_for_all_namespaces()
    assert [(c.metadata.namespace, c.metadata.name) for c in everywhere.items] == [("default", "b"), ("team", "a")]

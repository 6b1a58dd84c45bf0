"""The four patch types, their errors, and resourceVersion preconditions in patches."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localpv_emulator.apiserver import ApiServer
from tests.emulator.conftest import configmap

MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"


def pod(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "finalizers": ["example.com/a"]},
            "spec": {"containers": [{"name": "main", "image": "busybox:1"}]}}


def deployment(name: str) -> dict[str, object]:
    labels = {"app": name}
    return {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": labels}, "template": {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox:1", "env": [{"name": "A", "value": "1"}]},
                                {"name": "side", "image": "busybox:1"}],
                 "volumes": [{"name": "data", "emptyDir": {}}]}}}}


def test_merge_patch_merges_maps_replaces_lists_and_null_deletes(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", {**configmap("cm", a="1", b="2"),
                                                  "metadata": {"name": "cm", "labels": {"x": "1", "y": "2"}}})
    patched = core.patch_namespaced_config_map("cm", "default", {"data": {"a": None, "c": "3"},
                                                                 "metadata": {"labels": {"y": None}}},
                                               _content_type=MERGE)
    assert patched.data == {"b": "2", "c": "3"}
    assert patched.metadata.labels == {"x": "1"}


def test_json_patch_with_test_add_remove_replace(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", configmap("cm", a="1"))
    patched = core.patch_namespaced_config_map("cm", "default", [
        {"op": "test", "path": "/data/a", "value": "1"},
        {"op": "add", "path": "/data/b", "value": "2"},
        {"op": "replace", "path": "/data/a", "value": "one"},
        {"op": "add", "path": "/metadata/labels", "value": {"app": "x"}},
        {"op": "add", "path": "/metadata/labels/example.com~1role", "value": "db"},
        {"op": "move", "from": "/data/b", "path": "/data/c"},
    ])
    assert patched.data == {"a": "one", "c": "2"}
    assert patched.metadata.labels == {"app": "x", "example.com/role": "db"}
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_config_map("cm", "default", [{"op": "test", "path": "/data/a", "value": "1"},
                                                           {"op": "remove", "path": "/data/a"}])
    assert exc.value.status == 422
    assert core.read_namespaced_config_map("cm", "default").data == {"a": "one", "c": "2"}  # all or nothing


def test_strategic_merge_patch_merges_keyed_lists(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    apps.create_namespaced_deployment("default", deployment("web"))
    patched = apps.patch_namespaced_deployment("web", "default", {
        "metadata": {"finalizers": ["example.com/b"]},
        "spec": {"template": {"spec": {"containers": [
            {"name": "main", "image": "busybox:2", "env": [{"name": "B", "value": "2"}]},
            {"name": "side", "$patch": "delete"}]}}},
    })
    assert patched.metadata.finalizers == ["example.com/b"]
    spec = patched.spec.template.spec
    assert [c.name for c in spec.containers] == ["main"]
    assert spec.containers[0].image == "busybox:2"
    assert [(e.name, e.value) for e in spec.containers[0].env] == [("A", "1"), ("B", "2")]
    assert [v.name for v in spec.volumes] == ["data"]
    assert patched.metadata.generation == 2


def test_strategic_merge_patch_set_merges_finalizers(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    patched = core.patch_namespaced_pod("p", "default", {"metadata": {"finalizers": ["example.com/b"]}})
    assert patched.metadata.finalizers == ["example.com/a", "example.com/b"]


def test_pod_spec_is_immutable_but_for_images(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}})
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "other", "image": "x"}]}})
    assert exc.value.status == 422


def test_strategic_directives_delete_from_primitive_list(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    patched = core.patch_namespaced_pod("p", "default", {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a"]}})
    assert patched.metadata.finalizers is None


def test_a_resource_version_in_a_patch_is_a_precondition(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map("default", configmap("cm", a="1"))
    core.patch_namespaced_config_map("cm", "default", {"data": {"a": "2"}})
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_config_map("cm", "default", {
            "metadata": {"resourceVersion": created.metadata.resource_version}, "data": {"a": "3"}},
            _content_type=MERGE)
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "Conflict"


def test_patching_a_missing_object_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_config_map("absent", "default", {"data": {"a": "1"}})
    assert exc.value.status == 404


def test_unknown_patch_type_is_415(srv: ApiServer, api: client.ApiClient) -> None:
    srv.create(configmap("cm"))
    response = api.rest_client.pool_manager.request(
        "PATCH", srv.url + "/api/v1/namespaces/default/configmaps/cm", body=b"{}",
        headers={"Content-Type": "text/plain"})
    assert response.status == 415
    assert json.loads(response.data)["reason"] == "UnsupportedMediaType"


def test_server_side_apply_creates_then_merges(core: client.CoreV1Api) -> None:
    applied = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1"}}
    created = core.patch_namespaced_config_map("cm", "default", applied, field_manager="me",
                                               _content_type=APPLY)
    assert created.data == {"a": "1"}
    merged = core.patch_namespaced_config_map("cm", "default", {**applied, "data": {"b": "2"}},
                                              field_manager="me", _content_type=APPLY)
    assert merged.data == {"a": "1", "b": "2"}  # simplified apply: fields are never removed
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_config_map("cm", "default", applied, _content_type=APPLY)
    assert exc.value.status == 422  # apply needs a field manager


def test_status_patch_touches_only_status(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    patched = core.patch_namespaced_pod_status("p", "default", {
        "metadata": {"labels": {"ignored": "yes"}}, "status": {"phase": "Running"}})
    assert patched.status.phase == "Running"
    assert patched.metadata.labels is None

"""Create/read/update/delete through the real client: bookkeeping, 404/409/422/400 answers,
the status subresource, generation and no-op writes."""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localpv_emulator.apiserver import ApiServer
from tests.emulator.conftest import configmap, pv, pvc


def status_of(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, object]:
    body: dict[str, object] = json.loads(exc.value.body)
    return body


def test_crud_round_trip_for_several_kinds(srv: ApiServer, core: client.CoreV1Api,
                                           storage: client.StorageV1Api) -> None:
    created = core.create_persistent_volume(pv("pv-a"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.generation == 1
    assert created.status.phase == "Pending"  # status is the server's on create
    assert created.spec.persistent_volume_reclaim_policy == "Retain"  # defaulted
    cm = core.create_namespaced_config_map("default", configmap("settings", a="1"))
    sc = storage.create_storage_class({"metadata": {"name": "fast"}, "provisioner": "example.com/x"})
    assert sc.volume_binding_mode == "Immediate" and sc.reclaim_policy == "Delete"

    assert core.read_namespaced_config_map("settings", "default").data == {"a": "1"}
    cm.data = {"a": "2"}
    updated = core.replace_namespaced_config_map("settings", "default", cm)
    assert int(updated.metadata.resource_version) > int(cm.metadata.resource_version)
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["settings"]

    core.delete_namespaced_config_map("settings", "default")
    storage.delete_storage_class("fast")
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("settings", "default")
    assert exc.value.status == 404
    assert status_of(exc)["message"] == 'configmaps "settings" not found'
    assert status_of(exc)["reason"] == "NotFound"
    with pytest.raises(ApiException) as exc:
        storage.read_storage_class("fast")
    assert status_of(exc)["message"] == 'storageclasses.storage.k8s.io "fast" not found'


def test_one_global_resource_version_orders_all_writes(srv: ApiServer, core: client.CoreV1Api) -> None:
    versions = [
        int(core.create_persistent_volume(pv("pv-a")).metadata.resource_version),
        int(core.create_namespaced_config_map("default", configmap("x")).metadata.resource_version),
        int(core.create_namespace({"metadata": {"name": "team"}}).metadata.resource_version),
    ]
    assert versions == sorted(versions) and len(set(versions)) == 3
    listed = core.list_persistent_volume()
    assert int(listed.metadata.resource_version) >= versions[-1]


def test_create_twice_is_409_already_exists(core: client.CoreV1Api) -> None:
    core.create_persistent_volume(pv("pv-a"))
    with pytest.raises(ApiException) as exc:
        core.create_persistent_volume(pv("pv-a"))
    assert exc.value.status == 409
    status = status_of(exc)
    assert status["reason"] == "AlreadyExists"
    assert status["message"] == 'persistentvolumes "pv-a" already exists'
    assert status["details"] == {"name": "pv-a", "kind": "persistentvolumes"}


def test_stale_update_is_409_conflict(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map("default", configmap("cm", a="1"))
    first = core.read_namespaced_config_map("cm", "default")
    second = core.read_namespaced_config_map("cm", "default")
    first.data = {"a": "first"}
    core.replace_namespaced_config_map("cm", "default", first)
    second.data = {"a": "second"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map("cm", "default", second)
    assert exc.value.status == 409
    assert status_of(exc)["reason"] == "Conflict"
    assert status_of(exc)["message"] == (
        'Operation cannot be fulfilled on configmaps "cm": the object has been modified; please apply your '
        "changes to the latest version and try again")
    second.metadata.resource_version = None  # an unconditional update is allowed
    assert core.replace_namespaced_config_map("cm", "default", second).data == {"a": "second"}


def test_invalid_objects_are_422_with_causes(core: client.CoreV1Api) -> None:
    bad = pv("Bad_Name")
    bad["spec"].pop("capacity")
    bad["spec"]["nfs"] = {"server": "s", "path": "/x"}
    bad["metadata"]["labels"] = {"ok": "not ok!"}
    with pytest.raises(ApiException) as exc:
        core.create_persistent_volume(bad)
    assert exc.value.status == 422
    status = status_of(exc)
    assert status["reason"] == "Invalid"
    assert str(status["message"]).startswith('PersistentVolume "Bad_Name" is invalid: [')
    fields = {cause["field"]: cause["reason"] for cause in status["details"]["causes"]}  # type: ignore[index]
    assert fields == {"metadata.name": "FieldValueInvalid", "metadata.labels[ok]": "FieldValueInvalid",
                      "spec.capacity": "FieldValueRequired", "spec.nfs": "FieldValueForbidden"}


@pytest.mark.parametrize(("change", "field"), [
    (lambda spec: spec.update(hostPath={"path": "/elsewhere"}), "spec.persistentvolumesource"),
    (lambda spec: spec.update(volumeMode="Block"), "volumeMode"),
])
def test_pv_source_and_mode_are_immutable(srv: ApiServer, core: client.CoreV1Api, change: object,
                                          field: str) -> None:
    core.create_persistent_volume(pv("pv-a"))
    srv.settle()  # the binder makes it Available first
    body = core.api_client.sanitize_for_serialization(core.read_persistent_volume("pv-a"))
    change(body["spec"])  # type: ignore[operator]
    with pytest.raises(ApiException) as exc:
        core.replace_persistent_volume("pv-a", body)
    assert exc.value.status == 422
    assert status_of(exc)["details"]["causes"][0]["field"] == field  # type: ignore[index]


def test_claim_spec_is_immutable_but_a_bound_claim_may_grow(srv: ApiServer, core: client.CoreV1Api) -> None:
    core.create_persistent_volume(pv("pv-a", "5Gi"))
    core.create_namespaced_persistent_volume_claim("default", pvc("data", "1Gi"))
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_persistent_volume_claim("data", "default", {"spec": {"accessModes": ["ReadWriteMany"]}})
    assert exc.value.status == 422 and "spec is immutable after creation" in status_of(exc)["message"]  # type: ignore[operator]
    srv.settle()
    grown = core.patch_namespaced_persistent_volume_claim(
        "data", "default", {"spec": {"resources": {"requests": {"storage": "2Gi"}}}})
    assert grown.spec.resources.requests == {"storage": "2Gi"}
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_persistent_volume_claim(
            "data", "default", {"spec": {"resources": {"requests": {"storage": "1Gi"}}}})
    assert "can not be less than previous value" in status_of(exc)["message"]  # type: ignore[operator]


def test_namespaced_objects_need_their_namespace(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("nowhere", configmap("x", namespace="nowhere"))
    assert exc.value.status == 404
    assert status_of(exc)["message"] == 'namespaces "nowhere" not found'
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("default", configmap("x", namespace="kube-system"))
    assert exc.value.status == 400
    assert status_of(exc)["message"] == (
        "the namespace of the provided object does not match the namespace sent on the request")


def test_body_kind_must_match_the_url(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("default", {**configmap("x"), "kind": "Secret"})
    assert exc.value.status == 400


def test_generate_name_and_resource_version_on_create(core: client.CoreV1Api) -> None:
    made = core.create_namespaced_config_map("default", {"metadata": {"generateName": "job-"}})
    assert made.metadata.name.startswith("job-") and len(made.metadata.name) == len("job-") + 5
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("default", {"metadata": {"name": "y", "resourceVersion": "5"}})
    assert exc.value.status == 500


def test_generation_counts_spec_changes_only(srv: ApiServer, core: client.CoreV1Api) -> None:
    core.create_persistent_volume(pv("pv-a"))
    labelled = core.patch_persistent_volume("pv-a", {"metadata": {"labels": {"x": "y"}}})
    assert labelled.metadata.generation == 1
    grown = core.patch_persistent_volume("pv-a", {"spec": {"capacity": {"storage": "2Gi"}}})
    assert grown.metadata.generation == 2
    status = core.patch_persistent_volume_status("pv-a", {"status": {"message": "hello"}})
    assert status.metadata.generation == 2


def test_a_no_op_update_writes_nothing(core: client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map("default", configmap("cm", a="1"))
    again = core.replace_namespaced_config_map("cm", "default", cm)
    assert again.metadata.resource_version == cm.metadata.resource_version


def test_main_resource_ignores_status_and_status_ignores_the_rest(srv: ApiServer, core: client.CoreV1Api) -> None:
    core.create_persistent_volume(pv("pv-a"))
    srv.settle()
    body = core.api_client.sanitize_for_serialization(core.read_persistent_volume("pv-a"))
    body["status"] = {"phase": "Failed"}
    body["metadata"]["labels"] = {"via": "main"}
    after_main = core.replace_persistent_volume("pv-a", body)
    assert after_main.status.phase != "Failed"
    assert after_main.metadata.labels == {"via": "main"}

    body = core.api_client.sanitize_for_serialization(after_main)
    body["status"] = {"phase": "Failed", "message": "broken"}
    body["metadata"]["labels"] = {"via": "status"}
    body["spec"]["capacity"] = {"storage": "9Gi"}
    after_status = core.replace_persistent_volume_status("pv-a", body)
    assert after_status.status.phase == "Failed" and after_status.status.message == "broken"
    assert after_status.metadata.labels == {"via": "main"}
    assert after_status.spec.capacity == {"storage": "1Gi"}


def test_delete_answers_with_the_object_or_a_success_status(core: client.CoreV1Api) -> None:
    core.create_persistent_volume(pv("pv-a"))
    core.create_namespaced_config_map("default", configmap("cm"))
    gone_pv = core.delete_persistent_volume("pv-a")
    assert gone_pv.metadata.name == "pv-a"  # PVs answer with the object, like pods and claims
    gone_cm = core.delete_namespaced_config_map("cm", "default")
    assert gone_cm["kind"] == "Status" and gone_cm["status"] == "Success"
    assert gone_cm["details"]["name"] == "cm"


def test_wrong_verbs_and_unknown_paths(srv: ApiServer, api: client.ApiClient) -> None:
    http = api.rest_client.pool_manager
    response = http.request("GET", srv.url + "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
    assert response.status == 405
    assert json.loads(response.data)["reason"] == "MethodNotAllowed"
    response = http.request("GET", srv.url + "/api/v1/nothings")
    assert response.status == 404
    assert json.loads(response.data)["reason"] == "NotFound"


def test_secrets_take_string_data_and_check_base64(core: client.CoreV1Api) -> None:
    secret = core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    assert secret.data == {"k": "dg=="} and secret.type == "Opaque"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_secret("default", {"metadata": {"name": "t"}, "data": {"k": "%%%"}})
    assert exc.value.status == 422


def test_access_reviews_follow_the_denial_list(srv: ApiServer, api: client.ApiClient,
                                               core: client.CoreV1Api) -> None:
    authz = client.AuthorizationV1Api(api)
    review = {"spec": {"resourceAttributes": {"verb": "list", "resource": "persistentvolumes"}}}
    assert authz.create_self_subject_access_review(review).status.allowed is True
    srv.deny("list", "persistentvolumes")
    assert authz.create_self_subject_access_review(review).status.allowed is False
    with pytest.raises(ApiException) as exc:
        core.list_persistent_volume()
    assert exc.value.status == 403
    assert json.loads(exc.value.body)["message"] == (
        'persistentvolumes is forbidden: User "system:anonymous" cannot list resource "persistentvolumes" '
        'in API group "" at the cluster scope')
    srv.allow_all()
    core.list_persistent_volume()


def test_concurrent_read_modify_write_loses_no_update(srv: ApiServer) -> None:
    """Optimistic concurrency under real contention: every increment lands exactly once."""
    srv.create(configmap("counter", n="0"))

    def increment(times: int) -> None:
        core = client.CoreV1Api(srv.api_client())
        for _ in range(times):
            while True:
                cm = core.read_namespaced_config_map("counter", "default")
                cm.data = {"n": str(int(cm.data["n"]) + 1)}
                try:
                    core.replace_namespaced_config_map("counter", "default", cm)
                    break
                except ApiException as exc:
                    assert exc.status == 409  # somebody else won: re-read and retry

    threads = [threading.Thread(target=increment, args=(15,)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    final = srv.get("v1", "ConfigMap", "counter", "default")
    assert final is not None and final["data"] == {"n": "90"}

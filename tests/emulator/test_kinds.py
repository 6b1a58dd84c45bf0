"""Kinds with their own rules: leases, both Event APIs, services, RBAC, workloads; and dry runs."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localpv_emulator.apiserver import ApiServer
from tests.conftest import wait_for
from tests.emulator.conftest import configmap


def test_leases_for_leader_election(api: client.ApiClient) -> None:
    coordination = client.CoordinationV1Api(api)
    lease = {"metadata": {"name": "localpv"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15,
                                                      "renewTime": "2024-01-01T00:00:00.000000Z"}}
    created = coordination.create_namespaced_lease("kube-system", lease)
    created.spec.holder_identity = "b"
    renewed = coordination.replace_namespaced_lease("localpv", "kube-system", created)
    assert renewed.spec.holder_identity == "b"
    created.spec.holder_identity = "c"  # a second candidate with the stale version loses
    with pytest.raises(ApiException) as exc:
        coordination.replace_namespaced_lease("localpv", "kube-system", created)
    assert exc.value.status == 409
    made = coordination.replace_namespaced_lease("other", "kube-system", {**lease, "metadata": {"name": "other"}})
    assert made.metadata.name == "other"  # PUT creates leases, as the real server allows


def test_core_events_as_recorders_write_them(api: client.ApiClient, core: client.CoreV1Api) -> None:
    event = {"metadata": {"name": "pv-a.17c3a1b2c3d4e5f6", "namespace": "default"},
             "involvedObject": {"kind": "PersistentVolume", "name": "pv-a", "uid": "u"},
             "reason": "VolumeDeleted", "message": "deleted", "type": "Normal", "count": 1,
             "source": {"component": "localpv"}, "firstTimestamp": "2024-01-01T00:00:00Z",
             "lastTimestamp": "2024-01-01T00:00:00Z"}
    core.create_namespaced_event("default", event)
    core.patch_namespaced_event("pv-a.17c3a1b2c3d4e5f6", "default", {"count": 2})
    assert core.read_namespaced_event("pv-a.17c3a1b2c3d4e5f6", "default").count == 2
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_event("default", {**event, "metadata": {"name": "x"},
                                                 "involvedObject": {"kind": "Pod", "namespace": "other"}})
    assert exc.value.status == 422


def test_events_v1_are_validated_strictly(api: client.ApiClient) -> None:
    events = client.EventsV1Api(api)
    good = {"metadata": {"name": "e1"}, "eventTime": "2024-01-01T00:00:00.000000Z", "reportingController":
            "localpv", "reportingInstance": "node-1", "action": "Provision", "reason": "Provisioned",
            "type": "Normal", "regarding": {"kind": "PersistentVolume", "name": "pv-a"}}
    assert events.create_namespaced_event("default", good).reporting_controller == "localpv"
    with pytest.raises(ApiException) as exc:
        events.create_namespaced_event("default", {**good, "metadata": {"name": "e2"}, "action": None,
                                                   "type": "Loud"})
    assert exc.value.status == 422
    assert {"action", "type"} <= {c["field"] for c in json.loads(exc.value.body)["details"]["causes"]}


def test_services_get_a_cluster_ip_that_is_immutable(core: client.CoreV1Api) -> None:
    made = core.create_namespaced_service("default", {"metadata": {"name": "metrics"},
                                                      "spec": {"ports": [{"port": 8080}]}})
    assert made.spec.cluster_ip and made.spec.ports[0].protocol == "TCP"
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_service("metrics", "default", {"spec": {"clusterIP": "10.0.0.1"}})
    assert exc.value.status == 422


def test_workloads_need_a_matching_selector(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    template = {"metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "agent", "image": "localpv:1"}]}}
    made = apps.create_namespaced_daemon_set("kube-system", {"metadata": {"name": "agent"}, "spec": {
        "selector": {"matchLabels": {"app": "agent"}}, "template": template}})
    assert made.status.number_ready == 0 and made.metadata.generation == 1
    with pytest.raises(ApiException) as exc:
        apps.create_namespaced_deployment("default", {"metadata": {"name": "web"}, "spec": {
            "selector": {"matchLabels": {"app": "other"}}, "template": template}})
    assert exc.value.status == 422


def test_statefulsets_are_defaulted_and_own_their_pods(api: client.ApiClient, core: client.CoreV1Api) -> None:
    """node-cleanup's tests give pods a StatefulSet owner: real objects the client reads, that
    the garbage collector does not take for dangling references."""
    apps = client.AppsV1Api(api)
    template = {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "db:1"}]}}
    made = apps.create_namespaced_stateful_set("default", {"metadata": {"name": "db"}, "spec": {
        "serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": template}})
    assert (made.spec.replicas, made.spec.pod_management_policy, made.status.replicas) == (1, "OrderedReady", 0)
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": made.metadata.uid,
             "controller": True}
    core.create_namespaced_pod("default", {"metadata": {"name": "db-0", "ownerReferences": [owner]},
                                           "spec": template["spec"]})
    apps.delete_namespaced_stateful_set("db", "default")
    wait_for(lambda: not core.list_namespaced_pod("default").items, what="the garbage collector takes the pod")
    with pytest.raises(ApiException) as exc:
        apps.create_namespaced_stateful_set("default", {"metadata": {"name": "bad"}, "spec": {
            "serviceName": "db", "selector": {"matchLabels": {"app": "other"}}, "template": template}})
    assert exc.value.status == 422


def test_rbac_names_may_contain_colons(api: client.ApiClient) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role({"metadata": {"name": "system:localpv"},
                              "rules": [{"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["*"]}]})
    binding = rbac.create_cluster_role_binding({"metadata": {"name": "system:localpv"}, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:localpv"},
        "subjects": [{"kind": "ServiceAccount", "name": "localpv", "namespace": "kube-system"}]})
    binding.role_ref.name = "other"
    with pytest.raises(ApiException) as exc:
        rbac.replace_cluster_role_binding("system:localpv", binding)
    assert exc.value.status == 422


def test_dry_run_validates_without_storing(srv: ApiServer, core: client.CoreV1Api) -> None:
    rv = srv.store.rv
    answer = core.create_namespaced_config_map("default", configmap("cm"), dry_run="All")
    assert answer.metadata.uid and srv.get("v1", "ConfigMap", "cm", "default") is None
    assert srv.store.rv == rv


def test_send_initial_events_ends_with_a_marked_bookmark(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create(configmap("cm"))
    response = core.list_namespaced_config_map("default", watch=True, send_initial_events=True,
                                               allow_watch_bookmarks=True, resource_version_match="NotOlderThan",
                                               timeout_seconds=1, _preload_content=False)
    events = [json.loads(line) for line in response.read().splitlines() if line.strip()]
    response.release_conn()
    assert events[0]["type"] == "ADDED"
    marker = events[1]
    assert marker["type"] == "BOOKMARK"
    assert marker["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_discovery_lists_groups_resources_and_status_subresources(api: client.ApiClient) -> None:
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = {g.name: g.preferred_version.group_version for g in client.ApisApi(api).get_api_versions().groups}
    assert groups["storage.k8s.io"] == "storage.k8s.io/v1" and groups["batch"] == "batch/v1"
    resources = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    pvs = resources["persistentvolumes"]
    assert (pvs.kind, pvs.namespaced, pvs.short_names, pvs.singular_name) == (
        "PersistentVolume", False, ["pv"], "persistentvolume")
    assert "watch" in pvs.verbs and resources["persistentvolumes/status"].verbs == ["get", "patch", "update"]
    assert resources["persistentvolumeclaims"].namespaced is True
    assert "configmaps/status" not in resources
    version = client.VersionApi(api).get_code()
    assert (version.major, version.minor, version.git_version) == ("1", "31", "v1.31.0")

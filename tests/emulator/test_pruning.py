"""Unknown fields are dropped on create, update and patch, at every depth, as a real
kube-apiserver drops them when it decodes into its Go types (no strict field validation).

Reads go over raw HTTP: the ``kubernetes`` client's typed models would drop unknown
fields on the client side and hide what the server stored.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3

from localpv_emulator.apiserver import RESOURCES, ApiServer
from tests.emulator.conftest import pv

Obj = dict[str, Any]


class Http:
    """Plain JSON over HTTP to the emulator, nothing in between."""

    def __init__(self, srv: ApiServer) -> None:
        self.url = srv.url
        self.pool = urllib3.PoolManager(retries=False, timeout=5)

    def __call__(self, method: str, path: str, body: Any = None,
                 content_type: str = "application/json") -> tuple[int, Obj]:
        data = None if body is None else json.dumps(body).encode()
        resp = self.pool.request(method, self.url + path, body=data, headers={"Content-Type": content_type})
        return resp.status, json.loads(resp.data)


@pytest.fixture
def http(srv: ApiServer) -> Http:
    return Http(srv)


def _local_pv_with_unknown_fields(name: str) -> Obj:
    obj = pv(name, node="node-1")
    obj["bogusTop"] = 1
    obj["metadata"]["bogusMeta"] = "x"
    obj["metadata"]["labels"] = {"keep": "me"}
    obj["spec"]["bogusSpec"] = True
    obj["spec"]["local"]["bogusLocal"] = "y"
    obj["spec"]["nodeAffinity"]["bogusAffinity"] = {}
    obj["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["bogusExpr"] = 1
    obj["spec"]["claimRef"] = {"namespace": "default", "name": "c1", "bogusRef": 2}
    obj["spec"]["mountOptions"] = ["noatime"]
    return obj


def _assert_pruned(stored: Obj) -> None:
    spec = stored["spec"]
    assert "bogusTop" not in stored
    assert "bogusMeta" not in stored["metadata"]
    assert "bogusSpec" not in spec
    assert spec["local"] == {"path": "/mnt/pv-a"}
    assert "bogusAffinity" not in spec["nodeAffinity"]
    assert spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0] == {
        "key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}
    assert spec["claimRef"] == {"namespace": "default", "name": "c1"}
    # known fields, free-form maps and defaults survive
    assert stored["metadata"]["labels"] == {"keep": "me"}
    assert spec["capacity"] == {"storage": "1Gi"}
    assert spec["mountOptions"] == ["noatime"]
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"


def test_unknown_fields_of_a_pv_are_dropped_at_every_level(srv: ApiServer, http: Http) -> None:
    status, created = http("POST", "/api/v1/persistentvolumes", _local_pv_with_unknown_fields("pv-a"))
    assert status == 201, created
    _assert_pruned(created)
    status, read = http("GET", "/api/v1/persistentvolumes/pv-a")
    assert status == 200
    _assert_pruned(read)
    _, listed = http("GET", "/api/v1/persistentvolumes")
    _assert_pruned({"apiVersion": "v1", "kind": "PersistentVolume", **listed["items"][0]})


def test_an_update_or_patch_with_only_unknown_fields_changes_nothing(srv: ApiServer, http: Http) -> None:
    http("POST", "/api/v1/persistentvolumes", pv("pv-a"))
    srv.settle()  # the binder has made it Available: nothing writes to it any more
    _, created = http("GET", "/api/v1/persistentvolumes/pv-a")
    rv = created["metadata"]["resourceVersion"]
    status, patched = http("PATCH", "/api/v1/persistentvolumes/pv-a", {"spec": {"bogus": 1}, "metadata": {"x": 1}},
                           "application/merge-patch+json")
    assert status == 200
    assert "bogus" not in patched["spec"] and "x" not in patched["metadata"]
    assert patched["metadata"]["resourceVersion"] == rv  # a no-op: nothing stored, no watch event
    replaced = {**created, "spec": {**created["spec"], "hostPath": {"path": "/tmp/pv-a", "bogus": 2}}}
    status, updated = http("PUT", "/api/v1/persistentvolumes/pv-a", replaced)
    assert status == 200, updated
    assert updated["spec"]["hostPath"] == {"path": "/tmp/pv-a"}
    assert updated["metadata"]["resourceVersion"] == rv
    status, with_status = http("PUT", "/api/v1/persistentvolumes/pv-a/status",
                               {**created, "status": {**created["status"], "bogusStatus": 1}})
    assert status == 200, with_status
    assert with_status["status"] == created["status"]
    assert with_status["metadata"]["resourceVersion"] == rv


def test_pod_templates_are_pruned_to_the_depth_of_their_containers(srv: ApiServer, http: Http) -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"backoffLimit": 2, "bogusJob": 1, "template": {"spec": {
               "restartPolicy": "Never", "nodeName": "node-1", "bogusPod": 1,
               "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "Never",
                               "volumeMount": [{"name": "v", "mountPath": "/v"}],  # misspelt
                               "securityContext": {"privileged": True, "bogusSc": 1}}]}}}}
    status, created = http("POST", "/apis/batch/v1/namespaces/default/jobs", job)
    assert status == 201, created
    assert "bogusJob" not in created["spec"] and created["spec"]["backoffLimit"] == 2
    pod = created["spec"]["template"]["spec"]
    assert "bogusPod" not in pod and pod["nodeName"] == "node-1"
    container = pod["containers"][0]
    assert "volumeMount" not in container
    assert container["securityContext"] == {"privileged": True}
    assert container["imagePullPolicy"] == "Never"


def test_a_crd_keeps_its_content_and_loses_unknown_metadata(srv: ApiServer, http: Http) -> None:
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
               "metadata": {"name": "m", "bogusMeta": 1},
               "spec": {"endpoints": [{"port": "metrics"}], "anythingGoes": {"x": 1}}, "extra": True}
    status, created = http("POST", "/apis/monitoring.coreos.com/v1/namespaces/default/servicemonitors", monitor)
    assert status == 201, created
    assert "bogusMeta" not in created["metadata"]
    assert created["spec"] == monitor["spec"] and created["extra"] is True


def test_the_direct_methods_prune_too(srv: ApiServer) -> None:
    obj = pv("pv-a")
    obj["spec"]["bogus"] = 1
    assert "bogus" not in srv.create(obj)["spec"]


def test_every_served_kind_has_a_schema() -> None:
    from kubernetes.client import models

    from localpv_emulator.apiserver.pruning import CRDS, MODELS

    for rt in RESOURCES:
        key = (rt.api_version, rt.kind)
        assert key in MODELS or key in CRDS, f"{rt.kind} in {rt.api_version} has no known-field schema"
        if key in MODELS:
            model = getattr(models, MODELS[key])
            assert set(model.attribute_map.values()) >= {"apiVersion", "kind", "metadata"}, MODELS[key]

"""CSIStorageCapacity in the emulator: served at the versions its switch names (v1, v1beta1,
v1alpha1), discovery answering accordingly, the API server's validation, and the garbage
collector removing a Node's objects with it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from localpv.kube.api import KubeApi
from localpv.kube.discovery import served_resource
from localpv.kube.errors import Backoff, NotFound, Permanent
from localpv.kube.resources import CSI_STORAGE_CAPACITIES, Resource
from localpv.kube.transport import connect
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.apiserver.resources import CAPACITY_VERSIONS_ENV
from localpv_emulator.apiserver.server import capacity_version_switch
from localpv_emulator.objects import node
from tests.conftest import http_get, wait_for

VERSIONS = ("v1", "v1beta1", "v1alpha1")


@contextmanager
def _serve(versions: tuple[str, ...]) -> Iterator[tuple[ApiServer, KubeApi]]:
    server = ApiServer(binder=False, capacity_versions=versions)
    server.start()
    try:
        yield server, KubeApi(connect(server.url), backoff=Backoff(initial=0.01, maximum=0.1, attempts=2))
    finally:
        server.stop()


def _capacity(res: Resource, name: str = "c", **fields: object) -> dict[str, object]:
    obj: dict[str, object] = {"apiVersion": res.api_version, "kind": "CSIStorageCapacity",
                              "metadata": {"name": name, "namespace": "default"},
                              "storageClassName": "fast", "capacity": "1Gi",
                              "nodeTopology": {"matchLabels": {"topology.localpv.dev/node": "n1"}}}
    obj.update(fields)
    return obj


@pytest.mark.parametrize("versions", [("v1",), ("v1beta1",), ("v1alpha1",), ("v1beta1", "v1alpha1"), ()])
def test_discovery_and_routing_follow_the_switch(versions: tuple[str, ...]) -> None:
    with _serve(versions) as (server, kube):
        found = served_resource(kube, CSI_STORAGE_CAPACITIES)
        preferred = next((v for v in VERSIONS if v in versions), None)
        assert (found.version if found else None) == preferred
        for res in CSI_STORAGE_CAPACITIES:
            if res.version in versions:
                assert kube.list(res, "default")[0] == []
            else:
                with pytest.raises(NotFound):
                    kube.list(res, "default")
        status, body = http_get(f"{server.url}/apis/storage.k8s.io")
        listed = {v["version"] for v in json.loads(body)["versions"]}
        assert status == 200 and listed == {"v1", *versions}  # StorageClasses keep v1 served
        status, body = http_get(f"{server.url}/apis/storage.k8s.io/v1")
        names = {r["name"] for r in json.loads(body)["resources"]}
        assert ("csistoragecapacities" in names) == ("v1" in versions) and "storageclasses" in names


@pytest.mark.parametrize("version", VERSIONS)
def test_validation_and_immutable_fields(version: str) -> None:
    res = next(r for r in CSI_STORAGE_CAPACITIES if r.version == version)
    with _serve((version,)) as (_server, kube):
        made = kube.create(res, _capacity(res, bogus="dropped"))
        assert made["capacity"] == "1Gi" and "bogus" not in made
        for bad, field in ((_capacity(res, "a", storageClassName=""), "storageClassName"),
                           (_capacity(res, "b", capacity="-1Gi"), "capacity"),
                           (_capacity(res, "c2", maximumVolumeSize="lots"), "maximumVolumeSize"),
                           (_capacity(res, "d", nodeTopology={"matchLabels": {"bad key!": "x"}}), "nodeTopology"),
                           (_capacity(res, "Not_A_Name"), "metadata.name")):
            with pytest.raises(Permanent) as refused:
                kube.create(res, bad)
            assert refused.value.status == 422 and field in str(refused.value), bad
        for field, value in (("storageClassName", "other"), ("nodeTopology", {"matchLabels": {"a": "b"}})):
            changed = {**made, field: value}
            with pytest.raises(Permanent) as refused:
                kube.replace(res, changed)
            assert refused.value.status == 422 and "immutable" in str(refused.value)
        updated = kube.replace(res, {**made, "capacity": "2Gi", "maximumVolumeSize": "2Gi"})
        assert (updated["capacity"], updated["maximumVolumeSize"]) == ("2Gi", "2Gi")


def test_objects_owned_by_a_node_go_with_it() -> None:
    """The garbage collector (by owner uid, for every kind) removes a deleted Node's objects."""
    res = CSI_STORAGE_CAPACITIES[0]
    with _serve(("v1",)) as (server, kube):
        owner = server.create(node("n1"))
        obj = _capacity(res)
        obj["metadata"]["ownerReferences"] = [  # type: ignore[index]
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": owner["metadata"]["uid"]}]
        kube.create(res, obj)
        server.delete("v1", "Node", "n1")
        wait_for(lambda: server.get(res.api_version, "CSIStorageCapacity", "c", "default") is None,
                 what="the capacity object to be collected with its Node")


def test_the_switch_reads_the_environment_and_refuses_unknown_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CAPACITY_VERSIONS_ENV, "v1beta1, v1alpha1")
    assert capacity_version_switch(None) == {"v1beta1", "v1alpha1"}
    monkeypatch.setenv(CAPACITY_VERSIONS_ENV, "none")
    assert capacity_version_switch(None) == frozenset()
    monkeypatch.delenv(CAPACITY_VERSIONS_ENV)
    assert capacity_version_switch(None) == {"v1"}
    with pytest.raises(ValueError, match="expected some of v1, v1beta1, v1alpha1, got v2"):
        capacity_version_switch(["v2"])
    done = subprocess.run([sys.executable, "-m", "localpv_emulator.apiserver", "--capacity-versions", "v2"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--capacity-versions: CSIStorageCapacity versions: expected" in done.stderr

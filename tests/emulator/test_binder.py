"""The PV binder: which volume a claim gets, phases, pre-binding, release, provisioning requests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client

from localpv_emulator.apiserver import ApiServer
from tests.emulator.conftest import node, phase, pv, pvc, storage_class, wait_for

SELECTED = "volume.kubernetes.io/selected-node"


@pytest.fixture
def srv_without_honor() -> Iterator[ApiServer]:
    """The emulator as a cluster with the feature gate HonorPVReclaimPolicy off (before 1.31)."""
    server = ApiServer(binder=True, honor_pv_reclaim_policy=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
    assert server.controller_failures == []


def bound_volume(srv: ApiServer, claim: str, namespace: str = "default") -> str | None:
    srv.settle()
    obj = srv.get("v1", "PersistentVolumeClaim", claim, namespace)
    assert obj is not None
    return obj["spec"].get("volumeName") if obj["status"].get("phase") == "Bound" else None


def test_a_new_volume_becomes_available(srv: ApiServer) -> None:
    created = srv.create(pv("pv-a"))
    assert created["status"]["phase"] == "Pending"
    srv.settle()
    volume = srv.get("v1", "PersistentVolume", "pv-a")
    assert volume is not None and volume["status"]["phase"] == "Available"
    assert volume["status"]["lastPhaseTransitionTime"]


def test_a_claim_binds_to_the_smallest_sufficient_volume(srv: ApiServer, core: client.CoreV1Api) -> None:
    for name, size in (("pv-big", "10Gi"), ("pv-small", "500Mi"), ("pv-fit", "2Gi"), ("pv-mid", "5Gi")):
        srv.create(pv(name, size))
    core.create_namespaced_persistent_volume_claim("default", pvc("data", "1Gi"))
    assert bound_volume(srv, "data") == "pv-fit"

    claim = core.read_namespaced_persistent_volume_claim("data", "default")
    volume = core.read_persistent_volume("pv-fit")
    assert claim.status.capacity == {"storage": "2Gi"} and claim.status.access_modes == ["ReadWriteOnce"]
    assert claim.metadata.annotations == {"pv.kubernetes.io/bind-completed": "yes",
                                          "pv.kubernetes.io/bound-by-controller": "yes"}
    assert volume.status.phase == "Bound"
    assert volume.metadata.annotations == {"pv.kubernetes.io/bound-by-controller": "yes"}
    ref = volume.spec.claim_ref
    assert (ref.kind, ref.namespace, ref.name, ref.uid, ref.api_version) == (
        "PersistentVolumeClaim", "default", "data", claim.metadata.uid, "v1")
    assert phase(srv, "PersistentVolume", "pv-big") == "Available"


def test_class_mode_access_modes_and_selector_must_fit(srv: ApiServer) -> None:
    srv.create(pv("pv-other-class", cls="slow"))
    srv.create(pv("pv-block", mode="Block"))
    srv.create(pv("pv-rwo"))
    srv.create(pv("pv-unlabelled", "1Gi", modes=("ReadWriteMany",)))
    srv.create(pv("pv-labelled", "3Gi", modes=("ReadWriteMany",), labels={"disk": "ssd"}))
    srv.create(pvc("rwx-ssd", modes=("ReadWriteMany",), selector={"matchLabels": {"disk": "ssd"}}))
    srv.create(pvc("fast", cls="fast"))
    srv.create(pvc("block", mode="Block"))
    assert bound_volume(srv, "rwx-ssd") == "pv-labelled"
    assert bound_volume(srv, "fast") is None  # no volume of class "fast"; "" matches only ""
    assert bound_volume(srv, "block") == "pv-block"
    assert phase(srv, "PersistentVolume", "pv-other-class") == "Available"


def test_the_fewest_access_modes_win_before_capacity(srv: ApiServer) -> None:
    srv.create(pv("pv-wide", "1Gi", modes=("ReadWriteOnce", "ReadWriteMany")))
    srv.create(pv("pv-narrow", "8Gi"))
    srv.create(pvc("data", "1Gi"))
    assert bound_volume(srv, "data") == "pv-narrow"


def test_wait_for_first_consumer_binds_on_the_selected_node_only(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create(storage_class("local", wffc=True))
    srv.create(node("n1", {"zone": "a"}))
    srv.create(node("n2", {"zone": "b"}))
    srv.create(pv("pv-n1", "1Gi", cls="local", node="n1"))
    srv.create(pv("pv-n2", "1Gi", cls="local", node="n2"))
    srv.create(pvc("data", cls="local"))
    assert bound_volume(srv, "data") is None  # waits for a consumer
    core.patch_namespaced_persistent_volume_claim("data", "default", {"metadata": {"annotations": {SELECTED: "n2"}}})
    assert bound_volume(srv, "data") == "pv-n2"


def test_node_affinity_operators_are_evaluated_against_node_labels(srv: ApiServer) -> None:
    srv.create(storage_class("local", wffc=True))
    srv.create(node("n1", {"disks": "4", "zone": "a"}))
    volume = pv("pv-many-disks", cls="local", node="n1")
    volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] = [{"matchExpressions": [
        {"key": "disks", "operator": "Gt", "values": ["8"]}]}, {"matchExpressions": [
            {"key": "zone", "operator": "NotIn", "values": ["a"]}]}]
    srv.create(volume)
    srv.create(pv("pv-plain", cls="local", node="n1"))
    srv.create(pvc("data", cls="local", selected_node="n1"))
    assert bound_volume(srv, "data") == "pv-plain"


def test_a_volume_pre_bound_by_claim_ref_waits_for_that_claim(srv: ApiServer) -> None:
    srv.create(pv("pv-reserved", "1Gi", claim=("default", "owner")))
    srv.create(pv("pv-spare", "5Gi"))
    srv.create(pvc("intruder", "1Gi"))
    assert bound_volume(srv, "intruder") == "pv-spare"
    assert phase(srv, "PersistentVolume", "pv-reserved") == "Available"
    srv.create(pvc("owner", "1Gi"))
    assert bound_volume(srv, "owner") == "pv-reserved"
    volume = srv.get("v1", "PersistentVolume", "pv-reserved")
    assert volume is not None and "annotations" not in volume["metadata"]  # not bound by the controller


def test_a_claim_naming_its_volume_gets_it(srv: ApiServer) -> None:
    srv.create(pv("pv-small", "1Gi"))
    srv.create(pv("pv-chosen", "9Gi"))
    srv.create(pvc("data", "1Gi", volume="pv-chosen"))
    assert bound_volume(srv, "data") == "pv-chosen"
    claim = srv.get("v1", "PersistentVolumeClaim", "data", "default")
    assert claim is not None and claim["metadata"]["annotations"] == {"pv.kubernetes.io/bind-completed": "yes"}


def test_deleting_the_claim_releases_the_volume(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create(pv("pv-a", reclaim="Delete"))
    srv.create(pvc("data"))
    assert bound_volume(srv, "data") == "pv-a"
    core.delete_namespaced_persistent_volume_claim("data", "default")
    wait_for(lambda: phase(srv, "PersistentVolume", "pv-a") == "Released", what="release")
    srv.settle()
    volume = srv.get("v1", "PersistentVolume", "pv-a")
    assert volume is not None and volume["spec"]["claimRef"]["name"] == "data"  # kept; the agent deletes


def test_a_claim_whose_volume_vanished_is_lost(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create(pv("pv-a"))
    srv.create(pvc("data"))
    assert bound_volume(srv, "data") == "pv-a"
    core.delete_persistent_volume("pv-a")
    wait_for(lambda: phase(srv, "PersistentVolumeClaim", "data", "default") == "Lost", what="claim lost")


def test_external_classes_get_the_storage_provisioner_annotation(srv: ApiServer) -> None:
    srv.create(storage_class("nfs", "example.com/nfs"))
    srv.create(storage_class("nfs-late", "example.com/nfs", wffc=True))
    srv.create(storage_class("manual"))
    srv.create(pvc("now", cls="nfs"))
    srv.create(pvc("later", cls="nfs-late"))
    srv.create(pvc("never", cls="manual"))
    srv.settle()

    def annotations(name: str) -> dict[str, str]:
        claim = srv.get("v1", "PersistentVolumeClaim", name, "default")
        assert claim is not None
        return dict(claim["metadata"].get("annotations") or {})

    assert annotations("now") == {"volume.kubernetes.io/storage-provisioner": "example.com/nfs",
                                  "volume.beta.kubernetes.io/storage-provisioner": "example.com/nfs"}
    assert annotations("later") == {}
    assert annotations("never") == {}
    claim = srv.get("v1", "PersistentVolumeClaim", "later", "default")
    assert claim is not None
    claim["metadata"]["annotations"] = {SELECTED: "n1"}
    srv.update(claim)
    srv.settle()
    assert annotations("later")["volume.kubernetes.io/storage-provisioner"] == "example.com/nfs"


def test_a_provisioned_pre_bound_volume_completes_the_binding(srv: ApiServer) -> None:
    srv.create(storage_class("nfs", "example.com/nfs"))
    claim = srv.create(pvc("data", "1Gi", cls="nfs"))
    provisioned = pv("pvc-1", "1Gi", cls="nfs", claim=("default", "data"))
    provisioned["spec"]["claimRef"]["uid"] = claim["metadata"]["uid"]
    srv.create(provisioned)
    assert bound_volume(srv, "data") == "pvc-1"


def test_the_default_class_is_assigned_to_claims_without_one(srv: ApiServer) -> None:
    srv.create(storage_class("standard", default=True))
    created = srv.create(pvc("data", cls=None))
    assert created["spec"]["storageClassName"] == "standard"
    explicit = srv.create(pvc("none", cls=""))
    assert explicit["spec"]["storageClassName"] == ""


SIZES = {"1Gi": 1 << 30, "2Gi": 2 << 30, "500Mi": 500 << 20, "1500Mi": 1500 << 20, "3G": 3 * 10**9}
MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany")
volume_specs = st.lists(st.tuples(st.sampled_from(sorted(SIZES)),
                                  st.sets(st.sampled_from(MODES), min_size=1)), max_size=6)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(volumes=volume_specs, request=st.sampled_from(sorted(SIZES)),
       wanted=st.sets(st.sampled_from(MODES), min_size=1, max_size=2))
def test_the_choice_matches_the_reference_rule(srv: ApiServer, volumes: list[tuple[str, set[str]]],
                                               request: str, wanted: set[str]) -> None:
    """Fewest sufficient access modes first, then the smallest capacity, then the name."""
    cls = f"c{next(EXAMPLE)}"  # a class per example keeps examples apart on one server
    for i, (size, modes) in enumerate(volumes):
        srv.create(pv(f"{cls}-pv{i}", size, cls=cls, modes=tuple(sorted(modes))))
    srv.settle()
    srv.create(pvc(cls, request, cls=cls, modes=tuple(sorted(wanted))))
    fitting = [(len(modes), SIZES[size], f"{cls}-pv{i}") for i, (size, modes) in enumerate(volumes)
               if wanted <= modes and SIZES[size] >= SIZES[request]]
    assert bound_volume(srv, cls) == (min(fitting)[2] if fitting else None)


EXAMPLE = itertools.count()


# --------------------------------------------------------------------------- HonorPVReclaimPolicy (KEP-2644)

IN_TREE = "kubernetes.io/gce-pd"
PV_CONTROLLER = "kubernetes.io/pv-controller"
EXTERNAL = "external-provisioner.volume.kubernetes.io/finalizer"


def provisioned(name: str, by: str, *, reclaim: str = "Delete", finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    volume = pv(name, reclaim=reclaim)
    volume["metadata"]["annotations"] = {"pv.kubernetes.io/provisioned-by": by}
    if finalizers:
        volume["metadata"]["finalizers"] = list(finalizers)
    return volume


def finalizers(srv: ApiServer, name: str) -> list[str] | None:
    srv.settle()
    volume = srv.get("v1", "PersistentVolume", name)
    return None if volume is None else list(volume["metadata"].get("finalizers") or [])


def test_the_pv_controller_protects_in_tree_dynamic_volumes_with_delete_only(srv: ApiServer) -> None:
    srv.create(provisioned("in-tree", IN_TREE, finalizers=(EXTERNAL,)))
    srv.create(provisioned("in-tree-retain", IN_TREE, reclaim="Retain", finalizers=(PV_CONTROLLER,)))
    srv.create(provisioned("csi", "local.csi.localpv.dev"))
    srv.create(provisioned("csi-protected", "local.csi.localpv.dev", finalizers=(EXTERNAL,)))
    srv.create(pv("static", reclaim="Delete"))
    assert finalizers(srv, "in-tree") == [PV_CONTROLLER], "external-provisioner's finalizer is not an in-tree one's"
    assert finalizers(srv, "in-tree-retain") == []
    assert finalizers(srv, "csi") == [] and finalizers(srv, "csi-protected") == [EXTERNAL]
    assert finalizers(srv, "static") == []
    # The policy changed to Retain: the finalizer goes.
    volume = srv.get("v1", "PersistentVolume", "in-tree")
    assert volume is not None
    volume["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    srv.update(volume)
    assert finalizers(srv, "in-tree") == []


def test_an_in_tree_volume_deleted_before_its_claim_waits_for_the_claim(srv: ApiServer) -> None:
    srv.create(provisioned("in-tree", IN_TREE))
    srv.create(pvc("data"))
    assert bound_volume(srv, "data") == "in-tree"
    srv.delete("v1", "PersistentVolume", "in-tree")
    srv.settle()
    volume = srv.get("v1", "PersistentVolume", "in-tree")
    assert volume is not None and volume["metadata"]["deletionTimestamp"] and volume["status"]["phase"] == "Bound"
    srv.delete("v1", "PersistentVolumeClaim", "data", "default")
    wait_for(lambda: srv.get("v1", "PersistentVolume", "in-tree") is None, what="the released volume to go")


def test_without_the_gate_nothing_is_added(srv_without_honor: ApiServer) -> None:
    srv = srv_without_honor
    srv.create(provisioned("in-tree", IN_TREE))
    srv.create(pvc("data"))
    assert bound_volume(srv, "data") == "in-tree"
    assert finalizers(srv, "in-tree") == []

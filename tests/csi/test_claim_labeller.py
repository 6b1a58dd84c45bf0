"""The claim labeller against the API emulator: the label follows the selected node (set,
changed, removed), claims of other classes are never touched, claims from before it started
are labelled, a label it cannot write is reported, a race with the scheduler is lost safely;
and the agents' look at its Lease (localpv/csi/labellerlease.py)."""

from __future__ import annotations

from typing import Any

from localpv.claimlabeller.app import LabellerOptions, LabellerReplica
from localpv.claimlabeller.controller import LabellerSettings
from localpv.clock import ManualClock
from localpv.csi.claimlabels import agrees, label_patch, labeller_lease_name, wanted_label
from localpv.csi.labellerlease import LabellerLease, Reading, verdict
from localpv.kube.api import KubeApi
from localpv.kube.errors import Conflict
from localpv.kube.events import EventRecorder
from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim, node, storage_class
from tests.conftest import wait_for
from tests.support.labeller import DRIVER, running_labeller

KEY = "localpv.dev/node"
SELECTED = "volume.kubernetes.io/selected-node"


def _label(server: ApiServer, name: str) -> str | None:
    found = server.get("v1", "PersistentVolumeClaim", name, "default") or {}
    return ((found.get("metadata") or {}).get("labels") or {}).get(KEY)


def _select(server: ApiServer, name: str, node_name: str | None) -> None:
    pvc = server.get("v1", "PersistentVolumeClaim", name, "default")
    assert pvc is not None
    annotations = pvc["metadata"].setdefault("annotations", {})
    if node_name is None:
        annotations.pop(SELECTED, None)
    else:
        annotations[SELECTED] = node_name
    server.update(pvc)


def _classes(server: ApiServer) -> None:
    server.create(storage_class("dyn", provisioner=DRIVER))
    server.create(storage_class("static"))  # kubernetes.io/no-provisioner
    server.create(storage_class("other", provisioner="other.csi.example.com"))


def _patches(server: ApiServer, name: str, status: int | None = None) -> int:
    """Label writes sent for the claim (with ``status``: those answered so)."""
    return sum(1 for r in server.requests if r.verb == "patch" and r.resource == "persistentvolumeclaims"
               and r.name == name and (status is None or r.status == status))


def test_the_rule_label_follows_the_annotation_and_both_must_agree() -> None:
    mine: dict[str, Any] = {"metadata": {"resourceVersion": "7", "annotations": {SELECTED: "node-1"}}}
    assert wanted_label(mine) == "node-1"
    assert label_patch(mine) == {"metadata": {"resourceVersion": "7", "labels": {KEY: "node-1"}}}
    assert not agrees(mine, "node-1")  # not labelled yet: wait
    mine["metadata"]["labels"] = {KEY: "node-1"}
    assert label_patch(mine) is None and agrees(mine, "node-1") and not agrees(mine, "node-2")
    moved = {"metadata": {"resourceVersion": "8", "annotations": {SELECTED: "node-2"}, "labels": {KEY: "node-1"}}}
    assert label_patch(moved) == {"metadata": {"resourceVersion": "8", "labels": {KEY: "node-2"}}}
    assert not agrees(moved, "node-1") and not agrees(moved, "node-2")  # the annotation is the truth
    gone = {"metadata": {"resourceVersion": "9", "labels": {KEY: "node-1"}}}
    assert label_patch(gone) == {"metadata": {"resourceVersion": "9", "labels": {KEY: None}}}
    long_name = "n" * 70  # a node name too long for a label value: hashed as the PVs' label is
    assert wanted_label({"metadata": {"annotations": {SELECTED: long_name}}}) != long_name
    assert labeller_lease_name(DRIVER) == "local.csi.localpv.dev-claim-labeller"


def test_the_label_is_set_changed_and_removed_with_the_selected_node(apiserver: ApiServer, kube: KubeApi) -> None:
    _classes(apiserver)
    apiserver.create(claim("data", "dyn"))
    with running_labeller(kube):
        apiserver.requests.clear()
        _select(apiserver, "data", "node-1")
        wait_for(lambda: _label(apiserver, "data") == "node-1", what="the label set")
        # the agent of node-1 had no room and removed the annotation; the scheduler picks node-2
        _select(apiserver, "data", None)
        wait_for(lambda: _label(apiserver, "data") is None, what="the label removed")
        _select(apiserver, "data", "node-2")
        wait_for(lambda: _label(apiserver, "data") == "node-2", what="the label changed")
        # a tenant (who controls its claim's metadata) points the label elsewhere: put back
        pvc = apiserver.get("v1", "PersistentVolumeClaim", "data", "default")
        assert pvc is not None
        pvc["metadata"]["labels"][KEY] = "node-1"
        apiserver.update(pvc)
        wait_for(lambda: _label(apiserver, "data") == "node-2", what="the label put back")
        # One write per change. A write may also meet the PV controller's (the emulator's binder
        # annotates the claim for the driver as a node is selected): refused (409), then redone.
        assert _patches(apiserver, "data", 200) == 4
        assert _patches(apiserver, "data") == 4 + _patches(apiserver, "data", 409)


def test_claims_of_other_classes_are_never_touched(apiserver: ApiServer, kube: KubeApi) -> None:
    _classes(apiserver)
    static = claim("static", "static", selected_node="node-1")
    static["metadata"]["labels"] = {KEY: "node-9"}  # whatever it carries stays
    apiserver.create(static)
    apiserver.create(claim("other", "other", selected_node="node-1"))
    apiserver.create(claim("nameless", "missing-class", selected_node="node-1"))
    apiserver.create(claim("dyn", "dyn", selected_node="node-1"))
    with running_labeller(kube):
        wait_for(lambda: _label(apiserver, "dyn") == "node-1", what="the dynamic claim labelled")
        _select(apiserver, "other", "node-2")
        _select(apiserver, "dyn", "node-2")
        wait_for(lambda: _label(apiserver, "dyn") == "node-2", what="the dynamic claim relabelled (after the other)")
    assert (_label(apiserver, "static"), _label(apiserver, "other"), _label(apiserver, "nameless")) == (
        "node-9", None, None)
    assert [_patches(apiserver, n) for n in ("static", "other", "nameless")] == [0, 0, 0]


def test_a_claim_handed_to_the_driver_is_labelled_even_before_its_class_is_known(
        apiserver: ApiServer, kube: KubeApi) -> None:
    """The PV controller's storage-provisioner annotation names the driver: that is enough (a
    class deleted since, or not yet in the cache); a class created later brings its claims in."""
    apiserver.create(claim("handed", "gone", selected_node="node-1"))
    apiserver.create(claim("early", "late", selected_node="node-1"))
    pvc = apiserver.get("v1", "PersistentVolumeClaim", "handed", "default")
    assert pvc is not None
    pvc["metadata"]["annotations"]["volume.kubernetes.io/storage-provisioner"] = DRIVER
    apiserver.update(pvc)
    with running_labeller(kube):
        wait_for(lambda: _label(apiserver, "handed") == "node-1", what="the handed claim labelled")
        assert _label(apiserver, "early") is None
        apiserver.create(storage_class("late", provisioner=DRIVER))
        wait_for(lambda: _label(apiserver, "early") == "node-1", what="the class's claims labelled once it exists")


def test_claims_from_before_it_ran_or_changed_while_it_was_down_are_labelled_at_start(
        apiserver: ApiServer, kube: KubeApi) -> None:
    _classes(apiserver)
    for i in range(5):  # an upgrade: claims scheduled (and bound) before any labeller ran
        apiserver.create(claim(f"old-{i}", "dyn", selected_node=f"node-{i % 2}"))
    with running_labeller(kube):
        wait_for(lambda: all(_label(apiserver, f"old-{i}") == f"node-{i % 2}" for i in range(5)),
                 what="every claim of before labelled")
    _select(apiserver, "old-0", "node-7")  # while it is stopped
    apiserver.create(claim("new", "dyn", selected_node="node-3"))
    with running_labeller(kube):
        wait_for(lambda: _label(apiserver, "old-0") == "node-7" and _label(apiserver, "new") == "node-3",
                 what="what changed while it was down labelled at its start")


def test_a_label_written_against_a_changed_claim_is_refused_by_its_resource_version(
        apiserver: ApiServer, kube: KubeApi) -> None:
    """The race with the scheduler: the label was computed from a version whose annotation has
    changed since; the conditional patch is refused (409), never applied to the new annotation."""
    _classes(apiserver)
    made = apiserver.create(claim("racy", "dyn", selected_node="node-1"))
    patch = label_patch(made)
    assert patch is not None
    _select(apiserver, "racy", "node-2")
    try:
        kube.patch(PERSISTENT_VOLUME_CLAIMS, "racy", patch, "default")
        raise AssertionError("a stale label patch was applied")
    except Conflict:
        pass
    assert _label(apiserver, "racy") is None


def test_a_label_it_cannot_write_is_reported_on_the_claim_and_in_its_metrics(
        apiserver: ApiServer, kube: KubeApi) -> None:
    _classes(apiserver)
    apiserver.deny("patch", "persistentvolumeclaims")
    apiserver.create(claim("stuck", "dyn", selected_node="node-1"))
    with running_labeller(kube, report_after=0.3, report_period=0.1) as labeller:
        events = wait_for(lambda: [e for e in apiserver.list("v1", "Event", "default")
                                   if e["involvedObject"]["name"] == "stuck" and e["reason"] == "NodeLabelPending"],
                          what="a NodeLabelPending event on the claim")
        assert events[0]["type"] == "Warning" and "forbidden" in events[0]["message"].lower()
        registry = labeller.metrics.registry
        assert registry.get_sample_value("localpv_claim_labels_pending") == 1
        assert (registry.get_sample_value("localpv_claim_labels_oldest_pending_seconds") or 0) >= 0.3
        apiserver.allow_all()
        wait_for(lambda: _label(apiserver, "stuck") == "node-1", timeout=90, what="labelled once allowed")
        wait_for(lambda: registry.get_sample_value("localpv_claim_labels_pending") == 0, what="nothing pending")


def test_leader_elected_replicas_one_labels_and_a_successor_takes_over(apiserver: ApiServer, kube: KubeApi) -> None:
    _classes(apiserver)
    options = {"settings": LabellerSettings(DRIVER), "namespace": "default", "lease_duration": 1.5,
               "renew_deadline": 1.0, "retry_period": 0.2}
    first = LabellerReplica(kube, LabellerOptions(identity="first", **options))  # type: ignore[arg-type]
    second = LabellerReplica(kube, LabellerOptions(identity="second", **options))  # type: ignore[arg-type]
    first.start()
    wait_for(lambda: first.labeller is not None, what="the first replica leading")
    second.start()
    try:
        apiserver.create(claim("a", "dyn", selected_node="node-1"))
        wait_for(lambda: _label(apiserver, "a") == "node-1", what="labelled by the leader")
        assert second.labeller is None and second.ready() == (True, "standby")
        first.stop(release=False)  # a crash: the lease expires
        apiserver.create(claim("b", "dyn", selected_node="node-2"))
        wait_for(lambda: _label(apiserver, "b") == "node-2", what="labelled by the successor")
        assert second.labeller is not None
    finally:
        second.stop()
        first.stop()


def test_the_agents_look_at_the_labellers_lease() -> None:
    held = {"holderIdentity": "x", "renewTime": "1"}
    assert verdict(None, Reading(None, 0.0)) is not None
    assert verdict(None, Reading({"holderIdentity": ""}, 0.0)) is not None
    assert verdict(None, Reading(held, 0.0)) is None  # one look cannot tell: the benefit of the doubt
    assert verdict(Reading(held, 0.0), Reading({**held, "renewTime": "2"}, 300.0)) is None
    stale = verdict(Reading(held, 0.0), Reading(dict(held), 300.0))
    assert stale is not None and "300s" in stale


def test_an_agent_says_on_its_node_when_no_labeller_runs_and_when_one_runs_again(
        apiserver: ApiServer, kube: KubeApi) -> None:
    """The labeller stopped: claims of this node wait unseen by the agent. The agent's look at
    the Lease says so on its Node and in its gauge, once, and again when a labeller is back."""
    _classes(apiserver)
    apiserver.create(node("node-1"))
    the_node = apiserver.get("v1", "Node", "node-1")
    assert the_node is not None
    recorder = EventRecorder(kube.for_events(), component="test")
    recorder.start()
    ups: list[bool] = []
    clock = ManualClock()
    lease = LabellerLease(kube, namespace="default", name=labeller_lease_name(DRIVER), node=lambda: the_node,
                          recorder=recorder, period=300.0, clock=clock, on_verdict=ups.append)
    options = LabellerOptions(LabellerSettings(DRIVER), namespace="default", identity="one", lease_duration=1.5,
                              renew_deadline=1.0, retry_period=0.2)

    def node_events(reason: str) -> list[dict[str, Any]]:
        return [e for e in apiserver.list("v1", "Event", "default")
                if e["involvedObject"].get("kind") == "Node" and e["reason"] == reason]

    try:
        assert lease.look() is False  # no Lease: never ran
        wait_for(lambda: node_events("ClaimLabellerDown"), what="the Node told")
        replica = LabellerReplica(kube, options)
        replica.start()
        try:
            wait_for(replica.elector.is_leader if replica.elector else (lambda: False), what="a leader")
            apiserver.create(claim("waits", "dyn", selected_node="node-1"))
            wait_for(lambda: _label(apiserver, "waits") == "node-1", what="labelled")
            assert lease.look() is True
            wait_for(lambda: node_events("ClaimLabellerBack"), what="the Node told it is back")
            seen = (apiserver.get("coordination.k8s.io/v1", "Lease", lease.name, "default") or {})["spec"]
            wait_for(lambda: (apiserver.get("coordination.k8s.io/v1", "Lease", lease.name, "default") or {})
                     ["spec"] != seen, what="a renewal")  # as between two of the agent's looks, minutes apart
            assert lease.look() is True
        finally:
            replica.stop(release=False)  # killed: its Lease is no longer renewed
        clock.advance(300.0)
        lease.look()
        assert lease.look() is False and "not renewed" in lease.why
        wait_for(lambda: len(node_events("ClaimLabellerDown")) == 2, what="the Node told again")
        assert ups[0] is False and ups[-1] is False
    finally:
        recorder.flush(2.0)
        recorder.stop()

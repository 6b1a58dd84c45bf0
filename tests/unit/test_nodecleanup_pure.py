"""The node-cleanup controller's decisions, without any API: which nodes a PV names, when a
node is lost, and what releasing its claim takes - the claim, the pods that wait on it, the
PV itself (research/local-static.md §1.11, §7.2; issue 25.3)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv.nodecleanup.controller import nodes_all_gone, parse_class_names, stale_pv_blocker
from localpv.nodecleanup.lostnode import (
    OUT_OF_SERVICE_TAINT,
    Action,
    NodeState,
    Scope,
    is_opted_in_volume,
    node_state_of,
    pv_node_names,
    release_step,
    scan_candidate,
    volume_state,
)

Obj = dict[str, Any]
HOST = "kubernetes.io/hostname"
CLASSES = frozenset({"local"})
DRIVER = "local.csi.localpv.dev"
SCOPE = Scope(CLASSES, DRIVER, honour_taint=True, delete_pods=False)
PODS = Scope(CLASSES, DRIVER, honour_taint=True, delete_pods=True)
LIVE, OUT, DELETED = NodeState.LIVE, NodeState.OUT_OF_SERVICE, NodeState.DELETED


def hostname_in(*values: str) -> Obj:
    return {"key": HOST, "operator": "In", "values": list(values)}


def with_terms(*terms: list[Obj]) -> Obj:
    """A PV whose required affinity has one term per argument (each a list of expressions)."""
    return {"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": exprs} for exprs in terms]}}}}


def pv(*, nodes: tuple[str, ...] = ("n1",), sc: str = "local", local: bool = True, claim: bool = True,
       phase: str = "Bound", policy: str = "Delete", deleting: bool = False, csi: str | None = None) -> Obj:
    """A static local PV; with ``csi``, a dynamic one made by that driver instead."""
    obj = with_terms([hostname_in(*nodes)])
    obj["metadata"] = {"name": "pv1", "uid": "pv-uid"}
    spec = obj["spec"]
    spec.update(storageClassName=sc, persistentVolumeReclaimPolicy=policy)
    if csi is not None:
        spec["csi"] = {"driver": csi, "volumeHandle": "pv1"}
        obj["metadata"]["annotations"] = {"pv.kubernetes.io/provisioned-by": csi}
    else:
        spec["local" if local else "hostPath"] = {"path": "/mnt/disks/a"}
    if claim:
        spec["claimRef"] = {"namespace": "ns", "name": "c1", "uid": "claim-uid"}
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    obj["status"] = {"phase": phase}
    return obj


def pvc(*, volume: str = "pv1", uid: str = "claim-uid", deleting: bool = False) -> Obj:
    meta: Obj = {"name": "c1", "namespace": "ns", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"volumeName": volume}}


def pod(name: str = "p1", *, claim: str = "c1", node: str = "", phase: str = "Pending", owned: bool = True,
        deleting: bool = False) -> Obj:
    meta: Obj = {"name": name, "namespace": "ns", "uid": f"{name}-uid"}
    if owned:
        meta["ownerReferences"] = [{"kind": "StatefulSet", "name": "db", "uid": "sts", "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    spec: Obj = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def node(name: str, *taints: str) -> Obj:
    return {"metadata": {"name": name}, "spec": {"taints": [{"key": k, "effect": "NoExecute"} for k in taints]}}


def states(**by_name: NodeState) -> Any:
    return lambda name: by_name.get(name, LIVE)


def gone(_name: str) -> bool:
    return False


def exists(_name: str) -> bool:
    return True


def must_not_ask(name: str) -> bool:
    raise AssertionError(f"node {name} looked up although a cheaper check decides")


# ---------------------------------------------------------------- flags and node names


@pytest.mark.parametrize(("text", "expected"), [
    ("", set()), ("local", {"local"}), ("a,b", {"a", "b"}), (" a , ,b ,", {"a", "b"}), (",", set()),
])
def test_class_names_are_a_comma_list(text: str, expected: set[str]) -> None:
    assert parse_class_names(text) == expected


@pytest.mark.parametrize(("obj", "expected"), [
    (None, set()),
    ({}, set()),
    ({"spec": {"nodeAffinity": {}}}, set()),
    ({"spec": {"nodeAffinity": {"required": {}}}}, set()),
    (with_terms(), set()),
    (with_terms([]), set()),
    (with_terms([hostname_in()]), set()),
    (with_terms([hostname_in("n1")]), {"n1"}),
    (with_terms([hostname_in("n1", "n2")]), {"n1", "n2"}),
    (with_terms([hostname_in("n1", "n2"), hostname_in("n2", "n3")]), {"n2"}),
    (with_terms([hostname_in("n1"), hostname_in("n2")]), set()),
    (with_terms([hostname_in("n1"), hostname_in()]), set()),
    (with_terms([hostname_in("n1")], [hostname_in("n2")]), {"n1", "n2"}),
    (with_terms([hostname_in("n1")], []), {"n1"}),
    (with_terms([{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z"]}]), set()),
    (with_terms([{"key": HOST, "operator": "NotIn", "values": ["n1"]}]), set()),
    (with_terms([{"key": "zone", "operator": "In", "values": ["z"]}, hostname_in("n1")]), {"n1"}),
])
def test_node_names_intersect_within_a_term_and_unite_across_terms(obj: Obj | None, expected: set[str]) -> None:
    assert pv_node_names(obj) == expected


names = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=4)
terms = st.lists(st.lists(names, max_size=3), max_size=3)


@given(terms)
def test_node_names_ignore_order_and_unrelated_expressions(raw: list[list[list[str]]]) -> None:
    built = [[hostname_in(*values) for values in term] for term in raw]
    reordered = [list(reversed(term)) for term in reversed(built)]
    noisy = [[*term, {"key": "zone", "operator": "In", "values": ["a"]}] for term in built]
    expected = pv_node_names(with_terms(*built))
    assert pv_node_names(with_terms(*reordered)) == expected
    assert pv_node_names(with_terms(*noisy)) == expected
    assert expected <= {v for term in raw for values in term for v in values}


# ---------------------------------------------------------------- class and node checks


@pytest.mark.parametrize(("obj", "scope", "expected"), [
    (pv(), SCOPE, True),
    (pv(), Scope(frozenset({"other", "local"})), True),
    (pv(), Scope(frozenset({"other"})), False),
    (pv(), Scope(frozenset()), False),
    (pv(local=False), SCOPE, False),
    (pv(csi=DRIVER), SCOPE, True),
    (pv(csi=DRIVER), Scope(CLASSES), False),  # no driver named: dynamic volumes are not in scope
    (pv(csi="other.csi.example.com"), SCOPE, False),
    (pv(csi=DRIVER, sc="other"), SCOPE, False),
])
def test_volume_of_opted_in_class(obj: Obj, scope: Scope, expected: bool) -> None:
    assert is_opted_in_volume(obj, scope) is expected


def test_dynamic_volume_must_be_made_by_the_driver_too() -> None:
    obj = pv(csi=DRIVER)
    del obj["metadata"]["annotations"]
    assert not is_opted_in_volume(obj, SCOPE)


# ---------------------------------------------------------------- lost nodes


@pytest.mark.parametrize(("nodes", "honour", "expected"), [
    ([], True, DELETED),
    ([], False, DELETED),
    ([node("n1")], True, LIVE),
    ([node("n1", OUT_OF_SERVICE_TAINT)], True, OUT),
    ([node("n1", OUT_OF_SERVICE_TAINT)], False, LIVE),  # the taint not opted in: a live node
    ([node("n1", "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")], True, LIVE),
    ([node("n1", OUT_OF_SERVICE_TAINT), node("m7")], True, LIVE),  # another node answers to the name
    ([node("n1", OUT_OF_SERVICE_TAINT), node("m7", OUT_OF_SERVICE_TAINT)], True, OUT),
    ([{"metadata": {"name": "n1"}}], True, LIVE),
])
def test_node_state(nodes: list[Obj], honour: bool, expected: NodeState) -> None:
    assert node_state_of(nodes, honour_taint=honour) is expected


def test_any_effect_of_the_taint_counts() -> None:
    for effect in ("NoExecute", "NoSchedule", "PreferNoSchedule"):
        tainted = {"spec": {"taints": [{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": effect}]}}
        assert node_state_of([tainted], honour_taint=True) is OUT


@pytest.mark.parametrize(("nodes", "by_name", "expected"), [
    (("n1",), {"n1": DELETED}, DELETED),
    (("n1",), {"n1": OUT}, OUT),
    (("n1",), {}, LIVE),
    (("n1", "n2"), {"n1": DELETED, "n2": OUT}, OUT),
    (("n1", "n2"), {"n1": DELETED, "n2": DELETED}, DELETED),
    (("n1", "n2"), {"n1": DELETED}, LIVE),
    ((), {}, None),
])
def test_volume_state(nodes: tuple[str, ...], by_name: dict[str, NodeState], expected: NodeState | None) -> None:
    assert volume_state(pv(nodes=nodes), states(**by_name)) is expected


@pytest.mark.parametrize(("nodes", "existing", "expected"), [
    (("n1",), set(), True),
    (("n1",), {"n1"}, False),
    (("n1", "n2"), {"n2"}, False),
    (("n1", "n2"), set(), True),
    ((), set(), False),
])
def test_nodes_all_gone(nodes: tuple[str, ...], existing: set[str], expected: bool) -> None:
    assert nodes_all_gone(pv(nodes=nodes), existing.__contains__) is expected


# ---------------------------------------------------------------- claim path: the scan


@pytest.mark.parametrize(("obj", "scope", "lookup"), [
    (pv(sc="other"), SCOPE, must_not_ask),
    (pv(local=False), SCOPE, must_not_ask),
    (pv(claim=False), SCOPE, must_not_ask),
    (pv(deleting=True), SCOPE, must_not_ask),
    (pv(phase="Released"), SCOPE, must_not_ask),  # claim gone, and no pods to look after
    (pv(), SCOPE, states()),
    (pv(nodes=()), SCOPE, states()),
])
def test_volume_is_not_a_candidate(obj: Obj, scope: Scope, lookup: Any) -> None:
    assert scan_candidate(obj, scope, lookup) is None


@pytest.mark.parametrize(("obj", "scope", "expected"), [
    (pv(), SCOPE, DELETED),
    (pv(phase="Available"), SCOPE, DELETED),
    (pv(csi=DRIVER), SCOPE, DELETED),
    (pv(phase="Released"), PODS, DELETED),  # pods may still wait on its claim
])
def test_volume_on_deleted_node_is_a_candidate(obj: Obj, scope: Scope, expected: NodeState) -> None:
    assert scan_candidate(obj, scope, states(n1=DELETED)) is expected
    assert scan_candidate(obj, scope, states(n1=OUT)) is OUT


# ---------------------------------------------------------------- claim path: the release


def step(obj: Obj, claim: Obj | None, pods: list[Obj] | None = None, scope: Scope = PODS,
         lookup: Any = None) -> Any:
    return release_step(obj, claim, pods or [], scope, lookup or states(n1=DELETED))


@pytest.mark.parametrize(("obj", "claim", "lookup", "reason"), [
    (pv(sc="other"), pvc(), must_not_ask, "opted-in"),
    (pv(claim=False), pvc(), must_not_ask, "no claim"),
    (pv(), pvc(uid="someone-else"), must_not_ask, "UID"),
    (pv(), pvc(), states(), "live"),
    (pv(), pvc(), states(n1=DELETED, n2=LIVE), None),
    (pv(nodes=()), pvc(), states(), "no node"),
    (pv(), pvc(volume="pv-other"), None, "another volume"),
    (pv(), pvc(volume=""), None, "another volume"),
    (pv(phase="Released"), pvc(), None, "released"),
])
def test_claim_is_kept(obj: Obj, claim: Obj, lookup: Any, reason: str | None) -> None:
    result = step(obj, claim, lookup=lookup)
    if reason is None:
        assert result.action is Action.DELETE_CLAIM
    else:
        assert result.action is Action.KEEP and reason in result.reason


@pytest.mark.parametrize(("obj", "state"), [(pv(), DELETED), (pv(csi=DRIVER), DELETED), (pv(), OUT)])
def test_claim_of_lost_node_is_deleted_first_whatever_pods_use_it(obj: Obj, state: NodeState) -> None:
    result = step(obj, pvc(), [pod(node="n1", phase="Running")], lookup=states(n1=state))
    assert (result.action, result.state, result.pods) == (Action.DELETE_CLAIM, state, ())


def test_terminating_claim_waits_for_the_pods_on_the_lost_node() -> None:
    holders = [pod("on-lost", node="n1", phase="Running"), pod("stuck", node="n1", phase="Running", deleting=True)]
    others = [pod("pending"), pod("elsewhere", node="n2", phase="Running"), pod("other-claim", claim="c2", node="n1"),
              pod("done", node="n1", phase="Succeeded")]
    result = step(pv(), pvc(deleting=True), holders + others)
    assert result.action is Action.DELETE_PODS
    assert [p["metadata"]["name"] for p in result.pods] == ["on-lost", "stuck"]
    # A Pending pod re-created now would wait for ever on a claim about to go: not yet.
    assert step(pv(), pvc(deleting=True), others).action is Action.WAIT


def test_once_the_claim_is_gone_the_pending_pods_go() -> None:
    pods = [pod("pending"), pod("bare", owned=False), pod("scheduled", node="n2"), pod("other-claim", claim="c2"),
            pod("leaving", deleting=True), pod("on-lost", node="n1", phase="Running")]
    result = step(pv(phase="Released"), None, pods)
    assert result.action is Action.DELETE_PODS
    assert sorted(p["metadata"]["name"] for p in result.pods) == ["on-lost", "pending"]
    assert step(pv(phase="Released"), None, pods[1:5]).action is Action.KEEP


def test_without_pod_deletion_the_claim_is_all() -> None:
    assert step(pv(), pvc(), scope=SCOPE).action is Action.DELETE_CLAIM
    assert step(pv(), pvc(deleting=True), [pod(node="n1")], scope=SCOPE).action is Action.KEEP
    assert step(pv(phase="Released"), None, [pod()], scope=SCOPE, lookup=must_not_ask).action is Action.KEEP


def test_pods_of_a_claim_recreated_by_its_statefulset_are_not_touched() -> None:
    """The namesake claim has a new UID: its pods wait on a claim that is fine."""
    result = step(pv(phase="Released"), pvc(uid="new-claim"), [pod()], lookup=must_not_ask)
    assert result.action is Action.KEEP and "UID" in result.reason


def test_live_node_protects_claim_and_pods() -> None:
    for claim in (pvc(), pvc(deleting=True), None):
        assert step(pv(), claim, [pod(), pod(node="n1")], lookup=states()).action is Action.KEEP


# ---------------------------------------------------------------- stale PV path


@pytest.mark.parametrize(("phase", "policy", "deleted"), [
    ("Available", "Delete", True),
    ("Available", "Retain", True),
    ("Available", "Recycle", True),
    ("Released", "Delete", True),
    ("Released", "Retain", False),
    ("Released", "Recycle", False),
    ("Bound", "Delete", False),
    ("Pending", "Delete", False),
    ("Failed", "Delete", False),
    ("", "Delete", False),
])
def test_stale_pv_phase_and_policy(phase: str, policy: str, deleted: bool) -> None:
    obj = pv(phase=phase, policy=policy, claim=phase == "Released")
    assert (stale_pv_blocker(obj, SCOPE, gone, lambda ref: False) is None) is deleted


@pytest.mark.parametrize(("obj", "lookup", "claim_exists", "reason"), [
    (pv(phase="Available", sc="other"), must_not_ask, False, "opted-in"),
    (pv(phase="Available", local=False), must_not_ask, False, "opted-in"),
    (pv(phase="Available", deleting=True), must_not_ask, False, "being deleted"),
    (pv(phase="Available"), exists, False, "node"),
    (pv(phase="Available", nodes=("n1", "n2")), {"n2"}.__contains__, False, "node"),
    (pv(phase="Available"), gone, True, "claim still exists"),
    (pv(phase="Released"), gone, True, "claim still exists"),
])
def test_stale_pv_is_kept(obj: Obj, lookup: Any, claim_exists: bool, reason: str) -> None:
    assert reason in (stale_pv_blocker(obj, SCOPE, lookup, lambda ref: claim_exists) or "")


def test_stale_dynamic_volume_of_a_deleted_node_is_deleted() -> None:
    assert stale_pv_blocker(pv(csi=DRIVER, phase="Released"), SCOPE, gone, lambda ref: False) is None
    assert stale_pv_blocker(pv(csi=DRIVER, phase="Released"), SCOPE, exists, lambda ref: False) is not None


def test_stale_volume_waits_for_the_pods_of_its_claim() -> None:
    obj = pv(phase="Released")
    assert "pods still wait" in (stale_pv_blocker(obj, SCOPE, gone, lambda ref: False, lambda v: True) or "")
    assert stale_pv_blocker(obj, SCOPE, gone, lambda ref: False, lambda v: False) is None

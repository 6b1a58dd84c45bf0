"""The node-cleanup controller's decisions, without any API: which nodes a PV names, and
when its claim or the PV itself may be removed (research/local-static.md §1.11, §7.2)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv.nodecleanup.controller import (
    claim_cleanup_blocker,
    claim_deletion_blocker,
    is_opted_in_local_pv,
    nodes_all_gone,
    parse_class_names,
    stale_pv_blocker,
)
from localpv.nodecleanup.lostnode import pv_node_names

Obj = dict[str, Any]
HOST = "kubernetes.io/hostname"
CLASSES = frozenset({"local"})


def hostname_in(*values: str) -> Obj:
    return {"key": HOST, "operator": "In", "values": list(values)}


def with_terms(*terms: list[Obj]) -> Obj:
    """A PV whose required affinity has one term per argument (each a list of expressions)."""
    return {"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": exprs} for exprs in terms]}}}}


def pv(*, nodes: tuple[str, ...] = ("n1",), sc: str = "local", local: bool = True, claim: bool = True,
       phase: str = "Bound", policy: str = "Delete", deleting: bool = False) -> Obj:
    obj = with_terms([hostname_in(*nodes)])
    obj["metadata"] = {"name": "pv1", "uid": "pv-uid"}
    spec = obj["spec"]
    spec.update(storageClassName=sc, persistentVolumeReclaimPolicy=policy)
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


@pytest.mark.parametrize(("obj", "classes", "expected"), [
    (pv(), {"local"}, True),
    (pv(), {"other", "local"}, True),
    (pv(), {"other"}, False),
    (pv(), set(), False),
    (pv(local=False), {"local"}, False),
])
def test_local_pv_of_opted_in_class(obj: Obj, classes: set[str], expected: bool) -> None:
    assert is_opted_in_local_pv(obj, classes) is expected


@pytest.mark.parametrize(("nodes", "existing", "expected"), [
    (("n1",), set(), True),
    (("n1",), {"n1"}, False),
    (("n1", "n2"), {"n2"}, False),
    (("n1", "n2"), set(), True),
    ((), set(), False),
])
def test_nodes_all_gone(nodes: tuple[str, ...], existing: set[str], expected: bool) -> None:
    assert nodes_all_gone(pv(nodes=nodes), existing.__contains__) is expected


# ---------------------------------------------------------------- claim path


@pytest.mark.parametrize(("obj", "lookup", "reason"), [
    (pv(sc="other"), must_not_ask, "opted-in"),
    (pv(local=False), must_not_ask, "opted-in"),
    (pv(claim=False), must_not_ask, "no claim"),
    (pv(phase="Released"), must_not_ask, "released"),
    (pv(), exists, "node"),
    (pv(nodes=()), gone, "node"),
])
def test_claim_is_not_scheduled(obj: Obj, lookup: Any, reason: str) -> None:
    assert reason in (claim_cleanup_blocker(obj, CLASSES, lookup) or "")


def test_claim_is_scheduled_when_every_node_is_gone() -> None:
    assert claim_cleanup_blocker(pv(), CLASSES, gone) is None
    assert claim_cleanup_blocker(pv(phase="Available"), CLASSES, gone) is None
    assert claim_cleanup_blocker(pv(), set(), gone) is not None


@pytest.mark.parametrize(("claim", "lookup", "reason"), [
    (pvc(), exists, "node"),
    (None, gone, "no longer exists"),
    (pvc(volume="pv-other"), gone, "another volume"),
    (pvc(volume=""), gone, "another volume"),
    (pvc(uid="someone-else"), gone, "UID"),
    (pvc(deleting=True), gone, "being deleted"),
])
def test_claim_is_kept_at_due_time(claim: Obj | None, lookup: Any, reason: str) -> None:
    assert reason in (claim_deletion_blocker(pv(), claim, CLASSES, lookup) or "")


def test_claim_is_deleted_at_due_time_when_all_still_holds() -> None:
    assert claim_deletion_blocker(pv(), pvc(), CLASSES, gone) is None


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
    assert (stale_pv_blocker(obj, CLASSES, gone, lambda ref: False) is None) is deleted


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
    assert reason in (stale_pv_blocker(obj, CLASSES, lookup, lambda ref: claim_exists) or "")

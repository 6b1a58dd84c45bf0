"""The capacity planner on plain data: which objects, what they say, which writes, when."""

from __future__ import annotations

import copy

from localpv.config.dynamic import DynamicClass
from localpv.csi import capacity
from localpv.csi.capacity import NodeRef, Publication, Room
from localpv.naming import DNS1123_SUBDOMAIN_RE, QUALIFIED_NAME_RE, MiB

PUB = Publication(NodeRef("node-1", "uid-1"), "localpv", "local.csi.localpv.dev", "storage.k8s.io/v1")
CLASSES = {"thin": DynamicClass("thin", "fast"), "thick": DynamicClass("thick", "fast", provisioning="thick"),
           "slow": DynamicClass("slow", "slow")}


def test_each_class_gets_its_pools_figure_by_provisioning_rounded_down_to_whole_mib() -> None:
    rooms = {"fast": Room(thin=900 * MiB + 5, thick=300 * MiB), "slow": None}
    assert capacity.figures(CLASSES, rooms) == {"thin": 900 * MiB, "thick": 300 * MiB, "slow": 0}
    assert capacity.figures(CLASSES, {"fast": Room(MiB - 1, -5)}) == {"thin": 0, "thick": 0}  # slow: no pool here


def test_the_object_says_the_figure_for_this_node_only() -> None:
    obj = capacity.render(PUB, "thin", 1536 * MiB)
    assert obj["apiVersion"] == "storage.k8s.io/v1" and obj["kind"] == "CSIStorageCapacity"
    assert obj["capacity"] == obj["maximumVolumeSize"] == "1536Mi"
    assert obj["storageClassName"] == "thin"
    assert obj["nodeTopology"] == {"matchLabels": {"topology.localpv.dev/node": "node-1"}}
    meta = obj["metadata"]
    assert meta["namespace"] == "localpv" and meta["name"] == capacity.object_name("node-1", "thin")
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "uid-1"}]
    assert meta["labels"]["csi.storage.k8s.io/drivername"] == "local.csi.localpv.dev"
    assert meta["labels"]["localpv.dev/node"] == "node-1"
    assert capacity.selector(PUB) == "csi.storage.k8s.io/drivername=local.csi.localpv.dev,localpv.dev/node=node-1"


def test_names_are_deterministic_distinct_and_valid_whatever_the_names() -> None:
    long_node, long_class = "n" * 253, "c" * 253
    names = {capacity.object_name(n, c) for n in ("a", "b", long_node) for c in ("x", "y", long_class)}
    assert len(names) == 9
    assert all(DNS1123_SUBDOMAIN_RE.fullmatch(n) and len(n) <= 253 for n in names)
    assert capacity.object_name("a", "bc") != capacity.object_name("ab", "c")
    for name in (long_node, "n" * 63, "a.b-c"):
        obj = capacity.render(Publication(NodeRef(name, "u"), "ns", "d", "storage.k8s.io/v1"), "x", 0)
        values = [*obj["metadata"]["labels"].values(), *obj["nodeTopology"]["matchLabels"].values()]
        # label values (the node's hashed when its name is too long for one)
        assert all(len(v) <= 63 and QUALIFIED_NAME_RE.fullmatch(v) for v in values), values


def _listed(obj: dict[str, object], rv: str = "7", uid: str = "u-old") -> dict[str, object]:
    have = copy.deepcopy(obj)
    have["metadata"] = {**have["metadata"], "resourceVersion": rv, "uid": uid}  # type: ignore[dict-item]
    return have


def test_plan_creates_updates_recreates_and_deletes() -> None:
    wanted = capacity.wanted(PUB, {"thin": 100 * MiB, "thick": 50 * MiB, "slow": 0})
    names = {c: capacity.object_name("node-1", c) for c in ("thin", "thick", "slow", "gone")}
    same = _listed(wanted[names["thin"]])
    same["capacity"] = same["maximumVolumeSize"] = str(100 * MiB)  # another spelling of one quantity
    moved = _listed(wanted[names["thick"]])
    moved["capacity"] = "1Gi"
    edited = _listed(wanted[names["slow"]], uid="u-slow")
    edited["nodeTopology"] = {"matchLabels": {"topology.localpv.dev/node": "elsewhere"}}
    stale = _listed(capacity.render(PUB, "gone", 5 * MiB), uid="u-gone")
    actions = capacity.plan(wanted, [same, moved, edited, stale])
    by_name = {a.name: a for a in actions}
    assert names["thin"] not in by_name  # nothing to write
    assert by_name[names["thick"]].verb == "update"
    assert by_name[names["thick"]].obj["capacity"] == "50Mi"  # type: ignore[index]
    assert by_name[names["thick"]].obj["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    assert (by_name[names["slow"]].verb, by_name[names["slow"]].uid) == ("recreate", "u-slow")
    assert (by_name[names["gone"]].verb, by_name[names["gone"]].uid) == ("delete", "u-gone")
    assert [a.verb for a in capacity.plan(wanted, [])] == ["create"] * 3


def test_a_new_node_uid_or_lost_labels_are_written_again() -> None:
    wanted = capacity.wanted(PUB, {"thin": MiB})
    have = _listed(next(iter(wanted.values())))
    have["metadata"]["ownerReferences"][0]["uid"] = "uid-of-a-node-deleted-and-made-again"  # type: ignore[index]
    assert [a.verb for a in capacity.plan(wanted, [have])] == ["update"]
    have = _listed(next(iter(wanted.values())))
    del have["metadata"]["labels"]["csi.storage.k8s.io/managed-by"]  # type: ignore[index]
    assert [a.verb for a in capacity.plan(wanted, [have])] == ["update"]


def test_due_defers_writes_within_the_interval_but_never_deletions() -> None:
    actions = [capacity.Action("update", "a", {}), capacity.Action("create", "b", {}),
               capacity.Action("delete", "c"), capacity.Action("update", "d", {})]
    ready, wake = capacity.due(actions, {"a": 95.0, "c": 99.0, "d": 91.0}, now=100.0, min_interval=10.0)
    assert [a.name for a in ready] == ["b", "c"]
    assert wake == 101.0  # d may go at 101, a at 105: the first is when to look again
    ready, wake = capacity.due(actions, {}, now=100.0, min_interval=10.0)
    assert len(ready) == 4 and wake is None

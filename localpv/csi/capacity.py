"""What this node's CSIStorageCapacity objects should say, and what to write to make them say it.

Pure: the figures of the pools and the configuration in, the objects wanted; the wanted and
the existing objects in, the writes to make. :mod:`localpv.csi.publisher` gathers the inputs
and carries the writes out.

The rules, and why:

* **One object per dynamic class whose pool is configured on this node**, in the agent's
  namespace, for this node only (``nodeTopology`` matches the topology segment the node plugin
  reports in ``NodeGetInfo``, which the kubelet puts on the Node as a label). Its name is a hash
  of node and class (``localpv-<hex>``: deterministic, so a restarted agent finds its objects,
  and a valid DNS subdomain however long the names are); its labels name the driver and the
  node, so an agent lists only its own; its owner is the Node, so the garbage collector removes
  it with the Node.
* **``capacity`` is the largest new volume the agent would accept now** - the same account
  (:meth:`localpv.csi.account.Account.largest`) that decides provisioning, thin or thick as the
  class provisions - rounded down to whole MiB, since an image is the claim's size rounded
  *up* to whole MiB: a claim of exactly the published size must fit.
* **``maximumVolumeSize`` is the same figure**, not the pool's bound: the scheduler compares a
  claim's request with ``maximumVolumeSize`` when it is set and with ``capacity`` only when it
  is not, so a bound there would let it place claims on a full pool. One image may take all
  that is left, so the largest volume and the available capacity are one number here.
* **A pool configured but not usable now** (its disk missing, on tmpfs, unreadable) publishes
  0: the object stays, saying "no room here" where an operator looks. **A class that is gone,
  or whose pool is not configured on this node, has no object**: for a driver with
  ``storageCapacity: true`` the scheduler takes a missing object as no capacity (Kubernetes'
  documented semantics since the alpha of 1.19: no object, an unset capacity and a zero
  capacity all mean none), so removing it is the same verdict without a stale object.
* **``storageClassName`` and ``nodeTopology`` are immutable** (the API server refuses to change
  them): an object that says another class or topology is deleted and made again.
* **At most one write per object per ``min_interval``** (:func:`due`): a StatefulSet's burst of
  claims is one write with the final figure, not one per claim.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from localpv.config.dynamic import DynamicClass
from localpv.csi.volume import TOPOLOGY_KEY
from localpv.kube.objects import Obj
from localpv.naming import NODE_LABEL_KEY, MiB, format_binary_quantity, node_label_value, parse_quantity

#: external-provisioner's labels on the objects it publishes: which driver, which publisher.
DRIVER_LABEL = "csi.storage.k8s.io/drivername"
MANAGED_BY_LABEL = "csi.storage.k8s.io/managed-by"
NAME_PREFIX = "localpv-"


@dataclass(frozen=True)
class Room:
    """The largest new image a pool's account accepts now, thin and thick."""

    thin: int
    thick: int


@dataclass(frozen=True)
class NodeRef:
    """The Node the objects are about and owned by."""

    name: str
    uid: str


@dataclass(frozen=True)
class Publication:
    """Where and as whom the objects are written."""

    node: NodeRef
    namespace: str
    driver: str
    #: ``storage.k8s.io/<version>``: the version the cluster serves.
    api_version: str


def object_name(node_name: str, class_name: str) -> str:
    """``localpv-`` and 32 hex digits of a hash of node and class: deterministic, unique per
    pair, and a valid DNS subdomain whatever the names' lengths."""
    digest = hashlib.sha256(f"{node_name}\0{class_name}".encode()).hexdigest()[:32]
    return f"{NAME_PREFIX}{digest}"


def publishable(largest: int) -> int:
    """What a capacity object may say for an account's ``largest``: whole MiB, rounded down."""
    return max(0, largest) // MiB * MiB


def selector(pub: Publication) -> str:
    """The label selector of this node's objects."""
    return f"{DRIVER_LABEL}={pub.driver},{NODE_LABEL_KEY}={node_label_value(pub.node.name)}"


def figures(classes: Mapping[str, DynamicClass], rooms: Mapping[str, Room | None]) -> dict[str, int]:
    """Each class's published bytes: classes whose pool is not in ``rooms`` (not configured on
    this node) have none; a pool there as None (not usable now) gives 0."""
    found = {}
    for name, cls in classes.items():
        if cls.pool not in rooms:
            continue
        room = rooms[cls.pool]
        largest = 0 if room is None else (room.thick if cls.provisioning == "thick" else room.thin)
        found[name] = publishable(largest)
    return found


def render(pub: Publication, class_name: str, capacity: int) -> Obj:
    """The object for one class."""
    node_value = node_label_value(pub.node.name)
    quantity = format_binary_quantity(capacity)
    return {
        "apiVersion": pub.api_version, "kind": "CSIStorageCapacity",
        "metadata": {
            "name": object_name(pub.node.name, class_name), "namespace": pub.namespace,
            # The node is in its own label: a managed-by value naming it would pass the 63
            # characters of a label value for long node names.
            "labels": {DRIVER_LABEL: pub.driver, MANAGED_BY_LABEL: "localpv", NODE_LABEL_KEY: node_value},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": pub.node.name, "uid": pub.node.uid}],
        },
        "nodeTopology": {"matchLabels": {TOPOLOGY_KEY: node_value}},
        "storageClassName": class_name,
        "capacity": quantity,
        "maximumVolumeSize": quantity,
    }


def wanted(pub: Publication, published: Mapping[str, int]) -> dict[str, Obj]:
    """The objects wanted, by name, for each class's figure."""
    objects = (render(pub, name, capacity) for name, capacity in published.items())
    return {str(o["metadata"]["name"]): o for o in objects}


@dataclass(frozen=True)
class Action:
    """One write: ``create``, ``update`` (the existing object's resourceVersion kept),
    ``recreate`` (an immutable field differs: delete, then create) or ``delete``."""

    verb: str
    name: str
    obj: Obj | None = None
    #: The existing object's uid (delete and recreate: a precondition, never someone else's).
    uid: str = ""


def quantity_bytes(value: object) -> int | None:
    """A quantity field's bytes (None when unset or not a quantity)."""
    try:
        return parse_quantity(str(value)) if value is not None else None
    except ValueError:
        return None


def _differs(want: Obj, have: Obj) -> bool:
    if any(quantity_bytes(want[k]) != quantity_bytes(have.get(k)) for k in ("capacity", "maximumVolumeSize")):
        return True
    meta, current = want["metadata"], have.get("metadata") or {}
    labels = current.get("labels") or {}
    if any(labels.get(k) != v for k, v in meta["labels"].items()):
        return True
    owners = {(r.get("kind"), r.get("uid")) for r in current.get("ownerReferences") or []}
    return ("Node", meta["ownerReferences"][0]["uid"]) not in owners


def _immutable_differs(want: Obj, have: Obj) -> bool:
    return bool(want["storageClassName"] != have.get("storageClassName")
                or want["nodeTopology"] != have.get("nodeTopology"))


def plan(wanted_objects: Mapping[str, Obj], existing: Iterable[Obj]) -> list[Action]:
    """The writes that make ``existing`` (this node's objects, as listed) what is wanted."""
    actions: list[Action] = []
    have = {str(o["metadata"]["name"]): o for o in existing}
    for name, want in sorted(wanted_objects.items()):
        current = have.get(name)
        if current is None:
            actions.append(Action("create", name, want))
        elif _immutable_differs(want, current):
            actions.append(Action("recreate", name, want, str(current["metadata"].get("uid") or "")))
        elif _differs(want, current):
            updated = dict(want)
            updated["metadata"] = {**want["metadata"], "resourceVersion": current["metadata"].get("resourceVersion")}
            actions.append(Action("update", name, updated))
    for name, current in sorted(have.items()):
        if name not in wanted_objects:
            actions.append(Action("delete", name, uid=str(current["metadata"].get("uid") or "")))
    return actions


def due(actions: Iterable[Action], last_write: Mapping[str, float], now: float,
        min_interval: float) -> tuple[list[Action], float | None]:
    """The actions that may run now - their object not written within ``min_interval`` - and
    when the first deferred one may (None: none deferred). Deletions are never deferred: an
    object saying there is room where there is no pool any more must go at once."""
    ready: list[Action] = []
    wake: float | None = None
    for action in actions:
        allowed = last_write.get(action.name, float("-inf")) + min_interval
        if action.verb == "delete" or allowed <= now:
            ready.append(action)
        else:
            wake = allowed if wake is None else min(wake, allowed)
    return ready, wake

"""Kubernetes objects as localpv reads them: typed shapes, and the one set of accessors.

The API layer hands back objects as decoded JSON (:data:`Obj`). Every field the code reads is
described below (``total=False``: the API server leaves empty fields out), and read through
the accessors here, so that "the claim a PV names", "is it being deleted" and the like are
spelled once, with the same defaults, for the node agent, node cleanup, the NFS provisioner
and dynamic volumes. Accessors take any mapping, so a plain :data:`Obj` and a typed dict
both go in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

#: A Kubernetes object as the API returns it (decoded JSON).
Obj = dict[str, Any]


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]
    deletionTimestamp: str
    creationTimestamp: str
    finalizers: list[str]
    ownerReferences: list[Obj]


class ObjectReference(TypedDict, total=False):
    """What ``spec.claimRef`` and event targets hold."""

    kind: str
    apiVersion: str
    name: str
    namespace: str
    uid: str
    resourceVersion: str


class PersistentVolumeSpec(TypedDict, total=False):
    capacity: dict[str, str]
    local: dict[str, Any]
    csi: dict[str, Any]
    nfs: dict[str, Any]
    claimRef: ObjectReference
    storageClassName: str
    persistentVolumeReclaimPolicy: str
    volumeMode: str
    accessModes: list[str]
    nodeAffinity: Obj
    mountOptions: list[str]


class PersistentVolumeStatus(TypedDict, total=False):
    phase: str


class PersistentVolume(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PersistentVolumeSpec
    status: PersistentVolumeStatus


class PersistentVolumeClaimSpec(TypedDict, total=False):
    accessModes: list[str]
    storageClassName: str
    volumeMode: str
    volumeName: str
    resources: dict[str, dict[str, str]]


class PersistentVolumeClaim(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PersistentVolumeClaimSpec
    status: dict[str, Any]


#: The phases a PV reports (``status.phase``).
PV_PHASES = ("Pending", "Available", "Bound", "Released", "Failed")


# --------------------------------------------------------------------------- any object


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def name(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name") or "")


def namespace(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("namespace") or "")


def uid(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("uid") or "")


def resource_version(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("resourceVersion") or "")


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("annotations") or {}


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def deleting(obj: Mapping[str, Any]) -> bool:
    """Deletion was requested (a finalizer may keep the object a while)."""
    return bool(meta(obj).get("deletionTimestamp"))


# --------------------------------------------------------------------------- PersistentVolumes


def pv_spec(pv: Mapping[str, Any]) -> Mapping[str, Any]:
    return pv.get("spec") or {}


def pv_host_path(pv: Mapping[str, Any]) -> str | None:
    """``spec.local.path`` without a trailing ``/``; None for a PV that is not a local volume."""
    path = (pv_spec(pv).get("local") or {}).get("path")
    return str(path).rstrip("/") if path else None


def pv_is_csi(pv: Mapping[str, Any]) -> bool:
    """A PV served by a CSI driver (``spec.csi``): for localpv, a dynamic volume."""
    return bool(pv_spec(pv).get("csi"))


def pv_phase(pv: Mapping[str, Any]) -> str:
    return str((pv.get("status") or {}).get("phase") or "")


def pv_class(pv: Mapping[str, Any]) -> str:
    return str(pv_spec(pv).get("storageClassName") or "")


def pv_reclaim_policy(pv: Mapping[str, Any]) -> str:
    return str(pv_spec(pv).get("persistentVolumeReclaimPolicy") or "")


def pv_claim_ref(pv: Mapping[str, Any]) -> Obj | None:
    """``spec.claimRef`` when it names a claim, else None."""
    ref = pv_spec(pv).get("claimRef")
    return ref if isinstance(ref, dict) and ref.get("name") else None


def pv_claim_uid(pv: Mapping[str, Any]) -> str:
    return str((pv_spec(pv).get("claimRef") or {}).get("uid") or "")


def pv_claim_name(pv: Mapping[str, Any]) -> str:
    """``namespace/name`` of the claim the PV's claimRef names, "" if none."""
    ref = pv_spec(pv).get("claimRef") or {}
    return f"{ref.get('namespace') or ''}/{ref['name']}" if ref.get("name") else ""


def pv_is_claimed(pv: Mapping[str, Any]) -> bool:
    """Bound, Released, or at least reserved for a claim: its volume may hold data."""
    return bool(pv_spec(pv).get("claimRef")) or pv_phase(pv) in ("Bound", "Released")


def claim_event_target(pv: Mapping[str, Any]) -> Obj | None:
    """The live claim a PV is bound (or being bound) to, as an event target, so that
    ``kubectl describe pvc`` shows what is said about its volume; None once it is Released."""
    ref = pv_spec(pv).get("claimRef") or {}
    if not ref.get("name") or not ref.get("namespace") or pv_phase(pv) == "Released":
        return None
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": ref["name"], "namespace": ref["namespace"], "uid": ref.get("uid") or ""}}

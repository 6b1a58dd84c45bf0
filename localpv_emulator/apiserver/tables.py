"""Server-side tables for kubectl: the columns of ``kubectl get`` per kind."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from localpv_emulator.apiserver.resources import Obj, ResourceType
from localpv_emulator.apiserver.routing import HttpRequest
from localpv_emulator.apiserver.strategies import DEFAULT_CLASS_ANNOTATIONS


def human_duration(seconds: float) -> str:
    """``duration.HumanDuration``, which kubectl's AGE columns show."""
    s = max(0, int(seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 730:
        return f"{days}d"
    years = days // 365
    return f"{years}y{days % 365}d" if years < 8 and days % 365 else f"{years}y"


def _since(timestamp: Any) -> float:
    if not timestamp:
        return 0.0
    then = datetime.strptime(str(timestamp)[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    return (datetime.now(UTC) - then).total_seconds()


def _dig(obj: Any, path: str, default: Any = "") -> Any:
    """The value at a dotted path, or ``default`` (what the printers show for a missing field)."""
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return default if obj is None else obj


_MODE_ABBREVIATIONS = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX",
                       "ReadWriteOncePod": "RWOP"}


def _modes(modes: Any) -> str:
    return ",".join(str(_MODE_ABBREVIATIONS.get(m, m)) for m in modes or [])


def _node_status(node: Obj) -> str:
    ready = next((c for c in _dig(node, "status.conditions", []) if c.get("type") == "Ready"), None)
    status = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    return status + (",SchedulingDisabled" if _dig(node, "spec.unschedulable", False) else "")


def _job_status(job: Obj) -> str:
    for condition in _dig(job, "status.conditions", []):
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return "Running"


def _class_name(sc: Obj) -> str:
    annotations = sc["metadata"].get("annotations") or {}
    default = any(annotations.get(a) == "true" for a in DEFAULT_CLASS_ANNOTATIONS)
    return str(sc["metadata"]["name"]) + (" (default)" if default else "")


Column = tuple[str, str, Callable[[Obj], Any], int]  # name, type, cell, priority
_NAME: Column = ("Name", "string", lambda o: o["metadata"]["name"], 0)
_AGE: Column = ("Age", "string", lambda o: human_duration(_since(o["metadata"].get("creationTimestamp"))), 0)
_UNSET_VAC: Column = ("VolumeAttributesClass", "string",
                      lambda o: _dig(o, "spec.volumeAttributesClassName", "<unset>"), 0)
#: the server-side printers kubectl shows; kinds without one are printed by kubectl as NAME/AGE
PRINTERS: dict[tuple[str, str], tuple[Column, ...]] = {
    ("v1", "Namespace"): (_NAME, ("Status", "string", lambda o: _dig(o, "status.phase"), 0), _AGE),
    ("v1", "Node"): (
        _NAME, ("Status", "string", _node_status, 0),
        ("Roles", "string", lambda o: ",".join(sorted(k.split("/", 1)[1] for k in o["metadata"].get("labels") or {}
                                                      if k.startswith("node-role.kubernetes.io/"))) or "<none>", 0),
        _AGE, ("Version", "string", lambda o: _dig(o, "status.nodeInfo.kubeletVersion"), 0)),
    ("v1", "PersistentVolume"): (
        _NAME, ("Capacity", "string", lambda o: _dig(o, "spec.capacity.storage"), 0),
        ("Access Modes", "string", lambda o: _modes(_dig(o, "spec.accessModes", [])), 0),
        ("Reclaim Policy", "string", lambda o: _dig(o, "spec.persistentVolumeReclaimPolicy"), 0),
        ("Status", "string", lambda o: _dig(o, "status.phase"), 0),
        ("Claim", "string", lambda o: "/".join(filter(None, (_dig(o, "spec.claimRef.namespace"),
                                                             _dig(o, "spec.claimRef.name")))), 0),
        ("StorageClass", "string", lambda o: _dig(o, "spec.storageClassName"), 0), _UNSET_VAC,
        ("Reason", "string", lambda o: _dig(o, "status.reason"), 0), _AGE,
        ("VolumeMode", "string", lambda o: _dig(o, "spec.volumeMode"), 1)),
    ("v1", "PersistentVolumeClaim"): (
        _NAME, ("Status", "string", lambda o: _dig(o, "status.phase"), 0),
        ("Volume", "string", lambda o: _dig(o, "spec.volumeName"), 0),
        ("Capacity", "string", lambda o: _dig(o, "status.capacity.storage"), 0),
        ("Access Modes", "string", lambda o: _modes(_dig(o, "status.accessModes", [])), 0),
        ("StorageClass", "string", lambda o: _dig(o, "spec.storageClassName"), 0), _UNSET_VAC, _AGE,
        ("VolumeMode", "string", lambda o: _dig(o, "spec.volumeMode"), 1)),
    ("v1", "Pod"): (
        _NAME,
        ("Ready", "string", lambda o: f"{sum(bool(c.get('ready')) for c in _dig(o, 'status.containerStatuses', []))}"
                                      f"/{len(_dig(o, 'spec.containers', []))}", 0),
        ("Status", "string", lambda o: "Terminating" if o["metadata"].get("deletionTimestamp")
         else _dig(o, "status.reason") or _dig(o, "status.phase"), 0),
        ("Restarts", "string", lambda o: str(sum(int(c.get("restartCount", 0))
                                                 for c in _dig(o, "status.containerStatuses", []))), 0),
        _AGE, ("Node", "string", lambda o: _dig(o, "spec.nodeName", "<none>"), 1)),
    ("storage.k8s.io/v1", "StorageClass"): (
        ("Name", "string", _class_name, 0), ("Provisioner", "string", lambda o: o.get("provisioner", ""), 0),
        ("ReclaimPolicy", "string", lambda o: o.get("reclaimPolicy", ""), 0),
        ("VolumeBindingMode", "string", lambda o: o.get("volumeBindingMode", ""), 0),
        ("AllowVolumeExpansion", "string", lambda o: str(bool(o.get("allowVolumeExpansion"))).lower(), 0), _AGE),
    ("batch/v1", "Job"): (
        _NAME, ("Status", "string", _job_status, 0),
        ("Completions", "string", lambda o: f"{_dig(o, 'status.succeeded', 0)}/{_dig(o, 'spec.completions', 1)}", 0),
        ("Duration", "string", lambda o: human_duration(
            _since(_dig(o, "status.startTime")) - _since(_dig(o, "status.completionTime", None)))
         if _dig(o, "status.startTime") else "", 0),
        _AGE),
    ("v1", "ConfigMap"): (_NAME, ("Data", "integer",
                                  lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {}), 0), _AGE),
    ("v1", "Secret"): (_NAME, ("Type", "string", lambda o: o.get("type", ""), 0),
                       ("Data", "integer", lambda o: len(o.get("data") or {}), 0), _AGE),
}


def wants_table(accept: str) -> bool:
    """kubectl asks for ``as=Table`` first; plain JSON is its fallback."""
    return "as=Table" in accept


Renderer = Callable[[list[Obj], Obj], Obj]


def table_renderer(rt: ResourceType, req: HttpRequest) -> Renderer | None:
    """How to answer a request that asks for a Table; None for plain JSON."""
    if not wants_table(req.accept) or (rt.api_version, rt.kind) not in PRINTERS:
        return None
    include = req.query.get("includeObject", "Metadata")

    def render(objects: list[Obj], list_meta: Obj) -> Obj:
        return to_table(rt, objects, list_meta, include)

    return render


def to_table(rt: ResourceType, objects: list[Obj], list_meta: Obj, include: str) -> Obj:
    """A ``meta.k8s.io/v1`` Table like the server-side printers make (for kinds in PRINTERS)."""
    columns = PRINTERS[(rt.api_version, rt.kind)]
    rows = []
    for obj in objects:
        row: Obj = {"cells": [cell(obj) for _, _, cell, _ in columns]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    definitions = [{"name": name, "type": kind, "format": "name" if name == "Name" else "", "description": name,
                    "priority": priority} for name, kind, _, priority in columns]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta,
            "columnDefinitions": definitions, "rows": rows}

"""A strict, in-process emulator of kube-apiserver for tests and ``localpv demo``.

Kubernetes cannot run where this project is built and tested, so the product's tests talk
to this server instead, over real HTTP, with the real ``kubernetes`` client and ``kubectl``.
A lenient fake would let bugs through that a cluster catches at once, so this one copies
the server's contract where clients can observe it: one global resourceVersion, 409/410/422
semantics and their ``metav1.Status`` bodies, list/watch with selectors, paging and resume,
the status subresource, finalizers, preconditions, owner-reference garbage collection, and a
PV binder standing in for kube-controller-manager (see :mod:`localpv.testing.binder`).

For kubectl it also serves server-side tables (the columns of ``kubectl get``) and minimal
OpenAPI documents: v3 for kubectl >= 1.29 and a protobuf v2 for older ones, carrying only
what kubectl reads to let the server validate fields, which ``kubectl apply`` requires.

Known simplifications (each documented where it is implemented):

* storage is in memory; a list page past the first is served from a snapshot rebuilt from
  the watch history (as etcd would serve it) and expires with that history, which keeps at
  least ``history_limit`` of the most recent changes;
* every kind gets ``metadata.generation`` (the real server sets it only for some);
* server-side apply creates the object or strategically merges the applied configuration
  into it; there is no field ownership, no removal of fields dropped from the configuration
  and no apply conflicts;
* strategic merge knows the merge keys of the fields this project touches (containers,
  volumes, env, ports, conditions, finalizers, ownerReferences, ...); other lists replace;
* pods are deleted at once (no kubelet to confirm graceful termination), deletecollection
  deletes one by one, the two Event APIs are separate stores;
* there is no authentication; authorization answers "allowed" unless a denial was added
  with :meth:`ApiServer.deny`.

Usage: ``ApiServer().start()`` in tests, or
``python -m localpv.testing.apiserver --port N --kubeconfig-out FILE [--binder] [--job-completer]``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import bisect
import contextlib
import copy
import json
import random
import re
import select
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit

from localpv.testing.binder import PVBinder, QuantityError, Reconciler, parse_quantity
from localpv.testing.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    label_value_problems,
    node_selector_problems,
    qualified_name_problems,
)

__all__ = [
    "RESOURCES",
    "ApiError",
    "ApiServer",
    "Faults",
    "RequestLog",
    "RequestRecord",
    "ResourceType",
    "main",
]

Obj = dict[str, Any]

KUBE_VERSION = "1.31.0"
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
STATUS_VERBS = ("get", "patch", "update")
FAULT_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def now_rfc3339() -> str:
    """Timestamps as the API server writes them (second precision, ``Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# =========================================================================== the resource table


@dataclass(frozen=True, eq=False)  # rows are singletons: identity hashing keeps lookups cheap
class ResourceType:
    """One served resource. The :data:`RESOURCES` table drives routing, discovery and rules."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    #: has a ``/status`` subresource: the main resource ignores status and vice versa
    status: bool = False
    verbs: tuple[str, ...] = ALL_VERBS
    #: how names are validated: subdomain, label (RFC 1123), dns1035 (services), path (RBAC)
    name_rule: str = "subdomain"
    #: field selector labels beyond metadata.name / metadata.namespace
    fields: tuple[str, ...] = ()
    #: DELETE answers with the object (pods, PVs, ...) rather than a Success Status
    returns_deleted: bool = False
    #: PUT on a missing object creates it (events, leases, endpoints)
    create_on_update: bool = False
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        """``v1`` or ``group/version``, as written in objects."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``plural.group``, the resource name used in error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def singular(self) -> str:
        """Discovery's singularName."""
        return self.kind.lower()

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The URL path of the collection or of one object."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        ns = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{root}{ns}/{self.plural}" + (f"/{name}" if name else "")


_POD_FIELDS = (
    "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
    "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName",
)
_EVENT_FIELDS = (
    "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
    "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
    "reason", "reportingComponent", "source", "type",
)
_R = ResourceType
RESOURCES: tuple[ResourceType, ...] = (
    _R("", "v1", "namespaces", "Namespace", False, ("ns",), status=True, name_rule="label",
       fields=("status.phase",), returns_deleted=True),
    _R("", "v1", "nodes", "Node", False, ("no",), status=True, fields=("spec.unschedulable",)),
    _R("", "v1", "persistentvolumes", "PersistentVolume", False, ("pv",), status=True, returns_deleted=True),
    _R("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), status=True,
       returns_deleted=True),
    _R("", "v1", "pods", "Pod", True, ("po",), status=True, fields=_POD_FIELDS, returns_deleted=True,
       categories=("all",)),
    _R("", "v1", "events", "Event", True, ("ev",), fields=_EVENT_FIELDS, create_on_update=True),
    _R("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    _R("", "v1", "secrets", "Secret", True, fields=("type",)),
    _R("", "v1", "services", "Service", True, ("svc",), status=True, name_rule="dns1035",
       returns_deleted=True, categories=("all",)),
    _R("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",), returns_deleted=True),
    _R("", "v1", "endpoints", "Endpoints", True, ("ep",), create_on_update=True),
    _R("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, ("sc",), returns_deleted=True),
    _R("batch", "v1", "jobs", "Job", True, status=True, fields=("status.successful",), categories=("all",)),
    _R("coordination.k8s.io", "v1", "leases", "Lease", True, create_on_update=True),
    _R("events.k8s.io", "v1", "events", "Event", True, ("ev",)),
    _R("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), status=True, categories=("all",)),
    _R("apps", "v1", "deployments", "Deployment", True, ("deploy",), status=True, categories=("all",)),
    _R("rbac.authorization.k8s.io", "v1", "roles", "Role", True, name_rule="path"),
    _R("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, name_rule="path"),
    _R("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, name_rule="path"),
    _R("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, name_rule="path"),
    _R("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), status=True),
    _R("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
       verbs=("create",)),
    # The prometheus-operator CRD, as if installed: charts (ours included) create ServiceMonitors.
    _R("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", True, ("smon",)),
)
del _R

_BY_PATH = {(rt.group, rt.version, rt.plural): rt for rt in RESOURCES}
_BY_KIND = {(rt.api_version, rt.kind): rt for rt in RESOURCES}
NAMESPACES = _BY_KIND[("v1", "Namespace")]


def resource_for(api_version: str, kind: str) -> ResourceType:
    """The table row for an (apiVersion, kind) pair; KeyError names the pair when unknown."""
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        raise KeyError(f"the emulator does not serve {kind} in {api_version}") from None


# =========================================================================== errors


_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
    406: "NotAcceptable", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid",
    429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}


class ApiError(Exception):
    """An API failure, rendered as the ``metav1.Status`` body the real server sends."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: Obj | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details
        self.retry_after = retry_after

    def status(self) -> Obj:
        """The Status object for the response body or a watch ERROR event."""
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body

    # -- the constructors mirror k8s.io/apimachinery/pkg/api/errors

    @staticmethod
    def _details(rt: ResourceType, name: str, **extra: Any) -> Obj:
        details: Obj = {"name": name, "kind": rt.plural, **extra} if name else {"kind": rt.plural, **extra}
        if rt.group:
            details["group"] = rt.group
        return details

    @classmethod
    def not_found(cls, rt: ResourceType, name: str) -> ApiError:
        return cls(404, f'{rt.qualified} "{name}" not found', details=cls._details(rt, name))

    @classmethod
    def already_exists(cls, rt: ResourceType, name: str, deleting: bool = False) -> ApiError:
        prefix = "object is being deleted: " if deleting else ""
        return cls(409, f'{prefix}{rt.qualified} "{name}" already exists', "AlreadyExists",
                   cls._details(rt, name))

    @classmethod
    def conflict(cls, rt: ResourceType, name: str, why: str) -> ApiError:
        return cls(409, f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}', "Conflict",
                   cls._details(rt, name))

    @classmethod
    def stale(cls, rt: ResourceType, name: str) -> ApiError:
        return cls.conflict(rt, name, "the object has been modified; please apply your changes to the "
                                      "latest version and try again")

    @classmethod
    def invalid(cls, rt: ResourceType, name: str, errors: FieldErrors) -> ApiError:
        msgs = [f"{f}: {body}" for f, _, body in errors.items]
        text = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
        causes = [{"reason": reason, "message": body, "field": f} for f, reason, body in errors.items]
        details: Obj = {"name": name, "kind": rt.kind, "causes": causes}
        if rt.group:
            details["group"] = rt.group
        return cls(422, f'{rt.kind} "{name}" is invalid: {text}', "Invalid", details)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, message, "BadRequest")

    @classmethod
    def expired(cls, message: str) -> ApiError:
        return cls(410, message, "Expired")

    @classmethod
    def method_not_allowed(cls) -> ApiError:
        return cls(405, "the server does not allow this method on the requested resource",
                   "MethodNotAllowed", {})

    @classmethod
    def path_not_found(cls) -> ApiError:
        return cls(404, "the server could not find the requested resource", "NotFound", {})

    @classmethod
    def forbidden(cls, rt: ResourceType, name: str, why: str) -> ApiError:
        subject = f'{rt.qualified} "{name}"' if name else rt.qualified
        return cls(403, f"{subject} is forbidden: {why}", "Forbidden", cls._details(rt, name))

    @classmethod
    def injected(cls, code: int) -> ApiError:
        """A failure asked for by :class:`Faults`; 429 carries Retry-After like the real server."""
        if code == 429:
            return cls(429, "Too many requests, please try again later.", "TooManyRequests",
                       {"retryAfterSeconds": 1}, retry_after=1)
        return cls(code, f"injected fault: HTTP {code}", details={})


# =========================================================================== validation helpers


def _show(value: Any) -> str:
    """Render a value in an error the way Go's ``%q``/``%v`` would, near enough."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class FieldErrors:
    """Collects ``field.Error``s; each becomes a cause in a 422 Invalid Status."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str]] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def required(self, path: str, detail: str = "") -> None:
        self.items.append((path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else "")))

    def invalid(self, path: str, value: Any, detail: str = "") -> None:
        body = f"Invalid value: {_show(value)}" + (f": {detail}" if detail else "")
        self.items.append((path, "FieldValueInvalid", body))

    def forbidden(self, path: str, detail: str) -> None:
        self.items.append((path, "FieldValueForbidden", f"Forbidden: {detail}"))

    def unsupported(self, path: str, value: Any, supported: Iterable[str]) -> None:
        choices = ", ".join(json.dumps(s) for s in supported)
        self.items.append((path, "FieldValueNotSupported",
                           f"Unsupported value: {_show(value)}: supported values: {choices}"))

    def duplicate(self, path: str, value: Any) -> None:
        self.items.append((path, "FieldValueDuplicate", f"Duplicate value: {_show(value)}"))

    def immutable(self, path: str, value: Any) -> None:
        self.invalid(path, value, "field is immutable")

    def add(self, path: str, kind: str, detail: Any) -> None:
        """Record a problem reported as ``(path, kind, detail)`` by the selectors module."""
        if kind == "required":
            self.required(path, str(detail))
        elif kind == "forbidden":
            self.forbidden(path, str(detail))
        elif kind == "unsupported":
            self.unsupported(path, detail, ())
        else:
            self.invalid(path, detail)


_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
    "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)


def name_problems(name: str, rule: str) -> list[str]:
    """Why ``name`` is not acceptable under a resource's naming rule."""
    if rule == "path":
        if name in (".", ".."):
            return [f"may not be '{name}'"]
        return [f"may not contain '{c}'" for c in "/%" if c in name]
    if rule == "subdomain":
        if len(name) > 253:
            return ["must be no more than 253 characters"]
        return [] if _DNS1123_SUBDOMAIN.match(name) else [_SUBDOMAIN_MSG]
    pattern, msg = (_DNS1035_LABEL, _DNS1035_MSG) if rule == "dns1035" else (_DNS1123_LABEL, _LABEL_MSG)
    if len(name) > 63:
        return ["must be no more than 63 characters"]
    return [] if pattern.match(name) else [msg]


def _check_enum(errs: FieldErrors, path: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        errs.unsupported(path, value, allowed)


def _check_quantity(errs: FieldErrors, path: str, value: Any, positive: bool = False) -> None:
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        errs.invalid(path, value, str(exc))
        return
    if positive and amount <= 0:
        errs.invalid(path, value, "must be greater than zero")
    elif amount < 0:
        errs.invalid(path, value, "must be greater than or equal to 0")


def _check_label_map(errs: FieldErrors, path: str, labels: Any, values: bool) -> None:
    """Label (or annotation, when ``values`` is False) keys, and label values."""
    if labels is None:
        return
    if not isinstance(labels, dict):
        errs.invalid(path, labels, "must be a map of string keys to string values")
        return
    for key, value in labels.items():
        for problem in qualified_name_problems(str(key)):
            errs.invalid(path, key, problem)
        if not isinstance(value, str):
            errs.invalid(f"{path}[{key}]", value, "must be a string")
        elif values:
            for problem in label_value_problems(value):
                errs.invalid(f"{path}[{key}]", value, problem)


_STANDARD_FINALIZERS = ("kubernetes", "orphan", "foregroundDeletion")


def validate_metadata(rt: ResourceType, obj: Obj, errs: FieldErrors) -> None:
    """``ValidateObjectMeta``: names, labels, annotations, finalizers, owner references."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    if not name:
        errs.required("metadata.name", "name or generateName is required")
    else:
        for problem in name_problems(str(name), rt.name_rule):
            errs.invalid("metadata.name", name, problem)
    _check_label_map(errs, "metadata.labels", meta.get("labels"), values=True)
    _check_label_map(errs, "metadata.annotations", meta.get("annotations"), values=False)
    if len(json.dumps(meta.get("annotations") or {})) > 256 * 1024:
        errs.forbidden("metadata.annotations", "may not be more than 262144 bytes")
    for i, fin in enumerate(meta.get("finalizers") or []):
        if "/" not in str(fin) and fin not in _STANDARD_FINALIZERS:
            errs.invalid(f"metadata.finalizers[{i}]", fin,
                         "name is neither a standard finalizer name nor is it fully qualified")
        elif "/" in str(fin):
            for problem in qualified_name_problems(str(fin)):
                errs.invalid(f"metadata.finalizers[{i}]", fin, problem)
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for part in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(part):
                errs.required(f"metadata.ownerReferences[{i}].{part}", f"{part} must not be empty")
        controllers += bool(ref.get("controller"))
    if controllers > 1:
        errs.invalid("metadata.ownerReferences", meta.get("ownerReferences"),
                     "Only one reference can have Controller set to true")


# =========================================================================== per-kind strategies


class Strategy:
    """Per-kind rules, after the registry strategies of kube-apiserver.

    ``default`` runs on every write (the real server defaults on decode), ``prepare_create``
    only on create (status reset, generated fields), ``prepare_update`` may restore fields a
    client may not change through this endpoint.
    """

    #: Nodes are the exception: kubelets create them with status in one request.
    keep_status_on_create: ClassVar[bool] = False

    def initial_status(self, obj: Obj) -> Obj:
        """What a create stores as status (clients cannot set status on create)."""
        return {}

    def default(self, obj: Obj) -> None:
        """Fill defaulted fields, in place."""

    def prepare_create(self, obj: Obj, store: Store) -> None:
        """Set server-generated fields on create, in place."""

    def prepare_update(self, new: Obj, old: Obj) -> None:
        """Undo changes that this endpoint ignores, in place."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        """Kind-specific validation of the whole object."""

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        """Kind-specific rules about what an update may change."""

    def finalizers(self, obj: Obj) -> list[str]:
        """What still blocks the removal of an object marked for deletion."""
        return list(obj.get("metadata", {}).get("finalizers") or [])


def _spec(obj: Obj) -> Obj:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    return spec


class NamespaceStrategy(Strategy):
    """Namespaces carry the ``kubernetes`` spec finalizer until their content is gone."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Active"}

    def default(self, obj: Obj) -> None:
        name = obj.get("metadata", {}).get("name")
        if name:
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name

    def prepare_create(self, obj: Obj, store: Store) -> None:
        _spec(obj)["finalizers"] = ["kubernetes"]

    def prepare_update(self, new: Obj, old: Obj) -> None:
        _spec(new)["finalizers"] = list(old.get("spec", {}).get("finalizers") or [])

    def finalizers(self, obj: Obj) -> list[str]:
        return super().finalizers(obj) + list(obj.get("spec", {}).get("finalizers") or [])


class NodeStrategy(Strategy):
    """Kubelets register nodes with their status in the create request."""

    keep_status_on_create = True


ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
PV_SOURCES = (
    "hostPath", "local", "nfs", "csi", "iscsi", "fc", "awsElasticBlockStore", "gcePersistentDisk", "rbd",
    "cephfs", "cinder", "flexVolume", "azureFile", "azureDisk", "photonPersistentDisk", "portworxVolume",
    "scaleIO", "storageos", "vsphereVolume", "quobyte", "glusterfs", "flocker",
)


def _check_access_modes(errs: FieldErrors, path: str, modes: Any) -> None:
    if not modes:
        errs.required(path)
        return
    for mode in modes:
        _check_enum(errs, path, mode, ACCESS_MODES)
    if "ReadWriteOncePod" in modes and len(modes) > 1:
        errs.forbidden(path, "may not use ReadWriteOncePod with other access modes")


def _check_class_name(errs: FieldErrors, path: str, name: Any) -> None:
    if name:
        for problem in name_problems(str(name), "subdomain"):
            errs.invalid(path, name, problem)


class PersistentVolumeStrategy(Strategy):
    """``ValidatePersistentVolume``: capacity, one volume source, immutable source."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending"}

    def default(self, obj: Obj) -> None:
        spec = _spec(obj)
        spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
        spec.setdefault("volumeMode", "Filesystem")

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = _spec(obj)
        _check_access_modes(errs, "spec.accessModes", spec.get("accessModes"))
        capacity = spec.get("capacity")
        if not capacity:
            errs.required("spec.capacity")
        elif set(capacity) != {"storage"}:
            errs.unsupported("spec.capacity", sorted(set(capacity) - {"storage"}), ("storage",))
        else:
            _check_quantity(errs, "spec.capacity[storage]", capacity["storage"], positive=True)
        sources = [s for s in PV_SOURCES if spec.get(s) is not None]
        if not sources:
            errs.required("spec", "must specify a volume type")
        for extra in sources[1:]:
            errs.forbidden(f"spec.{extra}", "may not specify more than 1 volume type")
        _check_enum(errs, "spec.persistentVolumeReclaimPolicy", spec.get("persistentVolumeReclaimPolicy"),
                    ("Delete", "Recycle", "Retain"))
        _check_enum(errs, "spec.volumeMode", spec.get("volumeMode"), ("Block", "Filesystem"))
        _check_class_name(errs, "spec.storageClassName", spec.get("storageClassName"))
        self._validate_sources(spec, errs)
        affinity = (spec.get("nodeAffinity") or {}).get("required")
        if affinity is not None:
            for path, kind, detail in node_selector_problems(affinity, "spec.nodeAffinity.required"):
                errs.add(path, kind, detail)

    @staticmethod
    def _validate_sources(spec: Obj, errs: FieldErrors) -> None:
        required = {"local": ("path",), "hostPath": ("path",), "nfs": ("server", "path"),
                    "csi": ("driver", "volumeHandle")}
        for source, fields in required.items():
            if isinstance(spec.get(source), dict):
                for name in fields:
                    if not spec[source].get(name):
                        errs.required(f"spec.{source}.{name}")
        nfs_path = (spec.get("nfs") or {}).get("path")
        if nfs_path and not str(nfs_path).startswith("/"):
            errs.invalid("spec.nfs.path", nfs_path, "must be an absolute path")
        if spec.get("local") is not None and not (spec.get("nodeAffinity") or {}).get("required"):
            errs.required("spec.nodeAffinity", "Local volume requires node affinity")

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        nspec, ospec = _spec(new), _spec(old)
        if any(nspec.get(s) != ospec.get(s) for s in PV_SOURCES):
            errs.forbidden("spec.persistentvolumesource",
                           "spec.persistentvolumesource is immutable after creation")
        if nspec.get("volumeMode") != ospec.get("volumeMode"):
            errs.immutable("volumeMode", nspec.get("volumeMode"))
        if ospec.get("nodeAffinity") and nspec.get("nodeAffinity") != ospec.get("nodeAffinity"):
            errs.immutable("nodeAffinity", nspec.get("nodeAffinity"))


DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


class PersistentVolumeClaimStrategy(Strategy):
    """Claims are immutable but for a size increase and the binder's volumeName."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending"}

    def default(self, obj: Obj) -> None:
        _spec(obj).setdefault("volumeMode", "Filesystem")

    def prepare_create(self, obj: Obj, store: Store) -> None:
        """The DefaultStorageClass admission plugin: an unset class gets the default one."""
        spec = _spec(obj)
        if spec.get("storageClassName") is not None:
            return
        classes = [
            sc for sc in store.items(resource_for("storage.k8s.io/v1", "StorageClass"))
            if any((sc["metadata"].get("annotations") or {}).get(a) == "true" for a in DEFAULT_CLASS_ANNOTATIONS)
        ]
        if classes:
            newest = max(classes, key=lambda sc: (sc["metadata"]["creationTimestamp"], sc["metadata"]["name"]))
            spec["storageClassName"] = newest["metadata"]["name"]

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = _spec(obj)
        _check_access_modes(errs, "spec.accessModes", spec.get("accessModes"))
        requests = (spec.get("resources") or {}).get("requests") or {}
        if "storage" not in requests:
            errs.required("spec.resources[storage]")
        else:
            _check_quantity(errs, "spec.resources[storage]", requests["storage"], positive=True)
        _check_enum(errs, "spec.volumeMode", spec.get("volumeMode"), ("Block", "Filesystem"))
        _check_class_name(errs, "spec.storageClassName", spec.get("storageClassName"))
        if spec.get("selector") is not None:
            try:
                LabelSelector.from_object(spec["selector"])
            except SelectorError as exc:
                errs.invalid("spec.selector", spec["selector"], str(exc))

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        nspec, ospec = copy.deepcopy(_spec(new)), copy.deepcopy(_spec(old))
        if not ospec.get("volumeName"):  # binding sets it once
            ospec.pop("volumeName", None)
            nspec.pop("volumeName", None)
        for spec in (nspec, ospec):
            spec.pop("volumeAttributesClassName", None)
        new_size = (nspec.get("resources") or {}).get("requests", {}).get("storage")
        old_size = (ospec.get("resources") or {}).get("requests", {}).get("storage")
        if (old.get("status") or {}).get("phase") == "Bound" and new_size is not None:
            nspec.setdefault("resources", {}).setdefault("requests", {})["storage"] = old_size
            try:
                if parse_quantity(new_size) < parse_quantity(old_size):
                    errs.forbidden("spec.resources.requests.storage", "field can not be less than previous value")
            except QuantityError:
                pass  # already reported by validate()
        if nspec != ospec:
            errs.forbidden("spec", "spec is immutable after creation except resources.requests and "
                                   "volumeAttributesClassName for bound claims")


_RESTART_POLICIES = ("Always", "OnFailure", "Never")


def _default_pod_spec(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if not isinstance(container, dict):
            continue
        image = str(container.get("image") or "")
        latest = image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]
        container.setdefault("imagePullPolicy", "Always" if latest and "@" not in image else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})


def _validate_pod_spec(spec: Any, path: str, errs: FieldErrors) -> None:
    if not isinstance(spec, dict):
        errs.required(path)
        return
    containers = spec.get("containers") or []
    if not containers:
        errs.required(f"{path}.containers")
    names: set[str] = set()
    for part in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(part) or []):
            cpath, name = f"{path}.{part}[{i}]", str((container or {}).get("name") or "")
            if not name:
                errs.required(f"{cpath}.name")
            elif name in names:
                errs.duplicate(f"{cpath}.name", name)
            else:
                for problem in name_problems(name, "label"):
                    errs.invalid(f"{cpath}.name", name, problem)
            names.add(name)
            if not (container or {}).get("image"):
                errs.required(f"{cpath}.image")
    _check_enum(errs, f"{path}.restartPolicy", spec.get("restartPolicy"), _RESTART_POLICIES)
    volume_names: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        name = str((volume or {}).get("name") or "")
        if not name:
            errs.required(f"{path}.volumes[{i}].name")
        elif name in volume_names:
            errs.duplicate(f"{path}.volumes[{i}].name", name)
        volume_names.add(name)
        claim = (volume or {}).get("persistentVolumeClaim")
        if claim is not None and not claim.get("claimName"):
            errs.required(f"{path}.volumes[{i}].persistentVolumeClaim.claimName")


_POD_MUTABLE_MSG = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


class PodStrategy(Strategy):
    """Pods: defaulted spec, and a spec that is immutable but for images and a few fields."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending", "qosClass": "BestEffort"}

    def default(self, obj: Obj) -> None:
        _default_pod_spec(_spec(obj))

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        _validate_pod_spec(obj.get("spec"), "spec", errs)

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        mutable = copy.deepcopy(_spec(old))
        nspec = _spec(new)
        for part in ("containers", "initContainers"):
            for mine, theirs in zip(mutable.get(part) or [], nspec.get(part) or [], strict=False):
                mine["image"] = theirs.get("image")
        for name in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
            if name in nspec:
                mutable[name] = nspec[name]
        if mutable != nspec:
            errs.forbidden("spec", _POD_MUTABLE_MSG)


def _template_spec(obj: Obj) -> Obj:
    template = _spec(obj).get("template")
    if not isinstance(template, dict):
        return {}
    tspec = template.get("spec")
    return tspec if isinstance(tspec, dict) else {}


class JobStrategy(Strategy):
    """Jobs: generated selector and labels, restartPolicy rules, immutable template."""

    def default(self, obj: Obj) -> None:
        spec = _spec(obj)
        for key, value in (("parallelism", 1), ("completions", 1), ("backoffLimit", 6),
                           ("completionMode", "NonIndexed"), ("suspend", False),
                           ("podReplacementPolicy", "TerminatingOrFailed"), ("manualSelector", None)):
            if value is not None:
                spec.setdefault(key, value)
        if isinstance(spec.get("template"), dict):
            _default_pod_spec(spec["template"].setdefault("spec", {}))

    def prepare_create(self, obj: Obj, store: Store) -> None:
        spec, meta = _spec(obj), obj["metadata"]
        if spec.get("manualSelector") or not isinstance(spec.get("template"), dict):
            return
        uid, name = meta["uid"], meta["name"]
        generated = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                     "controller-uid": uid, "job-name": name}
        spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(generated)
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = _spec(obj)
        if not isinstance(spec.get("template"), dict):
            errs.required("spec.template")
            return
        tspec = _template_spec(obj)
        _validate_pod_spec(tspec, "spec.template.spec", errs)
        if tspec.get("restartPolicy") not in ("OnFailure", "Never"):
            errs.unsupported("spec.template.spec.restartPolicy", tspec.get("restartPolicy"), ("OnFailure", "Never"))

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        for name in ("template", "selector", "completions", "completionMode"):
            if _spec(new).get(name) != _spec(old).get(name):
                errs.immutable(f"spec.{name}", _spec(new).get(name))


class WorkloadStrategy(Strategy):
    """Deployments and DaemonSets: a selector that matches the template, and is immutable."""

    def __init__(self, defaults: Obj, status: Obj | None = None) -> None:
        self.defaults = defaults
        self.status = status or {}

    def initial_status(self, obj: Obj) -> Obj:
        return copy.deepcopy(self.status)

    def default(self, obj: Obj) -> None:
        spec = _spec(obj)
        for key, value in self.defaults.items():
            spec.setdefault(key, copy.deepcopy(value))
        if isinstance(spec.get("template"), dict):
            _default_pod_spec(spec["template"].setdefault("spec", {}))

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = _spec(obj)
        selector = spec.get("selector")
        if not selector:
            errs.required("spec.selector")
        template = spec.get("template")
        if not isinstance(template, dict):
            errs.required("spec.template")
            return
        labels = (template.get("metadata") or {}).get("labels") or {}
        try:
            if selector and not LabelSelector.from_object(selector).matches(labels):
                errs.invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`")
        except SelectorError as exc:
            errs.invalid("spec.selector", selector, str(exc))
        _validate_pod_spec(template.get("spec"), "spec.template.spec", errs)
        if _template_spec(obj).get("restartPolicy") != "Always":
            errs.unsupported("spec.template.spec.restartPolicy", _template_spec(obj).get("restartPolicy"), ("Always",))

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        if _spec(new).get("selector") != _spec(old).get("selector"):
            errs.immutable("spec.selector", _spec(new).get("selector"))


class StorageClassStrategy(Strategy):
    """Storage classes are immutable but for metadata and allowVolumeExpansion."""

    def default(self, obj: Obj) -> None:
        obj.setdefault("reclaimPolicy", "Delete")
        obj.setdefault("volumeBindingMode", "Immediate")

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        provisioner = obj.get("provisioner")
        if not provisioner:
            errs.required("provisioner")
        else:
            for problem in qualified_name_problems(str(provisioner)):
                errs.invalid("provisioner", provisioner, problem)
        _check_enum(errs, "reclaimPolicy", obj.get("reclaimPolicy"), ("Delete", "Retain"))
        _check_enum(errs, "volumeBindingMode", obj.get("volumeBindingMode"), ("Immediate", "WaitForFirstConsumer"))

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        for name in ("parameters", "provisioner", "reclaimPolicy"):
            if new.get(name) != old.get(name):
                errs.forbidden(name, f"updates to {name} are forbidden.")
        if new.get("volumeBindingMode") != old.get("volumeBindingMode"):
            errs.immutable("volumeBindingMode", new.get("volumeBindingMode"))


class DataStrategy(Strategy):
    """ConfigMaps and Secrets: key syntax, base64 for secrets, the ``immutable`` flag."""

    def __init__(self, secret: bool) -> None:
        self.secret = secret

    def default(self, obj: Obj) -> None:
        if not self.secret:
            return
        obj.setdefault("type", "Opaque")
        string_data = obj.pop("stringData", None) or {}
        if string_data:
            data = obj.setdefault("data", {}) or {}
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            obj["data"] = data

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        seen: set[str] = set()
        for part in ("data", "binaryData"):
            for key, value in (obj.get(part) or {}).items():
                if not _CONFIG_KEY.match(key) or key in (".", ".."):
                    errs.invalid(f"{part}[{key}]", key, "a valid config key must consist of alphanumeric "
                                 "characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', "
                                 "regex used for validation is '[-._a-zA-Z0-9]+')")
                if key in seen:
                    errs.invalid(f"{part}[{key}]", key, "duplicate of key present in data")
                seen.add(key)
                if (self.secret or part == "binaryData") and not self._is_base64(value):
                    errs.invalid(f"{part}[{key}]", "<value omitted>", "illegal base64 data")

    @staticmethod
    def _is_base64(value: Any) -> bool:
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            return False
        return True

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        if self.secret and new.get("type") != old.get("type"):
            errs.immutable("type", new.get("type"))
        if old.get("immutable"):
            if not new.get("immutable"):
                errs.forbidden("immutable", "field is immutable when `immutable` is set")
            for part in ("data", "binaryData"):
                if new.get(part) != old.get(part):
                    errs.forbidden(part, "field is immutable when `immutable` is set")


class ServiceStrategy(Strategy):
    """Services get a cluster IP allocated; it is immutable afterwards."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"loadBalancer": {}}

    def default(self, obj: Obj) -> None:
        spec = _spec(obj)
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))

    def prepare_create(self, obj: Obj, store: Store) -> None:
        spec = _spec(obj)
        if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
            spec["clusterIP"] = store.allocate_cluster_ip()
        if spec.get("clusterIP"):
            spec.setdefault("clusterIPs", [spec["clusterIP"]])

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = _spec(obj)
        _check_enum(errs, "spec.type", spec.get("type"), ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort"))
        ports = spec.get("ports") or []
        for i, port in enumerate(ports):
            number = (port or {}).get("port")
            if not isinstance(number, int) or not 0 < number < 65536:
                errs.invalid(f"spec.ports[{i}].port", number, "must be between 1 and 65535, inclusive")
            if len(ports) > 1 and not (port or {}).get("name"):
                errs.required(f"spec.ports[{i}].name")

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        old_ip, new_ip = _spec(old).get("clusterIP"), _spec(new).get("clusterIP")
        if old_ip and new_ip != old_ip and "ExternalName" not in (_spec(new).get("type"), _spec(old).get("type")):
            errs.immutable("spec.clusterIPs[0]", new_ip)


class CoreEventStrategy(Strategy):
    """core/v1 Events as client-go's recorders write them."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        involved = obj.get("involvedObject") or {}
        namespace = obj.get("metadata", {}).get("namespace")
        if involved.get("namespace") and involved["namespace"] != namespace:
            errs.invalid("involvedObject.namespace", involved["namespace"], "does not match event.namespace")


class EventsV1Strategy(Strategy):
    """events.k8s.io/v1 Events are validated strictly (``ValidateEventCreate``, new style)."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        for name in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
            if not obj.get(name):
                errs.required(name)
        _check_enum(errs, "type", obj.get("type"), ("Normal", "Warning"))
        if len(str(obj.get("note") or "")) > 1024:
            errs.invalid("note", "<value omitted>", "can have at most 1024 characters")


class RbacStrategy(Strategy):
    """Roles need verbs on every rule; bindings cannot change their roleRef."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        for i, rule in enumerate(obj.get("rules") or []):
            if not (rule or {}).get("verbs"):
                errs.required(f"rules[{i}].verbs", "verbs must contain at least one value")
        if obj.get("kind", "").endswith("Binding") and not obj.get("roleRef"):
            errs.required("roleRef.name")

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        if old.get("roleRef") and new.get("roleRef") != old.get("roleRef"):
            errs.invalid("roleRef", new.get("roleRef"), "cannot change roleRef")


_RBAC = RbacStrategy()
STRATEGIES: dict[tuple[str, str], Strategy] = {
    ("v1", "Namespace"): NamespaceStrategy(),
    ("v1", "Node"): NodeStrategy(),
    ("v1", "PersistentVolume"): PersistentVolumeStrategy(),
    ("v1", "PersistentVolumeClaim"): PersistentVolumeClaimStrategy(),
    ("v1", "Pod"): PodStrategy(),
    ("v1", "ConfigMap"): DataStrategy(secret=False),
    ("v1", "Secret"): DataStrategy(secret=True),
    ("v1", "Service"): ServiceStrategy(),
    ("v1", "Event"): CoreEventStrategy(),
    ("events.k8s.io/v1", "Event"): EventsV1Strategy(),
    ("storage.k8s.io/v1", "StorageClass"): StorageClassStrategy(),
    ("batch/v1", "Job"): JobStrategy(),
    ("apps/v1", "Deployment"): WorkloadStrategy({
        "replicas": 1, "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
    }),
    ("apps/v1", "DaemonSet"): WorkloadStrategy({
        "revisionHistoryLimit": 10,
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
    }, status={"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0,
               "numberReady": 0}),  # non-omitempty ints: clients require them
    **{("rbac.authorization.k8s.io/v1", kind): _RBAC
       for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")},
}
_DEFAULT_STRATEGY = Strategy()


def strategy_for(rt: ResourceType) -> Strategy:
    """The kind's strategy, or the permissive default."""
    return STRATEGIES.get((rt.api_version, rt.kind), _DEFAULT_STRATEGY)


# =========================================================================== patches

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, APPLY_PATCH, STRATEGIC_PATCH)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` deletes, lists replace."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class _PatchFailed(Exception):
    """A JSON patch that cannot apply to this document (the server answers 422)."""


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ApiError.bad_request(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def _container(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise _PatchFailed(f"doc is missing path: /{'/'.join(parts)}")
    return doc


def _list_index(parent: list[Any], part: str, adding: bool) -> int:
    if adding and part == "-":
        return len(parent)
    if not part.isdigit() or int(part) > len(parent) - (0 if adding else 1):
        raise _PatchFailed(f"index {part!r} out of bounds")
    return int(part)


def _json_get(doc: Any, parts: list[str]) -> Any:
    return _container(doc, parts)


def _json_remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise _PatchFailed("cannot remove the whole document")
    parent, last = _container(doc, parts[:-1]), parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _PatchFailed(f"unable to remove nonexistent key: {last}: missing value")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_list_index(parent, last, adding=False))
    raise _PatchFailed("cannot remove from a scalar")


def _json_add(doc: Any, parts: list[str], value: Any, replace: bool = False) -> Any:
    if not parts:
        return copy.deepcopy(value)
    parent, last = _container(doc, parts[:-1]), parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise _PatchFailed(f"replace operation does not apply: doc is missing key: /{'/'.join(parts)}")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        index = _list_index(parent, last, adding=not replace)
        if replace:
            parent[index] = copy.deepcopy(value)
        else:
            parent.insert(index, copy.deepcopy(value))
    else:
        raise _PatchFailed("cannot add to a scalar")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a copy of ``doc``."""
    if not isinstance(ops, list):
        raise ApiError.bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise ApiError.bad_request(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], _pointer(op.get("path"))
        try:
            if kind in ("add", "replace", "test") and "value" not in op:
                raise ApiError.bad_request(f"missing value for {kind} operation")
            if kind == "add":
                doc = _json_add(doc, path, op["value"])
            elif kind == "replace":
                doc = _json_add(doc, path, op["value"], replace=True)
            elif kind == "remove":
                _json_remove(doc, path)
            elif kind in ("move", "copy"):
                source = _pointer(op.get("from"))
                value = _json_remove(doc, source) if kind == "move" else copy.deepcopy(_json_get(doc, source))
                doc = _json_add(doc, path, value)
            elif kind == "test":
                if _json_get(doc, path) != op["value"]:
                    raise _PatchFailed(f"testing value {op.get('path')} failed: test failed")
            else:
                raise ApiError.bad_request(f"Unexpected kind: {kind}")
        except _PatchFailed as exc:
            raise ApiError(422, str(exc), "Invalid") from None
    return doc


# Strategic merge: the patchMergeKey of each list this project's objects use, by the last one
# or two field names of its path (Kubernetes declares them on the Go types).
_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("containers",): "name", ("initContainers",): "name", ("ephemeralContainers",): "name",
    ("volumes",): "name", ("env",): "name", ("volumeMounts",): "mountPath", ("volumeDevices",): "devicePath",
    ("imagePullSecrets",): "name", ("hostAliases",): "ip", ("conditions",): "type",
    ("ownerReferences",): "uid", ("containers", "ports"): "containerPort", ("initContainers", "ports"): "containerPort",
    ("spec", "ports"): "port", ("status", "addresses"): "type", ("topologySpreadConstraints",): "topologyKey",
    ("resourceClaims",): "name", ("schedulingGates",): "name",
}
#: lists of scalars merged as sets (patchStrategy "merge" without a key)
_MERGE_SETS = {("metadata", "finalizers")}


def _list_strategy(path: tuple[str, ...]) -> str | None:
    """``"set"`` for set-merged scalars, a merge key, or None for replace."""
    if path[-2:] in _MERGE_SETS:
        return "set"
    return _MERGE_KEYS.get(path[-2:]) or _MERGE_KEYS.get(path[-1:])


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not str(k).startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return value


_DELETE = object()


def strategic_merge(original: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """A strategic merge patch for the fields in :data:`_MERGE_KEYS`; JSON merge elsewhere.

    Supported directives: ``$patch: replace|delete|merge`` in maps and list items,
    ``$deleteFromPrimitiveList/<field>``, ``$retainKeys`` and ``$setElementOrder/<field>``
    (ordering is applied to merged keyed lists). Other lists replace, as for types without
    a patch strategy.
    """
    if not isinstance(patch, dict):
        return _strip_directives(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive == "delete":
        return _DELETE
    result = copy.deepcopy(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in (value or [])]
        elif key.startswith("$") or value is None:
            if value is None:
                result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, (*path, key), patch.get(f"$setElementOrder/{key}"))
        else:
            merged = strategic_merge(result.get(key), value, (*path, key))
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
    if isinstance(patch.get("$retainKeys"), list):
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    return result


def _merge_list(original: Any, patch: list[Any], path: tuple[str, ...], order: Any) -> list[Any]:
    strategy = _list_strategy(path)
    if strategy is None or not isinstance(original, list):
        return list(_strip_directives(patch))
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return list(_strip_directives(patch))
    if strategy == "set":
        return list(original) + [v for v in patch if v not in original]
    result = [copy.deepcopy(item) for item in original]
    for item in patch:
        if not isinstance(item, dict) or strategy not in item:
            result.append(_strip_directives(item))
            continue
        positions = [i for i, mine in enumerate(result)
                     if isinstance(mine, dict) and mine.get(strategy) == item[strategy]]
        if item.get("$patch") == "delete":
            result = [mine for i, mine in enumerate(result) if i not in positions]
        elif positions:
            result[positions[0]] = strategic_merge(result[positions[0]], item, path)
        else:
            result.append(strategic_merge({}, item, path))
    if isinstance(order, list):
        rank = {entry.get(strategy): i for i, entry in enumerate(order) if isinstance(entry, dict)}
        result.sort(key=lambda mine: rank.get(mine.get(strategy), len(rank)) if isinstance(mine, dict) else len(rank))
    return result


def decode_apply_body(body: bytes) -> Any:
    """Server-side apply bodies are YAML (JSON is YAML too); PyYAML is only needed for YAML."""
    try:
        return json.loads(body)
    except ValueError:
        pass
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a project dependency
        raise ApiError(415, "YAML apply bodies need PyYAML; send JSON", "UnsupportedMediaType") from None
    try:
        return yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise ApiError.bad_request(f"error decoding YAML: {exc}") from None


# =========================================================================== the store


@dataclass
class Change:
    """One committed write, as kept in the watch history.

    ``obj`` is the state after the write (for DELETED: the last state, stamped with the
    deletion's resourceVersion, as etcd reports it); ``prev`` the state before, which both
    the selector transitions of watches and the snapshots of paged lists need.
    """

    rv: int
    type: str
    rt: ResourceType
    key: str
    obj: Obj
    prev: Obj | None
    _line: bytes | None = field(default=None, repr=False)

    def line(self) -> bytes:
        """The watch event as one JSON line, encoded once however many watchers get it."""
        if self._line is None:
            self._line = encode_event(self.type, self.obj)
        return self._line


def encode_event(kind: str, obj: Obj) -> bytes:
    """One line of a watch stream."""
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


@dataclass
class DeleteOptions:
    """The parts of ``metav1.DeleteOptions`` the emulator honours."""

    propagation: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    dry_run: bool = False

    @classmethod
    def parse(cls, body: Any, query: Mapping[str, str]) -> DeleteOptions:
        """From the JSON body (what client libraries send) or the query string (kubectl)."""
        body = body if isinstance(body, dict) else {}
        preconditions = body.get("preconditions") or {}
        propagation = body.get("propagationPolicy") or query.get("propagationPolicy")
        orphan = body.get("orphanDependents", query.get("orphanDependents"))
        if propagation is None and orphan is not None:
            propagation = "Orphan" if str(orphan).lower() == "true" else "Background"
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(422, f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
                                f'"{propagation}": supported values: "Foreground", "Background", "Orphan", "nil"',
                           "Invalid")
        dry_run = body.get("dryRun") or query.get("dryRun")
        return cls(propagation, preconditions.get("uid"), preconditions.get("resourceVersion"), bool(dry_run))


def _meta_of(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise ApiError.bad_request("metadata must be an object")
    return meta


def _content(obj: Obj) -> Obj:
    """What ``generation`` tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


_NAME_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_OMITTED_WHEN_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences", "managedFields")
_IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")  # NamespaceLifecycle admission


class Store:
    """All objects, the global resourceVersion and the watch history, behind one lock.

    Stored dicts are never mutated after they are stored: a write stores a new dict. That is
    what lets watch events, list snapshots and controller passes share them without copies;
    callers that want to modify an object copy it first.
    """

    def __init__(self, history_limit: int) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 1
        self.history_limit = max(1, history_limit)
        self._objects: dict[ResourceType, dict[str, Obj]] = {rt: {} for rt in RESOURCES}
        self._history: list[Change] = []
        self._floor = self.rv
        self._uids: dict[str, tuple[ResourceType, str]] = {}
        self._dependents: dict[str, set[tuple[ResourceType, str]]] = {}
        self._deleting: set[tuple[ResourceType, str]] = set()
        self._last_change: dict[ResourceType, int] = {}
        self._next_ip = 10

    # -- reads (stored dicts: read-only by contract)

    @staticmethod
    def key(rt: ResourceType, namespace: str | None, name: str) -> str:
        """The storage key; its string order is the order of lists (as etcd's keys)."""
        return f"{namespace}/{name}" if rt.namespaced else name

    def peek(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        """The stored object itself (no copy: callers must not modify it)."""
        with self.lock:
            return self._objects[rt].get(self.key(rt, namespace, name))

    def items(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        """Current objects of a resource, in key order, optionally of one namespace."""
        with self.lock:
            return self._ordered(self._objects[rt], namespace)

    @staticmethod
    def _ordered(objects: Mapping[str, Obj], namespace: str | None) -> list[Obj]:
        if not namespace:
            return [objects[k] for k in sorted(objects)]
        prefix = f"{namespace}/"
        return [objects[k] for k in sorted(objects) if k.startswith(prefix)]

    def by_uid(self, uid: str) -> Obj | None:
        """Owner references name owners by uid; the garbage collector looks them up here."""
        with self.lock:
            where = self._uids.get(uid)
            return self._objects[where[0]].get(where[1]) if where else None

    def changed_since(self, rts: Iterable[ResourceType], rv: int) -> bool:
        """Whether any of these resources was written after ``rv`` (lets controllers skip passes)."""
        with self.lock:
            return any(self._last_change.get(rt, 0) > rv for rt in rts)

    # -- history

    def history_after(self, rv: int) -> list[Change] | None:
        """Changes with a resourceVersion above ``rv``; None when some are forgotten (410)."""
        with self.lock:
            if rv < self._floor:
                return None
            start = bisect.bisect_right(self._history, rv, key=lambda c: c.rv)
            return self._history[start:]

    def too_old(self, rv: int) -> ApiError:
        """The 410 a resume from a forgotten version gets, worded like the real watch cache."""
        return ApiError.expired(f"too old resource version: {rv} ({self._floor + 1})")

    def snapshot(self, rt: ResourceType, rv: int, namespace: str | None) -> list[Obj]:
        """The objects as they were at ``rv``: the current ones with later changes undone."""
        with self.lock:
            changes = self.history_after(rv)
            if changes is None:
                raise self.too_old(rv)
            objects = dict(self._objects[rt])
            for change in reversed(changes):
                if change.rt is not rt:
                    continue
                if change.prev is None:
                    objects.pop(change.key, None)
                else:
                    objects[change.key] = change.prev
            return self._ordered(objects, namespace)

    def forget_history(self) -> None:
        """Compact: every resume from a resourceVersion before now gets 410 Expired."""
        with self.lock:
            self._history.clear()
            self._floor = self.rv
            self.changed.notify_all()

    # -- writes

    def create(self, rt: ResourceType, namespace: str | None, body: Any, dry_run: bool = False) -> Obj:
        """POST: admission (namespace exists), server-set metadata, defaults, validation, 409."""
        obj = self._decoded(rt, body)
        meta = _meta_of(obj)
        self._place(rt, namespace, meta)
        with self.lock:
            if rt.namespaced:
                self._require_namespace(rt, str(namespace))
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, namespace, str(meta["generateName"]))
            if meta.get("resourceVersion"):
                raise ApiError(500, "resourceVersion should not be set on objects to be created")
            for name in ("uid", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"):
                meta.pop(name, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            strategy = strategy_for(rt)
            if rt.status and not strategy.keep_status_on_create:
                obj["status"] = strategy.initial_status(obj)
            strategy.default(obj)
            strategy.prepare_create(obj, self)
            errs = FieldErrors()
            validate_metadata(rt, obj, errs)
            strategy.validate(obj, errs)
            if errs:
                raise ApiError.invalid(rt, str(meta.get("name") or ""), errs)
            key = self.key(rt, namespace, meta["name"])
            existing = self._objects[rt].get(key)
            if existing is not None:
                raise ApiError.already_exists(rt, meta["name"], bool(existing["metadata"].get("deletionTimestamp")))
            if dry_run:
                return obj
            return self._commit("ADDED", rt, key, obj, None)

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """PUT (or a patch's result): optimistic concurrency, status rules, immutability, no-ops."""
        obj = self._decoded(rt, body)
        meta = _meta_of(obj)
        if meta.get("name") and meta["name"] != name:
            raise ApiError.bad_request(f"the name of the object ({meta['name']}) does not match the name on "
                                       f"the URL ({name})")
        meta["name"] = name
        self._place(rt, namespace, meta)
        with self.lock:
            key = self.key(rt, namespace, name)
            old = self._objects[rt].get(key)
            if old is None:
                if rt.create_on_update and subresource is None:
                    meta.pop("resourceVersion", None)
                    return self.create(rt, namespace, obj, dry_run)
                raise ApiError.not_found(rt, name)
            if meta.get("resourceVersion") and meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise ApiError.stale(rt, name)
            new = self._updated(rt, obj, old, subresource)
            if dry_run:
                return new
            return self._write(rt, key, new, old)

    def _updated(self, rt: ResourceType, obj: Obj, old: Obj, subresource: str | None) -> Obj:
        """The object to store for an update: system fields kept, status rules applied, validated."""
        strategy = strategy_for(rt)
        if subresource == "status":
            new = copy.deepcopy(old)
            new["status"] = obj.get("status", {})
        else:
            new = obj
            if rt.status:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
            nm, om = new["metadata"], old["metadata"]
            for name in ("creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
                if name in om:
                    nm[name] = om[name]
                else:
                    nm.pop(name, None)
            nm.pop("managedFields", None)
            if not nm.get("uid"):
                nm["uid"] = om["uid"]
            strategy.prepare_update(new, old)
        strategy.default(new)
        errs = FieldErrors()
        self._validate_meta_update(new, old, errs)
        validate_metadata(rt, new, errs)
        strategy.validate(new, errs)
        strategy.validate_update(new, old, errs)
        if errs:
            raise ApiError.invalid(rt, new["metadata"]["name"], errs)
        if _content(new) != _content(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return new

    @staticmethod
    def _validate_meta_update(new: Obj, old: Obj, errs: FieldErrors) -> None:
        nm, om = new["metadata"], old["metadata"]
        if nm.get("uid") != om.get("uid"):
            errs.immutable("metadata.uid", nm.get("uid"))
        if om.get("deletionTimestamp"):
            added = [f for f in nm.get("finalizers") or [] if f not in (om.get("finalizers") or [])]
            if added:
                errs.forbidden("metadata.finalizers", "no new finalizers can be added if the object is being "
                                                      f"deleted, found new finalizers {json.dumps(added)}")

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        body: bytes,
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Apply a patch of any of the four types; returns (object, created-by-apply)."""
        with self.lock:
            current = self.peek(rt, namespace, name)
            if content_type == APPLY_PATCH:
                applied = decode_apply_body(body)
                if not isinstance(applied, dict):
                    raise ApiError.bad_request("apply patches must be objects")
                if not field_manager:
                    raise ApiError(422, 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                                        "is required for apply patch", "Invalid")
                if current is None:
                    if subresource:
                        raise ApiError.not_found(rt, name)
                    applied.setdefault("metadata", {}).setdefault("name", name)
                    return self.create(rt, namespace, applied, dry_run), True
                patched = strategic_merge(current, applied)
            else:
                if current is None:
                    raise ApiError.not_found(rt, name)
                try:
                    doc = json.loads(body)
                except ValueError as exc:
                    raise ApiError.bad_request(f"error decoding patch: {exc}") from None
                if content_type == JSON_PATCH:
                    patched = json_patch(current, doc)
                elif not isinstance(doc, dict):
                    raise ApiError.bad_request("json: cannot unmarshal array into Go value of type "
                                               "map[string]interface {}")
                elif content_type == MERGE_PATCH:
                    patched = merge_patch(current, doc)
                else:
                    patched = strategic_merge(current, doc)
            if not isinstance(patched, dict):
                raise ApiError(422, "the patch did not produce an object", "Invalid")
            return self.update(rt, namespace, name, patched, subresource, dry_run), False

    def delete(self, rt: ResourceType, namespace: str | None, name: str, options: DeleteOptions) -> tuple[Obj, bool]:
        """Delete, or mark for deletion while finalizers remain; returns (object, gone)."""
        with self.lock:
            key = self.key(rt, namespace, name)
            old = self._objects[rt].get(key)
            if old is None:
                raise ApiError.not_found(rt, name)
            if rt is NAMESPACES and name in _IMMORTAL_NAMESPACES:
                raise ApiError.forbidden(rt, name, "this namespace may not be deleted")
            self._check_preconditions(rt, name, old, options)
            new = copy.deepcopy(old)
            meta = new["metadata"]
            finalizers = self._policy_finalizers(meta.get("finalizers") or [], options.propagation)
            if finalizers:
                meta["finalizers"] = finalizers
            else:
                meta.pop("finalizers", None)
            if not strategy_for(rt).finalizers(new):
                return (old, True) if options.dry_run else (self._remove(rt, key, old), True)
            if not meta.get("deletionTimestamp"):
                meta.update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
                if rt is NAMESPACES:
                    new["status"] = {**(new.get("status") or {}), "phase": "Terminating"}
            if options.dry_run or new == old:
                return new, False
            return self._commit("MODIFIED", rt, key, new, old), False

    @staticmethod
    def _check_preconditions(rt: ResourceType, name: str, obj: Obj, options: DeleteOptions) -> None:
        meta = obj["metadata"]
        if options.uid and options.uid != meta["uid"]:
            raise ApiError.conflict(rt, name, f"Precondition failed: UID in precondition: {options.uid}, "
                                              f"UID in object meta: {meta['uid']}")
        if options.resource_version and options.resource_version != meta["resourceVersion"]:
            raise ApiError.conflict(rt, name, "Precondition failed: ResourceVersion in precondition: "
                                              f"{options.resource_version}, ResourceVersion in meta: "
                                              f"{meta['resourceVersion']}")

    @staticmethod
    def _policy_finalizers(current: list[str], policy: str | None) -> list[str]:
        """The GC finalizers a propagation policy adds or removes (Background removes both)."""
        if policy is None:
            return list(current)
        kept = [f for f in current if f not in ("orphan", "foregroundDeletion")]
        extra = {"Orphan": ["orphan"], "Foreground": ["foregroundDeletion"]}.get(policy, [])
        return kept + extra

    def finalize_namespace(self, name: str) -> None:
        """The namespace controller's last step: drop the ``kubernetes`` spec finalizer."""
        with self.lock:
            key = self.key(NAMESPACES, None, name)
            old = self._objects[NAMESPACES].get(key)
            if old is None:
                return
            new = copy.deepcopy(old)
            new.setdefault("spec", {})["finalizers"] = []
            self._write(NAMESPACES, key, new, old)

    def allocate_cluster_ip(self) -> str:
        """A fresh service IP (clients and kubectl expect services to have one)."""
        with self.lock:
            self._next_ip += 1
            return f"10.96.{self._next_ip // 250}.{self._next_ip % 250 + 1}"

    # -- internals

    @staticmethod
    def _decoded(rt: ResourceType, body: Any) -> Obj:
        """Check and default apiVersion/kind like the real decoder (400 on a mismatch)."""
        if not isinstance(body, dict):
            raise ApiError.bad_request(f"the object provided is unrecognized (must be of type {rt.kind})")
        obj = copy.deepcopy(body)
        api_version, kind = obj.setdefault("apiVersion", rt.api_version), obj.setdefault("kind", rt.kind)
        if api_version != rt.api_version:
            raise ApiError.bad_request(f"the API version in the data ({api_version}) does not match the "
                                       f"expected API version ({rt.api_version})")
        if kind != rt.kind:
            raise ApiError.bad_request(f"the object provided is unrecognized (must be of type {rt.kind}): "
                                       f"kind {kind!r}")
        meta = obj.setdefault("metadata", {})
        if isinstance(meta, dict):
            for name in _OMITTED_WHEN_EMPTY:
                if name in meta and not meta[name]:
                    del meta[name]  # Go's omitempty: an empty list or map is not stored
        return obj

    @staticmethod
    def _place(rt: ResourceType, namespace: str | None, meta: Obj) -> None:
        """``EnsureObjectNamespaceMatchesRequestNamespace``."""
        if not rt.namespaced:
            meta.pop("namespace", None)
        elif not meta.get("namespace"):
            meta["namespace"] = namespace
        elif meta["namespace"] != namespace:
            raise ApiError.bad_request("the namespace of the provided object does not match the namespace "
                                       "sent on the request")

    def _require_namespace(self, rt: ResourceType, namespace: str) -> None:
        ns = self._objects[NAMESPACES].get(namespace)
        if ns is None:
            raise ApiError.not_found(NAMESPACES, namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(403, f"{rt.qualified} is forbidden: unable to create new content in namespace "
                                f"{namespace} because it is being terminated", "Forbidden",
                           {"name": namespace, "kind": rt.plural,
                            "causes": [{"reason": "NamespaceTerminating", "message": f"namespace {namespace} is "
                                        "being terminated", "field": "metadata.namespace"}]})

    def _generate_name(self, rt: ResourceType, namespace: str | None, prefix: str) -> str:
        prefix = prefix[: 63 - 5]
        while True:
            name = prefix + "".join(random.choices(_NAME_SUFFIX_CHARS, k=5))
            if self.key(rt, namespace, name) not in self._objects[rt]:
                return name

    def _write(self, rt: ResourceType, key: str, new: Obj, old: Obj) -> Obj:
        """Store an update: a no-op writes nothing; emptied finalizers on a deleted object remove it."""
        if new == old:
            return old
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not strategy_for(rt).finalizers(new):
            gone = self._remove(rt, key, old)
            meta["resourceVersion"] = gone["metadata"]["resourceVersion"]
            return new
        return self._commit("MODIFIED", rt, key, new, old)

    def _commit(self, kind: str, rt: ResourceType, key: str, obj: Obj, prev: Obj | None) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._objects[rt][key] = obj
        self._index(rt, key, prev, obj)
        self._record(Change(self.rv, kind, rt, key, obj, prev))
        return obj

    def _remove(self, rt: ResourceType, key: str, last: Obj) -> Obj:
        self.rv += 1
        gone = copy.deepcopy(last)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        del self._objects[rt][key]
        self._index(rt, key, last, None)
        self._record(Change(self.rv, "DELETED", rt, key, gone, last))
        return gone

    def _record(self, change: Change) -> None:
        self._history.append(change)
        self._last_change[change.rt] = change.rv
        excess = len(self._history) - self.history_limit
        if excess > max(16, self.history_limit // 4):  # trim in batches: amortised O(1)
            self._floor = self._history[excess - 1].rv
            del self._history[:excess]
        self.changed.notify_all()

    def _index(self, rt: ResourceType, key: str, old: Obj | None, new: Obj | None) -> None:
        where = (rt, key)
        if old is not None:
            self._uids.pop(old["metadata"]["uid"], None)
            for ref in old["metadata"].get("ownerReferences") or []:
                dependents = self._dependents.get(ref.get("uid"), set())
                dependents.discard(where)
                if not dependents:
                    self._dependents.pop(ref.get("uid"), None)
            self._deleting.discard(where)
        if new is not None:
            self._uids[new["metadata"]["uid"]] = where
            for ref in new["metadata"].get("ownerReferences") or []:
                self._dependents.setdefault(ref.get("uid"), set()).add(where)
            if new["metadata"].get("deletionTimestamp"):
                self._deleting.add(where)

    # -- what the garbage collector reads

    def owners_and_dependents(self) -> list[tuple[str, list[Obj]]]:
        """Each referenced owner uid with the objects that reference it."""
        with self.lock:
            return [
                (uid, [self._objects[rt][key] for rt, key in sorted(deps, key=lambda d: (d[0].plural, d[1]))])
                for uid, deps in sorted(self._dependents.items())
            ]

    def deleting(self) -> list[tuple[ResourceType, Obj]]:
        """Objects marked for deletion and held by finalizers."""
        with self.lock:
            ordered = sorted(self._deleting, key=lambda d: (d[0].plural, d[1]))
            return [(rt, self._objects[rt][key]) for rt, key in ordered]


class _ClusterView:
    """The :class:`~localpv.testing.binder.Cluster` protocol over a :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.changed = store.changed

    @property
    def resource_version(self) -> int:
        return self.store.rv

    def changed_since(self, kinds: Iterable[tuple[str, str]], rv: int) -> bool:
        return self.store.changed_since([resource_for(*k) for k in kinds], rv)

    def changes_since(self, rv: int) -> list[tuple[str, str, str, str]] | None:
        changes = self.store.history_after(rv)
        if changes is None:
            return None
        return [(c.rt.api_version, c.rt.kind, c.obj["metadata"].get("namespace", ""), c.obj["metadata"]["name"])
                for c in changes]

    def view(self, api_version: str, kind: str) -> list[Obj]:
        return self.store.items(resource_for(api_version, kind))

    def peek(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        return self.store.peek(resource_for(api_version, kind), namespace, name)

    def update(self, obj: Obj, subresource: str | None = None) -> Obj:
        rt = resource_for(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        return self.store.update(rt, meta.get("namespace"), meta["name"], obj, subresource)


# =========================================================================== built-in controllers


def _identity(obj: Obj) -> tuple[ResourceType, str | None, str]:
    meta = obj["metadata"]
    return resource_for(obj["apiVersion"], obj["kind"]), meta.get("namespace"), meta["name"]


class GarbageCollector(Reconciler):
    """kube-controller-manager's garbage collector and namespace controller, in one pass.

    Dependents whose owners are all gone are deleted in the background; dangling references
    next to a live owner are removed; ``foregroundDeletion`` waits for the dependents to go,
    ``orphan`` strips the references; a terminating namespace is emptied, then finalized.
    """

    name = "garbage-collector"

    def __init__(self, store: Store) -> None:
        super().__init__(_ClusterView(store))
        self.store = store

    def reconcile(self) -> None:
        for owner_uid, dependents in self.store.owners_and_dependents():
            if self.store.by_uid(owner_uid) is None:
                for dependent in dependents:
                    self._drop_dangling(dependent)
        for rt, obj in self.store.deleting():
            self._finish(rt, obj)

    def _delete(self, obj: Obj) -> None:
        if not obj["metadata"].get("deletionTimestamp"):
            rt, namespace, name = _identity(obj)
            self.store.delete(rt, namespace, name, DeleteOptions(propagation="Background"))

    def _drop_dangling(self, obj: Obj) -> None:
        refs = obj["metadata"].get("ownerReferences") or []
        alive = [ref for ref in refs if self.store.by_uid(ref.get("uid", "")) is not None]
        if not alive:
            self._delete(obj)
        elif len(alive) != len(refs):
            self._set_owner_refs(obj, alive)

    def _set_owner_refs(self, obj: Obj, refs: list[Obj]) -> None:
        new = copy.deepcopy(obj)
        new["metadata"]["ownerReferences"] = refs
        rt, namespace, name = _identity(obj)
        self.store.update(rt, namespace, name, new)

    def _dependents(self, uid: str) -> list[Obj]:
        return next((deps for owner, deps in self.store.owners_and_dependents() if owner == uid), [])

    def _finish(self, rt: ResourceType, obj: Obj) -> None:
        finalizers = obj["metadata"].get("finalizers") or []
        uid = obj["metadata"]["uid"]
        if "foregroundDeletion" in finalizers:
            dependents = self._dependents(uid)
            for dependent in dependents:
                self._delete(dependent)
            if not dependents:
                self._remove_finalizer(rt, obj, "foregroundDeletion")
        elif "orphan" in finalizers:
            for dependent in self._dependents(uid):
                refs = [r for r in dependent["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                self._set_owner_refs(dependent, refs)
            self._remove_finalizer(rt, obj, "orphan")
        if rt is NAMESPACES:
            self._empty_namespace(obj["metadata"]["name"])

    def _remove_finalizer(self, rt: ResourceType, obj: Obj, finalizer: str) -> None:
        fresh = self.store.peek(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if fresh is None:
            return
        new = copy.deepcopy(fresh)
        new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers") or [] if f != finalizer]
        self.store.update(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"], new)

    def _empty_namespace(self, namespace: str) -> None:
        content = [obj for rt in RESOURCES if rt.namespaced for obj in self.store.items(rt, namespace)]
        for obj in content:
            self._delete(obj)
        if not content:
            self.store.finalize_namespace(namespace)


JOBS = resource_for("batch/v1", "Job")


def _job_finished(job: Obj) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def finish_job(store: Store, namespace: str, name: str, succeeded: bool) -> Obj:
    """Write the status the Job controller writes when a Job completes or fails."""
    with store.lock:
        job = store.peek(JOBS, namespace, name)
        if job is None:
            raise ApiError.not_found(JOBS, name)
        now = now_rfc3339()
        spec, status = job.get("spec") or {}, copy.deepcopy(job.get("status") or {})
        status.setdefault("startTime", now)
        status.update(active=0, ready=0, terminating=0, uncountedTerminatedPods={})
        kept = [c for c in status.get("conditions") or []
                if c.get("type") not in ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")]
        if succeeded:
            status.update(succeeded=int(spec.get("completions") or 1), completionTime=now)
            reason, message, types = "CompletionsReached", "Reached expected number of succeeded pods", (
                "SuccessCriteriaMet", "Complete")
        else:
            status.update(failed=int(spec.get("backoffLimit") or 0) + 1)
            status.pop("completionTime", None)
            reason, message, types = "BackoffLimitExceeded", "Job has reached the specified backoff limit", (
                "FailureTarget", "Failed")
        status["conditions"] = kept + [
            {"type": t, "status": "True", "lastProbeTime": now, "lastTransitionTime": now,
             "reason": reason, "message": message}
            for t in types
        ]
        return store.update(JOBS, namespace, name, {**job, "status": status}, subresource="status")


class JobCompleter(Reconciler):
    """Stands in for the Job controller and its pods: decides each new Job's outcome.

    ``outcome(job)`` returns True (succeed), False (fail) or None (leave it running).
    """

    name = "job-completer"
    kinds = (("batch/v1", "Job"),)

    def __init__(self, store: Store, outcome: Callable[[Obj], bool | None]) -> None:
        super().__init__(_ClusterView(store))
        self.store = store
        self.outcome = outcome

    def reconcile(self) -> None:
        for job in self.store.items(JOBS):
            if _job_finished(job) or job["metadata"].get("deletionTimestamp"):
                continue
            result = self.outcome(job)
            if result is not None:
                finish_job(self.store, job["metadata"]["namespace"], job["metadata"]["name"], result)


# =========================================================================== requests and responses


@dataclass
class HttpRequest:
    """What the dispatcher needs of an HTTP request (kept apart from http.server for tests)."""

    method: str
    path: str
    query: dict[str, str]
    raw_query: str
    content_type: str
    body: bytes
    accept: str = ""

    def param(self, name: str) -> str | None:
        value = self.query.get(name)
        return value if value not in (None, "") else None

    def flag(self, name: str) -> bool:
        return (self.query.get(name) or "").lower() in ("true", "1")

    def int_param(self, name: str) -> int | None:
        value = self.param(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ApiError.bad_request(f"invalid value for {name}: {value!r}") from None

    def json(self) -> Any:
        """The body as JSON (YAML accepted too, as the real server's decoders do)."""
        if not self.body:
            raise ApiError.bad_request("the request body is empty")
        if "protobuf" in self.content_type or "cbor" in self.content_type:
            raise ApiError(415, "the body of the request was in an unknown format - accepted media types "
                                "include: application/json, application/yaml", "UnsupportedMediaType")
        try:
            return json.loads(self.body)
        except ValueError as exc:
            if "yaml" in self.content_type:
                return decode_apply_body(self.body)
            raise ApiError.bad_request(f"the body of the request could not be decoded as JSON: {exc}") from None


@dataclass
class HttpResponse:
    """A complete (non-streaming) response."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, status: int, obj: Any) -> HttpResponse:
        return cls(status, json.dumps(obj, separators=(",", ":")).encode())

    @classmethod
    def error(cls, err: ApiError) -> HttpResponse:
        response = cls.of(err.code, err.status())
        if err.retry_after is not None:
            response.headers["Retry-After"] = str(err.retry_after)
        return response


@dataclass(frozen=True)
class Route:
    """A resolved resource URL."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None

    def verb(self, method: str, watch: bool) -> str:
        """The Kubernetes verb (RBAC's vocabulary), or 405."""
        if self.name is None:
            verbs = {"GET": "watch" if watch else "list", "POST": "create", "DELETE": "deletecollection"}
        else:
            verbs = {"GET": "watch" if watch else "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        verb = verbs.get(method)
        allowed = STATUS_VERBS if self.subresource else self.rt.verbs
        if verb is None or verb not in allowed:
            raise ApiError.method_not_allowed()
        return verb


def parse_route(path: str) -> Route | None:
    """``/api/v1/...`` or ``/apis/<group>/<version>/...`` to a :class:`Route`; None if not a resource."""
    parts = [unquote(p) for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3 and (group, version, rest[2]) in _BY_PATH:
        namespace, rest = rest[1], rest[2:]
    rt = _BY_PATH.get((group, version, rest[0]))
    if rt is None or len(rest) > 3 or (namespace is not None and not rt.namespaced):
        return None
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if (rt.namespaced and name is not None and namespace is None) or (subresource and subresource != "status"):
        return None
    if subresource and not rt.status:
        return None
    return Route(rt, namespace, name, subresource)


# =========================================================================== selection


_FIELD_ALIASES = {"source": "source.component", "status.successful": "status.succeeded"}
_FIELD_DEFAULTS = {"spec.unschedulable": "false", "spec.hostNetwork": "false", "status.successful": "0"}


def selectable_fields(rt: ResourceType) -> set[str]:
    """The field labels the real server accepts for a resource."""
    names = {"metadata.name", *rt.fields}
    if rt.namespaced:
        names.add("metadata.namespace")
    return names


def field_value(obj: Obj, name: str) -> str:
    """An object's value for a field label, formatted as the server's field sets do."""
    value: Any = obj
    for part in _FIELD_ALIASES.get(name, name).split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return _FIELD_DEFAULTS.get(name, "")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v.get("ip", v)) if isinstance(v, dict) else str(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class Selection:
    """Label + field selectors of one list or watch request."""

    rt: ResourceType
    labels: LabelSelector
    fields: FieldSelector

    @classmethod
    def parse(cls, rt: ResourceType, req: HttpRequest) -> Selection:
        try:
            labels = LabelSelector.parse(req.query.get("labelSelector", ""))
            fields = FieldSelector.parse(req.query.get("fieldSelector", ""))
        except SelectorError as exc:
            raise ApiError.bad_request(str(exc)) from None
        for name in fields.fields:
            if name not in selectable_fields(rt):
                raise ApiError.bad_request(f'field label not supported: {name}')
        return cls(rt, labels, fields)

    @property
    def empty(self) -> bool:
        return self.labels.empty and not self.fields.requirements

    def matches(self, obj: Obj) -> bool:
        if not self.labels.matches(obj.get("metadata", {}).get("labels")):
            return False
        values = {name: field_value(obj, name) for name in self.fields.fields}
        return self.fields.matches(values)


def _list_item(obj: Obj) -> Obj:
    """List items carry no kind/apiVersion in the real server's JSON."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _encode_continue(rv: int, start: str) -> str:
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise ApiError.bad_request("continue key is not valid: incorrect encoded start resourceVersion "
                                   "(version meta.k8s.io/v1)") from None


# =========================================================================== tables for kubectl


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


# =========================================================================== watch streams


class WatchStream:
    """One watch: initial state or history replay, then live changes, bookmarks, timeout.

    Selector transitions follow the real watch cache: an object that stops matching is sent
    as DELETED (its previous content with the change's resourceVersion), one that starts
    matching as ADDED.
    """

    def __init__(
        self,
        server: ApiServer,
        route: Route,
        selection: Selection,
        start: int | None,
        bookmarks: bool,
        timeout: float | None,
        initial_end: bool,
        render: Renderer | None = None,
    ) -> None:
        self.server = server
        self.render = render
        self.store = server.store
        self.route = route
        self.selection = selection
        self.start = start
        self.bookmarks = bookmarks
        self.deadline = time.monotonic() + timeout if timeout else None
        self.initial_end = initial_end
        self.epoch = server.watch_epoch
        self.next_bookmark = time.monotonic() + server.bookmark_interval

    def stopped(self) -> bool:
        return self.server.watch_epoch != self.epoch

    def abrupt(self) -> bool:
        """Whether the stream was cut (no clean end of the chunked body)."""
        return self.stopped() and self.server.abrupt_cut

    def _visible(self, obj: Obj) -> bool:
        namespace = self.route.namespace
        return (namespace is None or obj["metadata"].get("namespace") == namespace) and self.selection.matches(obj)

    def _bookmark(self, rv: int, initial_end: bool = False) -> bytes:
        meta: Obj = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return encode_event("BOOKMARK", {"kind": self.route.rt.kind, "apiVersion": self.route.rt.api_version,
                                         "metadata": meta})

    def _translate(self, change: Change) -> bytes | None:
        if change.rt is not self.route.rt:
            return None
        now = change.type != "DELETED" and self._visible(change.obj)
        before = change.prev is not None and self._visible(change.prev)
        if now:
            kind, obj = ("MODIFIED" if before else "ADDED"), change.obj
        elif before and change.type == "DELETED":
            kind, obj = "DELETED", change.obj
        elif before and change.prev is not None:
            kind, obj = "DELETED", copy.deepcopy(change.prev)
            obj["metadata"]["resourceVersion"] = str(change.rv)
        else:
            return None
        if self.render is None and kind == change.type:
            return change.line()
        return self._event(kind, obj)

    def _event(self, kind: str, obj: Obj) -> bytes:
        if self.render is not None:
            obj = self.render([obj], {"resourceVersion": obj["metadata"]["resourceVersion"]})
        return encode_event(kind, obj)

    def lines(self, alive: Callable[[], bool]) -> Iterator[bytes]:
        """The stream's JSON lines; ends on timeout, disconnection, a dropped watch or expiry."""
        with self.store.lock:
            if self.start is None:
                cursor = self.store.rv
                first = [self._event("ADDED", o) for o in self.store.items(self.route.rt) if self._visible(o)]
            else:
                cursor, first = self.start, []
                if self.store.history_after(cursor) is None:
                    first, cursor = [encode_event("ERROR", self.store.too_old(cursor).status())], -1
        yield from first
        if cursor < 0:
            return
        if self.initial_end:
            yield self._bookmark(cursor, initial_end=True)
        while True:
            batch, cursor, done = self._next_batch(cursor, alive)
            yield from batch
            if done:
                return

    def _next_batch(self, cursor: int, alive: Callable[[], bool]) -> tuple[list[bytes], int, bool]:
        store = self.store
        with store.changed:
            while True:
                if self.stopped():
                    return [], cursor, True
                changes = store.history_after(cursor)
                if changes is None:
                    return [encode_event("ERROR", store.too_old(cursor).status())], cursor, True
                batch = [line for line in map(self._translate, changes) if line is not None]
                cursor = store.rv
                if batch:
                    return batch, cursor, False
                now = time.monotonic()
                if self.bookmarks and now >= self.next_bookmark:
                    self.next_bookmark = now + self.server.bookmark_interval
                    return [self._bookmark(cursor)], cursor, False
                if (self.deadline is not None and now >= self.deadline) or not alive():
                    return [], cursor, True
                store.changed.wait(timeout=self._wait_time(now))

    def _wait_time(self, now: float) -> float:
        limits = [1.0]
        if self.bookmarks:
            limits.append(self.next_bookmark - now)
        if self.deadline is not None:
            limits.append(self.deadline - now)
        return max(0.001, min(limits))


# =========================================================================== faults and the request log


class Faults:
    """Fault injection, so tests can prove that clients survive a misbehaving API server.

    Faults apply to HTTP requests only; direct store access through :class:`ApiServer`
    methods is never faulted, so tests can always seed and inspect.
    """

    def __init__(self, server: ApiServer, seed: int | None = None) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._errors: dict[str, tuple[float, int]] = {}
        self._latency = 0.0
        self._conflicts = 0.0

    def seed(self, seed: int) -> None:
        """Make the random choices of error_rate/conflict_storm reproducible."""
        with self._lock:
            self._rng.seed(seed)

    def drop_watches(self, abrupt: bool = False) -> None:
        """End every open watch stream now: cleanly (end of body), or by cutting the connection."""
        self._server.end_watches(abrupt)

    @staticmethod
    def _check_rate(rate: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1, not {rate}")

    def error_rate(self, verb: str, rate: float, code: int = 500) -> None:
        """Fail this fraction of requests of a verb with ``code`` (429 comes with Retry-After)."""
        if verb not in FAULT_VERBS:
            raise ValueError(f"verb must be one of {', '.join(FAULT_VERBS)}, not {verb!r}")
        self._check_rate(rate)
        with self._lock:
            if rate:
                self._errors[verb] = (rate, code)
            else:
                self._errors.pop(verb, None)

    def latency(self, seconds: float) -> None:
        """Add this delay to every request."""
        with self._lock:
            self._latency = max(0.0, seconds)

    def forget_history(self) -> None:
        """Compact the history: any resume (watch or continue) from an older version gets 410."""
        self._server.store.forget_history()

    def conflict_storm(self, rate: float) -> None:
        """Fail this fraction of updates and patches with 409 Conflict."""
        self._check_rate(rate)
        with self._lock:
            self._conflicts = rate

    def reset(self) -> None:
        """Remove every fault."""
        with self._lock:
            self._errors.clear()
            self._latency = 0.0
            self._conflicts = 0.0

    # -- used by the dispatcher

    def delay(self) -> float:
        with self._lock:
            return self._latency

    def injected_error(self, verb: str) -> ApiError | None:
        with self._lock:
            rate, code = self._errors.get(verb, (0.0, 500))
            return ApiError.injected(code) if rate and self._rng.random() < rate else None

    def injected_conflict(self) -> bool:
        with self._lock:
            return bool(self._conflicts) and self._rng.random() < self._conflicts


@dataclass(frozen=True)
class RequestRecord:
    """One served HTTP request."""

    method: str
    path: str
    query: str
    status: int
    verb: str
    resource: str = ""
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


class RequestLog:
    """Every request served, so tests and benchmarks can count API calls per verb/resource."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def record(self, record: RequestRecord) -> None:
        """Append one served request."""
        with self._lock:
            self._records.append(record)

    def records(self) -> list[RequestRecord]:
        """A snapshot of the log, oldest first."""
        with self._lock:
            return list(self._records)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.records())

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def count(
        self,
        verb: str | None = None,
        resource: str | None = None,
        *,
        method: str | None = None,
        status: int | None = None,
    ) -> int:
        """How many requests match every given criterion."""
        return sum(
            1 for r in self.records()
            if (verb is None or r.verb == verb) and (resource is None or r.resource == resource)
            and (method is None or r.method == method) and (status is None or r.status == status)
        )

    def counts(self) -> Counter[tuple[str, str]]:
        """Requests per (verb, resource)."""
        return Counter((r.verb, r.resource) for r in self.records())

    def clear(self) -> None:
        """Forget what was served so far (to count the calls of one phase of a test)."""
        with self._lock:
            self._records.clear()


@dataclass
class RequestInfo:
    """What the request log records about a request, filled in as it is understood."""

    verb: str = "discovery"
    resource: str = ""
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


# =========================================================================== the dispatcher


def _group_versions() -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for rt in RESOURCES:
        if rt.group:
            seen[(rt.group, rt.version)] = None
    return list(seen)


def _group_doc(group: str) -> Obj:
    versions = [{"groupVersion": f"{g}/{v}", "version": v} for g, v in _group_versions() if g == group]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _resource_list(group: str, version: str) -> Obj:
    """An APIResourceList, with ``/status`` subresources listed as the real server does."""
    resources: list[Obj] = []
    for rt in RESOURCES:
        if (rt.group, rt.version) != (group, version):
            continue
        entry: Obj = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                      "kind": rt.kind, "verbs": list(rt.verbs)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if rt.status:
            resources.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                              "kind": rt.kind, "verbs": list(STATUS_VERBS)})
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _openapi_root() -> Obj:
    """The OpenAPI v3 index: one document per group/version, as kubectl fetches them."""
    paths = {"api/v1": {"serverRelativeURL": f"/openapi/v3/api/v1?hash={_OPENAPI_HASH}"}}
    for group, version in _group_versions():
        paths[f"apis/{group}/{version}"] = {
            "serverRelativeURL": f"/openapi/v3/apis/{group}/{version}?hash={_OPENAPI_HASH}"}
    return {"paths": paths}


def _patch_paths(group_version: tuple[str, str] | None = None) -> Iterator[tuple[ResourceType, str]]:
    """Each patchable resource with the path template of its objects, as OpenAPI names them."""
    for rt in RESOURCES:
        if "patch" in rt.verbs and group_version in (None, (rt.group, rt.version)):
            yield rt, rt.path("{namespace}" if rt.namespaced else None, "{name}")


def _openapi_document(group: str, version: str) -> Obj:
    """A minimal OpenAPI v3 document: only the PATCH operations and their ``fieldValidation``
    parameter, which is what kubectl looks for to use server-side field validation instead
    of downloading schemas (the emulator has none; kubectl then builds patches from its
    compiled-in types)."""
    paths: Obj = {}
    for rt, item in _patch_paths((group, version)):
        paths[item] = {"patch": {
            "operationId": f"patch{rt.kind}",
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        }}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": f"v{KUBE_VERSION}"}, "paths": paths,
            "components": {"schemas": {}}}


_OPENAPI_HASH = "emulator"
OPENAPI_V2_PROTOBUF = "application/octet-stream"


def _pb_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _pb(number: int, *parts: bytes | str) -> bytes:
    """One length-delimited protobuf field (strings and messages are all the document needs)."""
    data = b"".join(p.encode() if isinstance(p, str) else p for p in parts)
    return _pb_varint(number << 3 | 2) + _pb_varint(len(data)) + data


def _openapi_v2_protobuf() -> bytes:
    """``/openapi/v2`` as gnostic's ``openapi.v2.Document`` protobuf, reduced to PATCH operations
    with their ``fieldValidation`` parameter and GVK extension.

    kubectl before 1.29 reads only this document (protobuf only) to decide whether the server
    validates fields itself; without it, ``kubectl apply`` refuses to run.
    """
    items = []
    for rt, path in _patch_paths():
        gvk = f'group: "{rt.group}"\nkind: {rt.kind}\nversion: {rt.version}\n'
        query_param = _pb(3, _pb(2, "query"), _pb(4, "fieldValidation"), _pb(6, "string"))
        parameter = _pb(8, _pb(1, _pb(2, query_param)))  # ParametersItem > Parameter > NonBodyParameter
        extension = _pb(13, _pb(1, "x-kubernetes-group-version-kind"), _pb(2, _pb(2, gvk)))
        operation = _pb(5, f"patch{rt.kind}") + parameter + extension
        items.append(_pb(2, _pb(1, path), _pb(2, _pb(8, operation))))  # Paths.path: NamedPathItem
    return _pb(1, "2.0") + _pb(2, _pb(1, "Kubernetes"), _pb(2, f"v{KUBE_VERSION}")) + _pb(8, *items)


class Dispatcher:
    """Turns an :class:`HttpRequest` into a response: routing, faults, authorization, verbs."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.store = server.store

    def handle(self, req: HttpRequest, info: RequestInfo) -> HttpResponse | WatchStream:
        """Answer one request (raises ApiError for failures); ``info`` is filled for the log."""
        delay = self.server.faults.delay()
        if delay:
            time.sleep(delay)
        if req.method == "GET":
            doc = self._discovery(req.path)
            if doc is not None:
                return doc
        route = parse_route(req.path)
        if route is None:
            raise ApiError.path_not_found()
        verb = route.verb(req.method, req.flag("watch"))
        info.verb, info.resource, info.subresource = verb, route.rt.plural, route.subresource
        info.namespace, info.name = route.namespace, route.name
        injected = self.server.faults.injected_error(verb)
        if injected is not None:
            raise injected
        if verb in ("update", "patch") and self.server.faults.injected_conflict():
            raise ApiError.stale(route.rt, route.name or "")
        self._authorize(verb, route)
        handler: Callable[[Route, HttpRequest], HttpResponse | WatchStream] = getattr(self, f"_{verb}")
        return handler(route, req)

    # -- discovery

    def _discovery(self, path: str) -> HttpResponse | None:
        path = path.rstrip("/") or "/"
        if path == "/version":
            return HttpResponse.of(200, self.server.version_info())
        if path in ("/healthz", "/livez", "/readyz"):
            return HttpResponse(200, b"ok", "text/plain; charset=utf-8")
        if path == "/api":
            address = f"127.0.0.1:{self.server.port}"
            return HttpResponse.of(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": address}]})
        if path == "/api/v1":
            return HttpResponse.of(200, _resource_list("", "v1"))
        if path == "/apis":
            groups = [_group_doc(g) for g in dict.fromkeys(g for g, _ in _group_versions())]
            return HttpResponse.of(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        if path == "/openapi/v2":
            return HttpResponse(200, _openapi_v2_protobuf(), OPENAPI_V2_PROTOBUF)
        if path == "/openapi/v3":
            return HttpResponse.of(200, _openapi_root())
        if path == "/openapi/v3/api/v1":
            return HttpResponse.of(200, _openapi_document("", "v1"))
        parts = path.split("/")[2:]
        known = _group_versions()
        if path.startswith("/openapi/v3/apis/") and tuple(parts[2:]) in known:
            return HttpResponse.of(200, _openapi_document(parts[2], parts[3]))
        if path.startswith("/apis/") and len(parts) == 1 and any(g == parts[0] for g, _ in known):
            return HttpResponse.of(200, {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(parts[0])})
        if path.startswith("/apis/") and len(parts) == 2 and tuple(parts) in known:
            return HttpResponse.of(200, _resource_list(parts[0], parts[1]))
        return None

    # -- authorization

    def _authorize(self, verb: str, route: Route) -> None:
        rt = route.rt
        if self.server.is_allowed(verb, rt.group, rt.plural, route.namespace, route.subresource or ""):
            return
        resource = rt.plural + (f"/{route.subresource}" if route.subresource else "")
        scope = f'in the namespace "{route.namespace}"' if route.namespace else "at the cluster scope"
        raise ApiError.forbidden(rt, route.name or "", f'User "system:anonymous" cannot {verb} resource '
                                                       f'"{resource}" in API group "{rt.group}" {scope}')

    # -- reads

    def _get(self, route: Route, req: HttpRequest) -> HttpResponse:
        obj = self.store.peek(route.rt, route.namespace, str(route.name))
        if obj is None:
            raise ApiError.not_found(route.rt, str(route.name))
        render = table_renderer(route.rt, req)
        if render is not None:
            return HttpResponse.of(200, render([obj], {"resourceVersion": obj["metadata"]["resourceVersion"]}))
        return HttpResponse.of(200, obj)

    def _list(self, route: Route, req: HttpRequest) -> HttpResponse:
        rt, selection = route.rt, Selection.parse(route.rt, req)
        limit = req.int_param("limit") or 0
        objects, list_rv, start = self._list_source(route, req)
        matched = [o for o in objects if (not start or self.store.key(rt, o["metadata"].get("namespace"),
                                                                    o["metadata"]["name"]) > start)
                   and selection.matches(o)]
        meta: Obj = {"resourceVersion": str(list_rv)}
        if 0 < limit < len(matched):
            last = matched[limit - 1]["metadata"]
            meta["continue"] = _encode_continue(list_rv, self.store.key(rt, last.get("namespace"), last["name"]))
            if selection.empty:
                meta["remainingItemCount"] = len(matched) - limit
            matched = matched[:limit]
        render = table_renderer(rt, req)
        if render is not None:
            return HttpResponse.of(200, render(matched, meta))
        return HttpResponse.of(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta,
                                     "items": [_list_item(o) for o in matched]})

    def _list_source(self, route: Route, req: HttpRequest) -> tuple[list[Obj], int, str]:
        """Which state a list reads: a continue token's snapshot, an exact version, or now."""
        rv_text, match, token = req.param("resourceVersion"), req.param("resourceVersionMatch"), req.param("continue")
        with self.store.lock:
            if token:
                if rv_text not in (None, "0"):
                    raise ApiError.bad_request("specifying resource version is not allowed when using continue")
                token_rv, start = _decode_continue(token)
                try:
                    return self.store.snapshot(route.rt, token_rv, route.namespace), token_rv, start.rstrip("\x00")
                except ApiError:
                    raise self._continue_expired() from None
            rv = self._parse_rv(rv_text)
            if match not in (None, "Exact", "NotOlderThan"):
                raise ApiError(422, f'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Unsupported '
                                    f'value: "{match}"', "Invalid")
            if match and rv is None:
                raise ApiError(422, 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                                    "resourceVersionMatch is forbidden unless resourceVersion is provided", "Invalid")
            if rv is not None and rv > self.store.rv:
                raise ApiError(504, f"Too large resource version: {rv}, current: {self.store.rv}", "Timeout",
                               {"causes": [{"reason": "ResourceVersionTooLarge",
                                            "message": "Too large resource version"}], "retryAfterSeconds": 1})
            if match == "Exact" and rv is not None:
                return self.store.snapshot(route.rt, rv, route.namespace), rv, ""
            return self.store.items(route.rt, route.namespace), self.store.rv, ""

    @staticmethod
    def _continue_expired() -> ApiError:
        return ApiError.expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a new "
            "list without the continue parameter, or use the continue token in this response to retrieve the "
            "remainder of the results. Continuing with the provided token results in an inconsistent list - "
            "objects that were created, modified, or deleted between the time the first chunk was returned and "
            "now may show up in the list.")

    @staticmethod
    def _parse_rv(text: str | None) -> int | None:
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            raise ApiError.bad_request(f"invalid resource version: {text!r}") from None
        return value if value > 0 else None

    def _watch(self, route: Route, req: HttpRequest) -> WatchStream:
        selection = Selection.parse(route.rt, req)
        if route.name is not None:  # GET .../name?watch=1 is the legacy form of a name selector
            selection = Selection(route.rt, selection.labels, FieldSelector(
                selection.fields.requirements + FieldSelector.parse(f"metadata.name={route.name}").requirements))
        if req.param("resourceVersionMatch") and not req.flag("sendInitialEvents"):
            raise ApiError(422, 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                                "resourceVersionMatch is forbidden for watch", "Invalid")
        initial_events = req.flag("sendInitialEvents")
        if initial_events and not req.flag("allowWatchBookmarks"):
            raise ApiError(422, 'ListOptions.meta.k8s.io "" is invalid: allowWatchBookmarks: Required value: '
                                "allowWatchBookmarks must be set to true when sendInitialEvents is specified",
                           "Invalid")
        start = None if initial_events else self._parse_rv(req.param("resourceVersion"))
        timeout = req.int_param("timeoutSeconds")
        return WatchStream(self.server, route, selection, start, req.flag("allowWatchBookmarks"),
                           float(timeout) if timeout else None, initial_events, table_renderer(route.rt, req))

    # -- writes

    def _create(self, route: Route, req: HttpRequest) -> HttpResponse:
        body = req.json()
        if route.rt.kind == "SelfSubjectAccessReview":
            return HttpResponse.of(201, self._access_review(body))
        obj = self.store.create(route.rt, route.namespace, body, dry_run=bool(req.param("dryRun")))
        return HttpResponse.of(201, obj)

    def _update(self, route: Route, req: HttpRequest) -> HttpResponse:
        existed = self.store.peek(route.rt, route.namespace, str(route.name)) is not None
        obj = self.store.update(route.rt, route.namespace, str(route.name), req.json(), route.subresource,
                                dry_run=bool(req.param("dryRun")))
        return HttpResponse.of(200 if existed else 201, obj)

    def _patch(self, route: Route, req: HttpRequest) -> HttpResponse:
        content_type = req.content_type.split(";")[0].strip().lower()
        if content_type not in PATCH_TYPES:
            raise ApiError(415, "the body of the request was in an unknown format - accepted media types "
                                f"include: {', '.join(PATCH_TYPES)}", "UnsupportedMediaType")
        obj, created = self.store.patch(route.rt, route.namespace, str(route.name), content_type, req.body,
                                        route.subresource, req.param("fieldManager"), bool(req.param("dryRun")))
        return HttpResponse.of(201 if created else 200, obj)

    def _delete(self, route: Route, req: HttpRequest) -> HttpResponse:
        body = req.json() if req.body.strip() else None
        options = DeleteOptions.parse(body, req.query)
        obj, gone = self.store.delete(route.rt, route.namespace, str(route.name), options)
        if gone and not route.rt.returns_deleted:
            return HttpResponse.of(200, self._success(route.rt, obj))
        return HttpResponse.of(200, obj)

    def _deletecollection(self, route: Route, req: HttpRequest) -> HttpResponse:
        body = req.json() if req.body.strip() else None
        options = DeleteOptions.parse(body, req.query)
        selection = Selection.parse(route.rt, req)
        with self.store.lock:
            for obj in self.store.items(route.rt, route.namespace):
                if selection.matches(obj):
                    meta = obj["metadata"]
                    self.store.delete(route.rt, meta.get("namespace"), meta["name"], options)
        return HttpResponse.of(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})

    @staticmethod
    def _success(rt: ResourceType, obj: Obj) -> Obj:
        details: Obj = {"name": obj["metadata"]["name"], "kind": rt.plural, "uid": obj["metadata"]["uid"]}
        if rt.group:
            details["group"] = rt.group
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def _access_review(self, body: Any) -> Obj:
        """SelfSubjectAccessReview: answered from the denial list, never stored."""
        review = Store._decoded(resource_for("authorization.k8s.io/v1", "SelfSubjectAccessReview"), body)
        spec = review.get("spec") or {}
        attrs = spec.get("resourceAttributes")
        if not attrs and not spec.get("nonResourceAttributes"):
            errs = FieldErrors()
            errs.required("spec.resourceAttributes",
                          "exactly one of nonResourceAttributes or resourceAttributes must be specified")
            raise ApiError.invalid(resource_for("authorization.k8s.io/v1", "SelfSubjectAccessReview"), "", errs)
        attrs = attrs or {}
        allowed = not attrs or self.server.is_allowed(
            str(attrs.get("verb", "")), str(attrs.get("group", "")), str(attrs.get("resource", "")),
            attrs.get("namespace") or None, str(attrs.get("subresource", "")))
        review["metadata"] = {"creationTimestamp": None}
        review["status"] = {"allowed": allowed} if allowed else {"allowed": False, "reason": "denied by the emulator"}
        return review


# =========================================================================== the HTTP server


class _HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its open connections, so stop/restart can cut them."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: ApiServer) -> None:
        self.api = api
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def cut_connections(self) -> None:
        """Shut every open connection: keep-alive clients and watches notice the server is gone."""
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; JSON bodies; chunked transfer for watches."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm on, the client's
    # delayed ACK then stalls every response by ~40 ms. kube-apiserver (Go) sets
    # TCP_NODELAY on every connection, and so does this emulator.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is in ApiServer.requests."""

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        req = HttpRequest(self.command, url.path, query, url.query, self.headers.get("Content-Type", ""),
                          self._read_body(), self.headers.get("Accept", ""))
        api, info = self.server.api, RequestInfo()
        try:
            result = api.dispatcher.handle(req, info)
        except ApiError as err:
            result = HttpResponse.error(err)
        except Exception as exc:  # an emulator bug must surface as a 500, not a dropped connection
            result = HttpResponse.error(ApiError(500, f"emulator error: {type(exc).__name__}: {exc}"))
        status = result.status if isinstance(result, HttpResponse) else 200
        api.requests.record(RequestRecord(self.command, url.path, url.query, status, info.verb, info.resource,
                                          info.namespace, info.name, info.subresource))
        if isinstance(result, WatchStream):
            self._stream(result)
        else:
            self._send(result)

    def _send(self, response: HttpResponse) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-cache, private")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(response.body)

    def _stream(self, stream: WatchStream) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            for line in stream.lines(self._client_alive):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            if stream.abrupt():
                self.connection.shutdown(socket.SHUT_RDWR)
            else:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away

    def _client_alive(self) -> bool:
        """A watch client that closed its end is noticed without waiting for the next event."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return not readable or bool(self.connection.recv(1, socket.MSG_PEEK))
        except OSError:
            return False


# =========================================================================== the facade


_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class ApiServer:
    """The emulator: a store, its controllers and an HTTP server on a daemon thread.

    Direct methods (:meth:`create`, :meth:`get`, ...) bypass HTTP but not the rules: they
    validate, bump resourceVersions and feed watches exactly like requests, and return
    copies. Every method is thread-safe.
    """

    def __init__(
        self,
        binder: bool = True,
        job_completer: bool = False,
        history_limit: int = 1000,
        *,
        bookmark_interval: float = 1.0,
        seed: int | None = None,
        kube_version: str = KUBE_VERSION,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.store = Store(history_limit)
        self.faults = Faults(self, seed)
        self.requests = RequestLog()
        self.dispatcher = Dispatcher(self)
        self.bookmark_interval = bookmark_interval
        self.kube_version = kube_version.lstrip("v")
        #: decides the outcome of each Job when the Job completer runs: True, False or None (running)
        self.job_outcome: Callable[[Obj], bool | None] = lambda job: True
        self.watch_epoch = 0
        self.abrupt_cut = False
        self._host, self._port = host, port
        self._denials: list[tuple[str, str, str, str | None, str]] = []
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lifecycle = threading.Lock()
        self._controllers: list[Reconciler] = [GarbageCollector(self.store)]
        if binder:
            self._controllers.append(PVBinder(_ClusterView(self.store)))
        if job_completer:
            self._controllers.append(JobCompleter(self.store, self._job_outcome))
        for name in _SYSTEM_NAMESPACES:
            self.store.create(NAMESPACES, None, {"metadata": {"name": name}})

    # -- lifecycle

    @property
    def port(self) -> int:
        """The bound port (0 before the first start when none was asked for)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: plain HTTP, no credentials (clients need none)."""
        return f"http://{self._host}:{self._port}"

    def start(self) -> ApiServer:
        """Bind (port 0 picks a free one) and serve on a daemon thread; start the controllers."""
        with self._lifecycle:
            if self._httpd is not None:
                return self
            for controller in self._controllers:
                controller.start()
            self._serve()
        return self

    def _serve(self) -> None:
        self._httpd = _HTTPServer((self._host, self._port), self)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"emulator-http-{self._port}", daemon=True)
        self._thread.start()

    def _shutdown_http(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self.end_watches(abrupt=True)
        self._httpd.cut_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd, self._thread = None, None

    def stop(self) -> None:
        """Stop serving and stop the controllers (state stays readable through the methods)."""
        with self._lifecycle:
            self._shutdown_http()
            for controller in self._controllers:
                controller.stop()

    def restart(self) -> None:
        """Stop HTTP and serve again on the same port with the state kept; connections are cut."""
        with self._lifecycle:
            self._shutdown_http()
            self._serve()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def end_watches(self, abrupt: bool) -> None:
        """End every open watch (used by stop/restart and :meth:`Faults.drop_watches`)."""
        with self.store.changed:
            self.abrupt_cut = abrupt
            self.watch_epoch += 1
            self.store.changed.notify_all()

    def settle(self, timeout: float = 5.0) -> None:
        """Wait until every controller has reacted to the current state (TimeoutError if not)."""
        deadline = time.monotonic() + timeout
        with self.store.changed:
            while not all(c.idle() for c in self._controllers):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the emulator's controllers did not settle")
                self.store.changed.wait(min(remaining, 0.05))

    @property
    def controller_failures(self) -> list[str]:
        """Exceptions raised by controller passes (an emulator bug; tests should assert none)."""
        return [f"{c.name}: {failure}" for c in self._controllers for failure in c.failures]

    def version_info(self) -> Obj:
        """The ``/version`` document (kubectl's dispatcher picks its kubectl from it)."""
        major, minor = self.kube_version.split(".")[:2]
        return {"major": major, "minor": minor, "gitVersion": f"v{self.kube_version}", "gitCommit": "emulator",
                "gitTreeState": "clean", "buildDate": "2024-08-13T07:28:49Z", "goVersion": "go1.22.5",
                "compiler": "gc", "platform": "linux/amd64"}

    # -- clients

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig for this server (no credentials); usable by kubectl and the client."""
        name = "localpv-emulator"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
            "current-context": name,
        }
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(config, indent=2) + "\n")
        return target

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this server (the import happens here, lazily)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    # -- direct store access

    @staticmethod
    def _locate(obj: Obj) -> tuple[ResourceType, str | None, str]:
        rt = resource_for(str(obj.get("apiVersion")), str(obj.get("kind")))
        meta = obj.get("metadata") or {}
        namespace = (meta.get("namespace") or "default") if rt.namespaced else None
        return rt, namespace, str(meta.get("name") or "")

    def create(self, obj: Obj) -> Obj:
        """Create like a POST (a namespaced object without namespace goes to ``default``)."""
        rt, namespace, _ = self._locate(obj)
        return copy.deepcopy(self.store.create(rt, namespace, obj))

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        """A copy of the object, or None (no 404: tests poll for absence with it)."""
        rt = resource_for(api_version, kind)
        obj = self.store.peek(rt, namespace if rt.namespaced else None, name)
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        """Objects with kind/apiVersion (unlike HTTP list items), in key order."""
        return copy.deepcopy(self.store.items(resource_for(api_version, kind), namespace))

    def update(self, obj: Obj, subresource: str | None = None) -> Obj:
        """Update like a PUT; ``subresource="status"`` writes only status, as ``/status`` does."""
        rt, namespace, name = self._locate(obj)
        return copy.deepcopy(self.store.update(rt, namespace, name, obj, subresource))

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
    ) -> Obj:
        """Delete like a DELETE; returns the object (marked for deletion when finalizers hold it)."""
        rt = resource_for(api_version, kind)
        obj, _ = self.store.delete(rt, namespace if rt.namespaced else None, name,
                                   DeleteOptions(propagation=propagation_policy))
        return copy.deepcopy(obj)

    def _job_outcome(self, job: Obj) -> bool | None:
        return self.job_outcome(job)  # looked up per call: tests may replace job_outcome any time

    def complete_job(self, namespace: str, name: str, succeeded: bool = True) -> Obj:
        """Mark a Job Complete or Failed, with the status the Job controller would write."""
        return copy.deepcopy(finish_job(self.store, namespace, name, succeeded))

    # -- authorization

    def deny(self, verb: str, resource: str, *, group: str = "", namespace: str | None = None,
             subresource: str = "") -> None:
        """Refuse a verb on a resource ("*" matches anything): requests get 403 Forbidden and
        SelfSubjectAccessReviews answer not allowed. ``namespace=None`` means every namespace."""
        with self._lifecycle:
            self._denials.append((verb, group, resource, namespace, subresource))

    def allow_all(self) -> None:
        """Remove every denial."""
        with self._lifecycle:
            self._denials.clear()

    def is_allowed(self, verb: str, group: str, resource: str, namespace: str | None, subresource: str = "") -> bool:
        """What authorization answers for a request or a SelfSubjectAccessReview."""
        def hit(pattern: str | None, value: str | None) -> bool:
            return pattern is None or pattern in ("*", value or "")

        with self._lifecycle:
            return not any(
                hit(v, verb) and hit(g, group) and hit(r, resource) and hit(n, namespace) and hit(s, subresource)
                for v, g, r, n, s in self._denials
            )


# =========================================================================== command line


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM (the standalone mode used by ``localpv demo`` and humans)."""
    parser = argparse.ArgumentParser(prog="python -m localpv.testing.apiserver",
                                     description="Serve the localpv Kubernetes API emulator.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    parser.add_argument("--kubeconfig-out", type=Path, help="write a kubeconfig for the server here")
    parser.add_argument("--binder", action="store_true", help="run the PV binder")
    parser.add_argument("--job-completer", action="store_true", help="mark every Job as succeeded")
    parser.add_argument("--history-limit", type=int, default=10000, help="watch events kept for resumes")
    parser.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds between watch bookmarks")
    parser.add_argument("--kube-version", default=KUBE_VERSION, help="version reported by /version")
    args = parser.parse_args(argv)
    server = ApiServer(binder=args.binder, job_completer=args.job_completer, history_limit=args.history_limit,
                       bookmark_interval=args.bookmark_interval, kube_version=args.kube_version, port=args.port)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    if args.kubeconfig_out:
        server.write_kubeconfig(args.kubeconfig_out)
    print(f"localpv API emulator serving on {server.url}", flush=True)
    while not stop.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Unknown fields are dropped, as kube-apiserver drops them when it decodes a request.

A real server without strict field validation (1.20; later ones with
``fieldValidation=Ignore``) decodes every create, update and patch result into the kind's
Go struct: a field the struct does not have is lost at any depth, and the object stored,
returned and sent to watchers lacks it. A client that misspells a field
(``spec.nodeAfinity``) or writes one its server does not know sees it vanish on a real
cluster; an emulator that kept it would hide the bug.

**Where the known fields come from.** Each built-in kind's schema is read from the models
of the ``kubernetes`` Python client (their ``openapi_types`` and ``attribute_map``, which
are generated from the Kubernetes OpenAPI document), so pruning goes as deep as the real
decoder: every nested struct, list item and map value typed as a struct, e.g.
``spec.local``, ``spec.nodeAffinity.required.nodeSelectorTerms[*]``, ``spec.claimRef``,
containers and volumes of pod templates. Values that are free-form in the OpenAPI
(``object``: int-or-string, ``RawExtension``, ``fieldsV1``) and maps of scalars (labels,
annotations, data, capacity) are kept whole. The models are those of the installed
client's Kubernetes version, which is not older than the emulated one: a field added
after the emulated version is kept where that server would drop it.

**CRDs.** ServiceMonitor and PrometheusRule, the CRDs the emulator serves (the chart
creates them when asked), are treated as CRDs whose schema sets
``x-kubernetes-preserve-unknown-fields``: its content is kept as sent, and
only its ``metadata`` is pruned to ObjectMeta, as apiextensions-apiserver always does.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

from localpv_emulator.apiserver.resources import Obj, ResourceType


@dataclass(eq=False)
class Struct:
    """A Go struct: only these JSON fields survive decoding (each with its own schema);
    with ``preserve_unknown`` the others are kept too, as a CRD's
    ``x-kubernetes-preserve-unknown-fields`` does."""

    fields: dict[str, Schema] = field(default_factory=dict)
    preserve_unknown: bool = False


@dataclass(frozen=True)
class ListOf:
    """A list whose items each have ``item``'s schema."""

    item: Schema


@dataclass(frozen=True)
class MapOf:
    """A map with arbitrary keys whose values each have ``value``'s schema."""

    value: Schema


#: None is a value kept whole: a scalar, a free-form ``object``, or a map or list of those.
Schema = Struct | ListOf | MapOf | None

#: The client model of each built-in kind the emulator serves.
MODELS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "Node"): "V1Node",
    ("v1", "PersistentVolume"): "V1PersistentVolume",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("v1", "Pod"): "V1Pod",
    ("v1", "Event"): "CoreV1Event",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Endpoints"): "V1Endpoints",
    ("storage.k8s.io/v1", "StorageClass"): "V1StorageClass",
    ("storage.k8s.io/v1", "CSIDriver"): "V1CSIDriver",
    ("storage.k8s.io/v1", "CSINode"): "V1CSINode",
    # One schema at its three versions: the client has the v1 model only.
    ("storage.k8s.io/v1", "CSIStorageCapacity"): "V1CSIStorageCapacity",
    ("storage.k8s.io/v1beta1", "CSIStorageCapacity"): "V1CSIStorageCapacity",
    ("storage.k8s.io/v1alpha1", "CSIStorageCapacity"): "V1CSIStorageCapacity",
    ("batch/v1", "Job"): "V1Job",
    ("coordination.k8s.io/v1", "Lease"): "V1Lease",
    ("events.k8s.io/v1", "Event"): "EventsV1Event",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "V1SelfSubjectAccessReview",
}
#: Served kinds that are CustomResourceDefinitions: content preserved, metadata pruned.
CRDS = frozenset({("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")})

_LIST = re.compile(r"^(?:List\[(.*)\]|list\[(.*)\])$")
_MAP = re.compile(r"^(?:Dict\[str, (.*)\]|dict\(str, (.*)\))$")


class _Schemas:
    """Schemas compiled from the client's models, once per model (some are recursive)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._structs: dict[str, Struct] = {}
        self._crd: Struct | None = None
        self._models: Any = None

    def for_kind(self, api_version: str, kind: str) -> Struct | None:
        model = MODELS.get((api_version, kind))
        if model is None and (api_version, kind) not in CRDS:
            return None
        with self._lock:
            if self._models is None:
                from kubernetes.client import models  # heavy: imported at the first write only

                self._models = models
            if model is not None:
                return self._struct(model)
            if self._crd is None:
                self._crd = Struct({"metadata": self._struct("V1ObjectMeta")}, preserve_unknown=True)
            return self._crd

    def _struct(self, name: str) -> Struct:
        struct = self._structs.get(name)
        if struct is None:
            struct = self._structs[name] = Struct()  # stored first: a model may contain itself
            model = getattr(self._models, name)
            for attribute, type_name in model.openapi_types.items():
                struct.fields[model.attribute_map[attribute]] = self._parse(type_name)
        return struct

    def _parse(self, type_name: str) -> Schema:
        listed = _LIST.match(type_name)
        if listed:
            item = self._parse(listed.group(1) or listed.group(2))
            return None if item is None else ListOf(item)
        mapped = _MAP.match(type_name)
        if mapped:
            value = self._parse(mapped.group(1) or mapped.group(2))
            return None if value is None else MapOf(value)
        if hasattr(self._models, type_name):
            return self._struct(type_name)
        return None  # str, int, bool, datetime, bytes, object: kept whole


_SCHEMAS = _Schemas()


def schema_for(rt: ResourceType) -> Struct | None:
    """The known fields of a kind, or None when it has no schema (nothing is pruned)."""
    return _SCHEMAS.for_kind(rt.api_version, rt.kind)


def prune(rt: ResourceType, obj: Obj) -> list[str]:
    """Remove, in place, the fields ``rt``'s kind does not know; returns their paths
    (``spec.bogus``, ``spec.containers[0].bogus``), as strict field validation names them."""
    dropped: list[str] = []
    schema = schema_for(rt)
    if schema is not None:
        _prune(obj, schema, "", dropped)
    return dropped


def _prune(value: Any, schema: Schema, path: str, dropped: list[str]) -> None:
    if isinstance(schema, Struct):
        if not isinstance(value, dict):
            return  # a value of the wrong type is validation's business, not pruning's
        for key in list(value):
            where = f"{path}.{key}" if path else str(key)
            if key in schema.fields:
                _prune(value[key], schema.fields[key], where, dropped)
            elif not schema.preserve_unknown:
                del value[key]
                dropped.append(where)
    elif isinstance(schema, ListOf):
        if isinstance(value, list):
            for i, item in enumerate(value):
                _prune(item, schema.item, f"{path}[{i}]", dropped)
    elif isinstance(schema, MapOf) and isinstance(value, dict):
        for key, item in value.items():
            _prune(item, schema.value, f"{path}[{key}]", dropped)

"""The resource table: every kind the emulator serves, which drives routing, discovery,
RBAC verbs and field selectors; and the few basics every other module shares."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]


KUBE_VERSION = "1.31.0"
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
STATUS_VERBS = ("get", "patch", "update")


def now_rfc3339() -> str:
    """Timestamps as the API server writes them (second precision, ``Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    # The chart's dynamic volumes ship a CSIDriver; kubelets report CSINodes.
    _R("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False, returns_deleted=True),
    _R("storage.k8s.io", "v1", "csinodes", "CSINode", False, returns_deleted=True),
    # Capacity tracking, at the three versions Kubernetes served it; which of them a server
    # serves is its switch (ApiServer's capacity_versions): CAPACITY_VERSIONS.
    *(_R("storage.k8s.io", version, "csistoragecapacities", "CSIStorageCapacity", True)
      for version in ("v1", "v1beta1", "v1alpha1")),
    _R("batch", "v1", "jobs", "Job", True, status=True, fields=("status.successful",), categories=("all",)),
    _R("coordination.k8s.io", "v1", "leases", "Lease", True, create_on_update=True),
    _R("events.k8s.io", "v1", "events", "Event", True, ("ev",)),
    _R("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), status=True, categories=("all",)),
    _R("apps", "v1", "deployments", "Deployment", True, ("deploy",), status=True, categories=("all",)),
    # Owners of the pods that node-cleanup deletes for lost nodes (no controller runs them).
    _R("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), status=True, categories=("all",)),
    _R("rbac.authorization.k8s.io", "v1", "roles", "Role", True, name_rule="path"),
    _R("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, name_rule="path"),
    _R("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, name_rule="path"),
    _R("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, name_rule="path"),
    _R("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), status=True),
    _R("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False,
       verbs=("create",)),
    # The prometheus-operator CRD, as if installed: charts (ours included) create ServiceMonitors.
    _R("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", True, ("smon",)),
    _R("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule", True, ("promrule",)),
)
del _R

#: The versions of CSIStorageCapacity a server may serve (v1 from 1.24, v1beta1 1.21-1.26,
#: v1alpha1 1.19-1.23); the emulator serves v1 unless told otherwise (its version is 1.31).
CAPACITY_VERSIONS = ("v1", "v1beta1", "v1alpha1")
#: The environment variable the standalone server and tests read the served versions from
#: (comma-separated; empty or ``none``: none).
CAPACITY_VERSIONS_ENV = "LOCALPV_EMULATOR_CAPACITY_VERSIONS"

BY_PATH = {(rt.group, rt.version, rt.plural): rt for rt in RESOURCES}
_BY_KIND = {(rt.api_version, rt.kind): rt for rt in RESOURCES}
NAMESPACES = _BY_KIND[("v1", "Namespace")]


def resource_for(api_version: str, kind: str) -> ResourceType:
    """The table row for an (apiVersion, kind) pair; KeyError names the pair when unknown."""
    try:
        return _BY_KIND[(api_version, kind)]
    except KeyError:
        raise KeyError(f"the emulator does not serve {kind} in {api_version}") from None

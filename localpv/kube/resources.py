"""The API resources localpv uses, as plain descriptors (no generated models).

Objects travel as plain ``dict`` JSON everywhere in localpv: it keeps the reconcile
logic pure and cheap (the generated models cost much CPU and memory for thousands of
PVs), and the same dicts are what the API server sends and accepts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the REST API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """REST path of the collection, or of one object (and its subresource)."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            root += f"/namespaces/{namespace}"
        root += f"/{self.plural}"
        if name is not None:
            root += f"/{name}"
            if subresource:
                root += f"/{subresource}"
        return root


PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", "PersistentVolume", False)
PERSISTENT_VOLUME_CLAIMS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True)
NODES = Resource("", "v1", "nodes", "Node", False)
EVENTS = Resource("", "v1", "events", "Event", True)
PODS = Resource("", "v1", "pods", "Pod", True)
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap", True)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", False)
STORAGE_CLASSES = Resource("storage.k8s.io", "v1", "storageclasses", "StorageClass", False)
JOBS = Resource("batch", "v1", "jobs", "Job", True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
SELF_SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False
)

#: CSIStorageCapacity at each version a cluster may serve it, most preferred first: v1 (GA,
#: from 1.24), v1beta1 (1.21 to 1.26), v1alpha1 (1.19 to 1.23, behind a feature gate and
#: ``--runtime-config``). Which one a cluster serves is asked through discovery
#: (:func:`localpv.kube.discovery.served_resource`), never assumed from its version.
CSI_STORAGE_CAPACITIES = tuple(
    Resource("storage.k8s.io", version, "csistoragecapacities", "CSIStorageCapacity", True)
    for version in ("v1", "v1beta1", "v1alpha1")
)

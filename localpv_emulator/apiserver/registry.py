"""Which :class:`~localpv_emulator.apiserver.strategies.Strategy` each kind gets."""

from __future__ import annotations

from localpv_emulator.apiserver.resources import ResourceType
from localpv_emulator.apiserver.strategies import (
    CoreEventStrategy,
    CSIStorageCapacityStrategy,
    DataStrategy,
    EventsV1Strategy,
    NamespaceStrategy,
    NodeStrategy,
    PersistentVolumeClaimStrategy,
    PersistentVolumeStrategy,
    RbacStrategy,
    ServiceStrategy,
    StorageClassStrategy,
    Strategy,
)
from localpv_emulator.apiserver.workloads import JobStrategy, PodStrategy, WorkloadStrategy

_RBAC = RbacStrategy()
_CAPACITY = CSIStorageCapacityStrategy()
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
    **{(f"storage.k8s.io/{version}", "CSIStorageCapacity"): _CAPACITY for version in ("v1", "v1beta1", "v1alpha1")},
    ("apps/v1", "StatefulSet"): WorkloadStrategy({
        "replicas": 1, "podManagementPolicy": "OrderedReady", "revisionHistoryLimit": 10,
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
    }, status={"replicas": 0}),  # a non-omitempty int: clients require it
    **{("rbac.authorization.k8s.io/v1", kind): _RBAC
       for kind in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")},
}
_DEFAULT_STRATEGY = Strategy()


def strategy_for(rt: ResourceType) -> Strategy:
    """The kind's strategy, or the permissive default."""
    return STRATEGIES.get((rt.api_version, rt.kind), _DEFAULT_STRATEGY)

"""What ``localpv node-cleanup`` exports, on a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from localpv.kube.metrics import ApiRequestMetrics

NODE_CLEANUP = "local_volume_node_cleanup"


class NodeCleanupMetrics:
    """What ``localpv node-cleanup`` exports: upstream's four counters (same names, so its
    dashboards keep working), the pods it deleted for lost nodes, and our API request metrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pv_deleted = Counter(f"{NODE_CLEANUP}_persistentvolume_delete",
                                  "PVs of deleted nodes deleted, by the phase they had.", ["phase"], registry=r)
        self.pv_delete_failed = Counter(f"{NODE_CLEANUP}_persistentvolume_delete_failed",
                                        "Failed deletions of PVs of deleted nodes.", ["phase"], registry=r)
        self.pvc_deleted = Counter(f"{NODE_CLEANUP}_persistentvolumeclaim_delete",
                                   "PVCs deleted because their volume's node was deleted.", registry=r)
        self.pvc_delete_failed = Counter(f"{NODE_CLEANUP}_persistentvolumeclaim_delete_failed",
                                         "Failed deletions of PVCs of deleted nodes.", registry=r)
        self.pod_deleted = Counter(f"{NODE_CLEANUP}_pod_delete",
                                   "Pods deleted because they waited on a claim released for a lost node, by "
                                   "what happened to the node (deleted, out-of-service).", ["cause"], registry=r)
        self.pod_delete_failed = Counter(f"{NODE_CLEANUP}_pod_delete_failed",
                                         "Failed deletions of pods waiting on claims of lost nodes.", ["cause"],
                                         registry=r)
        self.api = ApiRequestMetrics(r, upstream_prefix=None)

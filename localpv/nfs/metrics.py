"""Metrics of the NFS provisioner, under the names sig-storage-lib-external-provisioner uses.

The lib defines these (research B.9) but nfs-subdir never serves them; we do, with the
v6 label set (``class``) so dashboards written for the lib work unchanged. Durations are
observed on success only, as upstream. Our additions carry the ``localpv_`` prefix.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from localpv.kube.metrics import ApiRequestMetrics

CONTROLLER = "controller"


class NfsMetrics:
    """Everything ``localpv nfs`` exports, on a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.provision = Counter(f"{CONTROLLER}_persistentvolumeclaim_provision",
                                 "Volumes provisioned, by storage class.", ["class"], registry=r)
        self.provision_failed = Counter(f"{CONTROLLER}_persistentvolumeclaim_provision_failed",
                                        "Failed provisioning attempts, by storage class.", ["class"], registry=r)
        self.provision_duration = Histogram(f"{CONTROLLER}_persistentvolumeclaim_provision_duration_seconds",
                                            "Time to provision a volume (successes only).", ["class"], registry=r)
        self.delete = Counter(f"{CONTROLLER}_persistentvolume_delete", "Volumes deleted, by storage class.",
                              ["class"], registry=r)
        self.delete_failed = Counter(f"{CONTROLLER}_persistentvolume_delete_failed",
                                     "Failed deletion attempts, by storage class.", ["class"], registry=r)
        self.delete_duration = Histogram(f"{CONTROLLER}_persistentvolume_delete_duration_seconds",
                                         "Time to delete a volume (successes only).", ["class"], registry=r)
        self.directories_created = Counter("localpv_nfs_directories_created",
                                           "Directories created on the export (leaves and parents).", registry=r)
        self.path_rejections = Counter("localpv_nfs_path_rejections",
                                       "Claims or volumes refused because their path was unsafe.", ["operation"],
                                       registry=r)
        self.gave_up = Counter("localpv_nfs_gave_up", "Items dropped after the failure threshold until resync.",
                               ["queue"], registry=r)
        self.leader = Gauge("localpv_leader", "1 while this replica holds the leader lease.", registry=r)
        self.api = ApiRequestMetrics(r, upstream_prefix=None)

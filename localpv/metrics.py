"""Prometheus metrics, on registries we own (never the global default).

Agent metrics keep upstream's names and labels (research/local-static.md §3.10) so
existing dashboards keep working; what upstream lacks is added under ``localpv_``.
Each process builds one registry; tests build their own, so nothing leaks between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from localpv.kube.errors import ApiError

AGENT = "local_volume_provisioner"

#: Cleanup durations run from seconds (rm of a few files) to hours (shred of a disk).
CLEANUP_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, float("inf"))
#: The ``mode`` and ``type`` label values of the cleanup counters (see agent/executor.py).
CLEANUP_MODES = ("Filesystem", "Block")
CLEANUP_KINDS = ("process", "job")


class ApiRequestMetrics:
    """Request counters fed by :class:`localpv.kube.api.KubeApi`'s observer hook."""

    def __init__(self, registry: CollectorRegistry, *, upstream_prefix: str | None = AGENT) -> None:
        self.requests = Counter("localpv_api_requests", "API requests by verb, resource and outcome.",
                                ["verb", "resource", "code"], registry=registry)
        self.duration = Histogram("localpv_api_request_duration_seconds", "API request latency.",
                                  ["verb", "resource"], registry=registry)
        self._upstream: tuple[Counter, Counter, Histogram] | None = None
        if upstream_prefix:
            self._upstream = (
                Counter(f"{upstream_prefix}_apiserver_requests", "PV create/delete requests (upstream metric).",
                        ["method"], registry=registry),
                Counter(f"{upstream_prefix}_apiserver_requests_failed", "Failed PV create/delete requests.",
                        ["method"], registry=registry),
                Histogram(f"{upstream_prefix}_apiserver_requests_duration_seconds", "PV create/delete latency.",
                          ["method"], registry=registry),
            )

    def observe(self, verb: str, resource: str, seconds: float, error: ApiError | None) -> None:
        code = "ok" if error is None else str(error.status or "transport")
        self.requests.labels(verb, resource, code).inc()
        self.duration.labels(verb, resource).observe(seconds)
        if self._upstream and resource == "persistentvolumes" and verb in ("create", "delete"):
            total, failed, duration = self._upstream
            total.labels(verb).inc()
            duration.labels(verb).observe(seconds)
            if error is not None:
                failed.labels(verb).inc()


class _CallbackGauges(Collector):
    """Gauges computed at scrape time (ProcTable stats, cache sizes)."""

    def __init__(self, read: Callable[[], dict[str, float]], names: dict[str, str]) -> None:
        self._read = read
        self._names = names

    def collect(self) -> Iterator[Any]:
        values = self._read()
        for key, help_text in self._names.items():
            yield GaugeMetricFamily(key, help_text, value=values.get(key, 0.0))


class _LabelledGauge(Collector):
    """One gauge whose labelled samples are computed at scrape time."""

    def __init__(self, name: str, help_text: str, labels: tuple[str, ...],
                 read: Callable[[], dict[tuple[str, str], float]]) -> None:
        self._name, self._help, self._labels, self._read = name, help_text, labels, read

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(self._name, self._help, labels=list(self._labels))
        for labels, value in sorted(self._read().items()):
            family.add_metric(list(labels), value)
        yield family


class _VolumeGauges(Collector):
    """``localpv_persistentvolumes`` and ``localpv_persistentvolume_released_seconds``."""

    def __init__(self, read: Callable[[], tuple[dict[tuple[str, str], int], dict[str, float]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        counts, released_for = self._read()
        volumes = GaugeMetricFamily("localpv_persistentvolumes",
                                    "This node's PVs (the agent's cache) by StorageClass and phase.",
                                    labels=["class", "phase"])
        for (cls, phase), count in sorted(counts.items()):
            volumes.add_metric([cls, phase], count)
        yield volumes
        released = GaugeMetricFamily("localpv_persistentvolume_released_seconds",
                                     "Seconds the longest-Released PV of the class has been Released, as seen "
                                     "by this agent since it started (0: none is).", labels=["class"])
        for cls, seconds in sorted(released_for.items()):
            released.add_metric([cls], seconds)
        yield released


class AgentMetrics:
    """Everything the node agent exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.capacity = Gauge(f"{AGENT}_persistentvolume_capacity_bytes",
                              "Total capacity of discovered local volumes.", ["mode"], registry=r)
        self.discovery = Counter(f"{AGENT}_persistentvolume_discovery", "PVs created by discovery.",
                                 ["mode"], registry=r)
        self.discovery_duration = Histogram(f"{AGENT}_persistentvolume_discovery_duration_seconds",
                                            "Time from seeing a volume to its PV being created.", ["mode"],
                                            registry=r)
        self.delete = Counter(f"{AGENT}_persistentvolume_delete", "PVs deleted after cleaning.",
                              ["mode", "type"], registry=r)
        self.delete_failed = Counter(f"{AGENT}_persistentvolume_delete_failed", "Failed cleanups or deletions.",
                                     ["mode", "type"], registry=r)
        self.delete_duration = Histogram(f"{AGENT}_persistentvolume_delete_duration_seconds",
                                         "Time from cleanup start to PV deletion.",
                                         ["mode", "type", "capacity", "cleanup_command"],
                                         buckets=CLEANUP_BUCKETS, registry=r)
        self.api = ApiRequestMetrics(r)
        self.config_reload_failures = Counter("localpv_config_reload_failures",
                                              "Configuration reloads rejected (the last good one stays).",
                                              registry=r)
        self.config_last_reload_ok = Gauge("localpv_config_last_reload_success",
                                           "1 if the newest configuration on disk is in use.", registry=r)
        # The agent starts only with a valid configuration: it is in use from the first scrape.
        self.config_last_reload_ok.set(1)
        self.discovery_errors = Gauge("localpv_discovery_errors",
                                      "Entries or classes that failed in the last discovery pass.", registry=r)
        self.reconcile_duration = Histogram("localpv_reconcile_duration_seconds", "Duration of a reconcile pass.",
                                            registry=r)
        self.reconcile_triggers = Counter("localpv_reconcile_triggers", "What woke the reconcile loop.",
                                          ["trigger"], registry=r)
        self.cleanup_retries = Counter("localpv_cleanup_retries", "Cleanups that failed and were scheduled again.",
                                       ["mode", "type"], registry=r)
        # Exported at 0 from the first scrape: a series born at 1 hides the first failure from
        # increase() and rate(), and so from the alerts (helm/localpv/files/alerts.yaml).
        for mode in CLEANUP_MODES:
            for kind in CLEANUP_KINDS:
                self.delete_failed.labels(mode, kind)
                self.cleanup_retries.labels(mode, kind)
        self.thread_crashes = Counter("localpv_thread_crashes", "Background loops that crashed and were restarted.",
                                      ["thread"], registry=r)
        self.reconcile_failures = Counter("localpv_reconcile_failures",
                                          "Reconcile passes that ended with an unexpected error.", registry=r)
        self.identity_mismatches = Gauge("localpv_volume_identity_mismatches",
                                         "Volume paths held because what they show is not (provably) the volume "
                                         "recorded there: disks renumbered, swapped or replaced. Nothing on them "
                                         "is cleaned, offered or deleted.", ["class"], registry=r)
        self.hung_storage = Gauge("localpv_hung_storage",
                                  "Discovery entries and directories that did not answer in time, by class.",
                                  ["class"], registry=r)

    def watch_stuck(self, probes: Callable[[], float], cleaners: Callable[[], float]) -> None:
        """Threads and cleaner processes blocked on hung storage, read at scrape time."""
        self.registry.register(_CallbackGauges(lambda: {
            "localpv_storage_probes_stuck": probes(), "localpv_cleaners_lingering": cleaners()}, {
            "localpv_storage_probes_stuck": "Threads blocked in a look at storage that did not answer in time.",
            "localpv_cleaners_lingering": "Cleaner processes not reaped yet (running, or killed but stuck on "
                                          "hung storage).",
        }))

    def watch_volume_conditions(self, read: Callable[[], dict[tuple[str, str], float]]) -> None:
        """``localpv_volume_condition``: 1 per abnormal condition of a volume in use (none when healthy)."""
        self.registry.register(_LabelledGauge("localpv_volume_condition",
                                              "Abnormal conditions of this node's Bound and Available volumes "
                                              "(1 while abnormal; no series when healthy).",
                                              ("persistentvolume", "condition"), read))

    def watch_volumes(self, read: Callable[[], tuple[dict[tuple[str, str], int], dict[str, float]]]) -> None:
        """This node's PVs by class and phase, and how long the oldest Released one has
        waited, read at scrape time (see :mod:`localpv.agent.phases`)."""
        self.registry.register(_VolumeGauges(read))

    def watch_proctable(self, stats: Callable[[], dict[str, float]]) -> None:
        """Upstream's ProcTable gauges, read at scrape time."""
        self.registry.register(_CallbackGauges(stats, {
            f"{AGENT}_proctable_running": "Cleanups running now.",
            f"{AGENT}_proctable_succeeded": "Cleanups that succeeded (cumulative).",
            f"{AGENT}_proctable_failed": "Cleanups that failed (cumulative).",
        }))


NODE_CLEANUP = "local_volume_node_cleanup"


class NodeCleanupMetrics:
    """What ``localpv node-cleanup`` exports: upstream's four counters (same names, so its
    dashboards keep working) plus our API request metrics."""

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
        self.api = ApiRequestMetrics(r, upstream_prefix=None)

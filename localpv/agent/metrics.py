"""What the node agent exports, on a registry of its own.

Upstream's names and labels are kept (research/local-static.md §3.10) so existing dashboards
keep working; what upstream lacks is added under ``localpv_``. Each process builds one
registry; tests build their own, so nothing leaks between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from localpv.gauges import CallbackGauges, LabelledGauge
from localpv.kube.metrics import AGENT, ApiRequestMetrics

#: Cleanup durations run from seconds (rm of a few files) to hours (shred of a disk).
CLEANUP_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, float("inf"))
#: The ``mode`` and ``type`` label values of the cleanup counters (see agent/executor.py).
CLEANUP_MODES = ("Filesystem", "Block")
CLEANUP_KINDS = ("process", "job")


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
                                         "recorded there: disks renumbered, swapped or replaced, volumes without "
                                         "identity moved, or known only by the numbers of an earlier boot. Nothing "
                                         "on them is cleaned, offered or deleted.", ["class"], registry=r)
        self.hung_storage = Gauge("localpv_hung_storage",
                                  "Discovery entries and directories that did not answer in time, by class.",
                                  ["class"], registry=r)

    def watch_stuck(self, probes: Callable[[], float], cleaners: Callable[[], float]) -> None:
        """Threads and cleaner processes blocked on hung storage, read at scrape time."""
        self.registry.register(CallbackGauges(lambda: {
            "localpv_storage_probes_stuck": probes(), "localpv_cleaners_lingering": cleaners()}, {
            "localpv_storage_probes_stuck": "Threads blocked in a look at storage that did not answer in time.",
            "localpv_cleaners_lingering": "Cleaner processes not reaped yet (running, or killed but stuck on "
                                          "hung storage).",
        }))

    def watch_volume_conditions(self, read: Callable[[], dict[tuple[str, str], float]]) -> None:
        """``localpv_volume_condition``: 1 per abnormal condition of a volume in use (none when healthy)."""
        self.registry.register(LabelledGauge("localpv_volume_condition",
                                              "Abnormal conditions of this node's Bound and Available volumes "
                                              "(1 while abnormal; no series when healthy).",
                                              ("persistentvolume", "condition"), read))

    def watch_volumes(self, read: Callable[[], tuple[dict[tuple[str, str], int], dict[str, float]]]) -> None:
        """This node's PVs by class and phase, and how long the oldest Released one has
        waited, read at scrape time (see :mod:`localpv.agent.phases`)."""
        self.registry.register(_VolumeGauges(read))

    def watch_proctable(self, stats: Callable[[], dict[str, float]]) -> None:
        """Upstream's ProcTable gauges, read at scrape time."""
        self.registry.register(CallbackGauges(stats, {
            f"{AGENT}_proctable_running": "Cleanups running now.",
            f"{AGENT}_proctable_succeeded": "Cleanups that succeeded (cumulative).",
            f"{AGENT}_proctable_failed": "Cleanups that failed (cumulative).",
        }))

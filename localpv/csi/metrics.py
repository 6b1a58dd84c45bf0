"""Metrics of dynamic volumes, on the agent's registry: operations, CSI calls, pools.

Pool figures are read at scrape time (statfs of each pool, the journal's committed bytes),
so they are never stale and cost nothing between scrapes. Operation counters are exported
at 0 from the first scrape (a series born at 1 hides the first failure from ``increase()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

OPERATIONS = ("provision", "delete", "expand", "reschedule")
RESULTS = ("ok", "failed")


@dataclass(frozen=True)
class PoolFigures:
    """One pool's bytes: filesystem size, free, promised to images, really taken by images."""

    capacity: int
    free: int
    committed: int
    allocated: int
    images: int
    #: What the pool's thin images may still write (their sizes less what they have taken).
    unwritten: int = 0


class _PoolGauges(Collector):
    def __init__(self, read: Callable[[], dict[str, PoolFigures]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Any]:
        figures = self._read()
        families = {
            "capacity": GaugeMetricFamily("localpv_dynamic_pool_capacity_bytes",
                                          "Size of each pool's filesystem.", labels=["pool"]),
            "free": GaugeMetricFamily("localpv_dynamic_pool_free_bytes",
                                      "Bytes free in each pool's filesystem (what thick images and thin images' "
                                      "writes can still take).", labels=["pool"]),
            "committed": GaugeMetricFamily("localpv_dynamic_pool_committed_bytes",
                                           "Sum of the sizes of the pool's images (promised to claims).",
                                           labels=["pool"]),
            "allocated": GaugeMetricFamily("localpv_dynamic_pool_allocated_bytes",
                                           "Bytes the pool's images really take (thin images grow as written).",
                                           labels=["pool"]),
            "images": GaugeMetricFamily("localpv_dynamic_pool_images", "Images recorded in each pool.",
                                        labels=["pool"]),
            "unwritten": GaugeMetricFamily("localpv_dynamic_pool_unwritten_bytes",
                                           "What the pool's thin images may still write (their sizes less the bytes "
                                           "they take): more than the pool's free space less reserved means some "
                                           "tenant's writes will fail below its size.", labels=["pool"]),
        }
        for pool, f in sorted(figures.items()):
            for key, family in families.items():
                family.add_metric([pool], float(getattr(f, key)))
        yield from families.values()


class DynamicMetrics:
    """Registered on the agent's registry when dynamic volumes are on."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.operations = Counter("localpv_dynamic_operations", "Provisioning, deletion, expansion and rescheduling "
                                  "of dynamic volumes, by result.", ["operation", "result"], registry=r)
        self.duration = Histogram("localpv_dynamic_operation_duration_seconds",
                                  "Time of successful operations on dynamic volumes.", ["operation"], registry=r)
        self.calls = Counter("localpv_csi_calls", "CSI and registration calls served, by method and gRPC code.",
                             ["method", "code"], registry=r)
        self.call_duration = Histogram("localpv_csi_call_duration_seconds", "Time to answer CSI calls.", ["method"],
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 10, 60),
                                       registry=r)
        self.capacity_failures = Counter("localpv_dynamic_capacity_publish_failures",
                                         "Failed attempts to list or write this node's CSIStorageCapacity objects "
                                         "(or to ask which version the cluster serves).", registry=r)
        for operation in OPERATIONS:
            for result in RESULTS:
                self.operations.labels(operation, result)

    def observe_call(self, method: str, code: str, seconds: float) -> None:
        short = method.rsplit("/", 1)[-1]
        self.calls.labels(short, code).inc()
        self.call_duration.labels(short).observe(seconds)

    def watch_pools(self, read: Callable[[], dict[str, PoolFigures]]) -> None:
        self.registry.register(_PoolGauges(read))

    def watch_pool_risks(self, read: Callable[[], dict[str, int]]) -> None:
        """``localpv_dynamic_pool_at_risk_bytes``: for each pool at risk (fuller than its
        high-water mark while its free space cannot hold what its thin images may still write),
        the bytes of those promises it cannot hold; no series for a pool that is not."""
        from localpv.gauges import LabelledGauge

        self.registry.register(LabelledGauge(
            "localpv_dynamic_pool_at_risk_bytes",
            "Bytes that thin images of a pool past its high-water mark may still write and its free space "
            "(less reserved) cannot hold; no series while the pool is not at risk.", ("pool",),
            lambda: {(pool,): float(unbacked) for pool, unbacked in read().items()}))

    def watch_capacity(self, published: Callable[[], dict[str, int]], served: Callable[[], bool | None]) -> None:
        """``localpv_dynamic_capacity_bytes{storageclass}``: what this node's CSIStorageCapacity
        object of each class says (no series for a class without one); and
        ``localpv_dynamic_capacity_served``: 1 once the cluster is found to serve the API at some
        version, 0 when it serves none (nothing is published), absent before it answered."""
        from localpv.gauges import LabelledGauge

        self.registry.register(LabelledGauge(
            "localpv_dynamic_capacity_bytes",
            "The capacity this node's CSIStorageCapacity object of each dynamic class publishes (the largest "
            "new volume the agent would accept now).", ("storageclass",),
            lambda: {(name, ): float(value) for name, value in published().items()}))
        self.registry.register(LabelledGauge(
            "localpv_dynamic_capacity_served",
            "1: the cluster serves CSIStorageCapacity and this node publishes its capacity; 0: it serves no version "
            "of it, nothing is published.", (),
            lambda: {} if (answer := served()) is None else {(): float(answer)}))

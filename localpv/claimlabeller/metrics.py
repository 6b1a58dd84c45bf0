"""What ``localpv claim-labeller`` exports, on a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from localpv.kube.metrics import ApiRequestMetrics


class LabellerMetrics:
    """Labels written and claims still waiting for theirs: the agents see a claim of a dynamic class
    only once it is labelled, so a claim waiting long here is a pod waiting long for its volume."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.labelled = Counter("localpv_claim_labels_written",
                                "Node labels written on claims (set, changed or removed), by outcome.",
                                ["action", "outcome"], registry=r)
        self.pending = Gauge("localpv_claim_labels_pending",
                             "Claims of dynamic classes whose node label does not yet follow their selected node.",
                             registry=r)
        self.oldest = Gauge("localpv_claim_labels_oldest_pending_seconds",
                            "How long the claim waiting longest for its node label has waited (0: none waits).",
                            registry=r)
        self.leader = Gauge("localpv_leader", "1 while this replica holds the leader lease.", registry=r)
        self.api = ApiRequestMetrics(r, upstream_prefix=None)

"""Request metrics of the one API client layer (:class:`localpv.kube.api.KubeApi`'s observer).

Every process exports them; the node agent adds upstream's three PV request metrics under
its prefix (research/local-static.md §3.10), so existing dashboards keep working.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from localpv.kube.errors import ApiError

#: local-static-provisioner's metric prefix, which the node agent keeps.
AGENT = "local_volume_provisioner"


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

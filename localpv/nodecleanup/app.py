"""``localpv node-cleanup``'s composition root: the API connection, the controller, the runner."""

from __future__ import annotations

import socket

from localpv.daemon import serve
from localpv.kube.api import KubeApi
from localpv.kube.ratelimit import RateLimiter
from localpv.kube.transport import Transport
from localpv.nodecleanup.controller import NodeCleanupController, NodeCleanupOptions
from localpv.nodecleanup.metrics import NodeCleanupMetrics


def run(options: NodeCleanupOptions, *, transport: Transport, listener: socket.socket | str | None,
        metrics_path: str = "/metrics", limiter: RateLimiter | None = None,
        event_limiter: RateLimiter | None = None) -> None:
    """Run until SIGTERM/SIGINT (``listener`` None: no probes or metrics served). Raises
    ``ValueError``/``OSError`` for a controller it cannot build and
    :class:`~localpv.nodecleanup.controller.NodeCleanupError` when it cannot start."""
    metrics = NodeCleanupMetrics()
    api = KubeApi(transport, observer=metrics.api.observe, user_agent="localpv-node-cleanup", limiter=limiter,
                  event_limiter=event_limiter)
    controller = NodeCleanupController(api, options, metrics=metrics)
    serve(controller, registry=metrics.registry, listener=listener, metrics_path=metrics_path,
          connection=transport.about())

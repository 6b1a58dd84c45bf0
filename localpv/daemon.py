"""The one way a long-running localpv process runs: serve, start, wait, stop.

The node agent, the NFS provisioner and node cleanup are each a :class:`Service` built by
their own ``app`` module (their composition root). This module is what they share:
``/healthz``, ``/ready`` and ``/metrics`` are served before the service starts (a probe must
answer while it starts), the process then waits for SIGTERM or SIGINT (the kubelet stops
pods with SIGTERM) or for the service to finish by itself (an NFS replica that lost its
lease), and stops the service before the server, so that the last scrape still sees it.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from localpv.httpserver import StatusServer

log = logging.getLogger(__name__)

#: A probe's answer: (passes, why).
Verdict = tuple[bool, str]


class Service(Protocol):
    """What a deployable's app gives the runner."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def ready(self) -> Verdict: ...

    def healthy(self) -> Verdict: ...


def serve(
    service: Service,
    *,
    registry: CollectorRegistry,
    listener: socket.socket | str | None,
    metrics_path: str = "/metrics",
    documents: Mapping[str, Callable[[], Any]] | None = None,
    loopback_only: Sequence[str] = (),
    finished: threading.Event | None = None,
    on_started: Callable[[], None] | None = None,
    connection: str = "",
) -> bool:
    """Run ``service`` until a signal (True) or until ``finished`` is set (False).

    ``listener`` is a listening socket (bound by the caller, so that a port in use is reported
    before anything runs), an address, or None to serve nothing. An exception from the
    service's ``start`` stops what was started and propagates, for the caller to report.
    ``connection`` (the API server and where the credentials come from) is logged as the
    service starts: the first thing to check when requests are refused.
    """
    server = (StatusServer(listener, registry, ready=service.ready, healthy=service.healthy,
                           metrics_path=metrics_path, documents=dict(documents or {}),
                           loopback_only=tuple(loopback_only)) if listener is not None else None)
    signalled = threading.Event()
    done = threading.Event()

    def on_signal(*_: object) -> None:
        signalled.set()
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    if finished is not None:
        def on_finished() -> None:
            finished.wait()
            done.set()

        threading.Thread(target=on_finished, name="service-finished", daemon=True).start()
    if server is not None:
        server.start()
    if connection:
        log.info("%s", connection)
    try:
        try:
            service.start()
        except BaseException:
            service.stop()
            raise
        if on_started is not None:
            on_started()
        done.wait()
        service.stop()
    finally:
        if server is not None:
            server.stop()
    return signalled.is_set()

"""The small HTTP endpoint every long-running command serves: metrics and probes.

``/metrics`` (Prometheus text format, from our own registry), ``/healthz`` (the process
is alive and its loop is not stuck), ``/ready`` (upstream's readiness: the last discovery
pass had no errors). Standard library only; one daemon thread.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

#: A probe returns (ok, message).
Probe = Callable[[], tuple[bool, str]]


def parse_listen_address(address: str) -> tuple[str, int]:
    """``:8080`` → ("0.0.0.0", 8080); ``127.0.0.1:0`` → ("127.0.0.1", 0)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f'invalid listen address "{address}" (expected [host]:port)')
    return (host.strip("[]") or "0.0.0.0"), int(port)


class StatusServer:
    """Serves metrics and probes until :meth:`stop`."""

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        *,
        ready: Probe,
        healthy: Probe | None = None,
        metrics_path: str = "/metrics",
        documents: dict[str, Callable[[], Any]] | None = None,
    ) -> None:
        self.registry = registry
        #: Extra read-only JSON documents, e.g. the agent's ``/status``.
        self.documents = documents or {}
        self.probes: dict[str, Probe] = {"/ready": ready, "/healthz": healthy or (lambda: (True, "ok"))}
        self.metrics_path = metrics_path
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == server.metrics_path:
                    self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
                    return
                if path in server.documents:
                    body = json.dumps(server.documents[path](), indent=1, default=str).encode()
                    self._send(200, body, "application/json")
                    return
                probe = server.probes.get(path.rstrip("/") or path)
                if probe is None:
                    self._send(404, b"not found\n", "text/plain")
                    return
                ok, message = probe()
                self._send(200 if ok else 503, (message + "\n").encode(), "text/plain; charset=utf-8")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: " + format, *args)

        self._httpd = ThreadingHTTPServer(parse_listen_address(address), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="status-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

"""The small HTTP endpoint every long-running command serves: metrics and probes.

``/metrics`` (Prometheus text format, from our own registry), ``/healthz`` (the process
is alive and its loop is not stuck), ``/ready`` (upstream's readiness: the last discovery
pass had no errors). Standard library only; one daemon thread.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

#: A probe returns (ok, message).
Probe = Callable[[], tuple[bool, str]]


class ListenError(ValueError):
    """The listen address cannot be served; the message says what was expected and what was found."""


_PORT = re.compile(r"[0-9]{1,5}")
_HOST = re.compile(r"[^\s:\[\]/]*")
_EXAMPLES = '":8080", "127.0.0.1:8080" or "[::1]:8080"'


def parse_listen_address(address: str) -> tuple[str, int]:
    """``:8080`` → ("0.0.0.0", 8080); ``127.0.0.1:0`` → ("127.0.0.1", 0); ``[::1]:9090`` → ("::1", 9090).

    Raises :class:`ListenError` (a ValueError) saying what was expected and what was found.
    """
    host, colon, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]") and ":" in host:
        host = host[1:-1]  # an IPv6 literal
    elif not _HOST.fullmatch(host):
        found = "an IPv6 address without brackets" if host.count(":") else f'"{address}"'
        raise ListenError(f"expected [host]:port ({_EXAMPLES}), found {found}")
    if not colon or not _PORT.fullmatch(port):
        raise ListenError(f'expected [host]:port ({_EXAMPLES}), found "{address}"')
    if int(port) > 65535:
        raise ListenError(f"expected a port 0-65535, found {port}")
    return host or "0.0.0.0", int(port)


def _bind_problem(err: OSError, host: str, port: int) -> str:
    if err.errno == errno.EADDRINUSE:
        return f"expected a free port, found port {port} already in use on {host} (another process listens there)"
    if err.errno == errno.EADDRNOTAVAIL:
        return f"expected an address of this host (or none, for all of them), found {host}, " \
               "which is not an address of this host"
    if err.errno == errno.EACCES:
        return f"expected a port this process may bind, found port {port}, which needs privileges " \
               "(below 1024: root or CAP_NET_BIND_SERVICE)"
    return f"expected an address to listen on, found that {host}:{port} cannot be bound ({err.strerror or err})"


def bind_listener(address: str, backlog: int = 16) -> socket.socket:
    """Parse ``address`` and listen on it now, so that a port in use is known before anything runs.

    Raises :class:`ListenError` with one line: what was expected and what was found.
    """
    host, port = parse_listen_address(address)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as err:
        reason = err.strerror if isinstance(err, socket.gaierror) else str(err)
        raise ListenError(f'expected a host name or address of this host, found "{host}", '
                          f"which does not resolve ({reason})") from err
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As http.server does: a restarted process may bind while old connections linger in
        # TIME_WAIT. It does not let two processes listen on one port (Linux refuses the bind).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as err:
        sock.close()
        raise ListenError(_bind_problem(err, host, port)) from err
    return sock


class StatusServer:
    """Serves metrics and probes until :meth:`stop`."""

    def __init__(
        self,
        address: str | socket.socket,
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

        listener = bind_listener(address) if isinstance(address, str) else address
        httpd = ThreadingHTTPServer(listener.getsockname()[:2], Handler, bind_and_activate=False)
        httpd.socket.close()  # the unbound socket it made: serve the one already listening instead
        httpd.socket = listener
        httpd.address_family = listener.family
        httpd.server_address = listener.getsockname()
        httpd.server_name, httpd.server_port = str(httpd.server_address[0]), int(httpd.server_address[1])
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="status-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever: forever if it never ran
            self._httpd.shutdown()
        self._httpd.server_close()

"""The small HTTP endpoint every long-running command serves: metrics and probes.

``/metrics`` (Prometheus text format, from our own registry), ``/healthz`` (the process
is alive and its loop is not stuck), ``/ready`` (upstream's readiness: the last discovery
pass had no errors). Standard library only; one daemon thread.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import re
import selectors
import socket
import threading
from collections.abc import Callable, Iterable
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
        loopback_only: Iterable[str] = (),
        connection_timeout: float = 5.0,
        max_connections: int = 32,
    ) -> None:
        """``loopback_only`` documents are served only to clients on this host (``kubectl
        exec ... localpv status``): they name claims. Each connection is closed after
        ``connection_timeout`` seconds of silence, and at most ``max_connections`` are served
        at once (one thread each): more are closed at once rather than piling up threads."""
        self.registry = registry
        self.loopback_only = frozenset(loopback_only)
        self.refused_connections = 0
        #: Extra read-only JSON documents, e.g. the agent's ``/status``.
        self.documents = documents or {}
        self.probes: dict[str, Probe] = {"/ready": ready, "/healthz": healthy or (lambda: (True, "ok"))}
        self.metrics_path = metrics_path
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = connection_timeout  # socket timeout: an idle or slow client is dropped

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path in server.loopback_only and not _is_loopback(str(self.client_address[0])):
                    self._send(403, f"{path} is served only on this host: kubectl exec into the pod and run "
                                    "localpv status\n".encode(), "text/plain; charset=utf-8")
                    return
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
        httpd = _BoundedServer(listener.getsockname()[:2], Handler, bind_and_activate=False)
        httpd.slots = threading.BoundedSemaphore(max_connections)
        httpd.on_refused = self._refused
        httpd.socket.close()  # the unbound socket it made: serve the one already listening instead
        httpd.socket = listener
        httpd.address_family = listener.family
        httpd.server_address = listener.getsockname()
        httpd.server_name, httpd.server_port = str(httpd.server_address[0]), int(httpd.server_address[1])
        httpd.daemon_threads = True
        self._httpd = httpd
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="status-http", daemon=True)

    def _serve(self) -> None:
        """Accept connections until :meth:`stop` writes to the wake pipe.

        ``serve_forever`` wakes every half second to look for a shutdown request: a daemon on
        every node woke twice a second for nothing. This loop sleeps in ``select`` on the
        listening socket and the pipe, so the thread runs only when someone asks.
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self._httpd, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj == self._wake_r:
                        return
                    self._httpd.handle_request_noblock()

    def _refused(self) -> None:
        self.refused_connections += 1

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            os.write(self._wake_w, b"x")
            self._thread.join(10)
        self._httpd.server_close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)


def _is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, but only so many: past the bound a connection is closed at
    once (1,500 idle connections once grew a process to 222 threads)."""

    def handle_request_noblock(self) -> None:
        """One waiting connection, handled (socketserver's step of ``serve_forever``)."""
        self._handle_request_noblock()  # type: ignore[attr-defined]

    slots: threading.BoundedSemaphore
    on_refused: Callable[[], None]

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.on_refused()
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

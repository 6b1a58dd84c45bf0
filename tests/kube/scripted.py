"""A tiny HTTP server that answers from a script, and a clock whose waits are written down.

The emulator answers like a real API server; this one answers like a broken one: HTML on
200, a JSON array where an object belongs, a body cut short, a connection reset, a request
left hanging, a watch line that is not JSON. Each test queues the answers it needs, in
order; requests beyond the script get ``default``. Real HTTP (and TLS, when given a
context: client certificates are checked and their subject recorded) through both
transports, so what reaches ``KubeApi`` is what urllib3 really raises.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Reply:
    """A complete response; a non-bytes body is sent as JSON."""

    status: int = 200
    body: Any = b"{}"
    headers: dict[str, str] = field(default_factory=dict)
    #: Declare more bytes than are sent, then close: a body cut short.
    truncate: bool = False


@dataclass(frozen=True)
class Stream:
    """A watch: 200, then these lines, then end the response (or hang until the server stops)."""

    lines: tuple[bytes, ...]
    hang: bool = False


@dataclass(frozen=True)
class Reset:
    """Read the request, then reset the connection (RST, no response)."""


@dataclass(frozen=True)
class Close:
    """Read the request, then close the connection without a word (FIN, no RST): what a
    client sees when the server closed a pooled keep-alive connection as the request went
    out on it."""


@dataclass(frozen=True)
class Hang:
    """Read the request and never answer (until the server stops)."""


Answer = Reply | Stream | Reset | Close | Hang


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    #: Header names in lower case.
    headers: dict[str, str] = field(default_factory=dict)
    #: The common name of the client certificate the request came with, if any.
    client_cn: str | None = None

    @property
    def watch(self) -> bool:
        return self.query.get("watch") == "true"


def status_body(code: int, reason: str, message: str = "scripted") -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}


def event_line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


class ScriptedServer:
    """``with ScriptedServer() as srv: srv.script(Reply(503), Reply(200, {...}))``."""

    def __init__(self, default: Answer | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self.default: Answer = default or Hang()
        self.tls = tls
        self.requests: list[Request] = []
        self._answers: deque[Answer] = deque()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._served = threading.Condition(self._lock)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                headers = {k.lower(): v for k, v in self.headers.items()}
                peer = _client_cn(self.connection)
                with server._lock:
                    server.requests.append(Request(self.command, parts.path, query, headers, peer))
                    answer = server._answers.popleft() if server._answers else server.default
                    server._served.notify_all()
                server._answer(self, answer)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        if tls is not None:
            self._http.socket = tls.wrap_socket(self._http.socket, server_side=True)
        self._thread = threading.Thread(target=self._http.serve_forever, name="scripted-server", daemon=True)

    # ------------------------------------------------------------------ control

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host!s}:{port}"

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    def script(self, *answers: Answer) -> None:
        with self._lock:
            self._answers.extend(answers)

    def wait_requests(self, n: int, timeout: float = 10.0) -> list[Request]:
        """Block until at least ``n`` requests arrived (a deadline, not a sleep)."""
        with self._served:
            if not self._served.wait_for(lambda: len(self.requests) >= n, timeout):
                raise AssertionError(f"only {len(self.requests)} of {n} requests arrived: {self.requests}")
            return list(self.requests)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._http.shutdown()
        self._http.server_close()

    # ------------------------------------------------------------------ answering

    def _answer(self, handler: BaseHTTPRequestHandler, answer: Answer) -> None:
        if isinstance(answer, Hang):
            self._stopped.wait()
            handler.close_connection = True
            return
        if isinstance(answer, Close):
            handler.connection.shutdown(socket.SHUT_RDWR)
            handler.close_connection = True
            return
        if isinstance(answer, Reset):
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.connection.close()
            handler.close_connection = True
            return
        if isinstance(answer, Stream):
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Connection", "close")
            handler.end_headers()
            for line in answer.lines:
                handler.wfile.write(line)
                handler.wfile.flush()
            if answer.hang:
                self._stopped.wait()
            handler.close_connection = True
            return
        body = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
        handler.send_response(answer.status)
        handler.send_header("Content-Type", "application/json")
        for key, value in answer.headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(body) + (100 if answer.truncate else 0)))
        if answer.truncate:
            handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(body)
        handler.wfile.flush()
        if answer.truncate:
            handler.close_connection = True


def _client_cn(connection: socket.socket) -> str | None:
    cert = connection.getpeercert() if isinstance(connection, ssl.SSLSocket) else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class RecordingClock:
    """A :class:`~localpv.clock.Clock` whose waits return at once, advance its time and are recorded."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.waits: list[float] = []
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self.t

    def now(self) -> float:
        return self.monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        with self._lock:
            self.waits.append(timeout)
            self.t += max(0.0, timeout)
        return event.is_set()

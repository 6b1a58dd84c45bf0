"""The HTTP/1.1 server: keep-alive, JSON bodies, chunked watch streams, cut connections."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from localpv_emulator.apiserver.errors import ApiError
from localpv_emulator.apiserver.faults import LostResponse
from localpv_emulator.apiserver.requestlog import RequestInfo, RequestRecord
from localpv_emulator.apiserver.routing import HttpRequest, HttpResponse
from localpv_emulator.apiserver.watch import WatchStream

if TYPE_CHECKING:
    from localpv_emulator.apiserver.server import ApiServer


class EmulatorHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its open connections, so stop/restart can cut them."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: ApiServer) -> None:
        self.api = api
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        super().__init__(address, RequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (a SIGKILLed agent in a campaign, a cut
        connection) is not the emulator's error: no traceback on stderr for it."""
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, ConnectionReset...
            return
        super().handle_error(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def cut_connections(self) -> None:
        """Shut every open connection: keep-alive clients and watches notice the server is gone."""
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class RequestHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; JSON bodies; chunked transfer for watches."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm on, the client's
    # delayed ACK then stalls every response by ~40 ms. kube-apiserver (Go) sets
    # TCP_NODELAY on every connection, and so does this emulator.
    disable_nagle_algorithm = True
    server: EmulatorHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is in ApiServer.requests."""

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        req = HttpRequest(self.command, url.path, query, url.query, self.headers.get("Content-Type", ""),
                          self._read_body(), self.headers.get("Accept", ""))
        api, info = self.server.api, RequestInfo()
        try:
            result = api.dispatcher.handle(req, info)
        except ApiError as err:
            result = HttpResponse.error(err)
        except Exception as exc:  # an emulator bug must surface as a 500, not a dropped connection
            result = HttpResponse.error(ApiError(500, f"emulator error: {type(exc).__name__}: {exc}"))
        status = result.status if isinstance(result, HttpResponse) else 200
        lost = result.lost if isinstance(result, HttpResponse) else None
        api.requests.record(RequestRecord(self.command, url.path, url.query, status, info.verb, info.resource,
                                          info.namespace, info.name, info.subresource, lost=lost is not None))
        if isinstance(result, WatchStream):
            self._stream(result, lambda size: api.requests.sent(info.verb, info.resource, size))
        elif lost is not None:
            self._hang_up(lost)
        else:
            api.requests.sent(info.verb, info.resource, len(result.body))
            self._send(result)

    def _hang_up(self, how: LostResponse) -> None:
        """Lose the answer to a committed write: reset or close the connection where it was due."""
        self.close_connection = True  # "close": the server's usual shutdown sends FIN
        if how == "reset":
            # A zero linger time makes the close send RST instead of FIN. The socket closes
            # for real once its reader is closed too (it holds a reference).
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()
            self.connection.close()

    def _send(self, response: HttpResponse) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-cache, private")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(response.body)

    def _stream(self, stream: WatchStream, sent: Callable[[int], None]) -> None:
        """A watch as a chunked body. A clean end (timeoutSeconds, a dropped watch) sends the
        last chunk and keeps the connection for the client's next request, as kube-apiserver
        does: clients pool it. A cut (``drop_watches(abrupt=True)``, stop, restart) shuts the
        socket mid-body, which the client sees as a broken stream."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            for line in stream.lines(self._client_alive):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                sent(len(line))
            if stream.abrupt():
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            else:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True  # the client went away

    def _client_alive(self) -> bool:
        """A watch client that closed its end is noticed without waiting for the next event."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return not readable or bool(self.connection.recv(1, socket.MSG_PEEK))
        except OSError:
            return False

"""The status server stays small and private under a crowd (issue 12, "Endpoints"): idle
connections are dropped after a timeout, at most so many are served at once, and
``/status`` (it names claims) answers only clients on this host."""

from __future__ import annotations

import socket
import threading
import urllib.request

from prometheus_client import CollectorRegistry

from localpv.httpserver import StatusServer, _is_loopback
from tests.conftest import wait_for


def serve(**kwargs: object) -> StatusServer:
    server = StatusServer("127.0.0.1:0", CollectorRegistry(), ready=lambda: (True, "ok"),
                          documents={"/status": lambda: {"claims": ["team-a/db"]}}, **kwargs)  # type: ignore[arg-type]
    server.start()
    return server


def test_idle_connections_are_bounded_and_dropped() -> None:
    server = serve(connection_timeout=2.0, max_connections=8)
    before = threading.active_count()
    # 24 fit in the accept backlog (16) plus the slots: none waits on the kernel.
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(24)]
    try:
        wait_for(lambda: server.refused_connections >= 16, timeout=10, what="the crowd refused past the bound")
        assert threading.active_count() - before <= 8 + 2, "one thread per idle connection"
        for conn in idle:  # every connection ends: refused at once, or dropped after the timeout
            conn.settimeout(5)
            assert conn.recv(1) == b""
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        for conn in idle:
            conn.close()
        server.stop()


def test_status_is_served_to_this_host_only() -> None:
    server = serve(loopback_only=("/status",))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/status", timeout=5) as resp:
            assert resp.status == 200 and b"team-a/db" in resp.read()
    finally:
        server.stop()
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("::ffff:127.0.0.1")
    assert not _is_loopback("10.244.0.7") and not _is_loopback("192.168.1.2") and not _is_loopback("garbage")


def _wakeups(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status", encoding="ascii") as f:
        line = next(line for line in f if line.startswith("voluntary_ctxt_switches"))
    return int(line.split()[1])


def _waiting_in_select(native_id: int) -> bool:
    """The thread sleeps in the kernel's wait for its descriptors (``epoll_wait``/``poll``/
    ``select``) rather than, say, on the interpreter's lock or while starting a handler."""
    with open(f"/proc/self/task/{native_id}/wchan", encoding="ascii") as f:
        wchan = f.read()
    return any(name in wchan for name in ("epoll", "poll", "select"))


def test_the_server_thread_sleeps_until_someone_asks() -> None:
    """A daemon on every node must not wake for nothing (``serve_forever`` polls twice a second)."""
    server = serve()
    try:
        thread = next(t for t in threading.enumerate() if t.name == "status-http")
        assert thread.native_id is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as resp:
            assert resp.status == 200
        # The response reaches the client while the server thread may still be handing the
        # connection over (thread start, the interpreter's lock): count from its next sleep.
        native_id = thread.native_id
        wait_for(lambda: _waiting_in_select(native_id), timeout=10, what="the server thread back in select")
        before = _wakeups(thread.native_id)
        threading.Event().wait(1.5)  # the window watched, not a synchronisation
        assert _wakeups(thread.native_id) - before == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        server.stop()
    assert not thread.is_alive()

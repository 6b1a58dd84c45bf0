"""HTTP to the API server: one urllib3 pool, the credentials' headers on every request.

This is the narrow interface :class:`~localpv.kube.api.KubeApi` sends through:
:meth:`Transport.request` (one attempt, no retries, no redirects; the body stays unread
until asked for) returns a :class:`Response`, and :meth:`Transport.reauthenticate` says
whether credentials read again now differ (a request refused with 401 is then worth
sending once more). Everything else - what a failure means, what is retried, JSON - is
:mod:`localpv.kube.api`'s.

Why not the ``kubernetes`` package's ApiClient: importing it costs 23 MiB and 0.3 s over
urllib3 and ssl, on every node a DaemonSet runs on, and localpv uses nothing of it but
credentials and the HTTP layer. So a transport is built from one of two sources
(:func:`localpv.kube.client.make_api_client` chooses):

* credentials localpv reads itself (:mod:`localpv.kube.credentials`: the in-cluster service
  account, or a kubeconfig whose user has a token, a token file or a client certificate)
  over a pool of its own (:func:`connect`) - no ``kubernetes`` import;
* the ``kubernetes`` package's configuration, for kubeconfigs that need its auth plugins
  (exec, auth-provider, basic auth, a proxy): its headers as :class:`Credentials`, its
  urllib3 pool (:mod:`localpv.kube.client`).

Both are the same class, so both go through the same :class:`KubeApi` and failure policy:
what reaches it are urllib3's, http.client's and the socket's own exceptions.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlencode

import urllib3

from localpv.clock import Clock, SystemClock

log = logging.getLogger(__name__)

#: How long a token read from a file is used before the file is read again (client-go's figure).
TOKEN_FILE_PERIOD = 60.0


class Credentials(Protocol):
    """Who the requests are from."""

    def headers(self) -> dict[str, str]:
        """The headers that authenticate a request (none for a client certificate alone)."""
        ...

    def refresh(self) -> bool:
        """Read the credentials again now; True if they changed."""
        ...


class Anonymous:
    """No header: anonymous, or a client certificate (which the TLS context carries)."""

    def headers(self) -> dict[str, str]:
        return {}

    def refresh(self) -> bool:
        return False


ANONYMOUS = Anonymous()


class StaticToken:
    """A bearer token written in the kubeconfig itself: it cannot change under us."""

    def __init__(self, token: str) -> None:
        self._header = {"Authorization": f"Bearer {token}"}

    def headers(self) -> dict[str, str]:
        return dict(self._header)

    def refresh(self) -> bool:
        return False


class TokenFile:
    """A bearer token read from a file, and read again once ``period`` has passed.

    The kubelet rotates a service account's projected token in place (it expires within
    the hour, and the API server stops accepting it); client-go re-reads the file about
    once a minute, and so does this. A read that fails or finds the file empty keeps the
    token in hand (logged): the old one may still be valid, and a request is better tried
    than refused here. The first read must succeed (:class:`OSError` or ``ValueError``).
    """

    def __init__(self, path: str, *, clock: Clock | None = None, period: float = TOKEN_FILE_PERIOD) -> None:
        self.path = path
        self.period = period
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._token = self._read()
        self._read_at = self._clock.monotonic()

    def _read(self) -> str:
        with open(self.path, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise ValueError(f"the token file {self.path} is empty")
        return token

    def _reread(self) -> bool:
        """Read the file again (the lock held); True if the token changed."""
        self._read_at = self._clock.monotonic()
        try:
            token = self._read()
        except (OSError, ValueError) as err:
            log.warning("cannot read the token again, keeping the one in hand: %s", err)
            return False
        changed, self._token = token != self._token, token
        return changed

    def headers(self) -> dict[str, str]:
        with self._lock:
            if self._clock.monotonic() - self._read_at >= self.period:
                self._reread()
            return {"Authorization": f"Bearer {self._token}"}

    def refresh(self) -> bool:
        with self._lock:
            return self._reread()


class Response:
    """An answer whose body has not been read yet: :meth:`read` it whole, or :meth:`stream`
    its chunks (a watch); either returns the connection to the pool at the end, and
    :meth:`close` ends it from another thread."""

    def __init__(self, raw: urllib3.BaseHTTPResponse) -> None:
        self._raw = raw
        self.status: int = raw.status
        self.headers: Mapping[str, str] = raw.headers

    def read(self) -> bytes:
        try:
            return self._raw.read()
        finally:
            self._raw.release_conn()

    def stream(self) -> Iterator[bytes]:
        yield from self._raw.stream(None, decode_content=True)

    def close(self) -> None:
        """Unblock a reader in another thread and drop the connection (it may be mid-body)."""
        shutdown = getattr(self._raw, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self._raw.release_conn()


class Transport:
    """Requests to one API server (``server``: its URL, a path prefix included) through
    ``pool``, authenticated by ``credentials``. Thread-safe: urllib3's pools are."""

    def __init__(self, server: str, credentials: Credentials, pool: urllib3.PoolManager, *,
                 description: str = "") -> None:
        self.server = server.rstrip("/")
        self.credentials = credentials
        self.pool = pool
        #: Where the credentials come from, for the one line a daemon logs at start.
        self.description = description

    def request(self, method: str, path: str, *, query: list[tuple[str, Any]] | None = None,
                headers: Mapping[str, str] | None = None, body: bytes | None = None,
                timeout: float | tuple[float, float] | None = None) -> Response:
        """Send one request and return once the status line and headers are in; raises what
        urllib3 raises (never retrying, never following a redirect)."""
        url = self.server + path + ("?" + urlencode(query) if query else "")
        sent = {**(headers or {}), **self.credentials.headers()}
        raw = self.pool.request(method, url, body=body, headers=sent, timeout=_timeout(timeout),
                                preload_content=False, retries=False, redirect=False)
        return Response(raw)

    def about(self) -> str:
        """The server and where the credentials come from (never a secret), for a log line."""
        return f"API server {self.server}: {self.description}" if self.description else f"API server {self.server}"

    def reauthenticate(self) -> bool:
        """Read the credentials again now (after a 401); True if they changed."""
        return self.credentials.refresh()

    def close(self) -> None:
        self.pool.clear()


def _timeout(timeout: float | tuple[float, float] | None) -> urllib3.Timeout | None:
    """A total timeout, or (connect, read) - a watch's read timeout outlasts its request."""
    if timeout is None:
        return None
    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(total=timeout)


def connect(server: str, credentials: Credentials = ANONYMOUS, *, tls: ssl.SSLContext | None = None,
            tls_server_name: str | None = None, pool_size: int = 16, description: str = "") -> Transport:
    """A transport over a pool of localpv's own: ``pool_size`` connections kept (watches,
    workers and informers share them; urllib3's default of 10 would make them queue), no
    urllib3 retries (:class:`~localpv.kube.api.KubeApi` decides), ``tls`` for an https
    server (system roots when None), ``tls_server_name`` checked and sent as SNI instead
    of the server's host."""
    settings: dict[str, Any] = {"maxsize": pool_size, "retries": False}
    if server.startswith("https:"):
        settings["ssl_context"] = tls or tls_context()
        if tls_server_name:
            settings["server_hostname"] = tls_server_name
    return Transport(server, credentials, urllib3.PoolManager(**settings), description=description)


def tls_context(*, ca_file: str | None = None, ca_data: str | None = None, insecure: bool = False,
                cert: tuple[bytes, bytes] | None = None) -> ssl.SSLContext:
    """The TLS settings of a kubeconfig's cluster and user, in memory where the ssl module
    allows: the CA (a file, or PEM data; the system's roots when neither), or no
    verification at all (``insecure``), and a client certificate and key as PEM bytes (see
    :func:`load_client_certificate`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca_file or ca_data:
        context.load_verify_locations(cafile=ca_file, cadata=ca_data)
    else:
        context.load_default_certs()
    if cert is not None:
        load_client_certificate(context, *cert)
    return context


def load_client_certificate(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Give ``context`` a client certificate and key held in memory.

    The ssl module loads them from files only. An anonymous memory file (``memfd``,
    named through /proc/self/fd) keeps the key off every disk; without it (no memfd, no
    /proc), a private 0600 temporary file, removed right after loading.
    """
    data = cert_pem.rstrip(b"\n") + b"\n" + key_pem
    fd = _memory_file()
    if fd is not None:
        try:
            os.write(fd, data)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
            return
        finally:
            os.close(fd)
    import tempfile

    handle, path = tempfile.mkstemp(prefix="localpv-client-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)


def _memory_file() -> int | None:
    """A memfd readable through /proc, or None where there is none."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.memfd_create("localpv-client-certificate", os.MFD_CLOEXEC)
    except OSError:
        return None

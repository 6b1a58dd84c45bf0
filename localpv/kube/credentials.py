"""Cluster credentials localpv reads itself, without the ``kubernetes`` package.

Two sources, the common ones of a provisioner:

* **The in-cluster service account**: ``KUBERNETES_SERVICE_HOST``/``_PORT``, and the
  directory the kubelet mounts (``token``, ``ca.crt``). The token is rotated in place by
  the kubelet, so it is read again about once a minute, and at once after a 401
  (:class:`~localpv.kube.transport.TokenFile`). ``LOCALPV_SERVICEACCOUNT_DIR`` names
  another directory: for tests, or an operator who mounts the token elsewhere.
* **A kubeconfig** whose current context's user has a ``token``, a ``tokenFile`` or a
  client certificate (``client-certificate(-data)`` + ``client-key(-data)``), or nothing,
  with the cluster's ``server``, ``certificate-authority(-data)``,
  ``insecure-skip-tls-verify`` and ``tls-server-name``. Several files (``KUBECONFIG``
  with ``:``) merge as kubectl merges them: the first file to name a cluster, user or
  context wins, and so does the first ``current-context``; a relative path is relative to
  the file that holds it. Precedence as the ``kubernetes`` package's loader, so that the
  same file means the same on both paths: ``token`` before ``tokenFile``, ``-data`` before
  the file.

Anything else - an ``exec`` plugin, an ``auth-provider``, ``username``/``password``,
impersonation, a proxy (``proxy-url``, or one the environment sets for the server) - is
the ``kubernetes`` package's to do: :class:`NeedsLibrary` says why, and
:mod:`localpv.kube.client` hands the same file to it.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from localpv.clock import Clock
from localpv.kube.transport import (
    ANONYMOUS,
    TOKEN_FILE_PERIOD,
    Credentials,
    StaticToken,
    TokenFile,
    tls_context,
)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: Another service-account directory (tests; an operator who mounts the token elsewhere).
SERVICE_ACCOUNT_DIR_ENV = "LOCALPV_SERVICEACCOUNT_DIR"

#: The keys of a kubeconfig user that localpv reads itself (``extensions`` change nothing).
NATIVE_USER_KEYS = frozenset({"token", "tokenFile", "client-certificate", "client-certificate-data",
                              "client-key", "client-key-data", "extensions"})


class CredentialsError(Exception):
    """The credentials cannot be used: one line saying what was expected and what was found."""


class NeedsLibrary(Exception):
    """The credentials need the ``kubernetes`` package (the message says why)."""


@dataclass(frozen=True)
class Access:
    """What it takes to reach one API server."""

    server: str
    credentials: Credentials
    tls: ssl.SSLContext | None
    tls_server_name: str | None
    #: Where it came from, for the line a daemon logs at start (never a secret).
    description: str


def service_account_dir() -> str:
    return os.environ.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR


def in_cluster(*, clock: Clock | None = None) -> Access:
    """The pod's service account, as client-go's ``rest.InClusterConfig`` reads it."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise CredentialsError("expected KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, found "
                               f"{host or '(unset)'} and {port or '(unset)'}")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    _check_no_proxy(server)
    directory = service_account_dir()
    token_path, ca_path = os.path.join(directory, "token"), os.path.join(directory, "ca.crt")
    try:
        token = TokenFile(token_path, clock=clock)
    except (OSError, ValueError) as err:
        raise CredentialsError(f"expected the service account token {token_path}, found {_reason(err)}") from err
    try:
        tls = tls_context(ca_file=ca_path)
    except (OSError, ssl.SSLError) as err:
        raise CredentialsError(f"expected the cluster's CA certificate {ca_path}, found {_reason(err)}") from err
    return Access(server, token, tls, None,
                  f"the service account in {directory} (token read again every {TOKEN_FILE_PERIOD:g}s)")


@dataclass(frozen=True)
class _Entry:
    """One named cluster, user or context, and the directory of the file it came from."""

    value: Mapping[str, Any]
    base: str


def from_kubeconfig(paths: list[str], *, clock: Clock | None = None) -> Access:
    """The current context of the kubeconfig files ``paths`` (those that exist, merged)."""
    sections: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    current = ""
    existing = [path for path in paths if os.path.exists(path)]
    if not existing:
        raise CredentialsError(f"expected a kubeconfig file, found none at {os.pathsep.join(paths)}")
    for path in existing:
        doc = _load(path)
        current = current or _string(doc, "current-context", path)
        base = os.path.dirname(os.path.abspath(path))
        for section, named in sections.items():
            for name, value in _named_entries(doc, section, path):
                named.setdefault(name, _Entry(value, base))
    if not current:
        raise CredentialsError("expected a current-context, found none")
    context = sections["contexts"].get(current)
    if context is None:
        raise CredentialsError(f"expected a context named {current!r} (the current-context), found none")
    cluster_name = _string(context.value, "cluster", f"context {current!r}")
    cluster = sections["clusters"].get(cluster_name)
    if cluster is None:
        raise CredentialsError(f"expected a cluster named {cluster_name!r} (of context {current!r}), found none")
    # A context without a user, or naming none there is, is anonymous: as the kubernetes
    # package reads it (kubectl would refuse the latter).
    user = sections["users"].get(_string(context.value, "user", f"context {current!r}")) or _Entry({}, cluster.base)
    return _access(current, cluster, user, clock)


def _access(context: str, cluster: _Entry, user: _Entry, clock: Clock | None) -> Access:
    server = _string(cluster.value, "server", f"cluster of context {context!r}").rstrip("/")
    if not server:
        raise CredentialsError(f"expected a server for the cluster of context {context!r}, found none")
    if urlsplit(server).scheme not in ("http", "https"):
        raise CredentialsError(f"expected an http or https server URL, found {server!r}")
    others = sorted(k for k, v in user.value.items() if k not in NATIVE_USER_KEYS and v not in (None, "", [], {}))
    if others:
        raise NeedsLibrary(f"the user of context {context!r} authenticates with {', '.join(others)}")
    if cluster.value.get("proxy-url"):
        raise NeedsLibrary(f"the cluster of context {context!r} is reached through a proxy (proxy-url)")
    _check_no_proxy(server)

    credentials: Credentials = ANONYMOUS
    what = "no credentials"
    if token := _string(user.value, "token", "user"):
        credentials, what = StaticToken(token), "a token"
    elif token_file := _string(user.value, "tokenFile", "user"):
        path = os.path.join(user.base, token_file)
        try:
            credentials = TokenFile(path, clock=clock)
        except (OSError, ValueError) as err:
            raise CredentialsError(f"expected the user's tokenFile {path}, found {_reason(err)}") from err
        what = f"a token file read again every {TOKEN_FILE_PERIOD:g}s"
    tls: ssl.SSLContext | None = None
    if server.startswith("https:"):
        cert = _client_certificate(user)
        tls = _cluster_tls(cluster, cert)
        if cert is not None:
            what = "a client certificate" if what == "no credentials" else what + " and a client certificate"
    tls_server_name = _string(cluster.value, "tls-server-name", "cluster") or None
    return Access(server, credentials, tls, tls_server_name, f"context {context!r}, {what}")


def _cluster_tls(cluster: _Entry, cert: tuple[bytes, bytes] | None) -> ssl.SSLContext:
    insecure = cluster.value.get("insecure-skip-tls-verify")
    if not isinstance(insecure, bool | None):
        raise CredentialsError(f"expected insecure-skip-tls-verify to be true or false, found {insecure!r}")
    ca = _file_or_data(cluster, "certificate-authority", "cluster")
    try:
        return tls_context(ca_data=ca.decode("ascii", "replace") if ca is not None else None,
                           insecure=bool(insecure), cert=cert)
    except (OSError, ssl.SSLError) as err:
        raise CredentialsError(f"expected PEM certificates and a key that belongs to the client certificate, "
                               f"found {_reason(err)}") from err


def _client_certificate(user: _Entry) -> tuple[bytes, bytes] | None:
    cert, key = _file_or_data(user, "client-certificate", "user"), _file_or_data(user, "client-key", "user")
    if (cert is None) != (key is None):
        raise CredentialsError("expected client-certificate and client-key together, found only "
                               + ("client-certificate" if key is None else "client-key"))
    return (cert, key) if cert is not None and key is not None else None


def _file_or_data(entry: _Entry, key: str, where: str) -> bytes | None:
    """``key-data`` (base64) if set, else the file ``key`` names, else None."""
    data = _string(entry.value, f"{key}-data", where)
    if data:
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as err:
            raise CredentialsError(f"expected base64 in {key}-data of the {where}, found {_reason(err)}") from err
    path = _string(entry.value, key, where)
    if not path:
        return None
    path = os.path.join(entry.base, path)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise CredentialsError(f"expected the {key} file {path}, found {_reason(err)}") from err


def _check_no_proxy(server: str) -> None:
    """The ``kubernetes`` package sends through a proxy the environment names for the
    server (``HTTPS_PROXY``, unless ``NO_PROXY`` lists it); localpv's own pool does not."""
    from urllib.request import getproxies_environment, proxy_bypass

    proxies = getproxies_environment()
    parts = urlsplit(server)
    if (proxies.get(parts.scheme) or proxies.get("all")) and not proxy_bypass(parts.netloc):
        raise NeedsLibrary(f"the environment sets a proxy for {server}")


def _load(path: str) -> Mapping[str, Any]:
    from localpv.config import safe_load_limited

    try:
        with open(path, encoding="utf-8") as f:
            doc = safe_load_limited(f.read())
    except (OSError, ValueError) as err:
        raise CredentialsError(f"{path}: expected a readable kubeconfig, found {_reason(err)}") from err
    except Exception as err:  # yaml raises YAMLError and, for some inputs, others
        raise CredentialsError(f"{path}: expected a kubeconfig (YAML), found {_reason(err)}") from err
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise CredentialsError(f"{path}: expected a kubeconfig (a YAML mapping), found a YAML {type(doc).__name__}")
    return doc


def _named_entries(doc: Mapping[str, Any], section: str, path: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, value) of each entry of ``clusters``, ``users`` or ``contexts``."""
    field = section[:-1]
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise CredentialsError(f"{path}: expected {section} to be a list, found a {type(entries).__name__}")
    out: list[tuple[str, Mapping[str, Any]]] = []
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        value = entry.get(field) if isinstance(entry, dict) else None
        if not isinstance(name, str) or not isinstance(value, dict | None):
            raise CredentialsError(f"{path}: expected each of {section} to have a name and a {field} mapping, "
                                   f"found {str(entry)[:80]!r}")
        out.append((name, value or {}))
    return out


def _string(mapping: Mapping[str, Any], key: str, where: str) -> str:
    value = mapping.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise CredentialsError(f"expected {key} of the {where} to be a string, found {str(value)[:80]!r}")
    return value


def _reason(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror.lower()
    return " ".join(str(err).split()) or type(err).__name__

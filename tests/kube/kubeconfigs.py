"""Kubeconfigs for tests, and transports built from them the way the daemons build theirs
(:func:`~localpv.kube.client.make_api_client`), on either path: localpv's own
(``localpv``) or through the kubernetes package (``kubernetes``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from localpv.kube.client import LibraryCredentials, make_api_client
from localpv.kube.transport import Transport

#: The two paths; a fault test runs through both.
TRANSPORTS = ("localpv", "kubernetes")
TOKEN = "test-token-1"


def write_kubeconfig(path: Path, server: str, *, user: dict[str, Any] | None = None,
                     cluster: dict[str, Any] | None = None) -> Path:
    """A kubeconfig of one context: ``server`` (and ``cluster``'s other keys), ``user``."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test-cluster", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "test-user", "user": user or {}}],
        "contexts": [{"name": "test", "context": {"cluster": "test-cluster", "user": "test-user"}}]}))
    return path


def built_with(transport: Transport) -> str:
    """Which path built ``transport``."""
    return "kubernetes" if isinstance(transport.credentials, LibraryCredentials) else "localpv"


def transport_from(kind: str, kubeconfig: Path, **kwargs: Any) -> Transport:
    """The transport ``make_api_client`` builds from ``kubeconfig``, on the path ``kind``."""
    transport = make_api_client(str(kubeconfig), transport="kubernetes" if kind == "kubernetes" else "auto", **kwargs)
    assert built_with(transport) == kind, f"{kubeconfig} was meant for the {kind} path"
    return transport

"""The kube layer's tests run through both transports: every fault test gets the same
answer whether localpv or the kubernetes package built the connection."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from localpv.kube.api import KubeApi
from localpv.kube.errors import Backoff
from localpv.kube.transport import Transport
from localpv_emulator.apiserver import ApiServer
from tests.kube.kubeconfigs import TOKEN, TRANSPORTS, transport_from, write_kubeconfig

Connect = Callable[[str], Transport]


@pytest.fixture(params=TRANSPORTS)
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def connect_to(transport_kind: str, tmp_path: Path) -> Connect:
    """A function: server URL -> a transport to it with a token, on the path under test."""
    counter = itertools.count()

    def build(server: str) -> Transport:
        path = write_kubeconfig(tmp_path / f"kubeconfig-{next(counter)}", server, user={"token": TOKEN})
        return transport_from(transport_kind, path)

    return build


@pytest.fixture
def kube(apiserver: ApiServer, connect_to: Connect) -> KubeApi:
    """The product's API seam, pointed at the emulator, with fast retries, on both paths."""
    return KubeApi(connect_to(apiserver.url), backoff=Backoff(initial=0.01, maximum=0.2, attempts=5))

"""The capacity publisher's failures against the API emulator, its inputs as data: a refused
write or an unanswered discovery is counted, said and tried again after a backoff - never in a
loop - and the objects are put right once the API answers again. The clock is manual: the
publisher's passes are counted while time stands still."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from localpv.clock import ManualClock
from localpv.config import ProvisionerConfig
from localpv.config.dynamic import DynamicClass, PoolConfig
from localpv.csi.capacity import Room
from localpv.csi.publisher import CapacityPublisher, CapacitySettings
from localpv.kube.api import KubeApi
from localpv.kube.errors import Backoff
from localpv.kube.transport import connect
from localpv.naming import MiB
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node
from tests.conftest import wait_for

SETTINGS = CapacitySettings(min_interval=10.0, poll_period=60.0, resync_period=300.0, check_period=5.0)
CONFIG = ProvisionerConfig(dynamic_pools={"fast": PoolConfig(name="fast", host_dir="/p", mount_dir="/p")},
                           dynamic_classes={"dyn": DynamicClass("dyn", "fast")})


class Running:
    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.clock = ManualClock()
        self.failures = 0
        self.publisher = CapacityPublisher(
            KubeApi(connect(server.url), backoff=Backoff(initial=0.01, maximum=0.05, attempts=2)), node_name="n1",
            namespace="default", config=lambda: CONFIG, rooms=lambda: {"fast": Room(64 * MiB, 32 * MiB)},
            settings=SETTINGS, clock=self.clock, on_failure=self._failed)
        self.thread = threading.Thread(target=self.publisher.run, daemon=True)

    def _failed(self) -> None:
        self.failures += 1

    def waiting(self) -> None:
        wait_for(lambda: self.clock.waiters >= 1 and not self.publisher._wake.is_set(), what="the publisher to wait")

    def advance(self, seconds: float, *, woken: bool = True) -> None:
        """Move time on once the publisher waits; with ``woken``, wait for the pass that wakes."""
        self.waiting()
        before = self.publisher.passes
        self.clock.advance(seconds)
        if woken:
            wait_for(lambda: self.publisher.passes > before, what="a pass")
        self.waiting()
        if not woken:
            assert self.publisher.passes == before

    def objects(self) -> list[dict[str, object]]:
        return self.server.list("storage.k8s.io/v1", "CSIStorageCapacity", "default")


@pytest.fixture
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    server = ApiServer(binder=False, capacity_versions=getattr(request, "param", ("v1",)))
    server.start()
    server.create(node("n1"))
    env = Running(server)
    try:
        yield env
    finally:
        env.publisher.stop()
        env.thread.join(timeout=5)
        server.stop()


def test_a_refused_write_backs_off_and_pokes_wait_for_it(running: Running) -> None:
    running.server.deny("create", "csistoragecapacities", group="storage.k8s.io")
    running.thread.start()
    wait_for(lambda: running.failures == 1, what="the refused create counted")
    running.waiting()
    passes = running.publisher.passes
    for _ in range(50):  # a burst of pokes while the backoff runs: no request
        running.publisher.poke()
    running.waiting()
    assert running.failures == 1 and running.objects() == []
    assert running.publisher.passes - passes <= 50
    creates = running.server.requests.count("create", "csistoragecapacities")
    assert creates == 1
    running.advance(SETTINGS.min_interval)  # the first retry: refused again, the next wait doubles
    assert running.failures == 2
    running.advance(SETTINGS.min_interval, woken=False)  # within the doubled backoff: not woken
    assert running.failures == 2 and running.server.requests.count("create", "csistoragecapacities") == 2
    running.server.allow_all()
    running.advance(SETTINGS.min_interval)
    wait_for(lambda: len(running.objects()) == 1, what="the object made once the API allows it")
    assert running.objects()[0]["capacity"] == "64Mi"


def test_a_discovery_that_fails_is_tried_again_after_the_backoff(running: Running) -> None:
    running.server.stop()  # the API server down: connections refused
    running.thread.start()
    wait_for(lambda: running.failures >= 1, what="the failed discovery counted")
    running.waiting()
    assert running.failures == 1 and running.publisher.served is None
    running.server.start()  # back, on the same port
    running.advance(SETTINGS.min_interval)
    wait_for(lambda: len(running.objects()) == 1, what="the object made after discovery answered")
    assert running.publisher.served is True


@pytest.mark.parametrize("running", [("v1beta1",)], indirect=True)
def test_a_version_no_longer_served_is_found_again_through_discovery(running: Running) -> None:
    """A cluster upgraded under the agent (1.26 to 1.27: v1beta1 gone, v1 served): the list at the
    old version is 404, and after the backoff discovery finds v1."""
    running.thread.start()
    wait_for(lambda: running.server.list("storage.k8s.io/v1beta1", "CSIStorageCapacity", "default"),
             what="the object at v1beta1")
    running.waiting()
    running.server.capacity_versions = frozenset({"v1"})
    running.advance(SETTINGS.resync_period)
    assert running.failures == 1 and running.objects() == []
    running.advance(SETTINGS.min_interval)
    wait_for(lambda: len(running.objects()) == 1, what="the object made at v1")
    assert running.publisher.resource is not None and running.publisher.resource.version == "v1"

"""Capacity tracking end to end against the API emulator, at each version it serves: an agent's
dynamic side (real pool: ext4 on a loop device; real images; the real controller) publishes one
CSIStorageCapacity object per class for its node, keeps it right across provisioning, deletion,
a pool going and someone deleting the object, coalesces a burst into one write, and writes
nothing where the cluster serves no version.

The publisher runs on a manual clock: time moves only when a test advances it, so "at most one
write per object per interval" and "repaired at the resync" are checked by counting the
emulator's requests, never by sleeping. The controller and the emulator run in real time."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from localpv.cli.statusclient import render_status
from localpv.clock import ManualClock
from localpv.config import ProvisionerConfig
from localpv.config.dynamic import DynamicClass
from localpv.csi import capacity
from localpv.csi.app import DynamicVolumes
from localpv.csi.publisher import CapacitySettings
from localpv.kube.api import KubeApi
from localpv.kube.errors import Backoff
from localpv.kube.objects import Obj
from localpv.kube.transport import connect
from localpv.naming import MiB
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim, node, storage_class
from tests.conftest import wait_for
from tests.csi.conftest import PoolEnv
from tests.support.labeller import running_labeller

pytestmark = pytest.mark.root
DRIVER = "local.csi.localpv.dev"
NODE = "node-1"
NAMESPACE = "localpv"
THIN, THICK = "dyn", "dyn-thick"
SETTINGS = CapacitySettings(min_interval=10.0, poll_period=60.0, resync_period=300.0, check_period=5.0)


@dataclass
class Agent:
    server: ApiServer
    kube: KubeApi
    pool_env: PoolEnv
    state_dir: Path
    socket_dir: Path
    version: str | None
    config: ProvisionerConfig
    clock: ManualClock = field(default_factory=ManualClock)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    dynamic: DynamicVolumes | None = None

    def start(self) -> DynamicVolumes:
        self.dynamic = DynamicVolumes(self.kube, node_name=NODE, config=lambda: self.config,
                                      state_dir=str(self.state_dir), kubelet_dir=str(self.socket_dir),
                                      registry=self.registry, namespace=NAMESPACE, capacity=SETTINGS,
                                      capacity_clock=self.clock)
        self.dynamic.start()
        wait_for(self.dynamic.controller.synced.is_set, what="the controller's caches")
        return self.dynamic

    def stop(self) -> None:
        if self.dynamic is not None:
            self.dynamic.stop()

    @property
    def api_version(self) -> str:
        return f"storage.k8s.io/{self.version}"

    def objects(self) -> dict[str, Obj]:
        """This namespace's capacity objects by class (read directly from the emulator's store)."""
        assert self.version is not None
        return {o["storageClassName"]: o for o in self.server.list(self.api_version, "CSIStorageCapacity", NAMESPACE)}

    def figures(self) -> dict[str, int]:
        return {name: capacity.quantity_bytes(o["capacity"]) or 0 for name, o in self.objects().items()}

    def writes(self) -> int:
        return sum(self.server.requests.count(verb, "csistoragecapacities") for verb in ("create", "update", "delete"))

    def idle(self) -> None:
        """The publisher has finished its pass and waits on the clock (nothing poked meanwhile)."""
        assert self.dynamic is not None and self.dynamic.capacity is not None
        publisher = self.dynamic.capacity
        wait_for(lambda: self.clock.waiters >= 1 and not publisher._wake.is_set(),
                 what="the capacity publisher to wait")

    def advance(self, seconds: float) -> None:
        """Move the publisher's time on, once it waits, and wait for the pass that wakes."""
        self.idle()
        assert self.dynamic is not None and self.dynamic.capacity is not None
        publisher = self.dynamic.capacity
        before = publisher.passes
        self.clock.advance(seconds)
        wait_for(lambda: publisher.passes > before, what="a pass of the capacity publisher")
        self.idle()

    def claim(self, name: str, class_name: str, size: str) -> None:
        self.server.create(claim(name, class_name, size=size, selected_node=NODE))

    def bound(self, name: str) -> bool:
        pvc = self.server.get("v1", "PersistentVolumeClaim", name, "default")
        return bool(pvc and (pvc.get("status") or {}).get("phase") == "Bound")


def _statvfs(root: Path) -> tuple[int, int]:
    st = os.statvfs(root)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def _sample(text: str, series: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(series + " ")))


def _mib(n: int) -> int:
    return n // MiB * MiB


@pytest.fixture
def agent(request: pytest.FixtureRequest, pool_env: PoolEnv, socket_dir: Path, tmp_path: Path) -> Iterator[Agent]:
    version = getattr(request, "param", "v1")
    server = ApiServer(binder=True, capacity_versions=(version,) if version else ())
    server.start()
    kube = KubeApi(connect(server.url), backoff=Backoff(initial=0.01, maximum=0.2, attempts=5))
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    server.create(node(NODE))
    for name, provisioning in ((THIN, "thin"), (THICK, "thick")):
        server.create(storage_class(name, provisioner=DRIVER,
                                    parameters={"pool": "fast", "provisioning": provisioning}))
    config = ProvisionerConfig(dynamic_pools={"fast": pool_env.pool.config}, dynamic_classes={
        THIN: DynamicClass(THIN, "fast"), THICK: DynamicClass(THICK, "fast", provisioning="thick")})
    env = Agent(server, kube, pool_env, tmp_path / "state", socket_dir / "kubelet", version, config)
    try:
        with running_labeller(kube):  # the agent sees a claim once it carries its node's label
            yield env
    finally:
        env.stop()
        server.stop()
    assert server.controller_failures == []


@pytest.mark.parametrize("agent", ["v1", "v1beta1", "v1alpha1"], indirect=True)
def test_each_class_gets_its_figure_which_provisioning_lowers_and_deletion_raises(agent: Agent) -> None:
    size, _ = _statvfs(agent.pool_env.root)
    agent.start()
    objects = wait_for(lambda: len(found := agent.objects()) == 2 and found, what="one object per class")
    node_uid = agent.server.get("v1", "Node", NODE)["metadata"]["uid"]  # type: ignore[index]
    for name, obj in objects.items():
        assert obj["apiVersion"] == agent.api_version and obj["storageClassName"] == name
        assert obj["nodeTopology"] == {"matchLabels": {"topology.localpv.dev/node": NODE}}
        assert obj["metadata"]["ownerReferences"][0]["uid"] == node_uid
        assert obj["capacity"] == obj["maximumVolumeSize"]
    _, free = _statvfs(agent.pool_env.root)
    first = agent.figures()
    assert first == {THIN: _mib(size), THICK: _mib(free)}  # nothing promised yet: the bound, the free space

    agent.claim("thin-claim", THIN, "100Mi")
    wait_for(lambda: agent.bound("thin-claim"), what="the thin claim to be Bound")
    agent.advance(SETTINGS.min_interval)
    wait_for(lambda: agent.figures()[THIN] == _mib(size) - 100 * MiB, what="the thin figure to drop by 100 MiB")
    # The thick figure keeps what the thin image may still write: it drops by nearly as much.
    assert agent.figures()[THICK] <= first[THICK] - 90 * MiB

    agent.claim("thick-claim", THICK, "50Mi")
    wait_for(lambda: agent.bound("thick-claim"), what="the thick claim to be Bound")
    agent.advance(SETTINGS.min_interval)
    wait_for(lambda: agent.figures()[THIN] == _mib(size) - 150 * MiB, what="both promises counted")

    for name in ("thin-claim", "thick-claim"):
        agent.server.delete("v1", "PersistentVolumeClaim", name, "default")
    # The figure follows the journal: its records go last (after the image, the PV and the PV's
    # finalizer), and the publisher's pass must come after that.
    assert agent.dynamic is not None
    journal = agent.dynamic.journal
    wait_for(lambda: not agent.pool_env.pool.images.names() and not journal.snapshot(), timeout=30,
             what="both images removed and their records dropped")
    agent.advance(SETTINGS.min_interval)
    wait_for(lambda: agent.figures()[THIN] == first[THIN], what="the thin figure back")
    assert agent.figures()[THICK] >= first[THICK] - MiB
    text = generate_latest(agent.registry).decode()
    assert _sample(text, f'localpv_dynamic_capacity_bytes{{storageclass="{THIN}"}}') == first[THIN]
    assert _sample(text, "localpv_dynamic_capacity_served") == 1
    status = agent.dynamic.status()  # type: ignore[union-attr]
    assert {"storageclass": THIN, "capacity": first[THIN]} in status["capacity"]  # type: ignore[operator]
    shown = render_status({"node": NODE, "dynamic": status}).splitlines()
    assert any(line.split() == [THIN, f"{first[THIN] >> 20}Mi"] for line in shown), shown


def test_a_burst_of_twenty_provisions_is_one_write_per_object(agent: Agent) -> None:
    size, _ = _statvfs(agent.pool_env.root)
    agent.start()
    wait_for(lambda: len(agent.objects()) == 2, what="one object per class")
    agent.idle()
    before = agent.writes()
    names = [f"burst-{i}" for i in range(20)]
    for name in names:
        agent.claim(name, THIN, "8Mi")
    wait_for(lambda: all(agent.bound(n) for n in names), timeout=60, what="twenty claims Bound")
    agent.idle()
    assert agent.writes() == before  # twenty journal writes poked it: all deferred, none written yet
    agent.advance(SETTINGS.min_interval)
    wait_for(lambda: agent.figures()[THIN] == _mib(size) - 160 * MiB, what="the final figure")
    agent.idle()
    assert agent.writes() - before == 2  # one update per class, with the figure after all twenty


def test_an_object_deleted_or_edited_by_someone_is_repaired_at_the_resync(agent: Agent) -> None:
    agent.start()
    objects = wait_for(lambda: len(found := agent.objects()) == 2 and found, what="one object per class")
    thin, thick = objects[THIN], objects[THICK]
    agent.server.delete(agent.api_version, "CSIStorageCapacity", thin["metadata"]["name"], NAMESPACE)
    edited = {**thick, "capacity": "1Ei", "maximumVolumeSize": "1Ei"}
    agent.server.update(edited)
    agent.advance(SETTINGS.poll_period)  # a poll re-reads the pools, not the objects: nothing seen yet
    agent.idle()
    assert set(agent.objects()) == {THICK} and agent.objects()[THICK]["capacity"] == "1Ei"
    agent.advance(SETTINGS.resync_period)
    wait_for(lambda: (found := agent.objects()).keys() == {THIN, THICK} and found[THICK]["capacity"] != "1Ei",
             what="the deleted object made again and the edited one put right")
    assert agent.objects()[THIN]["capacity"] == thin["capacity"]


def test_a_pool_gone_from_the_node_takes_its_objects_and_one_back_brings_them(agent: Agent) -> None:
    agent.start()
    wait_for(lambda: len(agent.objects()) == 2, what="one object per class")
    with_pool = agent.config
    agent.config = ProvisionerConfig(dynamic_pools={}, dynamic_classes=with_pool.dynamic_classes)
    agent.advance(SETTINGS.check_period)  # the reloaded configuration is seen at the next check
    wait_for(lambda: agent.objects() == {}, what="the objects of the pool's classes deleted")
    agent.config = ProvisionerConfig(dynamic_pools=with_pool.dynamic_pools,
                                     dynamic_classes={THIN: with_pool.dynamic_classes[THIN]})
    agent.advance(SETTINGS.min_interval)  # the interval since the deletion, then the next check
    wait_for(lambda: set(agent.objects()) == {THIN}, what="the remaining class's object back")


@pytest.mark.parametrize("agent", [None], indirect=True)
def test_no_served_version_publishes_nothing_and_says_so_once(agent: Agent, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="localpv.csi.publisher")
    agent.start()
    publisher = agent.dynamic.capacity  # type: ignore[union-attr]
    assert publisher is not None
    wait_for(lambda: publisher.served is False, what="discovery to answer")
    agent.claim("c", THIN, "8Mi")
    wait_for(lambda: agent.bound("c"), what="the claim Bound (provisioning does not need capacity objects)")
    for _ in range(2):  # resyncs ask discovery again, silently
        agent.advance(SETTINGS.resync_period)
    agent.idle()
    said = [r for r in caplog.records if "serves CSIStorageCapacity at none" in r.getMessage()]
    assert len(said) == 1
    assert agent.server.requests.count(resource="csistoragecapacities") == 0
    assert agent.server.requests.count("discovery") >= 3  # asked at start and at each resync
    text = generate_latest(agent.registry).decode()
    assert _sample(text, "localpv_dynamic_capacity_served") == 0 and "localpv_dynamic_capacity_bytes{" not in text
    assert agent.dynamic.problems() == []  # type: ignore[union-attr]

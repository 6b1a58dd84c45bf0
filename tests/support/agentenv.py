"""An agent running against the API emulator, with real discovery directories: the `agent_env`
fixture (tests/agent and tests/reliability use it), and what tests do with such a node."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localpv.agent.journal import Journal
from localpv.agent.metrics import AgentMetrics
from localpv.agent.node import AgentOptions, NodeAgent
from localpv.clock import Clock
from localpv.config import ProvisionerConfig, parse_config
from localpv.host.scan import Entry
from localpv.kube.api import KubeApi, RequestObserver
from localpv.kube.errors import ApiError, Backoff
from localpv.kube.events import EventRecorder
from localpv.kube.transport import connect
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node, storage_class
from tests.conftest import wait_for
from tests.support.hostfs import sh

Obj = dict[str, Any]
NODE = "node-1"
#: Cleanup retries in tests come after fractions of a second, not minutes.
FAST_RETRY = Backoff(initial=0.2, maximum=0.5, factor=2.0, attempts=1_000_000, jitter=0.0)


@dataclass
class AgentEnv:
    """A node with discovery dirs, the emulator, and an agent factory."""

    apiserver: ApiServer
    api: KubeApi
    root: Path
    fs_dir: Path
    block_dir: Path
    state_dir: Path
    agents: list[NodeAgent] = field(default_factory=list)

    def config(self, **overrides: Any) -> ProvisionerConfig:
        data: dict[str, Any] = {"storageClassMap": {
            "local-fs": {"hostDir": "/mnt/disks", "mountDir": str(self.fs_dir)},
            "fast": {"hostDir": "/mnt/fast", "mountDir": str(self.block_dir), "volumeMode": "Block"},
        }}
        data.update(overrides)
        return parse_config(data).config

    def start_agent(
        self,
        config: ProvisionerConfig | None = None,
        *,
        config_path: str | None = None,
        discovery_period: float = 30.0,
        clock: Clock | None = None,
        watch_host: bool = True,
        job_image: str | None = None,
        retry_backoff: Backoff = FAST_RETRY,
        observer: RequestObserver | None = None,
        scanner: Callable[[str, frozenset[str]], list[Entry]] | None = None,
        boot: str | None = None,
    ) -> NodeAgent:
        """``observer``: also told of every request the agent makes (to inject a fault at a moment);
        ``boot``: the boot id the agent takes for this boot's (a node cannot be rebooted in a test)."""
        options = AgentOptions(node_name=NODE, namespace="default", job_image=job_image, config_path=config_path,
                               discovery_period=discovery_period, config_sync_period=0.2, watch_host=watch_host,
                               retry_backoff=retry_backoff, state_dir=str(self.state_dir))
        metrics = AgentMetrics()
        # As in production: the agent's own API handle reports to its request metrics.
        def observe(verb: str, resource: str, seconds: float, error: ApiError | None) -> None:
            metrics.api.observe(verb, resource, seconds, error)
            if observer is not None:
                observer(verb, resource, seconds, error)

        api = KubeApi(self.api.transport, backoff=self.api.backoff, observer=observe)
        recorder = EventRecorder(api, component="test-agent", min_update_interval=0.0)
        agent = NodeAgent(api, options, config or self.config(), Journal(self.state_dir / "journal.json"),
                          metrics=metrics, clock=clock, recorder=recorder, boot=boot,
                          **({"scanner": scanner} if scanner is not None else {}))
        agent.start()
        self.agents.append(agent)
        return agent

    def stop_agents(self) -> None:
        while self.agents:
            self.agents.pop().stop()

    def pvs(self) -> list[dict[str, Any]]:
        return self.apiserver.list("v1", "PersistentVolume")

    def pv_for(self, host_path: str) -> dict[str, Any] | None:
        found = [pv for pv in self.pvs() if pv["spec"].get("local", {}).get("path") == host_path]
        assert len(found) <= 1, f"duplicate PVs for {host_path}: {[p['metadata']['name'] for p in found]}"
        return found[0] if found else None

    def phase(self, host_path: str) -> str | None:
        pv = self.pv_for(host_path)
        return pv.get("status", {}).get("phase") if pv else None


def prepare(apiserver: ApiServer, kube: KubeApi, root: Path) -> AgentEnv:
    """The node, its classes and directories under ``root``, and an empty journal."""
    apiserver.create(node(NODE))
    for sc in (storage_class("local-fs", binding="Immediate"), storage_class("fast", binding="Immediate")):
        apiserver.create(sc)
    env = AgentEnv(apiserver, kube, root, root / "fs", root / "block", root / "state")
    for d in (env.fs_dir, env.block_dir, env.state_dir):
        d.mkdir(parents=True)
    # Tests start on a node whose volumes they make themselves: a journal with nothing to
    # recover. (The agent itself treats a missing journal as lost; tests of that remove it.)
    Journal.initialise(env.state_dir / "journal.json")
    return env


@pytest.fixture
def agent_env(apiserver: ApiServer, kube: KubeApi, tmp_path: Path) -> Iterator[AgentEnv]:
    env = prepare(apiserver, kube, tmp_path)
    try:
        yield env
    finally:
        env.stop_agents()


@contextlib.contextmanager
def fresh_agent_env(root: Path) -> Iterator[AgentEnv]:
    """What the ``agent_env`` fixture gives, with an emulator of its own: for a test that needs
    several nodes in turn (tests/support/swaps.py)."""
    server = ApiServer(binder=True)
    server.start()
    try:
        api = KubeApi(connect(server.url), backoff=Backoff(initial=0.01, maximum=0.2, attempts=5))
        env = prepare(server, api, root)
        try:
            yield env
        finally:
            env.stop_agents()
    finally:
        server.stop()


def bound_claim(env: AgentEnv, name: str, host_path: str) -> Obj:
    """A tenant's claim on the PV of ``host_path``, Bound, and the journal knowing it is used."""
    pv = wait_for(lambda: env.phase(host_path) == "Available" and env.pv_for(host_path), timeout=10,
                  what=f"{host_path} Available")
    env.apiserver.create({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs", "volumeMode": "Filesystem",
                 "volumeName": pv["metadata"]["name"], "resources": {"requests": {"storage": "1Mi"}}}})
    wait_for(lambda: env.phase(host_path) == "Bound", timeout=10, what=f"{host_path} Bound")
    wait_for(lambda: (e := Journal(env.state_dir / "journal.json").get(host_path)) is not None and e.state == "used",
             timeout=10, what=f"the journal records the use of {host_path}")
    return dict(pv)


def events(env: AgentEnv, reason: str, namespace: str = "default") -> list[Obj]:
    return [e for e in env.apiserver.list("v1", "Event", namespace) if e.get("reason") == reason]


def numbers(path: Path) -> str:
    """The journal's ``ident`` of the filesystem mounted at ``path`` (its root's device and inode)."""
    st = os.stat(path)
    return f"fs:{st.st_dev}:{st.st_ino}"


def swap(path_a: Path, path_b: Path, spare: Path) -> None:
    """Trade the mounts at ``path_a`` and ``path_b`` with ``mount --move`` (each keeps its data
    and its device number: an operator's remount script, not a reboot)."""
    spare.mkdir(exist_ok=True)
    sh("mount", "--move", path_a, spare)
    sh("mount", "--move", path_b, path_a)
    sh("mount", "--move", spare, path_b)


def forget_identities(state_dir: Path) -> None:
    """Rewrite the journal as a release from before identities kept it: no ``identity``, no ``boot``."""
    path = state_dir / "journal.json"
    doc = json.loads(path.read_text())
    for record in doc["volumes"].values():
        record.pop("identity", None)
        record.pop("boot", None)
    path.write_text(json.dumps(doc))

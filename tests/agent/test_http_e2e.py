"""The agent's HTTP endpoint: upstream metric names, readiness, and the status view."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from localpv.agent.node import NodeAgent
from localpv.cli.statusclient import render_status
from localpv.httpserver import StatusServer
from localpv_emulator.objects import claim
from tests.agent.conftest import AgentEnv
from tests.conftest import http_get as get
from tests.conftest import wait_for
from tests.support.hostfs import Mounter

pytestmark = pytest.mark.root


@pytest.fixture
def served(agent_env: AgentEnv) -> Iterator[Any]:
    servers: list[StatusServer] = []

    def serve(agent: NodeAgent) -> str:
        server = StatusServer("127.0.0.1:0", agent.metrics.registry, ready=agent.readiness, healthy=agent.healthy,
                              documents={"/status": agent.status})
        server.start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield serve
    for server in servers:
        server.stop()


def metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        metric_name, _, label_text = key.partition("{")
        if metric_name == name and ",".join(sorted(label_text.rstrip("}").split(","))) == wanted:
            return float(value)
    raise AssertionError(f"{name}{{{wanted}}} not exported")


def test_metrics_use_upstream_names_through_a_whole_lifecycle(
    agent_env: AgentEnv, mounter: Mounter, served: Any
) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1", size=32 * 1024 * 1024)
    agent = agent_env.start_agent()
    url = served(agent)
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Available", timeout=5)
    agent_env.apiserver.create(claim("c1", "local-fs"))
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Bound", timeout=5)
    (vol / "x").write_text("data")
    old = agent_env.pv_for("/mnt/disks/vol1")["metadata"]["uid"]  # type: ignore[index]
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    wait_for(lambda: (p := agent_env.pv_for("/mnt/disks/vol1")) and p["metadata"]["uid"] != old, timeout=10)
    agent.reconcile_once()
    status, text = get(url + "/metrics")
    assert status == 200
    prefix = "local_volume_provisioner_"
    assert metric(text, prefix + "persistentvolume_discovery_total", mode="Filesystem") == 2
    assert metric(text, prefix + "persistentvolume_delete_total", mode="Filesystem", type="process") == 1
    assert metric(text, prefix + "persistentvolume_capacity_bytes", mode="Filesystem") == 32 * 1024 * 1024
    assert metric(text, prefix + "proctable_succeeded") == 1
    assert metric(text, prefix + "proctable_running") == 0
    assert metric(text, prefix + "apiserver_requests_total", method="create") == 2
    assert metric(text, prefix + "apiserver_requests_total", method="delete") == 1
    assert f"{prefix}persistentvolume_delete_duration_seconds_bucket" in text
    assert 'capacity="500G"' in text and 'cleanup_command="/scripts/quick_reset.sh"' in text


def test_ready_healthz_and_status(agent_env: AgentEnv, mounter: Mounter, served: Any) -> None:
    mounter.tmpfs(agent_env.fs_dir / "good")
    (agent_env.fs_dir / "plain").mkdir()
    agent = agent_env.start_agent()
    url = served(agent)
    wait_for(lambda: agent.last_plan is not None, timeout=5)
    ready, body = get(url + "/ready")
    assert ready == 503 and "is not a valid mount point" in body
    assert get(url + "/healthz")[0] == 200
    (agent_env.fs_dir / "plain").rmdir()
    agent.reconcile_once()
    assert get(url + "/ready")[0] == 200
    code, text = get(url + "/status")
    doc = json.loads(text)
    assert code == 200 and doc["ready"] is True
    assert [v["path"] for v in doc["volumes"]] == ["/mnt/disks/good"]
    assert doc["volumes"][0]["phase"] == "Available" and doc["volumes"][0]["journal"] == "offered"
    table = render_status(doc)
    assert "/mnt/disks/good" in table and "Available" in table and "offered" in table
    assert doc["healthy"] is True and "health: ok (last pass" in table


def test_status_says_why_healthz_fails() -> None:
    """No command said why /healthz failed: `localpv status` shows what the probe sees."""
    doc = {"node": "n1", "ready": True, "readiness": "ok", "volumes": [], "healthy": False,
           "health": "state dir /var/lib/localpv is not writable"}
    assert "health: FAILING (state dir /var/lib/localpv is not writable)" in render_status(doc)


def test_status_says_when_the_journal_is_recovering() -> None:
    doc = {"node": "n1", "ready": True, "readiness": "ok", "volumes": [], "journal_recovering": True}
    assert "journal: recovering" in render_status(doc)
    assert "recovering" not in render_status(doc | {"journal_recovering": False})

"""The shipped alerts on a real Prometheus, scraping a real `localpv agent` process.

Prometheus (Debian's binary) loads helm/localpv/files/alerts.yaml through the same
per-alert overrides the chart applies (prometheusRule.rules; tests/alerts/shipped.py and
test_chart_monitoring.py hold them equal), with only LocalPVCleanupFailing's `for` made
short, and scrapes the agent every second. The agent runs against the API emulator with a
real tmpfs volume whose cleanup fails (a foreign mount inside it). The test waits, through
Prometheus's HTTP API, for the alert to fire.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from localpv_emulator.objects import claim
from tests.agent.conftest import AgentEnv
from tests.alerts.shipped import alert_rules, alerts, with_overrides
from tests.conftest import http_get, wait_for
from tests.emulator.test_cli import free_port
from tests.support.hostfs import Mounter

pytestmark = pytest.mark.root

ALERT = "LocalPVCleanupFailing"
HOST_PATH = "/mnt/disks/vol1"


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        status, body = http_get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        assert status == 200, f"{path}: HTTP {status} {body[:500]}"
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def alerts(self, state: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return [a for a in found if state is None or a["state"] == state]


@pytest.fixture
def prometheus(prometheus_binary: str, tmp_path: Path) -> Iterator[Callable[[str, Path], Prometheus]]:
    """Starts a real Prometheus scraping one target with a rules file; killed by PID at teardown."""
    started: list[Prometheus] = []

    def start(target: str, rules: Path) -> Prometheus:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "localpv", "static_configs": [{"targets": [target]}]}],
        }))
        log = tmp_path / "prometheus.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([prometheus_binary, f"--config.file={config}",
                                     f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                    stdout=out, stderr=subprocess.STDOUT)
        server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
        started.append(server)
        wait_for(lambda: proc.poll() is not None or http_get(f"{server.url}/-/ready", timeout=1)[0] == 200,
                 timeout=20, what="Prometheus ready")
        assert proc.poll() is None, f"prometheus exited {proc.returncode}: {log.read_text()[-2000:]}"
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.terminate()
            try:
                server.proc.wait(10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(10)


def test_a_failing_cleanup_fires_the_alert_on_a_real_prometheus(
    agent_env: AgentEnv, agent_process: Any, mounter: Mounter, prometheus: Callable[[str, Path], Prometheus],
    tmp_path: Path,
) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent = agent_process({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks",
                                                            "mountDir": str(agent_env.fs_dir)}}})
    target = f"127.0.0.1:{free_port()}"
    agent.argv[agent.argv.index("--listen-address") + 1] = target
    agent.start()
    wait_for(lambda: agent_env.phase(HOST_PATH) == "Available", timeout=20, what="PV Available")

    # The shipped rules with the one override a chart user would set: a short `for`.
    rules = tmp_path / "alerts.yaml"
    rules.write_text(yaml.safe_dump({"groups": with_overrides(alert_rules(), {ALERT: {"for": "1s"}})}))
    prom = prometheus(target, rules)

    # The failure counter was scraped at 0 before anything failed: increase() sees the failure.
    failures = 'local_volume_provisioner_persistentvolume_delete_failed_total{mode="Filesystem", type="process"}'
    wait_for(lambda: [s["value"][1] for s in prom.query(failures)] == ["0"], timeout=15,
             what="the failure counter scraped at 0")
    up = prom.query('up{job="localpv"}')
    assert [s["value"][1] for s in up] == ["1"], up
    assert prom.alerts() == [], "nothing fires on a healthy agent"

    agent_env.apiserver.create(claim("c1", "local-fs"))
    wait_for(lambda: agent_env.phase(HOST_PATH) == "Bound", timeout=10, what="claim bound")
    inner = mounter.tmpfs(vol / "foreign")  # a mount inside the volume fails every clean
    try:
        agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
        firing = wait_for(lambda: [a for a in prom.alerts("firing") if a["labels"]["alertname"] == ALERT],
                          timeout=30, what=f"{ALERT} firing in Prometheus")
        [alert] = firing
        assert alert["labels"]["severity"] == "warning"
        assert alert["labels"]["mode"] == "Filesystem" and alert["labels"]["type"] == "process"
        assert alert["labels"]["instance"] == target
        assert alert["annotations"]["runbook_url"] == "docs/operations.md#a-volume-stuck-released-or-a-cleanup-failing"
        assert agent_env.phase(HOST_PATH) == "Released", "the volume is held back while its cleanup fails"
        series = prom.query(f'ALERTS{{alertname="{ALERT}", alertstate="firing"}}')
        assert len(series) == 1

        # Every shipped rule evaluates against the real scrape without an error, and
        # nothing else fires on this agent.
        evaluated = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
        assert set(evaluated) == {r["alert"] for r in alerts()}
        wait_for(lambda: all(r.get("lastEvaluation", "").startswith("2") for r in
                             (x for g in prom.api("rules")["groups"] for x in g["rules"])),
                 timeout=10, what="every rule evaluated")
        broken = {name: r.get("lastError") for g in prom.api("rules")["groups"] for r in g["rules"]
                  if r["health"] != "ok" for name in [r["name"]]}
        assert broken == {}
        assert {a["labels"]["alertname"] for a in prom.alerts()} == {ALERT}
    finally:
        mounter.umount(inner)

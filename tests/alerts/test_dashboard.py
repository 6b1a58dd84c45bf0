"""The shipped Grafana dashboard (helm/localpv/files/dashboard.json): valid JSON that
Grafana can import, every query reads only metrics localpv exports, and promtool parses
every query (each one put in a throwaway recording rule)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.alerts.shipped import (
    DASHBOARD,
    PROMETHEUS_SERIES,
    dashboard,
    dashboard_exprs,
    exported_metric_names,
    metric_names,
    without_grafana_variables,
)

#: What the dashboard must show (issue 14), as metric names some panel reads.
MUST_SHOW = {
    "capacity": "local_volume_provisioner_persistentvolume_capacity_bytes",
    "cleanup durations": "local_volume_provisioner_persistentvolume_delete_duration_seconds_bucket",
    "cleanup failures": "local_volume_provisioner_persistentvolume_delete_failed_total",
    "API request rates": "localpv_api_requests_total",
    "NFS provisioning": "controller_persistentvolumeclaim_provision_total",
    "NFS provisioning failures": "controller_persistentvolumeclaim_provision_failed_total",
}


def test_the_dashboard_is_json_grafana_can_import() -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert board["uid"] == "localpv" and board["title"]
    assert "id" not in board, "an id would clash with the Grafana it is imported into"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel.get("targets") or []:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert target["refId"] and target["expr"], panel["title"]


def test_every_query_reads_only_metrics_localpv_exports() -> None:
    exported = exported_metric_names() | PROMETHEUS_SERIES
    exprs = dashboard_exprs()
    assert len(exprs) > 20
    for expr in exprs:
        names = metric_names(without_grafana_variables(expr))
        assert names, f"no metric in {expr!r}"
        assert names <= exported, f"{expr!r} reads {sorted(names - exported)}, which localpv does not export"


def test_the_dashboard_shows_what_operators_need() -> None:
    read = set().union(*(metric_names(without_grafana_variables(e)) for e in dashboard_exprs()))
    missing = {what: name for what, name in MUST_SHOW.items() if name not in read}
    assert not missing


def test_promtool_parses_every_query(promtool: str, tmp_path: Path) -> None:
    exprs = [without_grafana_variables(e) for e in dashboard_exprs()]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


def test_promtool_refuses_a_broken_query(promtool: str, tmp_path: Path) -> None:
    """The parse check can fail."""
    board = dashboard()
    target = next(p for p in board["panels"] if p.get("targets"))["targets"][0]
    target["expr"] = target["expr"].replace(")", "", 1)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:query", "expr": without_grafana_variables(target["expr"])}]}]}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode != 0

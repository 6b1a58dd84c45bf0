"""The chart's PrometheusRule and Grafana dashboard ConfigMap, installed with real Helm into
the API emulator: absent by default, and when enabled exactly the shipped files (the
rules with the per-alert overrides of values.yaml applied). The emulator serves the
prometheus-operator CRDs as if installed, and stores what Helm sends.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.alerts.shipped import ALERTS, DASHBOARD, alert_rules, with_overrides
from tests.helm.chart import CHART, NAMESPACE, RELEASE, Install, helm_runs, installed

Obj = dict[str, Any]
FULLNAME = f"{RELEASE}-localpv"

TUNED_RULES: dict[str, Obj] = {"LocalPVCleanupFailing": {"for": "1m", "severity": "critical"},
               "LocalPVApiErrors": {"enabled": False},
               "LocalPVAgentDown": {"expr": 'up{job="my-localpv"} == 0'}}
SCENARIOS: dict[str, Obj] = {
    "defaults": {},
    "enabled": {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
    "tuned": {
        "prometheusRule": {"enabled": True, "namespace": "kube-system", "labels": {"release": "kube-prometheus"},
                           "additionalRuleLabels": {"team": "storage", "severity": "none"},
                           "runbookBaseUrl": "https://example.org/localpv/blob/v0.1.0/", "rules": TUNED_RULES},
        "grafanaDashboard": {"enabled": True, "namespace": "default", "labels": {"grafana_dashboard": None,
                                                                                 "dashboards": "storage"},
                             "annotations": {"grafana_folder": "Storage"}}},
    # an NFS-only release still gets both: the rules cover every localpv process
    "nfs-only": {"nfs": {"server": "nfs.example.com"}, "prometheusRule": {"enabled": True},
                 "grafanaDashboard": {"enabled": True}},
    "unknown-alert": {"prometheusRule": {"enabled": True, "rules": {"LocalPVCleanupFailed": {"for": "1m"}}}},
    "bad-for": {"prometheusRule": {"enabled": True, "rules": {"LocalPVCleanupFailing": {"for": "an hour"}}}},
    "bad-override-key": {"prometheusRule": {"enabled": True, "rules": {"LocalPVCleanupFailing": {"fro": "1m"}}}},
}


@pytest.fixture(scope="module")
def installs(helm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Install]]:
    done = {name: Install(values) for name, values in SCENARIOS.items()}
    with helm_runs(helm_python, done, tmp_path_factory.mktemp("helm")) as installs:
        yield installs


def rule_object(inst: Install) -> Obj:
    [rule] = [o for o in inst.rendered("PrometheusRule") if o["metadata"]["name"] == FULLNAME]
    stored = inst.server.get("monitoring.coreos.com/v1", "PrometheusRule", FULLNAME, rule["metadata"]["namespace"])
    assert stored is not None and stored["spec"] == rule["spec"], "the emulator stored what Helm rendered"
    return rule


def dashboard_configmap(inst: Install) -> Obj:
    [cm] = inst.rendered("ConfigMap", f"{FULLNAME}-dashboard")
    return cm


def test_nothing_is_rendered_by_default(installs: dict[str, Install]) -> None:
    inst = installed(installs, "defaults")
    assert inst.rendered("PrometheusRule") == [] and inst.rendered("ServiceMonitor") == []
    assert inst.rendered("ConfigMap", f"{FULLNAME}-dashboard") == []


def test_the_rule_holds_the_shipped_groups_as_they_are(installs: dict[str, Install]) -> None:
    rule = rule_object(installed(installs, "enabled"))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["app.kubernetes.io/component"] == "monitoring"
    assert rule["spec"]["groups"] == alert_rules()["groups"]


def test_the_rule_template_reads_the_shipped_file() -> None:
    """One source of truth: the template includes files/alerts.yaml, the file promtool tests."""
    assert '.Files.Get "files/alerts.yaml"' in (CHART / "templates" / "prometheusrule.yaml").read_text()
    assert ALERTS.parent == CHART / "files"


def test_values_tune_the_rule_as_documented(installs: dict[str, Install]) -> None:
    rule = rule_object(installed(installs, "tuned"))
    assert rule["metadata"]["namespace"] == "kube-system"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    expected = with_overrides(alert_rules(), TUNED_RULES, runbook_base_url="https://example.org/localpv/blob/v0.1.0/",
                              additional_rule_labels={"team": "storage", "severity": "none"})
    assert rule["spec"]["groups"] == expected
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "LocalPVApiErrors" not in rules
    assert rules["LocalPVCleanupFailing"]["for"] == "1m"
    assert rules["LocalPVCleanupFailing"]["labels"] == {"severity": "critical", "team": "storage"}
    assert rules["LocalPVHungStorage"]["labels"] == {"severity": "warning", "team": "storage"}
    assert rules["LocalPVAgentDown"]["expr"] == 'up{job="my-localpv"} == 0'
    assert rules["LocalPVHungStorage"]["annotations"]["runbook_url"] == (
        "https://example.org/localpv/blob/v0.1.0/docs/operations.md#hung-storage")


def test_the_dashboard_configmap_holds_the_shipped_json(installs: dict[str, Install]) -> None:
    inst = installed(installs, "enabled")
    cm = dashboard_configmap(inst)
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert list(cm["data"]) == ["localpv.json"]
    assert cm["data"]["localpv.json"] == DASHBOARD.read_text().rstrip("\n")
    assert json.loads(cm["data"]["localpv.json"])["uid"] == "localpv"
    stored = inst.server.get("v1", "ConfigMap", f"{FULLNAME}-dashboard", NAMESPACE)
    assert stored is not None and stored["data"] == cm["data"]


def test_values_place_and_label_the_dashboard(installs: dict[str, Install]) -> None:
    cm = dashboard_configmap(installed(installs, "tuned"))
    assert cm["metadata"]["namespace"] == "default"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["labels"]["dashboards"] == "storage"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Storage"}


def test_an_nfs_only_release_gets_the_rule_and_the_dashboard(installs: dict[str, Install]) -> None:
    inst = installed(installs, "nfs-only")
    assert rule_object(inst)["spec"]["groups"] == alert_rules()["groups"]
    assert dashboard_configmap(inst)["data"]["localpv.json"] == DASHBOARD.read_text().rstrip("\n")


@pytest.mark.parametrize(("scenario", "words"), [
    ("unknown-alert", ["LocalPVCleanupFailed", "no such alert", "LocalPVCleanupFailing"]),
    ("bad-for", ["for"]),
    ("bad-override-key", ["fro"]),
])
def test_wrong_overrides_are_refused_with_the_reason(installs: dict[str, Install], scenario: str,
                                                     words: list[str]) -> None:
    error = installs[scenario].error
    assert error is not None, f"{scenario} installed"
    for word in words:
        assert word in error, f"{scenario}: {word!r} not in {error}"

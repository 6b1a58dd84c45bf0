"""The shipped alerting rules (helm/localpv/files/alerts.yaml), as they are: promtool
accepts them, every alert fires and stays quiet in its unit tests, reads only metrics
localpv exports, and carries what Alertmanager and an operator need."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.alerts.shipped import (
    ALERTS,
    PROMETHEUS_SERIES,
    UNIT_TESTS,
    alert_rules,
    alerts,
    exported_metric_names,
    metric_names,
    with_overrides,
)

SEVERITIES = {"critical", "warning", "info"}
#: The sections of docs/operations.md the runbooks point at (see docs/alerts.md).
RUNBOOK_PREFIX = "docs/operations.md#"


def promtool_run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)


def test_promtool_accepts_the_shipped_rules(promtool: str) -> None:
    proc = promtool_run(promtool, "check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


def test_promtool_rejects_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    """The check above can fail: a rules file with a broken expression is refused."""
    rules = alert_rules()
    rules["groups"][0]["rules"][0]["expr"] = "sum by (instance (up)"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(rules))
    assert promtool_run(promtool, "check", "rules", str(broken)).returncode != 0


def test_the_promtool_unit_tests_pass(promtool: str) -> None:
    proc = promtool_run(promtool, "test", "rules", str(UNIT_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_the_unit_tests_fail_when_a_threshold_moves(promtool: str, tmp_path: Path) -> None:
    """The unit tests hold the thresholds: the same tests on rules whose API error ratio
    and retry count thresholds were changed fail."""
    for alert, old, new in [("LocalPVApiErrors", "> 0.05", "> 0.1"),
                            ("LocalPVCleanupRetriedRepeatedly", ">= 3", ">= 2")]:
        rules = alert_rules()
        [rule] = [r for r in alerts(rules) if r["alert"] == alert]
        assert old in rule["expr"]
        rule["expr"] = rule["expr"].replace(old, new)
        changed = tmp_path / alert
        (changed / "rules").mkdir(parents=True)
        (changed / "rules" / "alerts.yaml").write_text(yaml.safe_dump(rules))
        tests = yaml.safe_load(UNIT_TESTS.read_text())
        tests["rule_files"] = ["rules/alerts.yaml"]
        (changed / "tests.yaml").write_text(yaml.safe_dump(tests))
        proc = promtool_run(promtool, "test", "rules", str(changed / "tests.yaml"))
        assert proc.returncode != 0, f"{alert}: {new} passed the unit tests"
        assert alert in proc.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    assert tests["rule_files"] == ["../../helm/localpv/files/alerts.yaml"], "the unit tests must test the shipped file"
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), "alerts never seen firing in tests/alerts/alerts_test.yaml"
    assert names - quiet == set(), "alerts never seen quiet in tests/alerts/alerts_test.yaml"
    assert (firing | quiet) - names == set(), "unit tests of alerts that are not shipped"


def test_every_alert_has_a_severity_summary_description_and_runbook() -> None:
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names)), "duplicate alert names"
    for rule in alerts():
        assert rule["alert"].startswith("LocalPV"), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, rule["alert"]
        assert annotations["runbook_url"].startswith(RUNBOOK_PREFIX), rule["alert"]
        assert "for" in rule, f"{rule['alert']}: state `for` (0m too), it is what prometheusRule.rules tunes"


def test_the_rules_read_only_metrics_localpv_exports() -> None:
    exported = exported_metric_names() | PROMETHEUS_SERIES
    for rule in alerts():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: no metric found in {rule['expr']!r}"
        assert names <= exported, f"{rule['alert']} reads {sorted(names - exported)}, which localpv does not export"


def test_exported_metric_names_are_read_from_the_registries() -> None:
    exported = exported_metric_names()
    assert {"local_volume_provisioner_persistentvolume_delete_failed_total", "localpv_hung_storage",
            "localpv_reconcile_duration_seconds_count", "localpv_storage_probes_stuck",
            "local_volume_provisioner_proctable_running", "controller_persistentvolumeclaim_provision_failed_total",
            "localpv_leader", "local_volume_node_cleanup_persistentvolume_delete_total"} <= exported
    assert "localpv_hung_storage_total" not in exported and "localpv_released_volumes" not in exported


@pytest.mark.parametrize(("expr", "names"), [
    ('up{job="localpv"} == 0', {"up"}),
    ('sum by (job, instance) (rate(a_total{code=~"5..|x{y}"}[10m])) / sum by (job, instance) (rate(a_total[10m]))'
     ' > 0.05', {"a_total"}),
    ("increase(b_total[15m]) > 0 and on (job, instance) c", {"b_total", "c"}),
    ('histogram_quantile(0.9, sum by (le, class) (rate(d_bucket[5m] offset 1h)))', {"d_bucket"}),
    ('max without (pod) (e) unless ignoring (x) group_left (y) f{__name__!="g"} * 1e3', {"e", "f"}),
    ('{__name__="h", job="x"}', {"h"}),
])
def test_metric_names_finds_the_selectors_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_with_overrides_keeps_the_shipped_groups_when_nothing_is_overridden() -> None:
    rules = alert_rules()
    assert with_overrides(rules) == rules["groups"]
    tuned = with_overrides(rules, {"LocalPVCleanupFailing": {"for": "1s", "severity": "critical"},
                                   "LocalPVApiErrors": {"enabled": False}},
                           runbook_base_url="https://example.org/", additional_rule_labels={"severity": "x", "t": "s"})
    assert [g["name"] for g in tuned] == ["localpv-agent", "localpv-nfs"]  # the API group is empty
    [rule] = [r for g in tuned for r in g["rules"] if r["alert"] == "LocalPVCleanupFailing"]
    assert rule["for"] == "1s" and rule["labels"] == {"severity": "critical", "t": "s"}
    assert rule["annotations"]["runbook_url"].startswith("https://example.org/docs/operations.md#")


def test_docs_alerts_md_lists_every_alert_as_shipped() -> None:
    """docs/alerts.md's table: each alert with its severity, expression, `for` and runbook."""
    text = (ALERTS.parents[3] / "docs" / "alerts.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `LocalPV"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[cells[0].strip("`")] = cells
    assert set(rows) == {rule["alert"] for rule in alerts()}
    for rule in alerts():
        name, severity, _, expr, for_, runbook = rows[rule["alert"]]
        assert severity == rule["labels"]["severity"], name
        assert expr.strip("`").replace("\\|", "|") == " ".join(rule["expr"].split()), name
        assert for_ == rule["for"], name
        assert runbook == f"`#{rule['annotations']['runbook_url'].split('#', 1)[1]}`", name

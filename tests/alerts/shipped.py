"""What the chart ships for monitoring (the alerting rules and the Grafana dashboard), and
what the tests need to judge it: the metric names localpv exports, the metric names a
PromQL expression reads, and the chart's per-alert overrides applied in Python."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

from tools.metrics_doc import (
    agent_registry,
    claim_labeller_registry,
    dynamic_registry,
    nfs_registry,
    node_cleanup_registry,
)

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "helm" / "localpv" / "files"
ALERTS = FILES / "alerts.yaml"
DASHBOARD = FILES / "dashboard.json"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")

#: Series Prometheus makes itself, which the rules and the dashboard may read.
PROMETHEUS_SERIES = frozenset({"up"})

Obj = dict[str, Any]


def alert_rules() -> Obj:
    """The shipped rules file, parsed."""
    with open(ALERTS, encoding="utf-8") as f:
        rules: Obj = yaml.safe_load(f)
    return rules


def alerts(rules: Obj | None = None) -> list[Obj]:
    return [rule for group in (rules or alert_rules())["groups"] for rule in group["rules"]]


def dashboard() -> Obj:
    with open(DASHBOARD, encoding="utf-8") as f:
        board: Obj = json.load(f)
    return board


def dashboard_exprs(board: Obj | None = None) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and query variables."""
    board = board or dashboard()
    exprs = []
    panels = list(board["panels"])
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels") or [])  # panels of a collapsed row
        exprs += [t["expr"] for t in panel.get("targets") or []]
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert match, f"variable {var['name']}: expected label_values(<series>, <label>), found {query!r}"
            exprs.append(match.group(1))
    return exprs


#: Grafana's variables, replaced by what they stand for when the expression is run.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "6h", "$instance": ".*"}


def without_grafana_variables(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a Grafana variable the tests do not know in {expr!r}"
    return expr


def with_overrides(rules: Obj, overrides: dict[str, Obj] | None = None, *, runbook_base_url: str = "",
                   additional_rule_labels: dict[str, str] | None = None) -> list[Obj]:
    """The groups the chart's PrometheusRule holds for these values (prometheusRule.rules,
    .runbookBaseUrl, .additionalRuleLabels): the template's rules, restated here so the
    chart test can hold the template to them and the Prometheus test use them."""
    overrides = overrides or {}
    names = {rule["alert"] for rule in alerts(rules)}
    unknown = set(overrides) - names
    assert not unknown, f"no such alerts: {sorted(unknown)}"
    groups = []
    for group in rules["groups"]:
        kept = []
        for shipped_rule in group["rules"]:
            override = overrides.get(shipped_rule["alert"]) or {}
            if override.get("enabled", True) is False:
                continue
            rule = copy.deepcopy(shipped_rule)
            if override.get("expr"):
                rule["expr"] = override["expr"]
            if "for" in override:
                rule["for"] = override["for"]
            rule["labels"] = {**(additional_rule_labels or {}), **(rule.get("labels") or {})}
            if override.get("severity"):
                rule["labels"]["severity"] = override["severity"]
            if rule.get("annotations", {}).get("runbook_url"):
                rule["annotations"]["runbook_url"] = runbook_base_url + rule["annotations"]["runbook_url"]
            kept.append(rule)
        if kept:
            groups.append({**copy.deepcopy(group), "rules": kept})
    return groups


# ------------------------------------------------------------------ metric names

_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
             "summary": ("", "_count", "_sum", "_created"), "gauge": ("",), "unknown": ("",)}


def exported_metric_names() -> frozenset[str]:
    """Every series name a localpv process can export: the agent's (with what dynamic volumes
    add to it), the NFS provisioner's, node cleanup's and the claim labeller's registries, built as the processes
    build them (the ones the metrics reference is generated from) and read the way a scrape
    reads them."""
    registries = [agent_registry(), dynamic_registry(), nfs_registry(), node_cleanup_registry(),
                  claim_labeller_registry()]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return frozenset(names)


_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                       "group_right", "inf", "nan", "atan2"})
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (selectors by name; the tests use this on
    the rules and the dashboard, and check it on known expressions)."""
    text = _STRINGS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        if word.lower() in _KEYWORDS or re.match(r"\s*\(", text[match.end():]):
            continue  # an operator, or a function or aggregation
        names.add(word)
    # A selector by name only in its matchers: {__name__="x"}.
    names.update(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    return names

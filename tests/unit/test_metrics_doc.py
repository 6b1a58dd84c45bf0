"""docs/metrics.md lists exactly what the processes export (``tools/metrics_doc.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tools import metrics_doc
from tools.metrics_doc import COMMAND, PROCESSES, UPSTREAM, exported, metrics_of, render


def test_the_generated_part_of_the_metrics_doc_is_current() -> None:
    committed = metrics_doc.DOC.read_text(encoding="utf-8")
    assert render(committed) == committed, f"docs/metrics.md is stale: run {COMMAND}"


def test_every_exported_metric_has_an_upstream_equivalent_entry() -> None:
    names = {metric.name for metrics in exported().values() for metric in metrics}
    missing = sorted(names - set(UPSTREAM))
    assert not missing, f"say what upstream has for {missing} in UPSTREAM (tools/metrics_doc.py; 'none' if nothing)"
    stale = sorted(set(UPSTREAM) - names)
    assert not stale, f"UPSTREAM in tools/metrics_doc.py names metrics nobody exports any more: {stale}"


@pytest.mark.parametrize(("heading", "command", "factory"), PROCESSES, ids=[p[1] for p in PROCESSES])
def test_documented_names_and_types_are_what_the_exposition_says(heading: str, command: str, factory: object) -> None:
    assert callable(factory)
    registry = factory()
    text = generate_latest(registry).decode()
    for metric in metrics_of(registry):
        assert f"# TYPE {metric.name} {metric.type}\n" in text, (command, metric.name)


def test_the_agent_registry_has_the_scrape_time_gauges() -> None:
    names = {metric.name for metric in metrics_of(metrics_doc.agent_registry())}
    assert {"local_volume_provisioner_proctable_running", "localpv_storage_probes_stuck"} <= names


def test_labels_come_from_the_registration_even_without_samples() -> None:
    registry = CollectorRegistry()
    Counter("x_events", "Events.", ["kind", "zone"], registry=registry)
    Gauge("y_level", "Level.", registry=registry)
    assert [(m.name, m.type, m.labels, m.help) for m in metrics_of(registry)] == [
        ("x_events_total", "counter", ("kind", "zone"), "Events."), ("y_level", "gauge", (), "Level.")]


def test_labels_of_a_custom_collector_are_found_without_samples() -> None:
    class Scraped(Collector):
        def collect(self) -> Iterator[GaugeMetricFamily]:
            yield GaugeMetricFamily("z_things", "Things.", labels=["class", "phase"])

    registry = CollectorRegistry()
    registry.register(Scraped())
    assert [(m.name, m.labels) for m in metrics_of(registry)] == [("z_things", ("class", "phase"))]


def test_a_doc_without_its_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        render("# Metrics\n\nno markers here\n")


def test_a_metric_without_an_upstream_entry_shows_in_the_doc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(UPSTREAM, "localpv_leader")
    text = render(metrics_doc.DOC.read_text(encoding="utf-8"))
    assert "| `localpv_leader` | gauge | - | 1 while this replica holds the leader lease. | (missing:" in text

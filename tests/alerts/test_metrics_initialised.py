"""The cleanup failure counters exist at 0 from the first scrape.

A labelled counter is born when first incremented, at 1; increase() and rate() need two
samples, so the first failure of a process would be invisible to the alerts (a persistent
failure would show only at its first retry, a one-off never)."""

from __future__ import annotations

from prometheus_client import generate_latest

from localpv.agent.metrics import CLEANUP_KINDS, CLEANUP_MODES, AgentMetrics

COUNTERS = ("local_volume_provisioner_persistentvolume_delete_failed_total", "localpv_cleanup_retries_total")


def test_cleanup_failure_counters_start_at_zero_for_every_mode_and_type() -> None:
    registry = AgentMetrics().registry
    for name in COUNTERS:
        for mode in CLEANUP_MODES:
            for kind in CLEANUP_KINDS:
                assert registry.get_sample_value(name, {"mode": mode, "type": kind}) == 0.0, (name, mode, kind)
    text = generate_latest(registry).decode()
    assert 'local_volume_provisioner_persistentvolume_delete_failed_total{mode="Block",type="job"} 0.0' in text


def test_a_failure_is_counted_on_the_initialised_series() -> None:
    metrics = AgentMetrics()
    metrics.delete_failed.labels("Filesystem", "process").inc()
    assert metrics.registry.get_sample_value(COUNTERS[0], {"mode": "Filesystem", "type": "process"}) == 1.0
    assert metrics.registry.get_sample_value(COUNTERS[0], {"mode": "Block", "type": "process"}) == 0.0

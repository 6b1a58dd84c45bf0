"""Generate the metric tables of ``docs/metrics.md`` from the metric registrations.

    python3 -m tools.metrics_doc           # rewrite the part of docs/metrics.md between the markers
    python3 -m tools.metrics_doc --check   # exit 1 if that part is stale

Each process's registry is built the way the process builds it (the node agent's
constructor registers its scrape-time gauges too), then walked: name as exposed, type,
label names and help text come from the code, so they cannot drift. What the code cannot
say, the upstream equivalent of each metric, is kept in :data:`UPSTREAM` below;
``tests/unit/test_metrics_doc.py`` fails when a metric has no entry there or an entry
names a metric that no longer exists. The prose around the markers is written by hand.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from tools import write_or_check

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "metrics.md"
COMMAND = "python3 -m tools.metrics_doc"
BEGIN = "<!-- BEGIN generated metrics: edit tools/metrics_doc.py or the registrations, then run it -->\n"
END = "<!-- END generated metrics -->\n"

_LSP = "local-static-provisioner"
_LIB = "sig-storage-lib-external-provisioner v6 (registered by the library; nfs-subdir never serves them)"

#: The upstream equivalent of every exported metric, by the name it is exposed under.
UPSTREAM: dict[str, str] = {
    # node agent: local-static-provisioner's own names (research: local-static.md §3.10)
    "local_volume_provisioner_persistentvolume_capacity_bytes":
        f"{_LSP}, same name and labels; upstream sums only the volumes created by the last pass "
        "(so it mostly reads 0), localpv every volume that has a PV",
    "local_volume_provisioner_persistentvolume_discovery_total": f"{_LSP}, same name and labels",
    "local_volume_provisioner_persistentvolume_discovery_duration_seconds":
        f"{_LSP}, same name, labels and buckets; timed from the first sight of the volume",
    "local_volume_provisioner_persistentvolume_delete_total": f"{_LSP}, same name and labels",
    "local_volume_provisioner_persistentvolume_delete_failed_total":
        f"{_LSP}, same name and labels; counts failed in-process cleanups, cleanup Jobs that could not be "
        "created and failed PV deletions (a cleanup Job that fails is counted when it is retried, by "
        "`localpv_cleanup_retries_total`)",
    "local_volume_provisioner_persistentvolume_delete_duration_seconds":
        f"{_LSP}, same name and labels; buckets 1 s to 12 h instead of Prometheus's default 5 ms to 10 s",
    "local_volume_provisioner_apiserver_requests_total": f"{_LSP}, same name and labels (PV create and delete)",
    "local_volume_provisioner_apiserver_requests_failed_total": f"{_LSP}, same name and labels",
    "local_volume_provisioner_apiserver_requests_duration_seconds": f"{_LSP}, same name and labels",
    "local_volume_provisioner_proctable_running": f"{_LSP}, same name",
    "local_volume_provisioner_proctable_succeeded": f"{_LSP}, same name",
    "local_volume_provisioner_proctable_failed": f"{_LSP}, same name",
    "localpv_api_requests_total": "none; upstream counts PV create and delete only (`*_apiserver_requests_total`)",
    "localpv_api_request_duration_seconds": "none",
    "localpv_config_reload_failures_total": "none; upstream exits on a configuration it cannot parse",
    "localpv_config_last_reload_success": "none",
    "localpv_discovery_errors": "none; upstream shows them only as a failing `/ready`",
    "localpv_reconcile_duration_seconds": "none",
    "localpv_reconcile_triggers_total": "none; upstream polls every 10 s",
    "localpv_cleanup_retries_total": "none; upstream retries a failed in-process cleanup at once and never a "
                                     "failed Job",
    "localpv_thread_crashes_total": "none",
    "localpv_reconcile_failures_total": "none",
    "localpv_hung_storage": "none",
    "localpv_volume_identity_mismatches": "none; upstream knows a volume by its path only",
    "localpv_volume_condition": "none for local volumes (local-static-provisioner issue #10); for CSI drivers "
                                "the external health monitor reports the same conditions as `VolumeConditionAbnormal` "
                                "events, with no metric",
    "localpv_persistentvolumes": "none (kube-state-metrics' kube_persistentvolume_status_phase counts every PV "
                                 "of the cluster, with no node)",
    "localpv_persistentvolume_released_seconds": "none",
    "localpv_storage_probes_stuck": "none",
    "localpv_cleaners_lingering": "none",
    # NFS provisioner: the external-provisioner library's controller metrics (research: nfs-and-peers.md B.9)
    "controller_persistentvolumeclaim_provision_total": f"{_LIB}, same name and labels (v11 adds `source`)",
    "controller_persistentvolumeclaim_provision_failed_total": f"{_LIB}, same name and labels",
    "controller_persistentvolumeclaim_provision_duration_seconds": f"{_LIB}, same name and labels",
    "controller_persistentvolume_delete_total": f"{_LIB}, same name and labels",
    "controller_persistentvolume_delete_failed_total": f"{_LIB}, same name and labels",
    "controller_persistentvolume_delete_duration_seconds": f"{_LIB}, same name and labels",
    "localpv_nfs_directories_created_total": "none",
    "localpv_nfs_path_rejections_total": "none; upstream does not check rendered paths",
    "localpv_nfs_gave_up_total": "none; the library stops retrying silently after its failure thresholds",
    "localpv_leader": "none",
    # node cleanup: local-static-provisioner's node-cleanup controller (research: local-static.md §3.10)
    "local_volume_node_cleanup_persistentvolume_delete_total": f"{_LSP} node-cleanup, same name and labels",
    "local_volume_node_cleanup_persistentvolume_delete_failed_total": f"{_LSP} node-cleanup, same name and labels",
    "local_volume_node_cleanup_persistentvolumeclaim_delete_total": f"{_LSP} node-cleanup, same name",
    "local_volume_node_cleanup_persistentvolumeclaim_delete_failed_total": f"{_LSP} node-cleanup, same name",
    "local_volume_node_cleanup_pod_delete_total": "none: upstream's node-cleanup deletes no pods",
    "local_volume_node_cleanup_pod_delete_failed_total": "none",
    # dynamic volumes (in the node agent, with a dynamicClassMap)
    "localpv_dynamic_operations_total": "external-provisioner's controller_operation counts; none for deletion "
                                        "and expansion in local-path-provisioner",
    "localpv_dynamic_operation_duration_seconds": "external-provisioner's operation duration histogram",
    "localpv_csi_calls_total": "csi-lib-utils' csi_sidecar_operations_seconds count (kubelet side: "
                               "csi_operations_seconds)",
    "localpv_csi_call_duration_seconds": "kubelet's csi_operations_seconds",
    "localpv_dynamic_pool_capacity_bytes": "none (local-path-provisioner and OpenEBS hostpath report no pools)",
    "localpv_dynamic_pool_free_bytes": "none",
    "localpv_dynamic_pool_committed_bytes": "none",
    "localpv_dynamic_pool_allocated_bytes": "none",
    "localpv_dynamic_pool_images": "none",
    "localpv_dynamic_pool_unwritten_bytes": "none",
    "localpv_dynamic_pool_at_risk_bytes": "none",
    "localpv_dynamic_capacity_bytes": "none (external-provisioner publishes the objects; kube-state-metrics can "
                                      "read them)",
    "localpv_dynamic_capacity_served": "none",
    "localpv_dynamic_capacity_publish_failures_total": "none (external-provisioner logs its capacity errors)",
}


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    labels: tuple[str, ...]
    help: str


def agent_registry() -> CollectorRegistry:
    """The registry ``localpv agent`` serves: built by a NodeAgent, which adds the scrape-time gauges."""
    from localpv.agent.journal import Journal
    from localpv.agent.node import AgentOptions, NodeAgent
    from localpv.config import ProvisionerConfig
    from localpv.kube.api import KubeApi

    # The constructor talks to nobody; start() would.
    agent = NodeAgent(cast(KubeApi, None), AgentOptions(node_name="docs"), ProvisionerConfig(), Journal(None))
    agent.procs.shutdown()
    return agent.metrics.registry


def dynamic_registry() -> CollectorRegistry:
    """What dynamic volumes add to the agent's registry (only when a dynamicClassMap exists)."""
    from localpv.csi.metrics import DynamicMetrics

    metrics = DynamicMetrics()
    metrics.watch_pools(dict)
    metrics.watch_pool_risks(dict)
    metrics.watch_capacity(dict, lambda: None)
    return metrics.registry


def nfs_registry() -> CollectorRegistry:
    from localpv.nfs.metrics import NfsMetrics

    return NfsMetrics().registry


def node_cleanup_registry() -> CollectorRegistry:
    from localpv.nodecleanup.metrics import NodeCleanupMetrics

    return NodeCleanupMetrics().registry


#: (heading, command, registry factory) of every process that serves /metrics.
PROCESSES: tuple[tuple[str, str, Callable[[], CollectorRegistry]], ...] = (
    ("Node agent", "localpv agent", agent_registry),
    ("Node agent: dynamic volumes", "localpv agent (with a dynamicClassMap)", dynamic_registry),
    ("NFS provisioner", "localpv nfs", nfs_registry),
    ("Node cleanup", "localpv node-cleanup", node_cleanup_registry),
)


def _collectors(registry: CollectorRegistry) -> Iterator[Any]:
    # prometheus_client has no public way to list a registry's collectors, nor the label
    # names of a labelled metric that has no child yet; both are read from its internals.
    yield from list(registry._collector_to_names)


def metrics_of(registry: CollectorRegistry) -> list[Metric]:
    """Every metric family a registry exposes, in registration order."""
    out: list[Metric] = []
    for collector in _collectors(registry):
        wrapped = isinstance(collector, MetricWrapperBase)
        for family in collector.describe() if wrapped else collector.collect():
            # A metric's label names (or a custom collector's family's), whether or not it has samples.
            owner = collector if wrapped else family
            labels = tuple(getattr(owner, "_labelnames", ()))
            for sample in family.samples:
                labels += tuple(k for k in sample.labels if k not in labels and k not in ("le", "quantile"))
            name = f"{family.name}_total" if family.type == "counter" else family.name
            out.append(Metric(name, family.type, labels, family.documentation))
    return out


def exported() -> dict[str, list[Metric]]:
    """Heading -> the metrics that process exports."""
    return {heading: metrics_of(factory()) for heading, _, factory in PROCESSES}


def _cell(text: str) -> str:
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def generated_part() -> str:
    lines: list[str] = []
    for heading, command, factory in PROCESSES:
        lines += [f"### {heading} (`{command}`)", "",
                  "| Metric | Type | Labels | Help | Upstream equivalent |", "|---|---|---|---|---|"]
        for metric in metrics_of(factory()):
            labels = ", ".join(f"`{label}`" for label in metric.labels) or "-"
            upstream = UPSTREAM.get(metric.name, "(missing: add it to UPSTREAM in tools/metrics_doc.py)")
            lines.append(f"| `{metric.name}` | {metric.type} | {labels} | {_cell(metric.help)} | {_cell(upstream)} |")
        lines.append("")
    return "\n".join(lines)


def render(document: str) -> str:
    """``document`` with the part between the markers replaced by the generated tables."""
    match = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), document, re.S)
    if match is None:
        raise ValueError(f"{DOC.relative_to(REPO)} lost its markers; put them back:\n{BEGIN}{END}")
    return document[:match.start()] + BEGIN + "\n" + generated_part() + "\n" + END + document[match.end():]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the generated part is stale, write nothing")
    args = parser.parse_args(argv)
    current = DOC.read_text(encoding="utf-8")
    try:
        text = render(current)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return write_or_check(DOC, text, current, check=args.check, repo=REPO, command=COMMAND)


if __name__ == "__main__":
    sys.exit(main())

"""``localpv node-cleanup``: frees PVCs and PVs pinned to lost (deleted, or out-of-service) Nodes."""

from __future__ import annotations

import sys

import click

from localpv.cli.common import (
    KUBECONFIG_OPTION,
    METRICS_PATH_OPTION,
    api_client_or_exit,
    bad_parameter,
    duration_param,
    kube_api_rate_options,
    listen_or_exit,
    one_line,
)
from localpv.cli.root import cli
from localpv.kube.ratelimit import CONTROLLER_EVENT_RATE, CONTROLLER_RATE, rate_limiter


def _driver_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A CSI driver name, by the rule the ConfigMap's ``csiDriverName`` follows."""
    from localpv.config.dynamic import driver_name_problem

    if (problem := driver_name_problem(value)) is not None:
        raise bad_parameter(ctx, param, value, problem)
    return value


@cli.command("node-cleanup")
@click.option("--storageclass-names", default="", envvar="LOCALPV_STORAGECLASS_NAMES",
              help="Comma list of the StorageClasses whose PVCs and PVs may be removed (empty: none).")
@click.option("--pvc-deletion-delay", default="60s", show_default=True, callback=duration_param,
              help="How long a deleted Node may take to come back before its volumes' PVCs are deleted.")
@click.option("--stale-pv-discovery-interval", default="10s", show_default=True, callback=duration_param,
              help="Period of the scan that deletes unclaimed PVs of deleted Nodes.")
@click.option("--resync", default="10m", show_default=True, callback=duration_param,
              help="Safety-net period of the scan for PVCs to free (a Node deletion triggers it at once).")
@click.option("--csi-driver-name", default="local.csi.localpv.dev", show_default=True, callback=_driver_name,
              envvar="LOCALPV_CSI_DRIVER_NAME",
              help="The CSI driver whose PVs are localpv's dynamic volumes (the ConfigMap's csiDriverName).")
@click.option("--out-of-service-taint/--no-out-of-service-taint", default=False, show_default=True,
              help="Also treat a Node with the node.kubernetes.io/out-of-service taint as lost.")
@click.option("--out-of-service-delay", default="5m", show_default=True, callback=duration_param,
              help="How long a Node must stay out of service before its volumes' PVCs are deleted.")
@click.option("--delete-pods/--no-delete-pods", default=True, show_default=True,
              help="Delete the pods still waiting on a PVC released for a lost Node, so their controller "
                   "re-creates them (with a new, empty volume elsewhere).")
@click.option("--worker-threads", default=10, show_default=True, type=click.IntRange(1, 256),
              help="Concurrent PVC checks and deletions.")
@KUBECONFIG_OPTION
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz (empty disables).")
@METRICS_PATH_OPTION
@kube_api_rate_options(CONTROLLER_RATE, CONTROLLER_EVENT_RATE)
def node_cleanup(storageclass_names: str, pvc_deletion_delay: float, stale_pv_discovery_interval: float,
                 resync: float, csi_driver_name: str, out_of_service_taint: bool, out_of_service_delay: float,
                 delete_pods: bool, worker_threads: int, kubeconfig: str | None, listen_address: str,
                 metrics_path: str, kube_api_qps: float, kube_api_burst: int, event_qps: float,
                 event_burst: int) -> None:
    """Remove PVCs and PVs pinned to lost Nodes (opt-in per StorageClass; data is never touched)."""
    from localpv.nodecleanup.app import run
    from localpv.nodecleanup.controller import NodeCleanupError, NodeCleanupOptions, parse_class_names

    options = NodeCleanupOptions(parse_class_names(storageclass_names), pvc_deletion_delay,
                                 stale_pv_discovery_interval, resync, worker_threads, driver=csi_driver_name,
                                 out_of_service=out_of_service_taint, out_of_service_delay=out_of_service_delay,
                                 delete_pods=delete_pods)
    transport = api_client_or_exit(kubeconfig)
    listener = listen_or_exit(listen_address) if listen_address else None
    try:
        run(options, transport=transport, listener=listener, metrics_path=metrics_path,
            limiter=rate_limiter(kube_api_qps, kube_api_burst), event_limiter=rate_limiter(event_qps, event_burst))
    except (ValueError, OSError, NodeCleanupError) as err:
        click.echo(f"error: {one_line(str(err))}", err=True)
        sys.exit(1)

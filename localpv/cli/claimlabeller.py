"""``localpv claim-labeller``: labels each claim of a dynamic class with its selected node."""

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
    namespace_param,
    one_line,
    refuse,
)
from localpv.cli.root import cli
from localpv.config.dynamic import DEFAULT_DRIVER_NAME
from localpv.kube.ratelimit import CONTROLLER_EVENT_RATE, CONTROLLER_RATE, rate_limiter
from localpv.naming import DNS1123_SUBDOMAIN_RE


def _driver_param(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if 0 < len(value) <= 63 and DNS1123_SUBDOMAIN_RE.fullmatch(value):
        return value
    raise bad_parameter(ctx, param, value, "expected a CSI driver name (a DNS-1123 subdomain of at most 63 "
                                           f"characters, such as {DEFAULT_DRIVER_NAME}), got {value!r}")


@cli.command("claim-labeller")
@click.option("--driver-name", default=DEFAULT_DRIVER_NAME, show_default=True, envvar="LOCALPV_DRIVER_NAME",
              callback=_driver_param, help="The CSI driver whose StorageClasses' claims are labelled.")
@click.option("--leader-election/--no-leader-election", default=True, show_default=True,
              envvar="LOCALPV_LEADER_ELECTION", help="Campaign for a Lease (one replica labels at a time).")
@click.option("--namespace", envvar="POD_NAMESPACE", default="default", show_default=True, callback=namespace_param,
              help="Namespace of the leader Lease (env POD_NAMESPACE).")
@click.option("--report-after", default="60s", show_default=True, callback=duration_param,
              envvar="LOCALPV_REPORT_AFTER",
              help="A claim whose label could not be written for this long gets a Warning event.")
@click.option("--resync", default="10m", show_default=True, callback=duration_param,
              help="Safety-net period of the claims' relist (jittered).")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="Concurrent label writes.")
@KUBECONFIG_OPTION
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz (empty disables).")
@METRICS_PATH_OPTION
@kube_api_rate_options(CONTROLLER_RATE, CONTROLLER_EVENT_RATE)
def claim_labeller(driver_name: str, leader_election: bool, namespace: str, report_after: float, resync: float,
                   workers: int, kubeconfig: str | None, listen_address: str, metrics_path: str, kube_api_qps: float,
                   kube_api_burst: int, event_qps: float, event_burst: int) -> None:
    """Label each claim of the driver's StorageClasses with its selected node, so that every agent
    watches its own node's claims only (docs/dynamic-volumes.md, "A fleet")."""
    from localpv.claimlabeller.app import LabellerOptions, run
    from localpv.claimlabeller.controller import LabellerSettings

    if report_after <= 0:
        refuse(f"--report-after {report_after:g}s", "expected a positive duration")
    options = LabellerOptions(LabellerSettings(driver_name, workers=workers, report_after=report_after,
                                               resync_period=resync),
                              leader_election=leader_election, namespace=namespace)
    transport = api_client_or_exit(kubeconfig)
    listener = listen_or_exit(listen_address) if listen_address else None
    try:
        code = run(options, transport=transport, listener=listener, metrics_path=metrics_path,
                   limiter=rate_limiter(kube_api_qps, kube_api_burst),
                   event_limiter=rate_limiter(event_qps, event_burst))
    except (ValueError, OSError) as err:
        click.echo(f"error: {one_line(str(err))}", err=True)
        sys.exit(1)
    sys.exit(code)

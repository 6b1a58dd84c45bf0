"""``localpv nfs``: one subdirectory of an NFS export per claim."""

from __future__ import annotations

import sys

import click

from localpv.cli.common import (
    CONFIG_ERROR_EXIT,
    KUBECONFIG_OPTION,
    api_client_or_exit,
    duration_param,
    kube_api_rate_options,
    listen_or_exit,
    named,
    namespace_param,
    one_line,
)
from localpv.cli.root import cli
from localpv.kube.ratelimit import CONTROLLER_EVENT_RATE, CONTROLLER_RATE, rate_limiter
from localpv.naming import (
    provisioner_name_problem,
    quote,
)


def _octal_mode(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        mode = int(value, 8)
    except ValueError as err:
        raise click.BadParameter(f"expected an octal mode such as 0777, got {value!r}") from err
    if not 0 <= mode <= 0o7777:
        raise click.BadParameter(f"mode {value!r} out of range")
    return mode


@cli.command()
@click.option("--nfs-server", envvar="NFS_SERVER", default="", help="NFS server put in every PV (env NFS_SERVER).")
@click.option("--nfs-path", envvar="NFS_PATH", default="", help="Exported path on the server (env NFS_PATH).")
@click.option("--provisioner-name", envvar="PROVISIONER_NAME", default="",
              help="Must equal StorageClass.provisioner (env PROVISIONER_NAME).")
@click.option("--enable-leader-election", "leader_election", envvar="ENABLE_LEADER_ELECTION", default="true",
              show_default=True, help="Go ParseBool value (env ENABLE_LEADER_ELECTION).")
@KUBECONFIG_OPTION
@click.option("--namespace", envvar="POD_NAMESPACE", default=None, callback=namespace_param,
              help="Namespace of the leader Lease (env POD_NAMESPACE; else the service account's, else default).")
@click.option("--mount-dir", envvar="NFS_MOUNT_DIR", default="/persistentvolumes", show_default=True,
              help="Where the export is mounted in this pod (env NFS_MOUNT_DIR).")
@click.option("--dir-mode", envvar="NFS_DIR_MODE", default="0777", show_default=True, callback=_octal_mode,
              help="Mode of each volume directory, set explicitly (env NFS_DIR_MODE).")
@click.option("--cluster-id", envvar="LOCALPV_CLUSTER_ID", default="",
              help="This cluster's id in the ownership records on the export (env LOCALPV_CLUSTER_ID); empty: the "
                   "uid of namespace kube-system. A rebuilt cluster sets its old id to take its directories back.")
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz.")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1, 256), envvar="LOCALPV_WORKERS",
              help="Claim workers, and as many volume workers.")
@click.option("--resync-period", default="15m", show_default=True, callback=duration_param,
              envvar="LOCALPV_RESYNC_PERIOD",
              help="Offer every claim and volume again, re-arming items that were given up.")
@click.option("--retry-initial", default="15s", show_default=True, callback=duration_param,
              envvar="LOCALPV_RETRY_INITIAL", help="First delay after a failure; it doubles per failure.")
@click.option("--retry-max", default="1000s", show_default=True, callback=duration_param, envvar="LOCALPV_RETRY_MAX",
              help="Longest delay between retries of one item.")
@click.option("--failed-provision-threshold", default=15, show_default=True, type=click.IntRange(0),
              envvar="LOCALPV_FAILED_PROVISION_THRESHOLD", help="Retries before giving up until resync (0: never).")
@click.option("--failed-delete-threshold", default=15, show_default=True, type=click.IntRange(0),
              envvar="LOCALPV_FAILED_DELETE_THRESHOLD", help="Retries before giving up until resync (0: never).")
@click.option("--lease-duration", default="15s", show_default=True, callback=duration_param,
              envvar="LOCALPV_LEASE_DURATION",
              help="Leader election: how long other replicas wait after the last renewal before taking over.")
@click.option("--renew-deadline", default="10s", show_default=True, callback=duration_param,
              envvar="LOCALPV_RENEW_DEADLINE",
              help="Leader election: the leader steps down when it cannot renew within this long.")
@click.option("--retry-period", default="2s", show_default=True, callback=duration_param, envvar="LOCALPV_RETRY_PERIOD",
              help="Leader election: wait between attempts to acquire or renew the Lease.")
@kube_api_rate_options(CONTROLLER_RATE, CONTROLLER_EVENT_RATE)
def nfs(nfs_server: str, nfs_path: str, provisioner_name: str, leader_election: str, kubeconfig: str | None,
        namespace: str | None, mount_dir: str, dir_mode: int, cluster_id: str, listen_address: str, workers: int,
        resync_period: float, retry_initial: float, retry_max: float, failed_provision_threshold: int,
        failed_delete_threshold: int, lease_duration: float, renew_deadline: float, retry_period: float,
        kube_api_qps: float, kube_api_burst: int, event_qps: float, event_burst: int) -> None:
    """Provision one subdirectory of an NFS export per claim (nfs-subdir-external-provisioner).

    Every setting is checked before anything starts; all problems are reported at once, one
    line each, exit 2: the provisioner name as Kubernetes will check it (StorageClass, Lease),
    the kubeconfig, the listen address (bound here, so a port in use is reported first). Then
    the cluster id: without ``--cluster-id`` it is read from the cluster, and a provisioner that
    cannot read it exits (2 when setting it is the fix, 1 when the API server did not answer).
    """
    from localpv.httpserver import ListenError, parse_listen_address
    from localpv.kube.client import kubeconfig_problem
    from localpv.kube.leader import LeaseConfig
    from localpv.kube.workqueue import ItemBackoff
    from localpv.nfs.app import NfsOptions, check_mount_dir, election_namespace, run
    from localpv.nfs.cluster import CLUSTER_NAMESPACE, ClusterIdUnavailable
    from localpv.nfs.controller import ControllerSettings
    from localpv.nfs.ownership import cluster_id_problem
    from localpv.nfs.params import parse_bool
    from localpv.nfs.provisioner import NfsSource

    problems = [f"{env} is required (or {flag})" for env, flag, value in (
        ("NFS_SERVER", "--nfs-server", nfs_server), ("NFS_PATH", "--nfs-path", nfs_path),
        ("PROVISIONER_NAME", "--provisioner-name", provisioner_name)) if not value]
    elect: bool | None = None
    try:
        elect = parse_bool(leader_election)
    except ValueError as err:
        problems.append(f"ENABLE_LEADER_ELECTION: {err}")
    if provisioner_name and elect is not None:
        name_problem = provisioner_name_problem(provisioner_name, leader_election=elect)
        if name_problem:
            problems.append(f"PROVISIONER_NAME (--provisioner-name) {quote(provisioner_name)}: {name_problem}")
    try:
        source = NfsSource(nfs_server, nfs_path, mount_dir, dir_mode) if nfs_path else None
    except ValueError as err:
        problems.append(str(err))
    problems += [p for p in (check_mount_dir(mount_dir),) if p]
    if cluster_id and (id_problem := cluster_id_problem(cluster_id)):
        problems.append(f"{named('cluster_id', '--cluster-id', 'LOCALPV_CLUSTER_ID', quote(cluster_id))}: "
                        f"{id_problem}")
    try:
        LeaseConfig("", "", "", lease_duration, renew_deadline, retry_period)  # validates the timing
    except ValueError as err:
        problems.append(str(err))
    if kubeconfig and (kc_problem := kubeconfig_problem(kubeconfig)):
        problems.append(f"{named('kubeconfig', '--kubeconfig', 'KUBECONFIG', kubeconfig)}: {kc_problem}")
    try:
        parse_listen_address(listen_address)
    except ListenError as err:
        what = named("listen_address", "--listen-address", "LOCALPV_LISTEN_ADDRESS", quote(listen_address))
        problems.append(f"{what}: {err}")
    if problems:
        for problem in problems:
            click.echo(f"error: {one_line(problem)}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    assert source is not None and elect is not None
    settings = ControllerSettings(
        provisioner_name=provisioner_name, workers=workers, resync_period=resync_period,
        backoff=ItemBackoff(retry_initial, retry_max), failed_provision_threshold=failed_provision_threshold,
        failed_delete_threshold=failed_delete_threshold,
    )
    options = NfsOptions(source=source, controller=settings, cluster_id=cluster_id or None, leader_election=elect,
                         namespace=election_namespace(namespace), lease_duration=lease_duration,
                         renew_deadline=renew_deadline, retry_period=retry_period)
    transport = api_client_or_exit(kubeconfig)
    listener = listen_or_exit(listen_address)
    try:
        code = run(options, transport=transport, listener=listener,
                   limiter=rate_limiter(kube_api_qps, kube_api_burst),
                   event_limiter=rate_limiter(event_qps, event_burst))
    except ClusterIdUnavailable as err:
        fix = (f"set --cluster-id (or LOCALPV_CLUSTER_ID) to this cluster's id, the uid of namespace "
               f"{CLUSTER_NAMESPACE} or the id it had before a rebuild, or grant get on namespace "
               f"{CLUSTER_NAMESPACE}") if err.settable else "the provisioner needs it before it starts"
        click.echo(f"error: {one_line(f'cannot read the cluster id: {err}; {fix}')}", err=True)
        sys.exit(CONFIG_ERROR_EXIT if err.settable else 1)
    sys.exit(code)

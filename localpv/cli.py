"""The ``localpv`` command line.

Every command imports what it needs inside its body: ``localpv --help`` must stay fast
and must not pay for the ``kubernetes`` client (about 47 MB and 0.3 s).
Options read environment variables too: each option names its variable explicitly
(upstream's names where one exists, e.g. ``MY_NODE_NAME``), else ``LOCALPV_<OPTION>``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from localpv import __version__

if TYPE_CHECKING:
    from localpv.config import LoadedConfig

CONFIG_ERROR_EXIT = 2

#: Options several commands share, declared once.
CONFIG_OPTION = click.option("--config", "config_path", default="/etc/provisioner/config", show_default=True,
                             envvar="LOCALPV_CONFIG", type=click.Path(),
                             help="Mounted ConfigMap directory or YAML file.")
KUBECONFIG_OPTION = click.option("--kubeconfig", envvar="KUBECONFIG", default=None,
                                 help="Out-of-cluster kubeconfig (env KUBECONFIG).")


def _load_config_or_exit(path: str) -> LoadedConfig:
    """Load the configuration; on problems print each (with typo hints) and exit 2.

    Warnings of a valid configuration go to stderr too: they are usually typos.
    """
    from localpv.config import ConfigError, load_config

    try:
        loaded = load_config(path)
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"error: {problem}", err=True)
        for warning in err.warnings:
            click.echo(f"warning: {warning}", err=True)
        click.echo(f"{path}: configuration is invalid", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    for warning in loaded.warnings:
        click.echo(f"warning: {warning}", err=True)
    return loaded


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "LOCALPV"})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """Kubernetes storage provisioner for node-local volumes and NFS subdirectories."""
    from localpv.logs import setup_logging

    setup_logging(verbose)
    ctx.ensure_object(dict)


@cli.command()
def version() -> None:
    """Print the version."""
    click.echo(f"localpv {__version__}")


@cli.group()
def config() -> None:
    """Inspect provisioner configuration."""


@config.command("check")
@click.argument("path", type=click.Path(exists=True, dir_okay=True, file_okay=True))
@click.option("--output", "-o", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
def config_check(path: str, output: str) -> None:
    """Validate a ConfigMap directory or YAML file and print the effective configuration.

    Exits 0 when valid, 2 with one line per problem otherwise.
    """
    import json

    import yaml

    from localpv.config import config_to_data

    data = config_to_data(_load_config_or_exit(path).config)
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), nl=False)


@config.command("reference")
def config_reference() -> None:
    """Print the configuration reference (Markdown), generated from the parser's tables."""
    from localpv.config import reference_markdown

    click.echo(reference_markdown(), nl=False)


@cli.command()
@click.option("--dry-run", is_flag=True, required=True, help="Only show what would be done (required).")
@click.option("--config", "config_path", default="/etc/provisioner/config", show_default=True,
              envvar="LOCALPV_CONFIG", type=click.Path(exists=True), help="ConfigMap directory or YAML file.")
@click.option("--node", "node_name", envvar="MY_NODE_NAME", required=True, help="Node name (env MY_NODE_NAME).")
@click.option("--output", "-o", type=click.Choice(["table", "yaml", "json"]), default="table", show_default=True)
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None,
              help="Read the real Node, StorageClasses and PVs (read-only).")
def discover(dry_run: bool, config_path: str, node_name: str, output: str, kubeconfig: str | None) -> None:
    """Show the PVs the agent would create on this node, and why entries are skipped."""
    import json

    import yaml

    from localpv.agent.dryrun import dry_run as run_dry
    from localpv.agent.dryrun import render_table

    config = _load_config_or_exit(config_path).config
    api = None
    if kubeconfig:
        from localpv.kube.api import KubeApi
        from localpv.kube.client import make_api_client

        api = KubeApi(make_api_client(kubeconfig))
    result = run_dry(config, node_name, api=api)
    if output == "json":
        click.echo(json.dumps(result.as_json(), indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(result.as_json(), sort_keys=False), nl=False)
    else:
        click.echo(render_table(result), nl=False)
    for assumption in result.assumptions if output != "table" else ():
        click.echo(f"note: {assumption}", err=True)


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    from localpv.config import parse_go_duration

    try:
        seconds = parse_go_duration(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err
    if seconds <= 0:
        raise click.BadParameter("must be positive")
    return seconds


def _wait_for_signal() -> None:
    """Block until SIGTERM or SIGINT (the kubelet stops pods with SIGTERM)."""
    import signal
    import threading

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


@cli.command()
@CONFIG_OPTION
@click.option("--node", "node_name", envvar="MY_NODE_NAME", required=True, help="This node (env MY_NODE_NAME).")
@click.option("--namespace", envvar="MY_NAMESPACE", default="default", show_default=True,
              help="Namespace for cleanup Jobs (env MY_NAMESPACE).")
@click.option("--job-image", envvar="JOB_CONTAINER_IMAGE", default=None,
              help="Cleanup Job image (env JOB_CONTAINER_IMAGE).")
@KUBECONFIG_OPTION
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz.")
@click.option("--metrics-path", default="/metrics", show_default=True)
@click.option("--discovery-period", default="10s", show_default=True, callback=_duration,
              help="Safety-net period between passes (events trigger passes at once).")
@click.option("--config-sync-period", default="5s", show_default=True, callback=_duration,
              help="How often the configuration is re-read.")
@click.option("--state-dir", default="/var/lib/localpv", show_default=True, envvar="LOCALPV_STATE_DIR",
              help="Host directory for the cleanup journal (must survive pod restarts).")
@click.option("--host-events/--no-host-events", default=True, show_default=True,
              help="React to mount and block-device events at once.")
def agent(config_path: str, node_name: str, namespace: str, job_image: str | None, kubeconfig: str | None,
          listen_address: str, metrics_path: str, discovery_period: float, config_sync_period: float,
          state_dir: str, host_events: bool) -> None:
    """Run the node agent (the DaemonSet entrypoint)."""
    import logging
    import os

    from localpv.agent.journal import Journal, JournalError
    from localpv.agent.node import AgentError, AgentOptions, NodeAgent
    from localpv.httpserver import StatusServer
    from localpv.kube.api import KubeApi
    from localpv.kube.client import ClientConfigError, make_api_client
    from localpv.kube.errors import ApiError
    from localpv.metrics import AgentMetrics

    log = logging.getLogger("localpv.agent")
    loaded = _load_config_or_exit(config_path)
    try:
        journal = Journal(os.path.join(state_dir, "journal.json"))
        api_client = make_api_client(kubeconfig)
    except (JournalError, ClientConfigError) as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
    metrics = AgentMetrics()
    api = KubeApi(api_client, observer=metrics.api.observe)
    options = AgentOptions(node_name=node_name, namespace=namespace, job_image=job_image, config_path=config_path,
                           discovery_period=discovery_period, config_sync_period=config_sync_period,
                           watch_host=host_events, state_dir=state_dir)
    node_agent = NodeAgent(api, options, loaded.config, journal, metrics=metrics)
    server = StatusServer(listen_address, metrics.registry, ready=node_agent.readiness, healthy=node_agent.healthy,
                          metrics_path=metrics_path, documents={"/status": node_agent.status})
    server.start()
    try:
        node_agent.start()
    except (AgentError, ApiError) as err:
        click.echo(f"error: {err}", err=True)
        server.stop()
        sys.exit(1)
    log.info("agent running on node %s", node_name)
    try:
        _wait_for_signal()
    finally:
        node_agent.stop()
        server.stop()


@cli.command()
@click.option("--device", type=click.Path(), default=None, envvar="LOCAL_PV_BLKDEVICE",
              help="Block device to wipe (env LOCAL_PV_BLKDEVICE); refused if not a block device or in use.")
@click.option("--dir", "directory", type=click.Path(), default=None, envvar="LOCAL_PV_FILESYSTEM",
              help="Mounted volume whose contents to remove (env LOCAL_PV_FILESYSTEM); must be a mount point "
                   "directly inside a discovery dir (--discovery-dir, --config).")
@click.option("--discovery-dir", "discovery_dirs", multiple=True, type=click.Path(), envvar="LOCALPV_DISCOVERY_DIR",
              help="A class's mountDir; --dir must be one of its entries (repeatable).")
@click.option("--config", "config_path", default=None, type=click.Path(), envvar="LOCALPV_CONFIG",
              help="ConfigMap directory or YAML file: its Filesystem classes' mountDirs are discovery dirs.")
@click.option("--unsafe-any-directory", is_flag=True, allow_from_autoenv=False,
              help="DANGEROUS: empty --dir even if it is not a mounted volume inside a discovery dir.")
@click.option("--command", "command", default=None,
              help="Cleaner command for --device, split like a shell would (default: quick_reset.sh).")
@click.option("--timeout", default="6h", show_default=True, callback=_duration)
def cleanup(device: str | None, directory: str | None, discovery_dirs: tuple[str, ...], config_path: str | None,
            unsafe_any_directory: bool, command: str | None, timeout: float) -> None:
    """Wipe one volume; exit 0 only when it is verified clean (the cleanup Job entrypoint).

    What is not a volume is refused (exit 2, one line: the flag, what was expected, what
    was found) before anything is touched: a path that is not a mount point (an unmounted
    disk leaves the host's own directory there), outside the discovery dirs, or a block
    device that is not one or is in use (mounted, holding a mounted partition, claimed).
    """
    import shlex
    import threading

    from localpv.agent.cleaning import (
        block_cleaner,
        discovery_dir_problem,
        filesystem_cleaner,
        home_discovery_dir,
        not_an_entry_problem,
    )
    from localpv.config import DEFAULT_BLOCK_CLEANER
    from localpv.host.cleaner import block_device_problem
    from localpv.host.fsclean import mount_point_problem

    def refuse(flag: str, value: str, problem: str | None) -> None:
        """Exit 2 with one line when there is a problem: the flag, what was expected, what was found."""
        if problem is not None:
            click.echo(f"error: {flag} {value}: {problem}", err=True)
            sys.exit(CONFIG_ERROR_EXIT)

    if (device is None) == (directory is None):
        raise click.UsageError("give exactly one of --device or --dir")
    if device is not None:
        refuse("--device", device, block_device_problem(device))
        argv = shlex.split(command) if command else list(DEFAULT_BLOCK_CLEANER)
        fn = block_cleaner(device, argv, timeout=timeout, on_line=click.echo)
    elif unsafe_any_directory:
        assert directory is not None
        click.echo(f"warning: --unsafe-any-directory: emptying {directory} without checking it is a volume",
                   err=True)
        fn = filesystem_cleaner(directory, None, require_mount_point=False)
    else:
        assert directory is not None
        for given in discovery_dirs:
            refuse("--discovery-dir", given, discovery_dir_problem(given))
        classes = _load_config_or_exit(config_path).config.classes.values() if config_path else ()
        dirs = [*discovery_dirs, *(c.mount_dir for c in classes if c.volume_mode == "Filesystem")]
        refuse("--dir", directory, mount_point_problem(directory))
        if not dirs:
            refuse("--dir", directory, "expected --discovery-dir or --config to say which discovery dir it must "
                   "be an entry of (or --unsafe-any-directory), found neither")
        home = home_discovery_dir(directory, dirs)
        if home is None:
            refuse("--dir", directory, not_an_entry_problem(directory, dirs))
        assert home is not None  # refuse() exited otherwise; None would skip the cleaner's own check
        fn = filesystem_cleaner(directory, home)
    outcome = fn(threading.Event())
    click.echo(("clean: " if outcome.ok else "NOT clean: ") + outcome.message, err=not outcome.ok)
    sys.exit(0 if outcome.ok else 1)


@cli.command()
@click.option("--agent-url", default="http://127.0.0.1:8080", show_default=True, envvar="LOCALPV_AGENT_URL",
              help="The agent's --listen-address (run this in the agent pod: kubectl exec).")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def status(agent_url: str, output: str) -> None:
    """Show this node's volumes: PV, phase, claim, cleanup state and progress, skipped entries."""
    import json

    from localpv.agent.status import StatusUnavailable, fetch_status, render_status

    try:
        doc = fetch_status(agent_url)
    except StatusUnavailable as err:
        click.echo(f"error: {err} (is the agent running? run this inside its pod)", err=True)
        sys.exit(1)
    click.echo(json.dumps(doc, indent=2) if output == "json" else render_status(doc), nl=output == "json")


@cli.command()
@CONFIG_OPTION
@click.option("--node", "node_name", envvar="MY_NODE_NAME", default=None, help="This node (env MY_NODE_NAME).")
@click.option("--namespace", envvar="MY_NAMESPACE", default="default", show_default=True,
              help="Namespace of cleanup Jobs (env MY_NAMESPACE).")
@KUBECONFIG_OPTION
@click.option("--in-pod/--on-host", default=None,
              help="Whether mounts reach this process through a pod volume (default: in a pod when "
                   "KUBERNETES_SERVICE_HOST is set); decides whether mount propagation matters.")
@click.option("--no-cluster", is_flag=True, help="Check the host only (no Node, StorageClass or RBAC checks).")
def doctor(config_path: str, node_name: str | None, namespace: str, kubeconfig: str | None, in_pod: bool | None,
           no_cluster: bool) -> None:
    """Explain why volumes on this node do not become PVs; exit 1 when something is wrong.

    Run it in the agent pod (kubectl exec <pod> -- localpv doctor) or on the node with
    --kubeconfig. Each problem is printed with its fix.
    """
    import os

    from localpv.config import ConfigError, load_config
    from localpv.doctor import diagnose, failed, gather_cluster, gather_host, render

    try:
        loaded = load_config(config_path)
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"ERROR  config: {problem}\n       fix: correct the ConfigMap (localpv config check PATH)")
        sys.exit(1)
    config = loaded.config
    pod = in_pod if in_pod is not None else bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    cluster = None
    if not no_cluster:
        if not node_name:
            raise click.UsageError("--node (or MY_NODE_NAME) is required unless --no-cluster is given")
        from localpv.kube.api import KubeApi
        from localpv.kube.client import ClientConfigError, make_api_client
        from localpv.kube.errors import Backoff

        try:
            api = KubeApi(make_api_client(kubeconfig), backoff=Backoff(attempts=2), user_agent="localpv-doctor")
        except ClientConfigError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)
        cluster = gather_cluster(api, config, node_name, namespace)
    findings = diagnose(config, gather_host(config, in_pod=pod), cluster)
    click.echo(render(findings), nl=False)
    sys.exit(1 if failed(findings) else 0)


@cli.command()
@click.option("--volumes", default=2, show_default=True, help="How many volumes to make.")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds allowed for each step.")
@click.option("--simulate-mounts", is_flag=True, help="Plain directories even as root (what non-root gets).")
def demo(volumes: int, timeout: float, simulate_mounts: bool) -> None:
    """Run the whole lifecycle of a local volume against the embedded API emulator.

    Real tmpfs mounts when run as root, simulated mount points otherwise. Exits 0 when
    every step happened and the tenant's data was really wiped.
    """
    from localpv.demo import Demo, DemoFailed

    try:
        Demo(sys.stdout, volumes=volumes, timeout=timeout, simulate=simulate_mounts).run()
    except DemoFailed as err:
        click.echo(f"demo failed: {err}", err=True)
        sys.exit(1)


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
@click.option("--namespace", envvar="POD_NAMESPACE", default=None,
              help="Namespace of the leader Lease (env POD_NAMESPACE; else the service account's, else default).")
@click.option("--mount-dir", envvar="NFS_MOUNT_DIR", default="/persistentvolumes", show_default=True,
              help="Where the export is mounted in this pod (env NFS_MOUNT_DIR).")
@click.option("--dir-mode", envvar="NFS_DIR_MODE", default="0777", show_default=True, callback=_octal_mode,
              help="Mode of each volume directory, set explicitly (env NFS_DIR_MODE).")
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz.")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1, 256), envvar="LOCALPV_WORKERS",
              help="Claim workers, and as many volume workers.")
@click.option("--resync-period", default="15m", show_default=True, callback=_duration, envvar="LOCALPV_RESYNC_PERIOD",
              help="Offer every claim and volume again, re-arming items that were given up.")
@click.option("--retry-initial", default="15s", show_default=True, callback=_duration,
              envvar="LOCALPV_RETRY_INITIAL", help="First delay after a failure; it doubles per failure.")
@click.option("--retry-max", default="1000s", show_default=True, callback=_duration, envvar="LOCALPV_RETRY_MAX",
              help="Longest delay between retries of one item.")
@click.option("--failed-provision-threshold", default=15, show_default=True, type=click.IntRange(0),
              envvar="LOCALPV_FAILED_PROVISION_THRESHOLD", help="Retries before giving up until resync (0: never).")
@click.option("--failed-delete-threshold", default=15, show_default=True, type=click.IntRange(0),
              envvar="LOCALPV_FAILED_DELETE_THRESHOLD", help="Retries before giving up until resync (0: never).")
@click.option("--lease-duration", default="15s", show_default=True, callback=_duration,
              envvar="LOCALPV_LEASE_DURATION")
@click.option("--renew-deadline", default="10s", show_default=True, callback=_duration,
              envvar="LOCALPV_RENEW_DEADLINE")
@click.option("--retry-period", default="2s", show_default=True, callback=_duration, envvar="LOCALPV_RETRY_PERIOD")
def nfs(nfs_server: str, nfs_path: str, provisioner_name: str, leader_election: str, kubeconfig: str | None,
        namespace: str | None, mount_dir: str, dir_mode: int, listen_address: str, workers: int,
        resync_period: float, retry_initial: float, retry_max: float, failed_provision_threshold: int,
        failed_delete_threshold: int, lease_duration: float, renew_deadline: float, retry_period: float) -> None:
    """Provision one subdirectory of an NFS export per claim (nfs-subdir-external-provisioner)."""
    from localpv.kube.client import ClientConfigError
    from localpv.kube.workqueue import ItemBackoff
    from localpv.nfs.app import NfsOptions, check_mount_dir, election_namespace, run
    from localpv.nfs.controller import ControllerSettings
    from localpv.nfs.params import parse_bool
    from localpv.nfs.provisioner import NfsSource

    problems = [f"{env} is required (or {flag})" for env, flag, value in (
        ("NFS_SERVER", "--nfs-server", nfs_server), ("NFS_PATH", "--nfs-path", nfs_path),
        ("PROVISIONER_NAME", "--provisioner-name", provisioner_name)) if not value]
    try:
        elect = parse_bool(leader_election)
    except ValueError as err:
        problems.append(f"ENABLE_LEADER_ELECTION: {err}")
    try:
        source = NfsSource(nfs_server, nfs_path, mount_dir, dir_mode) if nfs_path else None
    except ValueError as err:
        problems.append(str(err))
    problems += [p for p in (check_mount_dir(mount_dir),) if p]
    if problems:
        for problem in problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    assert source is not None
    settings = ControllerSettings(
        provisioner_name=provisioner_name, workers=workers, resync_period=resync_period,
        backoff=ItemBackoff(retry_initial, retry_max), failed_provision_threshold=failed_provision_threshold,
        failed_delete_threshold=failed_delete_threshold,
    )
    options = NfsOptions(source=source, controller=settings, leader_election=elect,
                         namespace=election_namespace(namespace), lease_duration=lease_duration,
                         renew_deadline=renew_deadline, retry_period=retry_period)
    try:
        options.lease()  # validates the timing before anything starts
    except ValueError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    try:
        code = run(options, kubeconfig=kubeconfig, listen_address=listen_address)
    except ClientConfigError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
    sys.exit(code)


@cli.command("node-cleanup")
@click.option("--storageclass-names", default="", envvar="LOCALPV_STORAGECLASS_NAMES",
              help="Comma list of the StorageClasses whose PVCs and PVs may be removed (empty: none).")
@click.option("--pvc-deletion-delay", default="60s", show_default=True, callback=_duration,
              help="How long a deleted Node may take to come back before its volumes' PVCs are deleted.")
@click.option("--stale-pv-discovery-interval", default="10s", show_default=True, callback=_duration,
              help="Period of the scan that deletes unclaimed PVs of deleted Nodes.")
@click.option("--resync", default="10m", show_default=True, callback=_duration,
              help="Safety-net period of the scan for PVCs to free (a Node deletion triggers it at once).")
@click.option("--worker-threads", default=10, show_default=True, type=click.IntRange(1, 256),
              help="Concurrent PVC checks and deletions.")
@KUBECONFIG_OPTION
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz (empty disables).")
@click.option("--metrics-path", default="/metrics", show_default=True)
def node_cleanup(storageclass_names: str, pvc_deletion_delay: float, stale_pv_discovery_interval: float,
                 resync: float, worker_threads: int, kubeconfig: str | None, listen_address: str,
                 metrics_path: str) -> None:
    """Remove PVCs and PVs pinned to deleted Nodes (opt-in per StorageClass; data is never touched)."""
    from localpv.agent.nodecleanup import (
        NodeCleanupController,
        NodeCleanupError,
        NodeCleanupOptions,
        parse_class_names,
    )
    from localpv.httpserver import StatusServer
    from localpv.kube.api import KubeApi
    from localpv.kube.client import ClientConfigError, make_api_client
    from localpv.metrics import NodeCleanupMetrics

    options = NodeCleanupOptions(parse_class_names(storageclass_names), pvc_deletion_delay,
                                 stale_pv_discovery_interval, resync, worker_threads)
    metrics = NodeCleanupMetrics()
    try:
        api = KubeApi(make_api_client(kubeconfig), observer=metrics.api.observe, user_agent="localpv-node-cleanup")
        controller = NodeCleanupController(api, options, metrics=metrics)
        server = StatusServer(listen_address, metrics.registry, ready=controller.ready, healthy=controller.healthy,
                              metrics_path=metrics_path) if listen_address else None
    except (ClientConfigError, ValueError, OSError) as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
    if server is not None:
        server.start()
    try:
        controller.start()
        _wait_for_signal()
    except NodeCleanupError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
    finally:
        controller.stop()
        if server is not None:
            server.stop()


def main() -> None:
    """Console-script entry point."""
    cli(obj={})

"""``localpv agent``: the node agent, the DaemonSet's entrypoint."""

from __future__ import annotations

import os
import sys

import click

from localpv.cli.common import (
    CONFIG_OPTION,
    KUBECONFIG_OPTION,
    METRICS_PATH_OPTION,
    api_client_or_exit,
    duration_param,
    kube_api_rate_options,
    listen_or_exit,
    load_config_or_exit,
    named,
    namespace_param,
    node_name_param,
    one_line,
    refuse,
    secret_names_param,
)
from localpv.cli.root import cli
from localpv.kube.ratelimit import AGENT_EVENT_RATE, AGENT_RATE, rate_limiter


def state_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot hold the agent's journal: it must be (or become) a writable directory.

    A missing directory is created; writability is proven by creating and removing a file.
    """
    import stat
    import tempfile

    if not path:
        return "expected a directory, found an empty path"
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        pass  # something else is there: said below
    except OSError as err:
        return f"expected a directory that exists or can be created, found that it cannot be created " \
               f"({err.strerror})"
    try:
        st = os.stat(path)
    except OSError as err:
        return f"expected a directory, found {err.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else "something that is not a directory"
        return f"expected a directory, found {kind}"
    try:
        fd, probe = tempfile.mkstemp(prefix=".localpv-write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return f"expected a writable directory, found it not writable ({err.strerror})"
    return None


@cli.command()
@CONFIG_OPTION
@click.option("--node", "node_name", envvar="MY_NODE_NAME", required=True, callback=node_name_param,
              help="This node (env MY_NODE_NAME).")
@click.option("--namespace", envvar="MY_NAMESPACE", default="default", show_default=True, callback=namespace_param,
              help="Namespace for cleanup Jobs (env MY_NAMESPACE).")
@click.option("--job-image", envvar="JOB_CONTAINER_IMAGE", default=None,
              help="Cleanup Job image (env JOB_CONTAINER_IMAGE).")
@click.option("--job-image-pull-secrets", envvar="LOCALPV_JOB_IMAGE_PULL_SECRETS", default="",
              callback=secret_names_param,
              help="Comma-separated Secrets the cleanup Jobs pull their image with (env "
                   "LOCALPV_JOB_IMAGE_PULL_SECRETS; the chart sets the release's imagePullSecrets).")
@KUBECONFIG_OPTION
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz.")
@METRICS_PATH_OPTION
@click.option("--discovery-period", default="10s", show_default=True, callback=duration_param,
              help="Safety-net period between passes (events trigger passes at once).")
@click.option("--config-sync-period", default="5s", show_default=True, callback=duration_param,
              help="How often the configuration is re-read.")
@click.option("--state-dir", default="/var/lib/localpv", show_default=True, envvar="LOCALPV_STATE_DIR",
              help="Host directory for the cleanup journal (must survive pod restarts).")
@click.option("--host-events/--no-host-events", default=True, show_default=True,
              help="React to mount and block-device events at once.")
@click.option("--volume-health-period", default="60s", show_default=True, callback=duration_param,
              envvar="LOCALPV_VOLUME_HEALTH_PERIOD",
              help="Longest time between two looks at the health of the volumes in use (every pass looks; mount "
                   "and block-device events start one).")
@click.option("--kubelet-dir", default="/var/lib/kubelet", show_default=True, envvar="LOCALPV_KUBELET_DIR",
              help="The kubelet's root directory (dynamic volumes: where the CSI and registration sockets go).")
@click.option("--capacity-tracking/--no-capacity-tracking", default=True, show_default=True,
              envvar="LOCALPV_CAPACITY_TRACKING",
              help="Publish a CSIStorageCapacity object per dynamic class for this node (env "
                   "LOCALPV_CAPACITY_TRACKING; the chart sets it from dynamic.storageCapacity).")
@kube_api_rate_options(AGENT_RATE, AGENT_EVENT_RATE)
def agent(config_path: str, node_name: str, namespace: str, job_image: str | None,
          job_image_pull_secrets: tuple[str, ...], kubeconfig: str | None,
          listen_address: str, metrics_path: str, discovery_period: float, config_sync_period: float,
          state_dir: str, host_events: bool, volume_health_period: float, kubelet_dir: str, capacity_tracking: bool,
          kube_api_qps: float,
          kube_api_burst: int, event_qps: float, event_burst: int) -> None:
    """Run the node agent (the DaemonSet entrypoint).

    Everything a user can get wrong is checked before any thread starts, each as one line
    and exit 2: the configuration, the state dir (created if missing, must be writable, and
    used by no other agent: its lock is held until this process exits), the kubeconfig, and
    the listen address, which is bound here so that a port in use is reported before anything
    else runs.
    """
    from localpv.agent.app import AgentProcess, journal_path, run
    from localpv.agent.journal import Journal, JournalError
    from localpv.agent.node import AgentError, AgentOptions
    from localpv.agent.statedir import StateDirInUse, lock_state_dir
    from localpv.kube.errors import ApiError

    loaded = load_config_or_exit(config_path)
    problem = state_dir_problem(state_dir)
    if problem is None:
        try:
            state_lock = lock_state_dir(state_dir)  # held for the process's life
        except StateDirInUse as err:
            problem = str(err)
        except OSError as err:
            problem = f"expected a lock file that can be made, found that it cannot ({err.strerror})"
    if problem is not None:
        refuse(named("state_dir", "--state-dir", "LOCALPV_STATE_DIR", state_dir), problem)
    transport = api_client_or_exit(kubeconfig)
    listener = listen_or_exit(listen_address)
    try:
        journal = Journal(journal_path(state_dir))
    except JournalError as err:
        click.echo(f"error: {one_line(str(err))}", err=True)
        sys.exit(1)
    options = AgentOptions(node_name=node_name, namespace=namespace, job_image=job_image,
                           job_image_pull_secrets=job_image_pull_secrets, config_path=config_path,
                           discovery_period=discovery_period, config_sync_period=config_sync_period,
                           watch_host=host_events, state_dir=state_dir, volume_health_period=volume_health_period)
    process = AgentProcess(options, loaded.config, kubelet_dir=kubelet_dir, metrics_path=metrics_path,
                           capacity_tracking=capacity_tracking)
    try:
        run(process, journal, transport=transport, listener=listener,
            limiter=rate_limiter(kube_api_qps, kube_api_burst), event_limiter=rate_limiter(event_qps, event_burst))
    except (AgentError, ApiError) as err:
        click.echo(f"error: {one_line(str(err))}", err=True)
        sys.exit(1)
    finally:
        state_lock.release()

"""``localpv discover --dry-run``: the PVs the agent would create here, no cluster needed."""

from __future__ import annotations

import sys

import click

from localpv.cli.common import (
    CONFIG_ERROR_EXIT,
    api_client_or_exit,
    duration_param,
    load_config_or_exit,
    named,
    node_name_param,
    one_line,
    refuse,
)
from localpv.cli.root import cli


@cli.command()
@click.option("--dry-run", is_flag=True, help="Only show what would be done: the only mode, so optional (kept for "
                                             "compatibility).")
@click.option("--config", "config_path", default="/etc/provisioner/config", show_default=True,
              envvar="LOCALPV_CONFIG", type=click.Path(exists=True), help="ConfigMap directory or YAML file.")
@click.option("--node", "node_name", envvar="MY_NODE_NAME", required=True, callback=node_name_param,
              help="Node name (env MY_NODE_NAME).")
@click.option("--output", "-o", type=click.Choice(["table", "yaml", "json"]), default="table", show_default=True,
              help="Output format.")
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None,
              help="Read the real Node, StorageClasses and PVs (read-only; env KUBECONFIG, so a set "
                   "KUBECONFIG makes discover read the cluster).")
@click.option("--request-timeout", default="5s", show_default=True, callback=duration_param,
              help="With --kubeconfig: give up on the API server after this long (one attempt per request).")
def discover(dry_run: bool, config_path: str, node_name: str, output: str, kubeconfig: str | None,
             request_timeout: float) -> None:
    """Show the PVs the agent would create on this node, and why entries are skipped.

    With --kubeconfig, an API server that cannot be reached (or answers with an error) is
    one line and exit 1: the command line was fine, the cluster was not there (as
    ``localpv status`` when the agent is not). A Node the cluster does not have is exit 2.
    """
    import json

    import yaml

    from localpv.agent.dryrun import dry_run as run_dry
    from localpv.agent.dryrun import render_table
    from localpv.kube.errors import ApiError

    config = load_config_or_exit(config_path).config
    api = None
    host = ""
    if kubeconfig:
        from localpv.kube.api import KubeApi
        from localpv.kube.errors import NO_RETRY

        # One attempt, bounded: a person is waiting, and the dry run is read-only and repeatable.
        transport = api_client_or_exit(kubeconfig)
        host = transport.server
        api = KubeApi(transport, backoff=NO_RETRY, timeout=request_timeout, user_agent="localpv-discover")
    from localpv.config import ConfigError

    try:
        result = run_dry(config, node_name, api=api)
    except ConfigError as err:  # this node's overrides clash: what its agent would refuse
        for problem in err.problems:
            click.echo(f"error: {one_line(problem)}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    except ApiError as err:
        if err.status == 404 and err.reason == "NotFound" and f'nodes "{node_name}"' in err.message:
            refuse(named("node_name", "--node", "MY_NODE_NAME", node_name),
                    f"expected a Node of the cluster at {host}, found none")
        if err.status == 0:
            click.echo(f"error: cannot reach the API server at {host}: {_unreachable_reason(err, request_timeout)}",
                       err=True)
        else:
            click.echo(f"error: the API server at {host} answered {one_line(str(err))[:300]}", err=True)
        sys.exit(1)
    if output == "json":
        click.echo(json.dumps(result.as_json(), indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(result.as_json(), sort_keys=False, allow_unicode=True), nl=False)
    else:
        click.echo(render_table(result), nl=False)
    for assumption in result.assumptions if output != "table" else ():
        click.echo(f"note: {assumption}", err=True)


def _unreachable_reason(err: BaseException, timeout: float) -> str:
    """Why a request never got an answer, in a few words (the transport's exceptions nest deeply)."""
    import socket
    import ssl

    chain: list[BaseException] = []
    todo: list[BaseException] = [err]
    while todo and len(chain) < 20:
        exc = todo.pop(0)
        if exc in chain:
            continue
        chain.append(exc)
        todo += [e for e in (exc.__cause__, exc.__context__, getattr(exc, "reason", None))
                 if isinstance(e, BaseException)]
    names = {type(e).__name__ for e in chain}
    for exc in chain:
        if isinstance(exc, socket.gaierror):
            return f"the host name does not resolve ({exc.strerror})"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, ssl.SSLError):
            return f"TLS failed ({exc.reason or exc})"
    if names & {"ReadTimeoutError", "ConnectTimeoutError", "TimeoutError", "timeout"} or any(
            isinstance(e, TimeoutError) for e in chain):
        return f"no answer within {timeout:g}s"
    for exc in chain:
        if isinstance(exc, OSError) and exc.strerror:
            return exc.strerror
    return one_line(str(chain[-1]))[:200]

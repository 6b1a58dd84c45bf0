"""``localpv doctor``: why no PVs are created on this node."""

from __future__ import annotations

import os
import sys

import click

from localpv.cli.common import (
    CONFIG_OPTION,
    KUBECONFIG_OPTION,
    agent_url_param,
    api_client_or_exit,
    namespace_param,
    node_name_param,
)
from localpv.cli.root import cli


@cli.command()
@CONFIG_OPTION
@click.option("--node", "node_name", envvar="MY_NODE_NAME", default=None, callback=node_name_param,
              help="This node (env MY_NODE_NAME).")
@click.option("--namespace", envvar="MY_NAMESPACE", default="default", show_default=True, callback=namespace_param,
              help="Namespace of cleanup Jobs (env MY_NAMESPACE).")
@KUBECONFIG_OPTION
@click.option("--in-pod/--on-host", default=None,
              help="Whether mounts reach this process through a pod volume (default: in a pod when "
                   "KUBERNETES_SERVICE_HOST is set); decides whether mount propagation matters.")
@click.option("--no-cluster", is_flag=True, help="Check the host only (no Node, StorageClass or RBAC checks).")
@click.option("--agent-url", default="http://127.0.0.1:8080", show_default=True, envvar="LOCALPV_AGENT_URL",
              callback=agent_url_param, help="The running agent, asked for the volumes it holds or sees unhealthy "
                                        "(its --listen-address); not asked with --no-cluster.")
def doctor(config_path: str, node_name: str | None, namespace: str, kubeconfig: str | None, in_pod: bool | None,
           no_cluster: bool, agent_url: str) -> None:
    """Explain why volumes on this node do not become PVs; exit 1 when something is wrong.

    Run it in the agent pod (kubectl exec <pod> -- localpv doctor) or on the node with
    --kubeconfig. Each problem is printed with its fix.
    """

    from localpv.cli.statusclient import StatusUnavailable, fetch_status
    from localpv.config import ConfigError, load_config
    from localpv.doctor import AgentFacts, diagnose, failed, for_this_node, gather_cluster, gather_host, render

    try:
        loaded = load_config(config_path)
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"ERROR  config: {problem}\n       fix: correct the ConfigMap (localpv config check PATH)")
        sys.exit(1)
    config = loaded.config
    pod = in_pod if in_pod is not None else bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    cluster = None
    agent = None
    if not no_cluster:
        try:
            agent = AgentFacts.from_status(fetch_status(agent_url, timeout=2.0))
        except StatusUnavailable as err:
            agent = AgentFacts(unavailable=str(err))
        if not node_name:
            raise click.UsageError("--node (or MY_NODE_NAME) is required unless --no-cluster is given")
        from localpv.kube.api import KubeApi
        from localpv.kube.errors import Backoff

        api = KubeApi(api_client_or_exit(kubeconfig), backoff=Backoff(attempts=2), user_agent="localpv-doctor")
        cluster = gather_cluster(api, config, node_name, namespace)
    labels = None
    if cluster is not None and cluster.node is not None:
        labels = dict((cluster.node.get("metadata") or {}).get("labels") or {})
    # The host is checked with this node's directories (its nodes overrides applied), as its agent uses them.
    config, about = for_this_node(config, node_name, labels)
    findings = about + diagnose(config, gather_host(config, in_pod=pod), cluster, agent)
    click.echo(render(findings), nl=False)
    sys.exit(1 if failed(findings) else 0)

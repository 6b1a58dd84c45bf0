"""``localpv status``: the agent's view of every volume on this node."""

from __future__ import annotations

import sys

import click

from localpv.cli.common import (
    agent_url_param,
)
from localpv.cli.root import cli


@cli.command()
@click.option("--agent-url", default="http://127.0.0.1:8080", show_default=True, envvar="LOCALPV_AGENT_URL",
              callback=agent_url_param,
              help="The agent's --listen-address (run this in the agent pod: kubectl exec).")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output format.")
def status(agent_url: str, output: str) -> None:
    """Show this node's volumes: PV, phase, claim, cleanup state and progress, skipped entries."""
    import json

    from localpv.cli.statusclient import StatusUnavailable, fetch_status, render_status

    try:
        doc = fetch_status(agent_url)
    except StatusUnavailable as err:
        click.echo(f"error: {err} (is the agent running? run this inside its pod)", err=True)
        sys.exit(1)
    click.echo(json.dumps(doc, indent=2) if output == "json" else render_status(doc), nl=output == "json")

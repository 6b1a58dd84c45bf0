"""The ``localpv`` command line.

Every command imports what it needs inside its body: ``localpv --help`` must stay fast
and must not pay for the ``kubernetes`` client (about 47 MB and 0.3 s).
Options read environment variables too: each option names its variable explicitly
(upstream's names where one exists, e.g. ``MY_NODE_NAME``), else ``LOCALPV_<OPTION>``.
"""

from __future__ import annotations

import sys

import click

from localpv import __version__

CONFIG_ERROR_EXIT = 2


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

    from localpv.config import ConfigError, config_to_data, load_config

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
    data = config_to_data(loaded.config)
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
    from localpv.config import ConfigError, load_config

    try:
        config = load_config(config_path).config
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
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


def main() -> None:
    """Console-script entry point."""
    cli(obj={})

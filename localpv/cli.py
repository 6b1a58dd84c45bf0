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


def main() -> None:
    """Console-script entry point."""
    cli(obj={})

"""``localpv config check`` and ``localpv config reference``."""

from __future__ import annotations

import click

from localpv.cli.common import (
    load_config_or_exit,
)
from localpv.cli.root import cli


@cli.group()
def config() -> None:
    """Inspect provisioner configuration."""


@config.command("check")
@click.argument("path", type=click.Path(exists=True, dir_okay=True, file_okay=True, allow_dash=True))
@click.option("--output", "-o", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="Output format of the effective configuration.")
def config_check(path: str, output: str) -> None:
    """Validate a ConfigMap directory or YAML file and print the effective configuration.

    Exits 0 when valid, 2 with one line per problem otherwise. Stricter than the agent:
    two classes sharing a hostDir are an error here (the agent warns). A multi-document
    file (helm template output) is searched for the ConfigMap with storageClassMap; PATH
    "-" reads it from standard input (helm template ... | localpv config check -).
    """
    import json

    import yaml

    from localpv.config import config_to_data

    data = config_to_data(load_config_or_exit(path, strict=True, dash_is_stdin=True).config)
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True), nl=False)


@config.command("reference")
def config_reference() -> None:
    """Print the configuration reference (Markdown), generated from the parser's tables."""
    from localpv.config import reference_markdown

    click.echo(reference_markdown(), nl=False)

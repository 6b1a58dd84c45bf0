"""``localpv config check`` and ``localpv config reference``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from localpv.cli.common import (
    CONFIG_ERROR_EXIT,
    load_config_or_exit,
    one_line,
)
from localpv.cli.root import cli

if TYPE_CHECKING:
    from localpv.config.dynamic import DynamicClass


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
    two classes sharing a hostDir are an error here (the agent warns), and each dynamic
    class's mkfsOptions are tried with the real mkfs on a scratch image (where it is
    installed). A multi-document file (helm template output) is searched for the ConfigMap
    with storageClassMap; PATH "-" reads it from standard input (helm template ... | localpv
    config check -).
    """
    import json

    import yaml

    from localpv.config import config_to_data

    loaded = load_config_or_exit(path, strict=True, dash_is_stdin=True)
    if loaded.config.dynamic_classes:
        _try_mkfs_options(loaded.config.dynamic_classes)
    data = config_to_data(loaded.config)
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True), nl=False)


def _try_mkfs_options(classes: Mapping[str, DynamicClass]) -> None:
    """Each problem and warning of the mkfs trial on one line; exit 2 on a problem."""
    from localpv.csi.mkfstrial import try_classes

    found = try_classes(classes)
    for error in found.errors:
        click.echo(f"error: {one_line(error)}", err=True)
    for warning in found.warnings:
        click.echo(f"warning: {one_line(warning)}", err=True)
    if found.errors:
        sys.exit(CONFIG_ERROR_EXIT)


@config.command("reference")
def config_reference() -> None:
    """Print the configuration reference (Markdown), generated from the parser's tables."""
    from localpv.config import reference_markdown

    click.echo(reference_markdown(), nl=False)

"""``localpv config check`` and ``localpv config reference``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from localpv.cli.common import (
    CONFIG_ERROR_EXIT,
    bad_parameter,
    load_config_or_exit,
    node_name_param,
    one_line,
)
from localpv.cli.root import cli

if TYPE_CHECKING:
    from localpv.config import ProvisionerConfig
    from localpv.config.dynamic import DynamicClass


def node_labels_param(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, str]:
    """``--node-label KEY=VALUE`` (repeated): the Node's labels, each checked as the API server would."""
    from localpv.naming import label_key_problem, label_value_problem, quote_text

    labels: dict[str, str] = {}
    for item in value:
        key, sep, text = item.partition("=")
        problem = (f"expected KEY=VALUE, found {quote_text(item)}" if not sep else
                   label_key_problem(key) or label_value_problem(text))
        if problem is None and key in labels and labels[key] != text:
            problem = f"expected one value per key, found {key}={labels[key]} and {key}={text}"
        if problem is not None:
            raise bad_parameter(ctx, param, item, problem)
        labels[key] = text
    return labels


@cli.group()
def config() -> None:
    """Inspect provisioner configuration."""


@config.command("check")
@click.argument("path", type=click.Path(exists=True, dir_okay=True, file_okay=True, allow_dash=True))
@click.option("--output", "-o", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="Output format of the effective configuration.")
@click.option("--node", "node_name", default=None, callback=node_name_param,
              help="Print what this node gets: its nodes overrides applied, entries off on it left out.")
@click.option("--node-label", "node_labels", multiple=True, callback=node_labels_param, metavar="KEY=VALUE",
              help="A label of that node (repeat for each): selects the overrides by matchLabels.")
def config_check(path: str, output: str, node_name: str | None, node_labels: dict[str, str]) -> None:
    """Validate a ConfigMap directory or YAML file and print the effective configuration.

    Exits 0 when valid, 2 with one line per problem otherwise. Stricter than the agent:
    two classes sharing a hostDir are an error here (the agent warns), and each dynamic
    class's mkfsOptions are tried with the real mkfs on a scratch image (where it is
    installed). A multi-document file (helm template output) is searched for the ConfigMap
    with storageClassMap; PATH "-" reads it from standard input (helm template ... | localpv
    config check -).

    With --node (and the node's labels, --node-label), what that node's agent uses: each
    override that applied is named on stderr ("note: ..."); no cluster is needed.
    """
    import json

    import yaml

    from localpv.config import config_to_data

    if node_labels and node_name is None:
        click.echo("error: --node-label: expected --node with it (the labels are a node's), found none", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    loaded = load_config_or_exit(path, strict=True, dash_is_stdin=True)
    if loaded.config.dynamic_classes:
        _try_mkfs_options(loaded.config.dynamic_classes)
    config = loaded.config if node_name is None else _for_node_or_exit(loaded.config, node_name, node_labels)
    data = config_to_data(config)
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True), nl=False)


def _for_node_or_exit(config: ProvisionerConfig, node: str, labels: dict[str, str]) -> ProvisionerConfig:
    """What ``node`` gets; each override that applied, and each entry off there, said on stderr."""
    from localpv.config import ConfigError, for_node

    try:
        mine = for_node(config, node, labels, strict=True)
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"error: {one_line(problem)}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    for warning in mine.warnings:
        click.echo(f"warning: {one_line(warning)}", err=True)
    off = {f"storageClassMap.{n}" for n in config.classes if n not in mine.config.classes}
    off |= {f"dynamicPools.{n}" for n in config.dynamic_pools if n not in mine.config.dynamic_pools}
    for entry in sorted(off | set(mine.applied)):
        source = mine.applied.get(entry, "its enabled: false")
        said = f"is off on this node, by {source}" if entry in off else f"from {source}"
        click.echo(f"note: node {node}: {entry} {said}", err=True)
    return mine.config


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

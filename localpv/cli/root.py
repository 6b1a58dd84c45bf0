"""The ``localpv`` group: logging, ``--version``, and usage errors made one line."""

from __future__ import annotations

from typing import Any

import click

from localpv import __version__
from localpv.cli.common import (
    as_one_line,
)


class _Cli(click.Group):
    """The root group: usage errors of any command become one line."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as err:
            raise as_one_line(err) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as err:
            raise as_one_line(err) from None


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``: the version of the code that runs (the distribution's metadata is made
    from it at install time, and an editable install keeps whatever it was then)."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"localpv {__version__}")
    ctx.exit()


_DAEMONS = frozenset({"agent", "nfs", "node-cleanup", "claim-labeller"})

"""Subcommands that run until stopped (the chart's containers)."""


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "LOCALPV"})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              allow_from_autoenv=False, help="Print the version and exit.")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--log-level", type=click.Choice(["warning", "info", "debug"], case_sensitive=False), default=None,
              envvar="LOCALPV_LOG_LEVEL", help="Log level (env LOCALPV_LOG_LEVEL); with -v, the more verbose wins.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, log_level: str | None) -> None:
    """Kubernetes storage provisioner for node-local volumes and NFS subdirectories."""
    from localpv.logs import setup_logging

    if log_level:
        level = ("warning", "info", "debug").index(log_level.lower())
    else:
        # A healthy daemon that prints nothing leaves `kubectl logs` empty: the long-running
        # commands log at info unless told otherwise; one-shot commands stay quiet.
        level = 1 if ctx.invoked_subcommand in _DAEMONS else 0
    setup_logging(max(verbose, level))
    ctx.ensure_object(dict)


@cli.command()
def version() -> None:
    """Print the version."""
    click.echo(f"localpv {__version__}")


def main() -> None:
    """Console-script entry point."""
    cli(obj={})

"""``localpv demo``: the whole life of a local volume against the API emulator."""

from __future__ import annotations

import math
import sys

import click

from localpv.cli.common import (
    bad_parameter,
)
from localpv.cli.root import cli

#: Volumes the demo makes at most: each is a real tmpfs mount as root.
DEMO_MAX_VOLUMES = 50


#: Longest step the demo allows, in seconds.
DEMO_MAX_TIMEOUT = 3600.0


def _step_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= DEMO_MAX_TIMEOUT):
        raise bad_parameter(ctx, param, value,
                             f"expected seconds, more than 0 and at most {DEMO_MAX_TIMEOUT:g}, found {value:g}")
    return value


@cli.command()
@click.option("--volumes", default=2, show_default=True, type=click.IntRange(1, DEMO_MAX_VOLUMES),
              help="How many volumes to make.")
@click.option("--timeout", default=30.0, show_default=True, type=float, callback=_step_timeout,
              help="Seconds allowed for each step.")
@click.option("--simulate-mounts", is_flag=True, help="Plain directories even as root (what non-root gets).")
def demo(volumes: int, timeout: float, simulate_mounts: bool) -> None:
    """Run the whole lifecycle of a local volume against the embedded API emulator.

    Real tmpfs mounts when run as root, simulated mount points otherwise. Exits 0 when
    every step happened and the tenant's data was really wiped.
    """
    try:
        from localpv.demo import Demo, DemoFailed, DemoStopped
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("localpv_emulator"):
            raise
        click.echo("error: localpv demo needs the API emulator (localpv_emulator), which the production image "
                   "leaves out: run it from a checkout (pip install -e . && localpv demo)", err=True)
        sys.exit(1)

    try:
        Demo(sys.stdout, volumes=volumes, timeout=timeout, simulate=simulate_mounts).run()
    except DemoFailed as err:
        click.echo(f"demo failed: {err}", err=True)
        sys.exit(1)
    except DemoStopped as stopped:
        click.echo(f"demo stopped by {stopped}; its volumes were unmounted and removed", err=True)
        sys.exit(128 + stopped.signum)

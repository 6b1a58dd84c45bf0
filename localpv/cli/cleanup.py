"""``localpv cleanup``: wipe one volume, the cleanup Job's entrypoint."""

from __future__ import annotations

import sys

import click

from localpv.cli.common import (
    CONFIG_ERROR_EXIT,
    bad_parameter,
    duration_param,
    load_config_or_exit,
)
from localpv.cli.root import cli
from localpv.naming import (
    quote,
)


def _shell_words(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A command line split like a shell would: it must split (quotes closed)."""
    import shlex

    if value is not None:
        try:
            shlex.split(value)
        except ValueError as err:
            raise bad_parameter(ctx, param, value, f"expected a command line with its quotes closed, "
                                                    f"found {quote(value)} ({err})") from err
    return value


@cli.command()
@click.option("--device", type=click.Path(), default=None, envvar="LOCAL_PV_BLKDEVICE",
              help="Block device to wipe (env LOCAL_PV_BLKDEVICE); refused if not a block device or in use.")
@click.option("--dir", "directory", type=click.Path(), default=None, envvar="LOCAL_PV_FILESYSTEM",
              help="Mounted volume whose contents to remove (env LOCAL_PV_FILESYSTEM); must be a mount point "
                   "directly inside a discovery dir (--discovery-dir, --config).")
@click.option("--discovery-dir", "discovery_dirs", multiple=True, type=click.Path(), envvar="LOCALPV_DISCOVERY_DIR",
              help="A class's mountDir; --dir must be one of its entries (repeatable).")
@click.option("--config", "config_path", default=None, type=click.Path(), envvar="LOCALPV_CONFIG",
              help="ConfigMap directory or YAML file: its Filesystem classes' mountDirs are discovery dirs.")
@click.option("--unsafe-any-directory", is_flag=True, allow_from_autoenv=False,
              help="DANGEROUS: empty --dir even if it is not a mounted volume inside a discovery dir.")
@click.option("--command", "command", default=None, callback=_shell_words,
              help="Cleaner command for --device, split like a shell would (default: quick_reset.sh).")
@click.option("--timeout", default="6h", show_default=True, callback=duration_param,
              help="Give up (and kill the cleaner) after this long, a Go duration such as 30m.")
@click.option("--expect-identity", default="", envvar="LOCALPV_EXPECT_IDENTITY",
              help="Refuse unless the volume is this one (its filesystem UUID, WWN...: the identity `localpv "
                   "status` shows; env LOCALPV_EXPECT_IDENTITY). The agent passes it to its cleanup Jobs.")
def cleanup(device: str | None, directory: str | None, discovery_dirs: tuple[str, ...], config_path: str | None,
            unsafe_any_directory: bool, command: str | None, timeout: float, expect_identity: str) -> None:
    """Wipe one volume; exit 0 only when it is verified clean (the cleanup Job entrypoint).

    What is not a volume is refused (exit 2, one line: the flag, what was expected, what
    was found) before anything is touched: a path that is not a mount point (an unmounted
    disk leaves the host's own directory there), outside the discovery dirs, or a block
    device that is not one or is in use (mounted, holding a mounted partition, claimed).
    """
    import shlex
    import threading

    from localpv.agent.cleaning import (
        block_cleaner,
        discovery_dir_problem,
        filesystem_cleaner,
        home_discovery_dir,
        not_an_entry_problem,
    )
    from localpv.config import DEFAULT_BLOCK_CLEANER
    from localpv.host.cleaner import block_device_problem
    from localpv.host.fsclean import mount_point_problem

    def refuse(flag: str, value: str, problem: str | None) -> None:
        """Exit 2 with one line when there is a problem: the flag, what was expected, what was found."""
        if problem is not None:
            click.echo(f"error: {flag} {value}: {problem}", err=True)
            sys.exit(CONFIG_ERROR_EXIT)

    if (device is None) == (directory is None):
        raise click.UsageError("give exactly one of --device or --dir")
    if device is not None:
        refuse("--device", device, block_device_problem(device, expect_identity))
        argv = shlex.split(command) if command else list(DEFAULT_BLOCK_CLEANER)
        fn = block_cleaner(device, argv, timeout=timeout, on_line=click.echo, expect_identity=expect_identity)
    elif unsafe_any_directory:
        assert directory is not None
        click.echo(f"warning: --unsafe-any-directory: emptying {directory} without checking it is a volume",
                   err=True)
        fn = filesystem_cleaner(directory, None, require_mount_point=False, timeout=timeout,
                                expect_identity=expect_identity)
    else:
        assert directory is not None
        for given in discovery_dirs:
            refuse("--discovery-dir", given, discovery_dir_problem(given))
        classes = load_config_or_exit(config_path).config.classes.values() if config_path else ()
        dirs = [*discovery_dirs, *(c.mount_dir for c in classes if c.volume_mode == "Filesystem")]
        refuse("--dir", directory, mount_point_problem(directory))
        if not dirs:
            refuse("--dir", directory, "expected --discovery-dir or --config to say which discovery dir it must "
                   "be an entry of (or --unsafe-any-directory), found neither")
        home = home_discovery_dir(directory, dirs)
        if home is None:
            refuse("--dir", directory, not_an_entry_problem(directory, dirs))
        assert home is not None  # refuse() exited otherwise; None would skip the cleaner's own check
        fn = filesystem_cleaner(directory, home, timeout=timeout, expect_identity=expect_identity)
    outcome = fn(threading.Event())
    click.echo(("clean: " if outcome.ok else "NOT clean: ") + outcome.message, err=not outcome.ok)
    sys.exit(0 if outcome.ok else 1)

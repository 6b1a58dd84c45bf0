"""CLI edges of issue 14: --version, help on every option, discover without --dry-run, UTF-8 YAML."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from localpv.cli import cli


def _commands(cmd: click.Command, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            found += _commands(sub, (*path, name))
    return found


def test_version_flag_prints_the_package_version() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"localpv {version('localpv')}\n"


def test_version_flag_runs_no_command() -> None:
    result = CliRunner().invoke(cli, ["--version", "config", "reference"])
    assert result.exit_code == 0
    assert "|" not in result.output


_ALL_COMMANDS = _commands(cli, ("localpv",))


@pytest.mark.parametrize(("path", "command"), _ALL_COMMANDS, ids=[" ".join(path) for path, _ in _ALL_COMMANDS])
def test_every_option_has_help(path: tuple[str, ...], command: click.Command) -> None:
    missing = [param.opts[0] for param in command.params
               if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()]
    assert missing == [], f"{' '.join(path)}: options without help: {missing}"


def _unicode_config(tmp_path: Path) -> Path:
    disks = tmp_path / "disks"
    (disks / "dünïcødé").mkdir(parents=True)
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"storageClassMap": {"local": {"hostDir": str(disks), "mountDir": str(disks)}}}))
    return config


def test_discover_runs_without_dry_run_flag(tmp_path: Path) -> None:
    config = _unicode_config(tmp_path)
    plain = CliRunner().invoke(cli, ["discover", "--config", str(config), "--node", "n1", "-o", "json"])
    assert plain.exit_code == 0, plain.output
    flagged = CliRunner().invoke(cli, ["discover", "--dry-run", "--config", str(config), "--node", "n1",
                                       "-o", "json"])
    assert flagged.exit_code == 0, flagged.output
    assert plain.stdout == flagged.stdout


def test_discover_yaml_is_utf8_not_escaped(tmp_path: Path) -> None:
    config = _unicode_config(tmp_path)
    result = CliRunner().invoke(cli, ["discover", "--dry-run", "--config", str(config), "--node", "n1",
                                      "-o", "yaml"])
    assert result.exit_code == 0, result.output
    assert "dünïcødé" in result.stdout
    assert "\\x" not in result.stdout and "\\u" not in result.stdout


def test_config_check_yaml_is_utf8(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text('labelsForPV:\n  team: "x"\nstorageClassMap:\n  local:\n    hostDir: /mnt/dïsks\n'
                      "    mountDir: /mnt/dïsks\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 0, result.output
    assert "/mnt/dïsks" in result.stdout

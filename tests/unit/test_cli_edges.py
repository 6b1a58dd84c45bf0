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
    from localpv import __version__

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"localpv {__version__}\n"


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


def test_a_silent_failing_cleaner_says_no_output(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from localpv.agent import cleaning

    monkeypatch.setattr(cleaning, "block_device_problem", lambda path, expect_identity="": None)
    outcome = cleaning.block_cleaner("/dev/localpv-test-none", ["false"], timeout=10)(threading.Event())
    assert not outcome.ok
    assert outcome.message == "false exited with 1 (no output)"


def test_a_failing_cleaner_quotes_its_last_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from localpv.agent import cleaning

    monkeypatch.setattr(cleaning, "block_device_problem", lambda path, expect_identity="": None)
    outcome = cleaning.block_cleaner("/dev/localpv-test-none", ["sh", "-c", "echo disk gone; exit 3"],
                                     timeout=10)(threading.Event())
    assert outcome.message == "sh exited with 3: disk gone"


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def event(self, obj: object, kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))


class _Api:
    def __init__(self, pv: dict[str, object]) -> None:
        self.pv = pv

    def get(self, resource: object, name: str) -> dict[str, object]:
        return self.pv


class _Journal:
    def apply(self, changes: object) -> None:
        pass


def _collision_message(other: dict[str, object]) -> str:
    from localpv.agent.executor import Executor
    from localpv.agent.model import CreatePV
    from localpv.agent.pvbuilder import NodeInfo

    executor = object.__new__(Executor)
    recorder = _Recorder()
    vars(executor).update(api=_Api(other), node=NodeInfo("node-a", "uid-a", {"kubernetes.io/hostname": "node-a"}),
                          provisioner="local-volume-provisioner-node-a-uid-a", journal=_Journal(),
                          collisions={}, recorder=recorder)
    create = CreatePV(pv={"metadata": {"name": "local-pv-1234"}}, host_path="/mnt/disks/vol2", mode="Filesystem",
                      capacity=1)
    executor._on_name_taken(create)
    assert [reason for reason, _ in recorder.events] == ["PVNameCollision"]
    return recorder.events[0][1]


def test_name_collision_on_this_node_says_this_node() -> None:
    from localpv.naming import NODE_LABEL_KEY

    other = {"metadata": {"name": "local-pv-1234", "labels": {NODE_LABEL_KEY: "node-a"}},
             "spec": {"local": {"path": "/mnt/disks/vol1"}}}
    message = _collision_message(other)
    assert "(/mnt/disks/vol1 on this node)" in message
    assert "another node" not in message


def test_name_collision_of_a_pv_with_no_node_label_but_our_hostname_says_this_node() -> None:
    other = {"metadata": {"name": "local-pv-1234", "labels": {"kubernetes.io/hostname": "node-a"}},
             "spec": {"local": {"path": "/mnt/disks/vol1"}}}
    assert "(/mnt/disks/vol1 on this node)" in _collision_message(other)


def test_name_collision_on_another_node_names_it() -> None:
    from localpv.naming import NODE_LABEL_KEY

    other = {"metadata": {"name": "local-pv-1234", "labels": {NODE_LABEL_KEY: "node-b"}},
             "spec": {"local": {"path": "/mnt/disks/vol2"}}}
    assert "(/mnt/disks/vol2 on node node-b)" in _collision_message(other)


def test_name_collision_with_our_own_unlabelled_pv_does_not_say_another_node() -> None:
    from localpv.naming import PROVISIONED_BY_ANNOTATION

    other = {"metadata": {"name": "local-pv-1234",
                          "annotations": {PROVISIONED_BY_ANNOTATION: "local-volume-provisioner-node-a-uid-a"}},
             "spec": {"local": {"path": "/mnt/disks/vol1"}}}
    message = _collision_message(other)
    assert "(/mnt/disks/vol1 on this node)" in message
    assert "another node" not in message

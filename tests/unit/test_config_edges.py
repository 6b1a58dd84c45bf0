"""``config check`` edges of issue 14: names, labels, shared hostDirs, all unreadable files,
multi-document input, a cleaner that is not there."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from localpv.cli import cli
from localpv.config import MAX_CONFIG_BYTES, ConfigError, load_config, parse_config


def _problems(data: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    return err.value.problems


def _cls(host: str = "/mnt/disks") -> dict[str, str]:
    return {"hostDir": host, "mountDir": host}


@pytest.mark.parametrize("name", ["Bad_Class_Name", "a/b", "-x", "x.", "UPPER", "a" * 254, ""])
def test_invalid_storage_class_names_are_errors(name: str) -> None:
    [problem] = _problems({"storageClassMap": {name: _cls()}})
    assert problem.startswith(f"storageClassMap.{name}: expected a StorageClass name (a DNS-1123 subdomain")


def test_a_null_class_name_is_an_error_not_a_class_named_none(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("storageClassMap:\n  ~:\n    hostDir: /mnt/disks\n    mountDir: /mnt/disks\n")
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert err.value.problems == ["storageClassMap.None: expected a StorageClass name (a DNS-1123 subdomain: "
                                  'lowercase letters, digits, "-" and ".", starting and ending with a letter or '
                                  "digit, at most 253 characters), got nothing (null)"]


@pytest.mark.parametrize("name", ["local-storage", "fast.disks", "a", "0", "a" * 253])
def test_valid_storage_class_names_pass(name: str) -> None:
    assert list(parse_config({"storageClassMap": {name: _cls()}}).config.classes) == [name]


@pytest.mark.parametrize("key", ["bad key", "-x", "a/", "/x", "Bad_Prefix/x", "a/b/c", "x" * 64,
                                 "p" * 254 + "/x", ""])
def test_invalid_node_label_keys_are_errors(key: str) -> None:
    [problem] = _problems({"nodeLabelsForPV": ["kubernetes.io/hostname", key]})
    assert problem.startswith("nodeLabelsForPV[1]: ")
    assert "expected a label key" in problem or "expected a non-empty string" in problem


@pytest.mark.parametrize("key", ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "rack", "A_b.c-1",
                                 "x" * 63, "a" * 253 + "/" + "x" * 63])
def test_valid_label_keys_pass(key: str) -> None:
    assert parse_config({"nodeLabelsForPV": [key], "labelsForPV": {key: "v"}}).config.node_labels_for_pv == (key,)


@pytest.mark.parametrize(("key", "value", "bad"), [
    ("team", "has space", "value"), ("team", "v" * 64, "value"), ("team", "-v", "value"),
    ("bad key", "v", "key"), ("a/b/c", "v", "key"),
])
def test_invalid_labels_for_pv_are_errors(key: str, value: str, bad: str) -> None:
    [problem] = _problems({"labelsForPV": {key: value}})
    assert problem.startswith(f"labelsForPV.{key}: expected a label {bad}")


def test_labels_for_pv_accept_empty_and_63_character_values() -> None:
    labels = {"a": "", "b": "v" * 63, "example.com/c": "x_y.z-1"}
    assert dict(parse_config({"labelsForPV": labels}).config.labels_for_pv) == labels


_SHARED = {"storageClassMap": {"first": _cls("/mnt/disks"),
                               "second": {"hostDir": "/mnt//disks/", "mountDir": "/other"}}}


def test_two_classes_with_one_host_dir_are_a_strict_error_naming_both() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_SHARED, strict=True)
    problems = err.value.problems
    assert len(problems) == 1
    assert problems[0].startswith("storageClassMap.second.hostDir: ")
    assert "class first" in problems[0] and "first and second" in problems[0]


def test_the_agent_still_runs_a_shared_host_dir_with_a_warning_naming_both() -> None:
    [warning] = parse_config(_SHARED).warnings
    assert warning.startswith("storageClassMap.second.hostDir: same directory as class first")
    assert "(first or second)" in warning


def test_config_check_exits_2_on_a_shared_host_dir(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("storageClassMap:\n  a: {hostDir: /mnt/d, mountDir: /mnt/d}\n"
                      "  b: {hostDir: /mnt/d, mountDir: /mnt/e}\n")
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 2
    assert "error: storageClassMap.b.hostDir:" in result.stderr


def test_every_unreadable_file_of_a_config_dir_is_reported(tmp_path: Path) -> None:
    (tmp_path / "storageClassMap").write_text("a: {hostDir: /mnt/d, mountDir: /mnt/d}\n")
    (tmp_path / "labelsForPV").write_bytes(b"team: \xff\xfe\n")
    (tmp_path / "nodeLabelsForPV").write_bytes(b"- \xff\n")
    (tmp_path / "useJobForCleaning").write_text("[unclosed\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    keys = sorted(problem.split(":")[0] for problem in err.value.problems)
    assert keys == ["labelsForPV", "nodeLabelsForPV", "useJobForCleaning"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads anything")
def test_every_unreadable_file_is_reported_without_permission(tmp_path: Path) -> None:
    for name in ("labelsForPV", "nodeLabelsForPV"):
        (tmp_path / name).write_text("{}\n")
        (tmp_path / name).chmod(0)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert len(err.value.problems) == 2


_HELM_TEMPLATE = """\
---
# Source: localpv/templates/serviceaccount.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: localpv
---
# Source: localpv/templates/configmap.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: localpv-config
  namespace: storage
data:
  storageClassMap: |
    fast-disks:
      hostDir: /mnt/fast-disks
      mountDir: /mnt/fast-disks
  useNodeNameOnly: "true"
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: unrelated
data:
  other: "x"
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: localpv
"""


def test_helm_template_output_yields_the_provisioner_config_map(tmp_path: Path) -> None:
    config = tmp_path / "rendered.yaml"
    config.write_text(_HELM_TEMPLATE)
    loaded = load_config(config)
    assert list(loaded.config.classes) == ["fast-disks"]
    assert loaded.config.use_node_name_only is True
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 0, result.output


def test_several_provisioner_config_maps_are_an_error_naming_them(tmp_path: Path) -> None:
    second = _HELM_TEMPLATE.replace("name: unrelated\ndata:\n  other: \"x\"",
                                    "name: second\ndata:\n  storageClassMap: \"{}\"")
    config = tmp_path / "rendered.yaml"
    config.write_text(second)
    with pytest.raises(ConfigError) as err:
        load_config(config)
    [problem] = err.value.problems
    assert "found 2: storage/localpv-config, second" in problem


def test_a_stream_without_the_config_map_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "rendered.yaml"
    config.write_text("kind: ServiceAccount\n---\nkind: DaemonSet\n")
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert "found none" in err.value.problems[0]


def test_one_document_with_document_markers_still_loads(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("# header\n---\nstorageClassMap:\n  a: {hostDir: /mnt/d, mountDir: /mnt/d}\n---\n")
    assert list(load_config(config).config.classes) == ["a"]


def test_a_missing_block_cleaner_is_a_warning_naming_key_and_path() -> None:
    loaded = parse_config({"storageClassMap": {"b": {**_cls(), "volumeMode": "Block",
                                                     "blockCleanerCommand": ["/opt/nowhere/wipe.sh", "-f"]}}})
    assert loaded.warnings == ('storageClassMap.b.blockCleanerCommand: "/opt/nowhere/wipe.sh" does not exist here; '
                               "block volumes of this class are not cleaned unless the agent's image has it",)


@pytest.mark.parametrize("command", ["/scripts/quick_reset.sh", "/scripts/shred.sh", "/bin/sh", "sh"])
def test_a_cleaner_that_exists_or_is_packaged_is_not_warned_about(command: str) -> None:
    loaded = parse_config({"storageClassMap": {"b": {**_cls(), "volumeMode": "Block",
                                                     "blockCleanerCommand": [command]}}})
    assert loaded.warnings == ()


def test_a_missing_script_in_the_image_dir_is_warned_about() -> None:
    loaded = parse_config({"storageClassMap": {"b": {**_cls(), "blockCleanerCommand": ["/scripts/nope.sh"]}}})
    assert len(loaded.warnings) == 1 and '"/scripts/nope.sh" does not exist here' in loaded.warnings[0]


def test_config_check_prints_the_cleaner_warning_and_exits_0(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("storageClassMap:\n  b:\n    hostDir: /mnt/d\n    mountDir: /mnt/d\n"
                      "    blockCleanerCommand: [/nonexistent/cleaner]\n")
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 0
    assert "warning: storageClassMap.b.blockCleanerCommand:" in result.stderr


@pytest.mark.parametrize("kind, make", [
    ("a character device", lambda tmp: Path("/dev/zero")),
    ("a FIFO", lambda tmp: (os.mkfifo(tmp / "fifo"), tmp / "fifo")[1]),
])
def test_a_device_or_fifo_is_refused_not_read_without_end(tmp_path: Path, kind: str,
                                                          make: Callable[[Path], Path]) -> None:
    """`config check /dev/zero` read until memory ran out; a FIFO blocked for ever."""
    path = make(tmp_path)
    result = subprocess.run([sys.executable, "-m", "localpv", "config", "check", str(path)],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: {path}: cannot read configuration: expected a regular file, found {kind}"


def test_a_config_far_larger_than_any_configmap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(ConfigError) as err:
        load_config(big)
    assert err.value.problems == [f"{big}: cannot read configuration: expected at most 8 MiB, found a larger file"]


def test_a_fifo_inside_a_config_dir_is_reported_with_the_other_keys(tmp_path: Path) -> None:
    (tmp_path / "storageClassMap").write_text("a: {hostDir: /mnt/d, mountDir: /mnt/d}\n")
    os.mkfifo(tmp_path / "labelsForPV")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert [p.split(":")[0] for p in err.value.problems] == ["labelsForPV"]


def test_helm_template_output_can_be_piped_into_config_check() -> None:
    """`config check -` reads standard input: `helm template ... | localpv config check -`."""
    result = subprocess.run([sys.executable, "-m", "localpv", "config", "check", "-"], input=_HELM_TEMPLATE,
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    assert "storageClassMap" in result.stdout


def test_bad_input_on_stdin_is_one_line_naming_stdin() -> None:
    result = subprocess.run([sys.executable, "-m", "localpv", "config", "check", "-"], input=b"\xff",
                            capture_output=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.decode().startswith("error: <stdin>: cannot read configuration:")

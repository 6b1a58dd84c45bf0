"""Per-node overrides (``nodes``) of pools' and static classes' directories, resolved on data
(issue 25.5): what each node gets, which override wins, and every refusal in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from localpv.cli import cli
from localpv.config import ConfigError, config_to_data, for_node, is_uniform, parse_config

UPSTREAM = """
storageClassMap:
  fast-disks:
    hostDir: /mnt/fast-disks
    mountDir: /mnt/fast-disks
    blockCleanerCommand: ["/scripts/shred.sh", "2"]
    volumeMode: Filesystem
    fsType: ext4
    namePattern: "*"
nodeLabelsForPV: [kubernetes.io/hostname]
"""

FLEET = """
storageClassMap:
  fast:
    hostDir: /mnt/fast
    mountDir: /mnt/fast
    volumeMode: Block
    nodes:
      - matchLabels: {disk: nvme}
        hostDir: /mnt/nvme
      - matchLabels: {disk: nvme, rack: r1}
        hostDir: /mnt/never
      - name: node-7
        hostDir: /mnt/seven
        mountDir: /host/seven
      - matchLabels: {fast: none}
        enabled: false
dynamicPools:
  big:
    hostDir: /mnt/big
    reserved: 1Gi
    nodes:
      - name: node-2
        hostDir: /data/node-2/big
        reserved: 2Gi
  gpu:
    enabled: false
    nodes:
      - matchLabels: {gpu: "true"}
        enabled: true
        hostDir: /mnt/gpu-scratch
dynamicClassMap:
  big-thin: {pool: big}
  gpu-scratch: {pool: gpu}
"""


def parsed(text: str) -> Any:
    return parse_config(yaml.safe_load(text)).config


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    [problem] = err.value.problems
    return problem


def test_an_upstream_configmap_means_the_same_on_every_node() -> None:
    config = parsed(UPSTREAM)
    assert is_uniform(config)
    for node, labels in (("a", {}), ("b", {"disk": "nvme"})):
        mine = for_node(config, node, labels)
        assert mine.config == config and mine.applied == {}
    assert "nodes" not in config_to_data(config)["storageClassMap"]["fast-disks"]
    assert "enabled" not in config_to_data(config)["storageClassMap"]["fast-disks"]


def test_by_name_wins_over_by_label_and_the_first_label_match_wins() -> None:
    config = parsed(FLEET)
    assert not is_uniform(config)
    # node-7 carries labels of two label overrides, but is named: its own override applies.
    seven = for_node(config, "node-7", {"disk": "nvme", "rack": "r1"})
    fast = seven.config.classes["fast"]
    assert (fast.host_dir, fast.mount_dir) == ("/mnt/seven", "/host/seven")
    assert seven.applied["storageClassMap.fast"] == "storageClassMap.fast.nodes[2] (name node-7)"
    # Two label overrides match: the first in list order.
    racked = for_node(config, "node-1", {"disk": "nvme", "rack": "r1"})
    assert racked.config.classes["fast"].host_dir == "/mnt/nvme"
    assert racked.applied["storageClassMap.fast"].endswith("(matchLabels disk=nvme)")


def test_an_override_changes_only_what_it_sets_and_mountdir_follows_its_hostdir() -> None:
    config = parsed(FLEET)
    fast = for_node(config, "node-1", {"disk": "nvme"}).config.classes["fast"]
    assert (fast.host_dir, fast.mount_dir, fast.volume_mode) == ("/mnt/nvme", "/mnt/nvme", "Block")
    assert fast.nodes == ()  # resolved: nothing left to resolve
    big = for_node(config, "node-2", {}).config.dynamic_pools["big"]
    assert (big.host_dir, big.mount_dir, big.reserved, big.require_mount) == (
        "/data/node-2/big", "/data/node-2/big", 2 << 30, True)
    assert for_node(config, "node-3", {}).config.dynamic_pools["big"].reserved == 1 << 30


def test_entries_off_on_a_node_are_absent_from_its_configuration() -> None:
    config = parsed(FLEET)
    plain = for_node(config, "node-3", {"fast": "none"}).config
    assert "fast" not in plain.classes and "gpu" not in plain.dynamic_pools
    # The dynamic class stays: its claims selected here are rescheduled ("pool not configured").
    assert "gpu-scratch" in plain.dynamic_classes
    gpu = for_node(config, "node-4", {"gpu": "true"}).config.dynamic_pools["gpu"]
    assert (gpu.host_dir, gpu.enabled) == ("/mnt/gpu-scratch", True)


def test_a_label_change_changes_what_the_node_gets() -> None:
    config = parsed(FLEET)
    before = for_node(config, "node-5", {}).config
    after = for_node(config, "node-5", {"disk": "nvme"}).config
    assert before.classes["fast"].host_dir == "/mnt/fast" and after.classes["fast"].host_dir == "/mnt/nvme"
    assert before != after


def test_the_configuration_prints_back_with_its_overrides() -> None:
    data = config_to_data(parsed(FLEET))
    assert data["storageClassMap"]["fast"]["nodes"][2] == {"name": "node-7", "hostDir": "/mnt/seven",
                                                           "mountDir": "/host/seven"}
    assert data["dynamicPools"]["gpu"]["enabled"] is False
    assert parse_config(data).config == parsed(FLEET)  # what config check prints reads back the same


BASE_POOL = {"hostDir": "/mnt/big"}


def pool_with(*nodes: Any, **base: Any) -> dict[str, Any]:
    return {"dynamicPools": {"big": {**BASE_POOL, **base, "nodes": list(nodes)}},
            "dynamicClassMap": {"big-thin": {"pool": "big"}}}


@pytest.mark.parametrize(("nodes", "start", "words"), [
    ([{"name": "n1", "matchLabels": {"a": "b"}, "hostDir": "/mnt/x"}], "dynamicPools.big.nodes[0]: expected either",
     "got both"),
    ([{"hostDir": "/mnt/x"}], "dynamicPools.big.nodes[0]: expected either", "got neither"),
    ([{"name": "n1", "hostdir": "/mnt/x"}], "dynamicPools.big.nodes[0].hostdir: expected name or matchLabels",
     'did you mean "hostDir"'),
    ([{"name": "n1", "fsType": "xfs"}], "dynamicPools.big.nodes[0].fsType: expected name or matchLabels",
     "got an unknown key"),
    ([{"matchLabels": {"ssd": True}, "hostDir": "/mnt/x"}], "dynamicPools.big.nodes[0].matchLabels.ssd: expected a "
     "label value", 'quote it: "true"'),
    ([{"matchLabels": ["ssd"], "hostDir": "/mnt/x"}], "dynamicPools.big.nodes[0].matchLabels: expected a mapping",
     "a list of 1 items"),
    ([{"matchLabels": {}, "hostDir": "/mnt/x"}], "dynamicPools.big.nodes[0].matchLabels: expected a mapping",
     "match every node"),
    ([{"name": "n1", "hostDir": "/mnt/x"}, {"name": "n1", "hostDir": "/mnt/y"}],
     "dynamicPools.big.nodes[1].name: expected each node named once", "(also dynamicPools.big.nodes[0])"),
    ([{"matchLabels": {"a": "b"}, "hostDir": "/mnt/x"}, {"matchLabels": {"a": "b"}, "enabled": False}],
     "dynamicPools.big.nodes[1].matchLabels: expected each label set once", "never"),
    ([{"name": "n1"}], "dynamicPools.big.nodes[0]: expected at least one of", "got none"),
    ([{"name": "Node_1", "hostDir": "/mnt/x"}], "dynamicPools.big.nodes[0].name: expected a Node name",
     '"Node_1"'),
    ([{"name": "n1", "hostDir": "/proc/x"}], "dynamicPools.big.nodes[0].hostDir: expected a directory outside "
     "/proc", "/proc/x"),
    ({"name": "n1"}, "dynamicPools.big.nodes: expected a list", "a mapping"),
])
def test_a_bad_override_is_one_line_naming_its_key(nodes: Any, start: str, words: str) -> None:
    data = pool_with() if not isinstance(nodes, list) else pool_with(*nodes)
    if not isinstance(nodes, list):
        data["dynamicPools"]["big"]["nodes"] = nodes
    problem = refusal(data)
    assert problem.startswith(start), problem
    assert words in problem, problem
    assert "\n" not in problem


def test_a_class_override_may_not_change_what_the_class_means() -> None:
    problem = refusal({"storageClassMap": {"fast": {"hostDir": "/mnt/a", "mountDir": "/mnt/a",
                                                    "nodes": [{"name": "n1", "volumeMode": "Block"}]}}})
    assert problem == ("storageClassMap.fast.nodes[0].volumeMode: expected only hostDir, mountDir, enabled per node "
                       "(the rest of a class is one for every node), got volumeMode")


def test_an_entry_off_by_default_needs_overrides_that_enable_it_with_a_directory() -> None:
    problem = refusal(pool_with({"matchLabels": {"gpu": "true"}, "hostDir": "/mnt/g"}, enabled=False))
    assert problem.startswith("dynamicPools.big.nodes[0].enabled: expected true, as dynamicPools.big is disabled"), \
        problem
    data = pool_with({"matchLabels": {"gpu": "true"}, "enabled": True}, enabled=False)
    del data["dynamicPools"]["big"]["hostDir"]
    assert refusal(data) == ("dynamicPools.big.nodes[0].hostDir: required, as dynamicPools.big has no hostDir of its "
                             "own, got nothing")
    # Without nodes, hostDir stays required.
    assert refusal({"dynamicPools": {"big": {"enabled": False}}}) == "dynamicPools.big.hostDir: required, got nothing"


def test_a_named_override_onto_another_pools_directory_is_refused_with_the_configmap() -> None:
    data = pool_with({"name": "n1", "hostDir": "/mnt/other/sub"})
    data["dynamicPools"]["other"] = {"hostDir": "/mnt/other"}
    problem = refusal(data)
    assert problem.startswith("dynamicPools.other.hostDir: expected a directory apart from every other pool's"), problem
    assert problem.endswith("(node n1, with dynamicPools.big.nodes[0] (name n1))"), problem


def test_a_label_override_onto_a_static_class_directory_is_refused_for_the_nodes_it_selects() -> None:
    data = pool_with({"matchLabels": {"disk": "shared"}, "hostDir": "/mnt/disks/pool"})
    data["storageClassMap"] = {"local": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks"}}
    config = parse_config(data).config  # no node is known to carry the label yet
    assert for_node(config, "n1", {}).config.dynamic_pools["big"].host_dir == "/mnt/big"
    with pytest.raises(ConfigError) as err:
        for_node(config, "n2", {"disk": "shared"})
    [problem] = err.value.problems
    assert problem.startswith("dynamicPools.big.hostDir: expected a directory apart from every static class's, got "
                              "/mnt/disks/pool, inside storageClassMap.local.hostDir"), problem
    assert "(node n2, with dynamicPools.big.nodes[0] (matchLabels disk=shared))" in problem


# ---------------------------------------------------------------- localpv config check --node

def check(tmp_path: Path, *args: str, text: str = FLEET) -> Any:
    (tmp_path / "config.yaml").write_text(text)
    return CliRunner().invoke(cli, ["config", "check", str(tmp_path / "config.yaml"), *args])


def test_config_check_shows_what_a_node_gets_without_a_cluster(tmp_path: Path) -> None:
    result = check(tmp_path, "--node", "node-2", "--node-label", "disk=nvme", "--node-label", "fast=none")
    assert result.exit_code == 0, result.output
    data = yaml.safe_load(result.stdout)
    assert data["storageClassMap"]["fast"]["hostDir"] == "/mnt/nvme"  # the first matching label override
    assert data["dynamicPools"]["big"]["hostDir"] == "/data/node-2/big"
    assert "gpu" not in data["dynamicPools"] and "nodes" not in data["dynamicPools"]["big"]
    assert result.stderr.splitlines() == [
        "note: node node-2: dynamicPools.big from dynamicPools.big.nodes[0] (name node-2)",
        "note: node node-2: dynamicPools.gpu is off on this node, by its enabled: false",
        "note: node node-2: storageClassMap.fast from storageClassMap.fast.nodes[0] (matchLabels disk=nvme)",
    ]
    # What it prints for a node with every pool on is a configuration that reads back as it is (with a pool off,
    # its classes name a pool the printout lacks: on that node their claims are rescheduled).
    result = check(tmp_path, "--node", "node-2", "--node-label", "gpu=true")
    assert parse_config(yaml.safe_load(result.stdout)).config == for_node(parsed(FLEET), "node-2",
                                                                          {"gpu": "true"}).config


def test_config_check_without_node_prints_the_overrides(tmp_path: Path) -> None:
    result = check(tmp_path)
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["dynamicPools"]["gpu"]["nodes"] == [
        {"matchLabels": {"gpu": "true"}, "enabled": True, "hostDir": "/mnt/gpu-scratch",
         "mountDir": "/mnt/gpu-scratch"}]


@pytest.mark.parametrize(("args", "line"), [
    (["--node-label", "disk=nvme"], "error: --node-label: expected --node with it (the labels are a node's), found "
                                    "none"),
    (["--node", "n1", "--node-label", "disk"], "error: Invalid value for '--node-label': expected KEY=VALUE, found "
                                               '"disk"'),
    (["--node", "n1", "--node-label", "a=1", "--node-label", "a=2"], "error: Invalid value for '--node-label': "
                                                                     "expected one value per key, found a=1 and a=2"),
    (["--node", "Node_1"], "error: Invalid value for '--node': expected a Node name"),
])
def test_config_check_bad_node_flags_are_one_line_and_exit_2(tmp_path: Path, args: list[str], line: str) -> None:
    result = check(tmp_path, *args)
    assert result.exit_code == 2, result.output
    [said] = result.stderr.splitlines()
    assert said.startswith(line), said
    assert result.stdout == ""


def test_config_check_refuses_a_node_whose_overrides_clash(tmp_path: Path) -> None:
    text = FLEET.replace("- matchLabels: {fast: none}\n        enabled: false",
                         "- matchLabels: {fast: big}\n        hostDir: /mnt/big/fast")
    assert check(tmp_path, "--node", "n1", text=text).exit_code == 0
    result = check(tmp_path, "--node", "n1", "--node-label", "fast=big", text=text)
    assert result.exit_code == 2, result.output
    [said] = result.stderr.splitlines()
    assert said.startswith("error: dynamicPools.big.hostDir: expected a directory apart from every static class's, "
                           "got /mnt/big, containing storageClassMap.fast.hostDir (/mnt/big/fast)"), said
    assert said.endswith("(node n1, with storageClassMap.fast.nodes[3] (matchLabels fast=big))"), said


def test_two_classes_on_one_directory_of_a_node_are_an_error_for_config_check_and_a_warning_for_the_agent(
        tmp_path: Path) -> None:
    text = """
storageClassMap:
  a: {hostDir: /mnt/a, mountDir: /mnt/a}
  b:
    hostDir: /mnt/b
    mountDir: /mnt/b
    nodes:
      - {name: n1, hostDir: /mnt/a}
      - {matchLabels: {disk: a}, hostDir: /mnt/a}
"""
    loaded = parse_config(yaml.safe_load(text))  # the agent reads non-strictly: warned, as upstream runs it
    assert any("same directory as class a" in w for w in for_node(loaded.config, "n1", {}).warnings)
    named = check(tmp_path, text=text)
    assert named.exit_code == 2 and named.stderr.startswith("error: storageClassMap.b.hostDir: expected a "
                                                            "directory no other class uses"), named.output
    assert "(node n1, with storageClassMap.b.nodes[0] (name n1))" in named.stderr
    by_label = check(tmp_path, "--node", "n2", "--node-label", "disk=a",
                     text=text.replace("- {name: n1, hostDir: /mnt/a}\n", ""))
    assert by_label.exit_code == 2 and "(node n2, with storageClassMap.b.nodes[0] (matchLabels disk=a))" in \
        by_label.stderr, by_label.output

"""Per-node overrides in the chart (issue 25.5): classes[].nodes and dynamic.pools[].nodes reach
the ConfigMap as written, every directory they name is mounted in the agent, a mount point two
host directories would share is refused naming the value, and $(NODE_NAME) in agent.stateDir gives each
node's agent a state directory of its own. Real Helm against the API emulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from localpv.cli import cli
from tests.helm.chart import NAMESPACE, Install, helm_runs, installed, load_values

DYNAMIC = load_values("dynamic-values.yaml")


def fleet(**agent: Any) -> dict[str, Any]:
    return {
        **DYNAMIC,
        "agent": {**DYNAMIC.get("agent", {}), **agent},
        "classes": [{"name": "local-fs", "hostDir": "/mnt/disks", "nodes": [
            {"name": "node-a", "hostDir": "/data/node-a/disks"},
            {"matchLabels": {"example.com/disks": "b"}, "hostDir": "/data/node-b/disks"},
            {"matchLabels": {"example.com/disks": "none"}, "enabled": False}]}],
        "dynamic": {**DYNAMIC["dynamic"], "pools": [{"name": "fast", "hostDir": "/mnt/pools/fast", "nodes": [
            {"name": "node-a", "hostDir": "/data/node-a/pool"},
            {"matchLabels": {"example.com/disks": "b"}, "hostDir": "/data/node-b/pool", "reserved": "1Gi"}]}]},
    }


def with_nodes(nodes: list[Any]) -> dict[str, Any]:
    values = fleet()
    values["classes"][0]["nodes"] = nodes
    return values


SCENARIOS: dict[str, dict[str, Any]] = {
    "fleet": fleet(stateDir="/srv/state/$(NODE_NAME)"),
    "one-mount-two-dirs": with_nodes([{"name": "node-a", "hostDir": "/data/a", "mountDir": "/mnt/in-pod"},
                                      {"name": "node-b", "hostDir": "/data/b", "mountDir": "/mnt/in-pod"}]),
    "onto-the-class-mount": with_nodes([{"name": "node-a", "hostDir": "/data/a", "mountDir": "/mnt/disks"}]),
    "same-dir-twice": with_nodes([{"name": "node-a", "hostDir": "/data/a"},
                                  {"matchLabels": {"x": "y"}, "hostDir": "/data/a"}]),
    "name-and-labels": with_nodes([{"name": "node-a", "matchLabels": {"x": "y"}, "hostDir": "/data/a"}]),
    "unknown-key": with_nodes([{"name": "node-a", "hostdir": "/data/a"}]),
    "label-not-a-string": with_nodes([{"matchLabels": {"ssd": True}, "hostDir": "/data/a"}]),
}
REFUSED: dict[str, list[str]] = {
    "one-mount-two-dirs": ["classes[0].nodes[1].mountDir: expected a mount point of its own in the agent",
                           "found /mnt/in-pod, where /data/a is mounted already"],
    "onto-the-class-mount": ["classes[0].nodes[0].mountDir", "found /mnt/disks, where /mnt/disks is mounted already"],
    "name-and-labels": ["nodes/0"],
    "unknown-key": ["hostdir"],
    "label-not-a-string": ["ssd"],
}


@pytest.fixture(scope="module")
def installs(helm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Install]]:
    with helm_runs(helm_python, {name: Install(values) for name, values in SCENARIOS.items()},
                   tmp_path_factory.mktemp("helm")) as done:
        yield done


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - set(REFUSED)))
def test_good_override_values_install(installs: dict[str, Install], name: str) -> None:
    assert installs[name].error is None, installs[name].error


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bad_override_values_fail_the_install_naming_the_value(installs: dict[str, Install], name: str) -> None:
    inst = installs[name]
    assert inst.error is not None, f"{name}: Helm accepted values it must refuse"
    for word in REFUSED[name]:
        assert word in inst.error, f"{name}: message does not name {word!r}: {inst.error}"
    assert not inst.server.list("apps/v1", "DaemonSet", NAMESPACE), "a refused install created objects"


def test_every_directory_an_override_names_is_mounted_in_the_agent(installs: dict[str, Install]) -> None:
    [daemonset] = installed(installs, "fleet").rendered("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    for path in ("/data/node-a/disks", "/data/node-b/disks", "/data/node-a/pool", "/data/node-b/pool",
                 "/mnt/disks", "/mnt/pools/fast"):
        mount = mounts[path]
        assert mount["mountPropagation"] == "HostToContainer", mount
        assert volumes[mount["name"]]["hostPath"]["path"] == path
    state = next(m for m in mounts.values() if m["name"] == "state")
    assert state["mountPath"] == "/srv/state" and volumes["state"]["hostPath"]["path"] == "/srv/state"
    assert "--state-dir=/srv/state/$(MY_NODE_NAME)" in pod["containers"][0]["args"]
    env = [e["name"] for e in pod["containers"][0]["env"]]
    assert "MY_NODE_NAME" in env  # what the kubelet expands
    plain = installed(installs, "same-dir-twice").rendered("DaemonSet")[0]["spec"]["template"]["spec"]
    assert [m["mountPath"] for m in plain["containers"][0]["volumeMounts"]].count("/data/a") == 1
    assert not any("$(" in a for a in plain["containers"][0]["args"])


def test_the_configmap_gives_each_node_its_directories(installs: dict[str, Install], tmp_path: Path) -> None:
    """The ConfigMap the chart writes, as the kubelet mounts it, read by `localpv config check --node`."""
    data = installed(installs, "fleet").one("v1", "ConfigMap")["data"]
    for key, value in data.items():
        (tmp_path / key).write_text(value)
    for node, labels, disks, pool in (("node-a", [], "/data/node-a/disks", "/data/node-a/pool"),
                                      ("node-b", ["example.com/disks=b"], "/data/node-b/disks", "/data/node-b/pool"),
                                      ("node-c", [], "/mnt/disks", "/mnt/pools/fast")):
        args = ["config", "check", str(tmp_path), "--node", node, *(f"--node-label={label}" for label in labels)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        effective = yaml.safe_load(result.stdout)
        assert effective["storageClassMap"]["local-fs"]["hostDir"] == disks
        assert effective["dynamicPools"]["fast"]["hostDir"] == pool
    off = CliRunner().invoke(cli, ["config", "check", str(tmp_path), "--node", "n", "--node-label",
                                   "example.com/disks=none"])
    assert "local-fs" not in yaml.safe_load(off.stdout)["storageClassMap"]

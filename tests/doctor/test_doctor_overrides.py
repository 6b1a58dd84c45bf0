"""``localpv doctor`` checks the directories this node's agent uses - its ``nodes`` overrides
applied with the Node's real labels - and says which override gave each (issue 25.5)."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from localpv.cli import cli
from localpv.config import parse_config
from localpv.doctor import ERROR, OK, WARN, for_this_node
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node, storage_class


def fleet(tmp_path: Path) -> dict[str, object]:
    """Class local-fs at a directory that does not exist, except on nvme nodes (an override)."""
    nvme = tmp_path / "nvme"
    nvme.mkdir(exist_ok=True)
    return {"storageClassMap": {"local-fs": {
        "hostDir": str(tmp_path / "no-such-dir"), "mountDir": str(tmp_path / "no-such-dir"),
        "nodes": [{"matchLabels": {"disk": "nvme"}, "hostDir": str(nvme)}]}}}


def test_the_nodes_configuration_on_data(tmp_path: Path) -> None:
    config = parse_config(fleet(tmp_path)).config
    mine, said = for_this_node(config, "node-1", {"disk": "nvme"})
    assert mine.classes["local-fs"].host_dir == str(tmp_path / "nvme")
    assert [(f.level, f.message) for f in said] == [
        (OK, f"storageClassMap.local-fs: hostDir {tmp_path}/nvme, mountDir {tmp_path}/nvme, from "
             "storageClassMap.local-fs.nodes[0] (matchLabels disk=nvme)")]
    _, unknown = for_this_node(config, None, None)
    assert [f.level for f in unknown] == [WARN] and "give --node" in unknown[0].fix
    _, unread = for_this_node(config, "node-1", None)
    assert [f.level for f in unread] == [WARN] and "matchLabels are not applied" in unread[0].message
    # A uniform ConfigMap: nothing to say.
    plain = parse_config({"storageClassMap": {"a": {"hostDir": "/mnt/a", "mountDir": "/mnt/a"}}}).config
    assert for_this_node(plain, "node-1", {}) == (plain, [])


def test_refused_overrides_are_errors_with_the_command_that_shows_them(tmp_path: Path) -> None:
    data = fleet(tmp_path)
    data["dynamicPools"] = {"p": {"hostDir": str(tmp_path / "nvme" / "pool"), "requireMount": False}}
    data["dynamicClassMap"] = {"dyn": {"pool": "p"}}
    config = parse_config(data).config  # apart by default; the nvme override puts the class around the pool
    _, said = for_this_node(config, "node-1", {"disk": "nvme"})
    [error] = [f for f in said if f.level == ERROR]
    assert "the agent refuses this node's configuration: dynamicPools.p.hostDir" in error.message
    assert "--node node-1" in error.fix


def test_doctor_checks_the_directories_the_nodes_labels_select(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.create(node("node-1", {"disk": "nvme"}))
    apiserver.create(storage_class("local-fs"))
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(fleet(tmp_path)))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    result = CliRunner().invoke(cli, ["doctor", "--config", str(config_file), "--kubeconfig", str(kubeconfig),
                                      "--node", "node-1", "--on-host"])
    assert result.exit_code == 0, result.output
    assert (f"OK     config (node node-1): storageClassMap.local-fs: hostDir {tmp_path}/nvme, mountDir "
            f"{tmp_path}/nvme, from storageClassMap.local-fs.nodes[0] (matchLabels disk=nvme)") in result.output
    assert "no-such-dir" not in result.output
    # Without the label the node gets the default directory, which is missing: said, exit 1.
    labelled = apiserver.get("v1", "Node", "node-1")
    assert labelled is not None
    del labelled["metadata"]["labels"]["disk"]
    apiserver.update(labelled)
    result = CliRunner().invoke(cli, ["doctor", "--config", str(config_file), "--kubeconfig", str(kubeconfig),
                                      "--node", "node-1", "--on-host"])
    assert result.exit_code == 1, result.output
    assert f"ERROR  class local-fs: discovery directory {tmp_path}/no-such-dir" in result.output, result.output

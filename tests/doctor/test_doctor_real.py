"""``localpv doctor`` on real mounts and against the API emulator.

The propagation tests build the situation of an agent pod by hand: a "host" discovery
directory (a shared tmpfs) and the "pod's" view of it (a bind mount made a slave, which
is what ``mountPropagation: HostToContainer`` does, or left private, which is the
default). Then a disk is mounted on the host side and the test checks that the doctor's
verdict matches what the pod side really sees.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from localpv.cli import cli
from localpv.config import ProvisionerConfig, parse_config
from localpv.doctor import ERROR, OK, check_propagation, diagnose, failed, gather_host
from localpv.host.mounts import mount_points
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node, storage_class
from tests.support.hostfs import LoopDevices, Mounter, sh


def _host_and_pod(tmp_path: Path, mounter: Mounter, mode: str) -> tuple[Path, Path]:
    host = mounter.tmpfs(tmp_path / "host" / "disks")
    sh("mount", "--make-shared", host)
    pod = mounter.bind(host, tmp_path / "pod" / "disks")
    sh("mount", f"--make-{mode}", pod)
    return host, pod


def _config(host: Path, pod: Path, mode: str = "Filesystem") -> ProvisionerConfig:
    return parse_config({"storageClassMap": {"local": {"hostDir": str(host), "mountDir": str(pod),
                                                       "volumeMode": mode}}}).config


@pytest.mark.root
@pytest.mark.parametrize(("mode", "receives"), [("rslave", True), ("private", False)])
def test_propagation_verdict_matches_what_the_pod_side_sees(
        tmp_path: Path, mounter: Mounter, mode: str, receives: bool) -> None:
    host, pod = _host_and_pod(tmp_path, mounter, mode)
    config = _config(host, pod)
    [facts] = gather_host(config, in_pod=True).classes
    assert facts.mount is not None and facts.mount.mount_point == str(pod)
    assert [f.level for f in check_propagation(facts, in_pod=True)] == [OK if receives else ERROR]
    # Now a disk is mounted on the host, after the "pod" started.
    mounter.tmpfs(host / "vol1")
    assert (str(pod / "vol1") in mount_points()) is receives
    after = diagnose(config, gather_host(config, in_pod=True), None)
    assert failed(after) is not receives
    if not receives:  # the pod sees an empty directory where the host has a disk
        assert any("vol1 is a plain directory" in f.message for f in after)


@pytest.mark.root
def test_applying_the_suggested_bind_mount_fixes_a_plain_directory(tmp_path: Path, mounter: Mounter) -> None:
    # On a tmpfs: a directory of this machine's root disk has an identity nobody may read here
    # (the sandbox refuses to open /dev/vda), which the doctor rightly reports as well.
    disks = mounter.tmpfs(tmp_path / "disks")
    (disks / "data").mkdir(parents=True)
    config = parse_config({"storageClassMap": {"local": {"hostDir": str(disks), "mountDir": str(disks)}}}).config
    [problem] = [f for f in diagnose(config, gather_host(config, in_pod=False), None) if f.level == ERROR]
    command = problem.fix.split("`")[1].split()
    assert command[:2] == ["mount", "--bind"]
    mounter.bind(Path(command[2]), Path(command[3]))
    fixed = diagnose(config, gather_host(config, in_pod=False), None)
    assert not failed(fixed)
    assert "1 usable" in fixed[0].message


@pytest.mark.root
def test_block_class_sees_the_hosts_dev(tmp_path: Path, loops: LoopDevices) -> None:
    device = loops.attach()
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    (nvme / "disk1").symlink_to(device.path)
    (nvme / "gone").symlink_to("/dev/disk/by-id/no-such-disk")
    config = parse_config({"storageClassMap": {"nvme": {"hostDir": str(nvme), "mountDir": str(nvme),
                                                        "volumeMode": "Block"}}}).config
    host = gather_host(config, in_pod=True)
    assert host.dev_fs_type == "devtmpfs"
    findings = diagnose(config, host, None)
    assert any(f.subject == "/dev" and f.level == OK for f in findings)
    assert "2 entries, 1 usable as Block" in findings[0].message
    [broken] = [f for f in findings if f.level == ERROR and "gone" in f.message]
    assert "mountDevVolume" in broken.fix


# ---------------------------------------------------------------- the command, against the emulator


def _run(apiserver: ApiServer, tmp_path: Path, config: dict[str, object], *extra: str) -> tuple[int, str]:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    result = CliRunner().invoke(cli, ["doctor", "--config", str(config_file), "--kubeconfig", str(kubeconfig),
                                      "--node", "node-1", "--namespace", "storage", "--on-host", *extra])
    return result.exit_code, result.output


def _discovery(tmp_path: Path) -> dict[str, object]:
    disks = tmp_path / "disks"
    disks.mkdir(exist_ok=True)
    return {"storageClassMap": {"local-fs": {"hostDir": str(disks), "mountDir": str(disks)}}}


def test_healthy_node_exits_zero(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.create(node("node-1"))
    apiserver.create(storage_class("local-fs"))
    code, output = _run(apiserver, tmp_path, _discovery(tmp_path))
    assert code == 0, output
    assert "OK     node node-1: kubernetes.io/hostname=node-1" in output
    assert "StorageClass local-fs exists" in output
    assert "permissions the agent needs are granted" in output
    assert "ERROR" not in output


def test_missing_storage_class_and_node_label_are_reported_with_fixes(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}})
    code, output = _run(apiserver, tmp_path, _discovery(tmp_path))
    assert code == 1
    assert "ERROR  class local-fs: StorageClass local-fs does not exist" in output
    assert "fix: create StorageClass local-fs (chart: classes[].storageClass: true)" in output
    assert "fix: kubectl label node node-1 kubernetes.io/hostname=node-1" in output


def test_rbac_denials_are_found_by_access_reviews(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.create(node("node-1"))
    apiserver.create(storage_class("local-fs"))
    apiserver.deny("create", "persistentvolumes")
    apiserver.deny("create", "jobs", group="batch", namespace="storage")
    config = {**_discovery(tmp_path), "useJobForCleaning": "yes"}
    code, output = _run(apiserver, tmp_path, config)
    assert code == 1
    errors = [line for line in output.splitlines() if line.startswith("ERROR")]
    assert errors == ["ERROR  rbac: cannot create persistentvolumes (denied by the emulator)",
                      'ERROR  rbac: cannot create jobs.batch in namespace "storage" (denied by the emulator)']
    reviews = [r for r in apiserver.requests if r.resource == "selfsubjectaccessreviews"]
    assert len(reviews) == 19  # one review per permission: 14 for the agent, 5 for its Jobs


def test_missing_node_is_an_error(apiserver: ApiServer, tmp_path: Path) -> None:
    apiserver.create(storage_class("local-fs"))
    code, output = _run(apiserver, tmp_path, _discovery(tmp_path))
    assert code == 1 and "ERROR  node node-1: Node not readable: not found" in output


def test_unreachable_api_server(apiserver: ApiServer, tmp_path: Path) -> None:
    kubeconfig_holder = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    apiserver.stop()
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(_discovery(tmp_path)))
    result = CliRunner().invoke(cli, ["doctor", "--config", str(config_file), "--kubeconfig", str(kubeconfig_holder),
                                      "--node", "node-1", "--on-host"])
    assert result.exit_code == 1
    assert "ERROR  api: the API server cannot be used" in result.output


def test_host_only_and_bad_configuration(tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(_discovery(tmp_path)))
    ok = CliRunner().invoke(cli, ["doctor", "--config", str(config_file), "--no-cluster", "--on-host"])
    assert ok.exit_code == 0, ok.output
    config_file.write_text("storageClassMap:\n  x:\n    hostDir: relative\n")
    bad = CliRunner().invoke(cli, ["doctor", "--config", str(config_file), "--no-cluster"])
    assert bad.exit_code == 1 and "ERROR  config: storageClassMap.x.hostDir" in bad.output
    usage = CliRunner().invoke(cli, ["doctor", "--config", str(config_file)], env={"MY_NODE_NAME": ""})
    assert usage.exit_code != 0

"""`localpv discover --dry-run` and `localpv cleanup` as a person (or a Job) runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from localpv.naming import NODE_LABEL_KEY, pv_name
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node, storage_class
from tests.support.hostfs import LoopDevices, Mounter

pytestmark = pytest.mark.root


def localpv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localpv", *args], capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.fixture
def discovery(tmp_path: Path, mounter: Mounter, loops: LoopDevices) -> Path:
    fs, blk = tmp_path / "fs", tmp_path / "blk"
    mounter.tmpfs(fs / "vol1", size=20 * 1024 * 1024)
    (fs / "plain").mkdir()
    (fs / "file").write_text("x")
    blk.mkdir()
    (blk / "disk1").symlink_to(loops.attach(size=12 * 1024 * 1024).path)
    (blk / "broken").symlink_to(tmp_path / "nowhere")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"storageClassMap": {
        "local-fs": {"hostDir": "/mnt/disks", "mountDir": str(fs)},
        "fast": {"hostDir": "/mnt/fast", "mountDir": str(blk), "volumeMode": "Block"}}}))
    return cfg


def test_dry_run_json_lists_volumes_and_every_skipped_entry(discovery: Path) -> None:
    proc = localpv("discover", "--dry-run", "--config", str(discovery), "--node", "n1", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    names = {pv["metadata"]["name"]: pv for pv in doc["volumes"]}
    assert set(names) == {pv_name("vol1", "n1", "local-fs"), pv_name("disk1", "n1", "fast")}
    assert names[pv_name("disk1", "n1", "fast")]["spec"]["capacity"]["storage"] == "12Mi"
    reasons = {Path(s["path"]).name: s["reason"] for s in doc["skipped"]}
    assert set(reasons) == {"plain", "file", "broken"}
    assert "not a valid mount point" in reasons["plain"]
    assert "assuming" in proc.stderr  # says what it could not know without a cluster


def test_dry_run_table_is_readable(discovery: Path) -> None:
    proc = localpv("discover", "--dry-run", "--config", str(discovery), "--node", "n1")
    assert proc.returncode == 0
    assert "NAME" in proc.stdout and "/mnt/disks/vol1" in proc.stdout and "Skipped:" in proc.stdout


def test_dry_run_with_a_cluster_uses_its_node_classes_and_pvs(
    discovery: Path, apiserver: ApiServer, tmp_path: Path
) -> None:
    apiserver.create(node("n1", {"kubernetes.io/hostname": "n1.example"}))
    apiserver.create(storage_class("local-fs", reclaim="Retain", mount_options=["noatime"]))
    kubeconfig = tmp_path / "kc"
    apiserver.write_kubeconfig(str(kubeconfig))
    apiserver.create({"apiVersion": "v1", "kind": "PersistentVolume",
                      "metadata": {"name": pv_name("vol1", "n1", "local-fs"), "labels": {NODE_LABEL_KEY: "n1"}},
                      "spec": {"capacity": {"storage": "20Mi"}, "local": {"path": "/mnt/disks/vol1"},
                               "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                               "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                   {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}})
    proc = localpv("discover", "--dry-run", "--config", str(discovery), "--node", "n1", "-o", "json",
                   "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["volumes"] == []  # vol1 exists already; class "fast" has no StorageClass
    assert {"path": "", "class": "fast", "reason": 'StorageClass "fast" not found'} in doc["skipped"]
    assert apiserver.requests.count(verb="create") == 0 and apiserver.requests.count(verb="patch") == 0


def test_dry_run_uses_the_directories_the_nodes_labels_select(
    tmp_path: Path, mounter: Mounter, apiserver: ApiServer
) -> None:
    """What the node's agent would do with its nodes overrides applied (issue 25.5): by the
    Node's labels with a cluster; without one, by name only, and said."""
    mounter.tmpfs(tmp_path / "nvme" / "vol1")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"storageClassMap": {"local-fs": {
        "hostDir": "/mnt/disks", "mountDir": str(tmp_path / "none"),
        "nodes": [{"matchLabels": {"disk": "nvme"}, "hostDir": "/mnt/nvme", "mountDir": str(tmp_path / "nvme")}]}}}))
    apiserver.create(node("n1", {"disk": "nvme"}))
    apiserver.create(storage_class("local-fs"))
    kubeconfig = tmp_path / "kc"
    apiserver.write_kubeconfig(str(kubeconfig))
    proc = localpv("discover", "--dry-run", "--config", str(cfg), "--node", "n1", "-o", "json",
                   "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 0, proc.stderr
    [volume] = json.loads(proc.stdout)["volumes"]
    assert volume["spec"]["local"]["path"] == "/mnt/nvme/vol1"
    blind = localpv("discover", "--dry-run", "--config", str(cfg), "--node", "n1", "-o", "json")
    assert json.loads(blind.stdout)["volumes"] == []
    assert "the Node's labels are unknown, so the overrides by matchLabels (nodes) are not applied" in blind.stderr


def test_cleanup_device_uses_the_packaged_default_cleaner(loops: LoopDevices) -> None:
    dev = loops.attach(ext4=True)
    assert subprocess.run(["blkid", dev.path], capture_output=True, check=False).returncode == 0
    proc = localpv("cleanup", "--device", dev.path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert subprocess.run(["blkid", "-p", dev.path], capture_output=True, check=False).returncode == 2


def test_cleanup_dir_reports_failure_with_exit_1(tmp_path: Path, mounter: Mounter) -> None:
    vol = mounter.tmpfs(tmp_path / "vol")
    (vol / "a").write_text("x")
    mounter.tmpfs(vol / "nested")
    proc = localpv("cleanup", "--dir", str(vol), "--discovery-dir", str(tmp_path))
    assert proc.returncode == 1
    assert "NOT clean" in proc.stderr and "mounted inside the volume" in proc.stderr
    assert "nested" not in proc.stderr, "the names of a tenant's files appear in no output"
    assert not (vol / "a").exists()


def test_cleanup_needs_exactly_one_target() -> None:
    proc = localpv("cleanup")
    assert proc.returncode == 2 and "exactly one of --device or --dir" in proc.stderr

"""kubectl against the emulator: get (tables, JSON, selectors, watch), apply, delete."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path

from localpv_emulator.apiserver import ApiServer
from tests.conftest import require_tools
from tests.emulator.conftest import KUBECTL, Kubectl, kubectl_for, pv, pvc

MANIFEST = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  labels: {app: demo}
data:
  level: "{level}"
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-applied
  labels: {app: demo}
spec:
  capacity: {storage: {size}}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /tmp/applied}
"""


def manifest(tmp_path: Path, level: str, size: str) -> str:
    path = tmp_path / "manifest.yaml"
    path.write_text(MANIFEST.replace("{level}", level).replace("{size}", size))
    return str(path)


def test_get_prints_the_server_side_columns(srv: ApiServer, kubectl: Kubectl) -> None:
    srv.create(pv("pv-a", "2Gi", labels={"tier": "fast"}))
    srv.create(pvc("data", "1Gi"))
    srv.settle()
    out = kubectl("get", "pv").stdout.splitlines()
    assert out[0].split()[:6] == ["NAME", "CAPACITY", "ACCESS", "MODES", "RECLAIM", "POLICY"]
    assert out[1].split()[:6] == ["pv-a", "2Gi", "RWO", "Retain", "Bound", "default/data"]
    claims = kubectl("get", "pvc", "-n", "default").stdout.splitlines()
    assert claims[1].split()[:3] == ["data", "Bound", "pv-a"]


def test_get_json_and_label_selection(srv: ApiServer, kubectl: Kubectl) -> None:
    srv.create(pv("pv-a", labels={"tier": "fast"}))
    srv.create(pv("pv-b", labels={"tier": "slow"}))
    listing = json.loads(kubectl("get", "pv", "-o", "json").stdout)
    assert [item["metadata"]["name"] for item in listing["items"]] == ["pv-a", "pv-b"]
    assert kubectl("get", "pv", "-l", "tier=slow", "-o", "name").stdout.split() == ["persistentvolume/pv-b"]
    assert kubectl("get", "pv", "-l", "tier=none").stdout == ""


def test_apply_creates_then_changes_then_delete_removes(srv: ApiServer, kubectl: Kubectl, tmp_path: Path) -> None:
    out = kubectl("apply", "-f", manifest(tmp_path, "1", "1Gi")).stdout
    assert "configmap/settings created" in out and "persistentvolume/pv-applied created" in out
    out = kubectl("apply", "-f", manifest(tmp_path, "2", "3Gi")).stdout
    assert "configmap/settings configured" in out and "persistentvolume/pv-applied configured" in out
    settings = srv.get("v1", "ConfigMap", "settings", "default")
    volume = srv.get("v1", "PersistentVolume", "pv-applied")
    assert settings is not None and settings["data"] == {"level": "2"}
    assert volume is not None and volume["spec"]["capacity"] == {"storage": "3Gi"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in volume["metadata"]["annotations"]
    assert "unchanged" in kubectl("apply", "-f", manifest(tmp_path, "2", "3Gi")).stdout
    kubectl("delete", "-f", manifest(tmp_path, "2", "3Gi"))
    assert srv.get("v1", "ConfigMap", "settings", "default") is None
    assert srv.get("v1", "PersistentVolume", "pv-applied") is None


def test_apply_works_for_the_oldest_kubectl_too(tmp_path: Path) -> None:
    """kubectl before 1.29 reads the protobuf OpenAPI v2 document to decide on validation."""
    with ApiServer(binder=False, kube_version="1.27.3") as old:
        run = kubectl_for(old, tmp_path)
        assert "created" in run("apply", "-f", manifest(tmp_path, "1", "1Gi")).stdout
        assert "configured" in run("apply", "-f", manifest(tmp_path, "2", "1Gi")).stdout


def test_delete_by_name_and_errors(srv: ApiServer, kubectl: Kubectl) -> None:
    srv.create(pv("pv-a"))
    assert 'persistentvolume "pv-a" deleted' in kubectl("delete", "pv", "pv-a").stdout
    missing = kubectl("delete", "pv", "pv-a", check=False)
    assert missing.returncode != 0
    assert 'persistentvolumes "pv-a" not found' in missing.stderr


def test_get_watch_prints_new_objects(srv: ApiServer, tmp_path: Path) -> None:
    require_tools("kubectl")
    config = srv.write_kubeconfig(tmp_path / "kubeconfig")
    srv.create(pv("pv-a"))
    proc = subprocess.Popen([str(KUBECTL), "--kubeconfig", str(config), "get", "pv", "--watch", "--no-headers"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or []], daemon=True).start()
    try:
        assert lines.get(timeout=10).split()[0] == "pv-a"
        srv.create(pv("pv-b"))
        assert any(lines.get(timeout=10).split()[0] == "pv-b" for _ in range(5))
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_api_resources_and_version(kubectl: Kubectl) -> None:
    resources = kubectl("api-resources", "-o", "name").stdout.split()
    assert {"persistentvolumes", "storageclasses.storage.k8s.io", "jobs.batch", "leases.coordination.k8s.io"} <= set(
        resources)
    version = json.loads(kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.31.0"

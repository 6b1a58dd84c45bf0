"""The long-running commands, as real processes against the emulator with a token
kubeconfig, do their job without ever importing the ``kubernetes`` package (an idle
agent is 20 MiB larger with it, on every node of a DaemonSet). The process runs ``python -m localpv`` through a
small wrapper whose thread writes ``sys.modules`` to a file when the test asks (a line
on its stdin), after the command has done real work: PVs created or deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localpv.naming import NODE_LABEL_KEY
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim, node, storage_class
from tests.conftest import wait_for
from tests.kube.kubeconfigs import write_kubeconfig
from tests.support.hostfs import Mounter

WRAPPER = """
import json, os, runpy, sys, threading

report = sys.argv.pop(1)

def modules_on_request():
    sys.stdin.readline()
    with open(report + ".tmp", "w") as f:
        json.dump(sorted(sys.modules), f)
    os.replace(report + ".tmp", report)

threading.Thread(target=modules_on_request, daemon=True).start()
sys.argv[0] = "localpv"
runpy.run_module("localpv", run_name="__main__", alter_sys=True)
"""

PROVISIONER = "example.com/nfs"


def pvs(apiserver: ApiServer) -> list[dict[str, Any]]:
    return apiserver.list("v1", "PersistentVolume")


@pytest.fixture
def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", apiserver.url, user={"token": "daemon-token"})


def agent(apiserver: ApiServer, tmp_path: Path, mounter: Mounter) -> tuple[list[str], Callable[[], object]]:
    apiserver.create(node("n1"))
    apiserver.create(storage_class("local-fs", binding="Immediate"))
    discovery = tmp_path / "disks"
    for name in ("v1", "v2"):
        mounter.tmpfs(discovery / name, size=1 << 20)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks",
                                                                        "mountDir": str(discovery)}}}))
    args = ["agent", "--config", str(config), "--node", "n1", "--state-dir", str(tmp_path / "state"),
            "--no-host-events"]
    return args, lambda: len(pvs(apiserver)) == 2


def nfs(apiserver: ApiServer, tmp_path: Path, mounter: Mounter) -> tuple[list[str], Callable[[], object]]:
    apiserver.create(storage_class("nfs", binding="Immediate", provisioner=PROVISIONER))
    apiserver.create({**claim("data", "nfs"), "spec": {**claim("data", "nfs")["spec"],
                                                       "accessModes": ["ReadWriteMany"]}})
    export = tmp_path / "export"
    export.mkdir()
    args = ["nfs", "--nfs-server", "nfs.example.com", "--nfs-path", "/exports", "--provisioner-name", PROVISIONER,
            "--mount-dir", str(export)]
    return args, lambda: any(pv["spec"].get("nfs") for pv in pvs(apiserver))


def node_cleanup(apiserver: ApiServer, tmp_path: Path, mounter: Mounter) -> tuple[list[str], Callable[[], object]]:
    """A PV offered on a node the cluster no longer has: deleted by the stale-PV loop."""
    apiserver.create(storage_class("local", binding="Immediate"))
    apiserver.create({"apiVersion": "v1", "kind": "PersistentVolume",
                      "metadata": {"name": "pv-gone", "labels": {NODE_LABEL_KEY: "gone"}},
                      "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                               "storageClassName": "local", "persistentVolumeReclaimPolicy": "Delete",
                               "local": {"path": "/mnt/disks/gone"},
                               "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                   {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gone"]}]}]}}}})
    wait_for(lambda: pvs(apiserver)[0].get("status", {}).get("phase") == "Available",
             what="the PV available")
    args = ["node-cleanup", "--storageclass-names", "local", "--stale-pv-discovery-interval", "200ms"]
    return args, lambda: pvs(apiserver) == []


def claim_labeller(apiserver: ApiServer, tmp_path: Path, mounter: Mounter) -> tuple[list[str], Callable[[], object]]:
    """A claim of a dynamic class scheduled to a node: labelled with it (leader-elected)."""
    apiserver.create(storage_class("dyn", provisioner="local.csi.localpv.dev"))
    apiserver.create(claim("data", "dyn", selected_node="n1"))

    def labelled() -> bool:
        found = apiserver.get("v1", "PersistentVolumeClaim", "data", "default") or {}
        return (found["metadata"].get("labels") or {}).get(NODE_LABEL_KEY) == "n1"

    return ["claim-labeller"], labelled


@pytest.fixture
def mounter() -> Iterator[Mounter]:
    m = Mounter()
    try:
        yield m
    finally:
        m.umount_all()


@pytest.mark.root
@pytest.mark.parametrize("command", [agent, nfs, node_cleanup, claim_labeller],
                         ids=["agent", "nfs", "node-cleanup", "claim-labeller"])
def test_a_daemon_with_a_token_kubeconfig_works_without_the_kubernetes_package(
        command: Callable[[ApiServer, Path, Mounter], tuple[list[str], Callable[[], object]]],
        apiserver: ApiServer, kubeconfig: Path, tmp_path: Path, mounter: Mounter) -> None:
    args, worked = command(apiserver, tmp_path, mounter)
    report = tmp_path / "modules.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, str(report), *args, "--listen-address", "127.0.0.1:0"],
        env={**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": "default",
             "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdin is not None
    try:
        wait_for(lambda: worked() or proc.poll() is not None, timeout=30, what=f"{args[0]} doing its job")
        assert proc.poll() is None, f"{args[0]} ended: {proc.communicate(timeout=10)[1]}"
        proc.stdin.write("\n")
        proc.stdin.flush()
        modules = set(wait_for(lambda: report.exists() and json.loads(report.read_text()),
                               what="the report of sys.modules"))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert {"urllib3", "localpv.kube.transport", "localpv.kube.api"} <= modules, "the report is of a working client"
    assert sorted(m for m in modules if m == "kubernetes" or m.startswith("kubernetes.")) == []
    assert f"INFO localpv.daemon: API server {apiserver.url}: context 'test', a token" in stderr, stderr
    assert proc.returncode == 0, stderr

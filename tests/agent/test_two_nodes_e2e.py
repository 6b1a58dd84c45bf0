"""Two nodes on one host, one ConfigMap (issue 25.5): two real ``localpv agent`` processes with
two node names, each given its own discovery directory and pool by ``nodes`` overrides (one by
name, one by the Node's label), each making PVs and images only in its own directories - what
the two-node real cluster needs, where both kubelets share one host filesystem. A label change
on a Node moves its agent to another directory without a restart."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localpv.agent.journal import Journal
from localpv.kube.api import KubeApi
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim, node, storage_class
from tests.conftest import wait_for
from tests.support.hostfs import LoopDevices, MiB, Mounter
from tests.support.labeller import running_labeller

pytestmark = pytest.mark.root

DRIVER = "local.csi.localpv.dev"


def configmap(root: Path) -> dict[str, Any]:
    """Defaults that exist on no node; node-a named, node-b selected by its label."""
    return {
        "storageClassMap": {"local-fs": {
            "hostDir": str(root / "default" / "disks"), "mountDir": str(root / "default" / "disks"),
            "nodes": [{"name": "node-a", "hostDir": str(root / "a" / "disks")},
                      {"matchLabels": {"example.com/disks": "b"}, "hostDir": str(root / "b" / "disks")},
                      {"matchLabels": {"example.com/disks": "b2"}, "hostDir": str(root / "b" / "disks2")}]}},
        "dynamicPools": {"big": {
            "hostDir": str(root / "default" / "pool"),
            "nodes": [{"name": "node-a", "hostDir": str(root / "a" / "pool")},
                      {"matchLabels": {"example.com/disks": "b"}, "hostDir": str(root / "b" / "pool")},
                      {"matchLabels": {"example.com/disks": "b2"}, "hostDir": str(root / "b" / "pool")}]}},
        "dynamicClassMap": {"dyn": {"pool": "big"}},
    }


class Agents:
    """``python -m localpv agent`` per node: its own state dir and kubelet dir, one ConfigMap."""

    def __init__(self, root: Path, sockets: Path, config: Path, kubeconfig: Path) -> None:
        self.root, self.sockets, self.config, self.kubeconfig = root, sockets, config, kubeconfig
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str) -> None:
        state = self.root / name / "state"
        state.mkdir(parents=True)
        Journal.initialise(state / "journal.json")  # a node whose volumes the test made: nothing to recover
        argv = [sys.executable, "-m", "localpv", "-v", "agent", "--config", str(self.config), "--node", name,
                "--kubeconfig", str(self.kubeconfig), "--listen-address", "127.0.0.1:0", "--state-dir", str(state),
                "--kubelet-dir", str(self.sockets / name), "--discovery-period", "200ms", "--config-sync-period",
                "200ms", "--no-host-events"]
        (self.sockets / name).mkdir()
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(20)


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for the kubelet dirs (a socket's path holds 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="lpv-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def local_pvs(apiserver: ApiServer) -> dict[str, str]:
    """Static PVs: their path -> the node their affinity names."""
    found = {}
    for pv in apiserver.list("v1", "PersistentVolume"):
        if "local" in pv["spec"]:
            term = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
            found[pv["spec"]["local"]["path"]] = term["values"][0]
    return found


def dynamic_pv(apiserver: ApiServer, claim_name: str) -> dict[str, Any] | None:
    pvc = apiserver.get("v1", "PersistentVolumeClaim", claim_name, "default")
    assert pvc is not None
    name = f"pvc-{pvc['metadata']['uid']}"
    return apiserver.get("v1", "PersistentVolume", name)


def test_two_agents_of_one_configmap_keep_to_their_own_directories(
        apiserver: ApiServer, kube: KubeApi, loops: LoopDevices, mounter: Mounter, tmp_path: Path,
        sockets: Path) -> None:
    root = tmp_path
    for name in ("a", "b"):
        mounter.tmpfs(root / name / "disks" / "vol1")
        mounter.device(loops.attach(256 * MiB, ext4=True).path, root / name / "pool")
    mounter.tmpfs(root / "b" / "disks2" / "vol2")
    apiserver.create(node("node-a"))
    apiserver.create(node("node-b", {"example.com/disks": "b"}))
    apiserver.create(storage_class("local-fs", binding="Immediate"))
    apiserver.create(storage_class("dyn", provisioner=DRIVER, parameters={"pool": "big"}))
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(configmap(root)))
    kubeconfig = root / "kubeconfig"
    apiserver.write_kubeconfig(str(kubeconfig))
    agents = Agents(root, sockets, config, kubeconfig)
    with running_labeller(kube):  # each agent sees the claims labelled with its node
        try:
            agents.start("node-a")
            agents.start("node-b")
            expected = {str(root / "a" / "disks" / "vol1"): "node-a", str(root / "b" / "disks" / "vol1"): "node-b"}
            wait_for(lambda: local_pvs(apiserver) == expected, timeout=60,
                     what=f"one PV per node, each of its own directory (logs: {root}/node-*.log)")

            for name, selected in (("c-a", "node-a"), ("c-b", "node-b")):
                apiserver.create(claim(name, "dyn", size="32Mi", selected_node=selected))
            for name, mine, other in (("c-a", "a", "b"), ("c-b", "b", "a")):
                pv = wait_for(lambda name=name: dynamic_pv(apiserver, name), timeout=60,  # type: ignore[misc]
                              what=f"the dynamic PV of {name}")
                volume = pv["metadata"]["name"]
                assert (root / mine / "pool" / volume).is_dir()
                assert not (root / other / "pool" / volume).exists()
                term = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
                assert term["values"] == [f"node-{mine}"]
            assert not (root / "default").exists()  # no agent used the defaults

            # node-b's label now selects another discovery directory: taken up without a restart.
            labelled = apiserver.get("v1", "Node", "node-b")
            assert labelled is not None
            labelled["metadata"]["labels"]["example.com/disks"] = "b2"
            apiserver.update(labelled)
            wait_for(lambda: str(root / "b" / "disks2" / "vol2") in local_pvs(apiserver), timeout=60,
                     what="node-b's agent to offer the volume of its new directory")
            assert local_pvs(apiserver)[str(root / "b" / "disks2" / "vol2")] == "node-b"
            assert agents.alive(), "an agent exited"
        finally:
            agents.stop()

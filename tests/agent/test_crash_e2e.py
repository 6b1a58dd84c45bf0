"""kill -9 of the real `localpv agent` process mid-clean: the volume is never offered dirty."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim
from tests.agent.conftest import NODE, AgentEnv
from tests.conftest import wait_for
from tests.support.hostfs import LoopDevices

pytestmark = pytest.mark.root


class AgentProcess:
    """`python -m localpv agent` as a real child process."""

    def __init__(self, env: AgentEnv, config: Path, kubeconfig: Path) -> None:
        self.argv = [sys.executable, "-m", "localpv", "-v", "agent", "--config", str(config), "--node", NODE,
                     "--kubeconfig", str(kubeconfig), "--listen-address", "127.0.0.1:0",
                     "--state-dir", str(env.state_dir), "--discovery-period", "200ms", "--no-host-events"]
        self.log = env.root / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    apiserver.write_kubeconfig(str(path))
    return path


@pytest.fixture
def agent_process(agent_env: AgentEnv, kubeconfig: Path, tmp_path: Path) -> Iterator[Any]:
    made: list[AgentProcess] = []

    def make(config: dict[str, Any]) -> AgentProcess:
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        process = AgentProcess(agent_env, path, kubeconfig)
        made.append(process)
        return process

    yield make
    for process in made:
        process.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_kill9_mid_clean_then_restart_cleans_and_never_offers_dirty_data(
    agent_env: AgentEnv, agent_process: Any, loops: LoopDevices, tmp_path: Path
) -> None:
    dev = loops.attach(size=4 * 1024 * 1024)
    (agent_env.block_dir / "disk1").symlink_to(dev.path)
    gate, pids = tmp_path / "gate", tmp_path / "pids"
    script = tmp_path / "slow.sh"
    script.write_text(f"#!/bin/sh\necho $$ >> {pids}\nwhile [ ! -e {gate} ]; do sleep 0.02; done\n"
                      'dd if=/dev/zero of="$LOCAL_PV_BLKDEVICE" bs=1M oflag=direct 2>/dev/null; exit 0\n')
    script.chmod(0o755)
    agent = agent_process({"storageClassMap": {"fast": {
        "hostDir": "/mnt/fast", "mountDir": str(agent_env.block_dir), "volumeMode": "Block",
        "blockCleanerCommand": [str(script)]}}})
    agent.start()
    host_path = "/mnt/fast/disk1"
    old = wait_for(lambda: agent_env.phase(host_path) == "Available" and agent_env.pv_for(host_path),
                   timeout=20, what="PV Available")
    agent_env.apiserver.create(claim("c1", "fast", mode="Block"))
    wait_for(lambda: agent_env.phase(host_path) == "Bound", timeout=10)
    with open(dev.path, "r+b") as f:
        f.write(b"\xee" * 65536)
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")

    first = int(wait_for(lambda: pids.exists() and pids.read_text().split(), timeout=20, what="cleaner")[0])
    agent.kill9()
    assert alive(first), "the cleaner outlives a SIGKILLed agent (own session): the restart must deal with it"
    pv = agent_env.pv_for(host_path)
    assert pv is not None and pv["metadata"]["uid"] == old["metadata"]["uid"]

    agent.start()
    wait_for(lambda: not alive(first), timeout=20, what="leftover cleaner killed by the restarted agent")
    wait_for(lambda: len(pids.read_text().split()) >= 2, timeout=20, what="a fresh cleaner")
    pv = agent_env.pv_for(host_path)
    assert pv is not None and pv["metadata"]["uid"] == old["metadata"]["uid"], "not offered before clean"
    gate.touch()
    wait_for(lambda: (p := agent_env.pv_for(host_path)) is not None and p["metadata"]["uid"] != old["metadata"]["uid"]
             and p.get("status", {}).get("phase") == "Available", timeout=20, what="offered again")
    with open(dev.path, "rb") as f:
        assert f.read() == b"\0" * dev.size


def test_pv_deleted_while_agent_is_down_is_cleaned_before_reoffer(
    agent_env: AgentEnv, agent_process: Any, mounter: Any
) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent = agent_process({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks",
                                                            "mountDir": str(agent_env.fs_dir)}}})
    agent.start()
    host_path = "/mnt/disks/vol1"
    old = wait_for(lambda: agent_env.phase(host_path) == "Available" and agent_env.pv_for(host_path), timeout=20)
    agent_env.apiserver.create(claim("c1", "local-fs"))
    wait_for(lambda: agent_env.phase(host_path) == "Bound", timeout=10)
    wait_for(lambda: "used" in (agent_env.state_dir / "journal.json").read_text(), timeout=10,
             what="journal records the use")
    (vol / "data").write_text("tenant data")
    agent.kill9()
    # While the agent is down, someone deletes the claim and the PV object by hand.
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    agent_env.apiserver.delete("v1", "PersistentVolume", old["metadata"]["name"])
    agent.start()
    new = wait_for(lambda: agent_env.pv_for(host_path), timeout=20, what="re-offered")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert os.listdir(vol) == [], "the volume must be cleaned before it is offered again"

"""One agent per state dir (issue 24, item 4; issue 23's "one journal file never shared by two
agents"), with real agent processes against the emulator: a second agent on the same
``--state-dir`` exits at start with one line naming the dir and the holder, the first goes on,
``localpv status`` still answers, and the lock dies with its holder."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from localpv.agent.journal import Journal
from localpv.agent.statedir import LOCK_FILE, StateDirInUse, lock_state_dir
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node, storage_class
from tests.agent.test_cli_errors_e2e import localpv
from tests.conftest import wait_for
from tests.support.hostfs import Mounter
from tests.unit.test_cli_errors import assert_process_one_line_error


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Node:
    """A node with two tmpfs volumes, a configuration and a kubeconfig for real agents."""

    def __init__(self, apiserver: ApiServer, tmp_path: Path, mounter: Mounter) -> None:
        apiserver.create(node("n1"))
        apiserver.create(storage_class("local-fs", binding="Immediate"))
        discovery = tmp_path / "disks"
        for name in ("v1", "v2"):
            mounter.tmpfs(discovery / name, size=1 << 20)
        self.config = tmp_path / "config.yaml"
        self.config.write_text(yaml.safe_dump({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks",
                                                                                "mountDir": str(discovery)}}}))
        self.kubeconfig = str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))
        self.state = tmp_path / "state"
        self.apiserver = apiserver
        self.procs: list[subprocess.Popen[str]] = []

    def args(self, port: int) -> list[str]:
        return ["agent", "--config", str(self.config), "--node", "n1", "--kubeconfig", self.kubeconfig,
                "--state-dir", str(self.state), "--listen-address", f"127.0.0.1:{port}", "--no-host-events"]

    def start(self, port: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-m", "localpv", *self.args(port)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def published(self) -> int:
        return len(self.apiserver.list("v1", "PersistentVolume"))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def node_env(apiserver: ApiServer, tmp_path: Path, mounter: Mounter) -> Iterator[Node]:
    env = Node(apiserver, tmp_path, mounter)
    try:
        yield env
    finally:
        env.stop_all()


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.mark.root
def test_a_second_agent_on_the_same_state_dir_exits_at_start_naming_the_dir_and_the_holder(
        node_env: Node) -> None:
    first_port = free_port()
    first = node_env.start(first_port)
    wait_for(lambda: (node_env.published() == 2 and ready(first_port)) or first.poll() is not None, timeout=30,
             what="the first agent publishing its volumes")
    assert first.poll() is None, first.stderr.read() if first.stderr else ""
    requests = node_env.apiserver.requests.count()
    second = localpv(*node_env.args(free_port()), timeout=30)
    line = assert_process_one_line_error(second, "--state-dir", str(node_env.state))
    assert f"pid {first.pid}" in line, line
    assert node_env.apiserver.requests.count() == requests, "the second agent asked the cluster nothing"
    assert first.poll() is None, "the first agent goes on"
    # Readers need no lock: the agent's status, and the journal file itself.
    status = localpv("status", "--agent-url", f"http://127.0.0.1:{first_port}", "-o", "json")
    assert status.returncode == 0 and "/mnt/disks/v1" in status.stdout, status.stderr
    assert {path for path, _ in Journal(node_env.state / "journal.json")} == {"/mnt/disks/v1", "/mnt/disks/v2"}
    # The lock dies with its holder, however it dies: the next agent starts.
    first.kill()
    first.wait(10)
    third_port = free_port()
    third = node_env.start(third_port)
    wait_for(lambda: ready(third_port) or third.poll() is not None, timeout=30, what="the next agent running")
    assert third.poll() is None, third.stderr.read() if third.stderr else ""


def test_the_lock_is_not_inherited_by_the_processes_the_agent_starts(tmp_path: Path) -> None:
    lock = lock_state_dir(str(tmp_path))
    try:
        assert fcntl.fcntl(lock.fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        # A child started without closing descriptors (as a cleaner might be) holds nothing of it.
        child = subprocess.run([sys.executable, "-c", f"import os, sys; os.fstat({lock.fd})"], close_fds=False,
                               capture_output=True, text=True, check=False)
        assert child.returncode != 0 and "Bad file descriptor" in child.stderr
        with pytest.raises(StateDirInUse, match=f"pid {os.getpid()} on "):
            lock_state_dir(str(tmp_path))
    finally:
        lock.release()
    lock_state_dir(str(tmp_path)).release()  # released: free again
    assert (tmp_path / LOCK_FILE).exists()

"""Issue 12, the cases that need a process of their own: an API server (the emulator), a
server that never answers, a read-only mount, or a mistake that used to retry forever.

Each runs ``python -m localpv``; the subprocess timeout only bounds a regression (the
fixed commands end in about a second).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node
from tests.support.hostfs import Mounter, sh
from tests.unit.test_cli_errors import CONFIG, ENV_NAMES, assert_process_one_line_error


def localpv(*args: str, env: dict[str, str] | None = None, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ENV_NAMES and not k.startswith("LOCALPV_")}
    return subprocess.run([sys.executable, "-m", "localpv", *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env={**base, **(env or {})})


@pytest.fixture
def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> str:
    return str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))


def write_kubeconfig(path: Path, server: str) -> str:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n")
    return str(path)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An address that accepts connections (the kernel completes them) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def refused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # closed again: connections are refused


# ------------------------------------------------------------------ discover against a cluster


def test_discover_reports_an_api_server_that_refuses_in_one_line(tmp_path: Path) -> None:
    url = refused_url()
    kc = write_kubeconfig(tmp_path / "kc", url)
    proc = localpv("discover", "--dry-run", "--config", CONFIG, "--node", "n1", "--kubeconfig", kc)
    line = assert_process_one_line_error(proc, f"cannot reach the API server at {url}", code=1)
    assert "refused" in line


def test_discover_gives_up_on_a_silent_api_server_within_its_request_timeout(tmp_path: Path,
                                                                            silent_server: str) -> None:
    kc = write_kubeconfig(tmp_path / "kc", silent_server)
    started = time.monotonic()
    proc = localpv("discover", "--dry-run", "--config", CONFIG, "--node", "n1", "--kubeconfig", kc,
                   "--request-timeout", "0.5s")
    elapsed = time.monotonic() - started
    line = assert_process_one_line_error(proc, f"cannot reach the API server at {silent_server}", code=1)
    assert "0.5s" in line
    assert elapsed < 8, elapsed  # one attempt, no retries (process start included)


def test_discover_names_the_node_the_cluster_does_not_have(apiserver: ApiServer, kubeconfig: str) -> None:
    apiserver.create(node("n1"))
    proc = localpv("discover", "--dry-run", "--config", CONFIG, "--node", "n2", "--kubeconfig", kubeconfig)
    assert_process_one_line_error(proc, "--node", "n2")


def test_discover_with_an_empty_node_name_builds_nothing() -> None:
    proc = localpv("discover", "--dry-run", "--config", CONFIG, "--node", "")
    assert_process_one_line_error(proc, "--node")
    assert proc.stdout == ""


# ------------------------------------------------------------------ agent


@pytest.mark.parametrize("source", ["flag", "env"])
def test_agent_with_an_empty_node_name_exits_2_before_asking_the_cluster(apiserver: ApiServer, kubeconfig: str,
                                                                        tmp_path: Path, source: str) -> None:
    """It used to read ``/api/v1/nodes/`` (a list) and fail with "Node None has no uid"."""
    apiserver.create(node("n1"))
    apiserver.requests.clear()
    args = ["agent", "--config", CONFIG, "--kubeconfig", kubeconfig, "--state-dir", str(tmp_path / "state"),
            "--listen-address", "127.0.0.1:0"]
    proc = localpv(*args, "--node", "") if source == "flag" else localpv(*args, env={"MY_NODE_NAME": ""})
    assert_process_one_line_error(proc, "--node" if source == "flag" else "MY_NODE_NAME")
    assert apiserver.requests.count() == 0


def test_agent_reports_the_default_port_in_use_before_starting(apiserver: ApiServer, kubeconfig: str,
                                                              tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        proc = localpv("agent", "--config", CONFIG, "--node", "n1", "--kubeconfig", kubeconfig,
                       "--state-dir", str(tmp_path / "state"), "--listen-address", address)
    assert "in use" in assert_process_one_line_error(proc, "--listen-address", address)
    assert apiserver.requests.count() == 0  # nothing ran: not even the Node was read


@pytest.mark.root
def test_agent_refuses_a_read_only_state_dir(apiserver: ApiServer, kubeconfig: str, tmp_path: Path,
                                             mounter: Mounter) -> None:
    state = mounter.tmpfs(tmp_path / "state")
    sh("mount", "-o", "remount,ro", state)
    proc = localpv("agent", "--config", CONFIG, "--node", "n1", "--kubeconfig", kubeconfig,
                   "--state-dir", str(state), "--listen-address", "127.0.0.1:0")
    assert "not writable" in assert_process_one_line_error(proc, "--state-dir", str(state))
    assert apiserver.requests.count() == 0


# ------------------------------------------------------------------ nfs


def nfs_args(tmp_path: Path, kubeconfig: str, name: str) -> list[str]:
    export = tmp_path / "export"
    export.mkdir(exist_ok=True)
    return ["nfs", "--nfs-server", "nfs.example", "--nfs-path", "/exports", "--provisioner-name", name,
            "--mount-dir", str(export), "--kubeconfig", kubeconfig, "--listen-address", "127.0.0.1:0"]


@pytest.mark.parametrize(("name", "word"), [
    ("Example.com/NFS", "Lease"),          # a valid StorageClass provisioner, but not a valid Lease name
    ("example.com/nfs_subdir", "Lease"),
    ("a/b/c", "qualified name"),           # no StorageClass can name it
    ("example.com/-nfs", "qualified name"),
    ("/nfs", "qualified name"),
    ("example.com/" + "n" * 64, "63"),
], ids=["uppercase", "underscore", "two-slashes", "leading-dash", "empty-prefix", "name-too-long"])
def test_nfs_refuses_a_provisioner_name_kubernetes_rejects(apiserver: ApiServer, kubeconfig: str, tmp_path: Path,
                                                          name: str, word: str) -> None:
    proc = localpv(*nfs_args(tmp_path, kubeconfig, name))
    assert word in assert_process_one_line_error(proc, "PROVISIONER_NAME", name)
    assert apiserver.requests.count() == 0


def test_nfs_without_leader_election_accepts_a_name_only_a_lease_would_refuse() -> None:
    from localpv.naming import provisioner_name_problem

    assert provisioner_name_problem("Example.com/NFS", leader_election=False) is None
    assert provisioner_name_problem("Example.com/NFS", leader_election=True) is not None
    assert provisioner_name_problem("k8s-sigs.io/nfs-subdir-external-provisioner", leader_election=True) is None
    assert provisioner_name_problem("nfs", leader_election=True) is None


def test_nfs_reports_an_unusable_kubeconfig_and_listen_address_in_the_real_process(tmp_path: Path) -> None:
    args = nfs_args(tmp_path, "/bin/ls", "example.com/nfs")
    assert_process_one_line_error(localpv(*args), "--kubeconfig", "/bin/ls")
    kc = write_kubeconfig(tmp_path / "kc", refused_url())
    args = nfs_args(tmp_path, kc, "example.com/nfs")
    args[args.index("--listen-address") + 1] = ":99999"
    assert_process_one_line_error(localpv(*args), "--listen-address", ":99999")

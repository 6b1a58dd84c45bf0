"""``localpv nfs``: upstream's environment variables, flags, probes and metrics, exit codes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from localpv.cli import cli
from localpv.naming import lock_name
from localpv_emulator.apiserver import ApiServer
from tests.conftest import http_get as get
from tests.conftest import wait_for
from tests.nfs.conftest import NFS_PATH, PROVISIONER, SERVER, Cluster, Layout

UPSTREAM_ENV = ("NFS_SERVER", "NFS_PATH", "PROVISIONER_NAME", "ENABLE_LEADER_ELECTION", "KUBECONFIG", "POD_NAMESPACE",
                "NFS_MOUNT_DIR", "LOCALPV_CLUSTER_ID")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in UPSTREAM_ENV:
        monkeypatch.delenv(name, raising=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_runs_from_upstream_env_vars_serves_metrics_and_stops_cleanly_on_sigterm(
        apiserver: ApiServer, cluster: Cluster, layout: Layout, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "NFS_SERVER": SERVER, "NFS_PATH": NFS_PATH, "PROVISIONER_NAME": PROVISIONER, "ENABLE_LEADER_ELECTION": "1",
        "KUBECONFIG": str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")), "POD_NAMESPACE": "kube-system",
        "NFS_MOUNT_DIR": str(layout.export), "LOCALPV_LISTEN_ADDRESS": f"127.0.0.1:{port}",
    }
    cluster.storage_class()
    cluster.claim("cli")
    proc = subprocess.Popen([sys.executable, "-m", "localpv", "nfs"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        pv = wait_for(lambda: cluster.bound_pv("cli"), timeout=20, what="bound by the CLI process")
        assert pv["spec"]["nfs"]["server"] == SERVER
        base = f"http://127.0.0.1:{port}"
        counted = 'controller_persistentvolumeclaim_provision_total{class="nfs"} 1.0'
        _, body = wait_for(lambda: (r := get(base + "/metrics"))[0] == 200 and counted in r[1] and r,
                           what="provision counted in the served metrics")
        assert "localpv_leader 1.0" in body
        assert get(base + "/healthz") == (200, "ok\n")
        assert get(base + "/ready") == (200, "leader\n")
        lease = apiserver.get("coordination.k8s.io/v1", "Lease", lock_name(PROVISIONER), "kube-system")
        assert lease is not None and lease["spec"]["holderIdentity"].startswith(socket.gethostname() + "_")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    lease = apiserver.get("coordination.k8s.io/v1", "Lease", lock_name(PROVISIONER), "kube-system")
    assert lease is not None and lease["spec"]["holderIdentity"] == ""  # handed over on the way out
    # a daemon logs at info by default: `kubectl logs` of a working provisioner is not empty
    assert " INFO localpv." in err, err


@pytest.mark.usefixtures("clean_env")
def test_required_settings_are_all_reported_at_once_with_their_variables(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["nfs", "--mount-dir", str(tmp_path)])
    assert result.exit_code == 2
    for env, flag in (("NFS_SERVER", "--nfs-server"), ("NFS_PATH", "--nfs-path"),
                      ("PROVISIONER_NAME", "--provisioner-name")):
        assert f"error: {env} is required (or {flag})" in result.output


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {"ENABLE_LEADER_ELECTION": "yes"}, "ENABLE_LEADER_ELECTION: invalid boolean 'yes'"),
        (["--enable-leader-election", "maybe"], {}, "ENABLE_LEADER_ELECTION: invalid boolean 'maybe'"),
        (["--nfs-path", "exports"], {}, "NFS_PATH must be absolute"),
        ([], {"NFS_MOUNT_DIR": "/nonexistent/mount"}, "mount directory '/nonexistent/mount' does not exist"),
        (["--dir-mode", "0999"], {}, "expected an octal mode"),
        (["--lease-duration", "5s"], {}, "retry_period < renew_deadline < lease_duration"),
        (["--cluster-id", "prod cluster"], {}, '--cluster-id "prod cluster": expected letters, digits'),
        ([], {"LOCALPV_CLUSTER_ID": "-prod"}, 'LOCALPV_CLUSTER_ID="-prod": expected letters, digits'),
    ],
)
def test_bad_settings_exit_2_naming_the_setting(tmp_path: Path, args: list[str], env: dict[str, str],
                                                message: str) -> None:
    base = {"NFS_SERVER": SERVER, "NFS_PATH": NFS_PATH, "PROVISIONER_NAME": PROVISIONER,
            "NFS_MOUNT_DIR": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing-kubeconfig")}
    result = CliRunner().invoke(cli, ["nfs", *args], env={**base, **env})
    assert result.exit_code == 2, result.output
    assert message in result.output


def process_env(apiserver: ApiServer, layout: Layout, tmp_path: Path, **extra: str) -> dict[str, str]:
    """``localpv nfs`` in a process of its own against the emulator, configured as upstream's."""
    return {**os.environ, "NFS_SERVER": SERVER, "NFS_PATH": NFS_PATH, "PROVISIONER_NAME": PROVISIONER,
            "ENABLE_LEADER_ELECTION": "false", "NFS_MOUNT_DIR": str(layout.export),
            "KUBECONFIG": str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
            "LOCALPV_LISTEN_ADDRESS": f"127.0.0.1:{free_port()}", **extra}


def test_without_a_readable_cluster_id_it_exits_2_with_one_line_naming_the_flag(
        apiserver: ApiServer, cluster: Cluster, layout: Layout, tmp_path: Path) -> None:
    """Its RBAC lacks get on namespace kube-system: never run without a cluster id."""
    apiserver.deny("get", "namespaces")
    cluster.storage_class()
    cluster.claim("waits")
    env = {k: v for k, v in process_env(apiserver, layout, tmp_path).items() if k != "LOCALPV_CLUSTER_ID"}
    proc = subprocess.run([sys.executable, "-m", "localpv", "nfs"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: cannot read the cluster id: ")
    assert "403" in lines[0] and "--cluster-id (or LOCALPV_CLUSTER_ID)" in lines[0]
    assert os.listdir(layout.export) == [] and cluster.pvs() == []


def test_an_explicit_cluster_id_needs_no_read_of_the_cluster(apiserver: ApiServer, cluster: Cluster,
                                                            layout: Layout, tmp_path: Path) -> None:
    apiserver.deny("get", "namespaces")
    cluster.storage_class()
    cluster.claim("given")
    env = process_env(apiserver, layout, tmp_path, LOCALPV_CLUSTER_ID="prod-eu-1")
    proc = subprocess.Popen([sys.executable, "-m", "localpv", "nfs"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        pv = wait_for(lambda: cluster.bound_pv("given"), timeout=20, what="bound by the CLI process")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "cluster id prod-eu-1" in err
    [record] = [p for p in (layout.export / ".localpv").rglob("record")]
    assert json.loads(record.read_text())["cluster"] == "prod-eu-1"
    assert pv["spec"]["nfs"]["path"].startswith(NFS_PATH + "/")
    assert not [r for r in apiserver.requests if r.resource == "namespaces"]


@pytest.mark.usefixtures("clean_env")
def test_an_api_server_that_does_not_answer_for_the_cluster_id_is_exit_1_not_a_setting(
        apiserver: ApiServer, layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 2 says "change a setting"; an API server down at start is the kubelet's to retry."""
    from localpv.nfs import app
    from localpv.nfs.cluster import ClusterIdUnavailable

    def unanswered(api: object) -> str:
        raise ClusterIdUnavailable("reading namespace kube-system: 503 ServiceUnavailable: down", settable=False)

    monkeypatch.setattr(app, "read_cluster_id", unanswered)
    env = process_env(apiserver, layout, tmp_path, LOCALPV_LISTEN_ADDRESS="127.0.0.1:0")
    result = CliRunner().invoke(cli, ["nfs"], env={k: v for k, v in env.items() if k != "LOCALPV_CLUSTER_ID"})
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        "error: cannot read the cluster id: reading namespace kube-system: 503 ServiceUnavailable: down; the "
        "provisioner needs it before it starts"]

"""The standalone entry point: writes a kubeconfig, serves, stops on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

from kubernetes import client, config

from tests.emulator.conftest import wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_standalone_server_serves_the_kubeconfig_it_writes(tmp_path: Path) -> None:
    port, kubeconfig = free_port(), tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "localpv_emulator.apiserver", "--port", str(port),
                             "--kubeconfig-out", str(kubeconfig), "--binder", "--job-completer"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert f"serving on http://127.0.0.1:{port}" in proc.stdout.readline()
        api = config.new_client_from_config(str(kubeconfig))
        core = client.CoreV1Api(api)
        core.create_persistent_volume({"metadata": {"name": "pv-a"}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}}})
        wait_for(lambda: core.read_persistent_volume("pv-a").status.phase == "Available", what="binder")
        api.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait(timeout=5)

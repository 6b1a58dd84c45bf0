"""`localpv demo` is the README's first command: it must really walk the whole lifecycle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for

STEPS = ("1. discovered", "2. claim bound", "3. tenant writes data", "4. claim deleted",
         "5. cleaned and offered again", "done")


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "localpv", "demo", "--timeout", "20", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.root
def test_demo_with_real_tmpfs_mounts() -> None:
    proc = run_demo()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in STEPS:
        assert step in proc.stdout
    assert "mounted 2 real tmpfs volumes" in proc.stdout


def test_demo_with_simulated_mounts_says_so() -> None:
    proc = run_demo("--simulate-mounts")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SIMULATED" in proc.stdout
    for step in STEPS:
        assert step in proc.stdout


def _demo_mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if "/localpv-demo-" in line.split()[4]]


@pytest.mark.root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_demo_stopped_by_a_signal_leaves_no_mounts(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C cleaned up but SIGTERM (what `timeout`, systemd and kubectl send) left the
    tmpfs mounts behind: every way the demo ends unmounts what it mounted."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "localpv", "demo", "--volumes", "50", "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for(lambda: any(m.startswith(str(tmp_path)) for m in _demo_mounts()), timeout=30,
                 what="the demo's first tmpfs mount")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {sig.name}" in err
    leftover = [m for m in _demo_mounts() if m.startswith(str(tmp_path))]
    for m in leftover:
        subprocess.run(["umount", m], check=False)
    assert leftover == []
    assert list(tmp_path.iterdir()) == [], "the demo's work dir is removed"


def test_the_demo_without_the_emulator_says_where_to_run_it() -> None:
    """The production image leaves the emulator out (docs/architecture.md): one line, exit 1."""
    code = ("import sys\n"
            "class Hide:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.startswith('localpv_emulator'):\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "from localpv.cli import main\n"
            "sys.argv = ['localpv', 'demo', '--simulate-mounts']\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: localpv demo needs the API emulator (localpv_emulator), which the production image leaves out: run "
        "it from a checkout (pip install -e . && localpv demo)"]

"""`localpv demo` is the README's first command: it must really walk the whole lifecycle."""

from __future__ import annotations

import subprocess
import sys

import pytest

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

"""``useAlphaAPI: true`` is refused (issue 26): it asked for node affinity in the annotation
``volume.alpha.kubernetes.io/node-affinity``, which Kubernetes stopped reading in 1.11, and the
API server refuses a local PV without ``spec.nodeAffinity``, so every PV create failed while
the configuration was accepted in silence. ``false`` (the only behaviour there is) stays
accepted, so upstream values files and ConfigMaps that spell the default keep working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localpv.config import ConfigError, parse_config

REPO = Path(__file__).resolve().parents[2]
CLASSES = {"storageClassMap": {"sc1": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks"}}}


@pytest.mark.parametrize("value", [True, "true", "yes", "on", "True"])
def test_use_alpha_api_true_is_refused_in_one_line(value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({**CLASSES, "useAlphaAPI": value})
    [problem] = err.value.problems
    assert problem.startswith("useAlphaAPI: expected false or no key"), problem
    assert "1.11" in problem and "spec.nodeAffinity" in problem and problem.endswith("got boolean true"), problem


@pytest.mark.parametrize("value", [False, "false", "no", "off"])
def test_use_alpha_api_false_is_accepted_without_a_word(value: Any) -> None:
    loaded = parse_config({**CLASSES, "useAlphaAPI": value})
    assert loaded.warnings == ()
    assert loaded.config.use_alpha_api is False


def test_config_check_refuses_it_with_one_line_and_exit_2(tmp_path: Path) -> None:
    """As a mounted ConfigMap (one file per key, upstream's format), through the real CLI."""
    (tmp_path / "storageClassMap").write_text("sc1:\n  hostDir: /mnt/disks\n  mountDir: /mnt/disks\n")
    (tmp_path / "useAlphaAPI").write_text("true\n")
    proc = subprocess.run([sys.executable, "-m", "localpv", "config", "check", str(tmp_path)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120, check=False)
    assert proc.returncode == 2, proc
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: useAlphaAPI: expected false or no key"), line
    assert proc.stdout == ""

"""Cleanup Jobs pull their image with the chart's imagePullSecrets (issue 26).

values.yaml said "Pull secrets of every pod and cleanup Job", but the agent made its Jobs
without any: with a private registry every cleanup Job sat in ImagePullBackOff and no
released volume was ever offered again. The chart hands the names to the agent in
LOCALPV_JOB_IMAGE_PULL_SECRETS (tests/helm checks that); here the real `localpv agent`
process reads them and its Jobs carry them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localpv.naming import cleanup_job_name
from tests.agent.conftest import NODE, AgentEnv
from tests.agent.test_cleanup_e2e import bind_and_release
from tests.agent.test_crash_e2e import agent_process, kubeconfig  # noqa: F401  (fixtures)
from tests.conftest import wait_for
from tests.support.hostfs import LoopDevices
from tests.unit.test_cli_errors import assert_process_one_line_error

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.root
def test_cleanup_jobs_carry_the_pull_secrets_the_agent_was_given(
        agent_env: AgentEnv, agent_process: Any, loops: LoopDevices,  # noqa: F811  (the fixture imported above)
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOB_CONTAINER_IMAGE", "registry.example/localpv:test")
    monkeypatch.setenv("LOCALPV_JOB_IMAGE_PULL_SECRETS", "regcred,mirror-cred")
    dev = loops.attach()
    (agent_env.block_dir / "disk1").symlink_to(dev.path)
    agent = agent_process({"useJobForCleaning": True, "storageClassMap": {"fast": {
        "hostDir": "/mnt/fast", "mountDir": str(agent_env.block_dir), "volumeMode": "Block"}}})
    agent.start()
    bind_and_release(agent_env, "/mnt/fast/disk1", "fast", mode="Block")
    pv_name = agent_env.pv_for("/mnt/fast/disk1")["metadata"]["name"]  # type: ignore[index]
    job = wait_for(lambda: agent_env.apiserver.get("batch/v1", "Job", cleanup_job_name(pv_name), "default"),
                   timeout=15, what="the cleanup Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]
    assert pod["containers"][0]["image"] == "registry.example/localpv:test"


@pytest.mark.parametrize(("value", "found"), [("regcred,Bad_Name", '"Bad_Name"'), ("regcred,,other", "an empty")])
def test_a_pull_secret_that_no_secret_can_be_named_is_one_line(tmp_path: Path, value: str, found: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("storageClassMap:\n  fast:\n    hostDir: /mnt/fast\n    mountDir: /mnt/fast\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), LOCALPV_JOB_IMAGE_PULL_SECRETS=value)
    proc = subprocess.run([sys.executable, "-m", "localpv", "agent", "--config", str(config), "--node", NODE,
                           "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert_process_one_line_error(proc, "--job-image-pull-secrets", "(from LOCALPV_JOB_IMAGE_PULL_SECRETS)",
                                  "expected a Secret name", found)

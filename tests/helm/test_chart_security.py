"""What the chart's pods need from the cluster's security settings (issue 26): image pull
secrets reach the cleanup Jobs, and each pod meets the Pod Security Standards level the chart
README and NOTES.txt say its namespace needs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import Install, installed, load_values, run_helm

Obj = dict[str, Any]

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything": load_values("everything-values.yaml"),
    "pull-secrets": {"imagePullSecrets": ["regcred", {"name": "mirror-cred"}], "useJobForCleaning": True},
}


@pytest.fixture(scope="module")
def installs(helm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Install]]:
    done = {name: Install(values) for name, values in SCENARIOS.items()}
    try:
        run_helm(helm_python, list(done.values()), tmp_path_factory.mktemp("helm"))
        yield done
    finally:
        for inst in done.values():
            inst.server.stop()


def agent_env(inst: Install) -> dict[str, Any]:
    [ds] = inst.rendered("DaemonSet")
    [container] = ds["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


# ---------------------------------------------------------------- image pull secrets


def test_the_agent_is_given_the_pull_secrets_for_its_cleanup_jobs(installs: dict[str, Install]) -> None:
    """values.yaml says imagePullSecrets are those "of every pod and cleanup Job"; the agent makes
    the Jobs, so it is told their names (tests/agent/test_job_pull_secrets.py: it uses them)."""
    inst = installed(installs, "pull-secrets")
    assert agent_env(inst)["LOCALPV_JOB_IMAGE_PULL_SECRETS"] == "regcred,mirror-cred"
    [ds] = inst.rendered("DaemonSet")
    assert ds["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]
    assert "LOCALPV_JOB_IMAGE_PULL_SECRETS" not in agent_env(installed(installs, "defaults"))

"""Fixtures for the alert and dashboard tests: promtool and prometheus (Debian's
`prometheus` package, which .ci/run installs), and the fixtures reused from the agent
and chart tests."""

from __future__ import annotations

import os
import shutil

import pytest

# Reused, not copied: a real agent process against the API emulator (tests/agent) and
# the helm-sdkpy interpreter (tests/helm).
from tests.agent.conftest import agent_env  # noqa: F401
from tests.agent.test_crash_e2e import agent_process, kubeconfig  # noqa: F401
from tests.helm.conftest import helm_python  # noqa: F401


def _tool(name: str) -> str:
    """The path of a Prometheus tool. CI must have it (.ci/run installs Debian's prometheus
    package): there a missing one fails the tests; elsewhere they are skipped with the reason."""
    path = shutil.which(name)
    if path is None:
        why = f"{name} is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI installs it in .ci/run")
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return _tool("prometheus")

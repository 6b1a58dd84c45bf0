"""Fixtures for the alert and dashboard tests: promtool and prometheus (Debian's
`prometheus` package, which .ci/run installs), and the fixtures reused from the agent
and chart tests."""

from __future__ import annotations

import shutil

import pytest

# Reused, not copied: a real agent process against the API emulator (tests/agent) and
# the helm-sdkpy interpreter (tests/helm).
from tests.agent.conftest import agent_env  # noqa: F401
from tests.agent.test_crash_e2e import agent_process, kubeconfig  # noqa: F401
from tests.conftest import require_tools
from tests.helm.conftest import helm_python  # noqa: F401


def _tool(name: str) -> str:
    """The path of a Prometheus tool (Debian's prometheus package, which .ci/run installs):
    skipped without it, failed with LOCALPV_REQUIRE_TOOLS=1 (tests.conftest.require_tools)."""
    require_tools(name)
    return str(shutil.which(name))


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return _tool("prometheus")

"""Fixtures for the chart tests: a Python with real Helm, built once per machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helm.helmenv import HelmUnavailable, ensure_helm_python


@pytest.fixture(scope="session")
def helm_python() -> Path:
    """The helm-sdkpy interpreter. CI must have it (``.ci/run`` builds it): there a missing
    Helm fails the tests; elsewhere they are skipped with the reason."""
    try:
        return ensure_helm_python()
    except HelmUnavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"Helm is required in CI: {err}")
        pytest.skip(f"real Helm (helm-sdkpy) cannot be installed here: {err}")

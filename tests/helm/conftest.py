"""Fixtures for the chart tests: a Python with real Helm, built once per machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_TOOLS_ENV
from tests.helm.helmenv import HelmUnavailable, ensure_helm_python


@pytest.fixture(scope="session")
def helm_python() -> Path:
    """The helm-sdkpy interpreter (built on first use, from PyPI). CI must have it (``.ci/run``
    builds it and sets LOCALPV_REQUIRE_TOOLS=1): there a missing Helm fails the tests; elsewhere
    they are skipped with the reason, in one line."""
    try:
        return ensure_helm_python()
    except HelmUnavailable as err:
        why = f"real Helm (helm-sdkpy) cannot be installed here: {' '.join(str(err).split())[:300]}"
        if os.environ.get(REQUIRE_TOOLS_ENV) == "1":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)

"""Every ``[tool.setuptools.package-data]`` glob in pyproject.toml names files that exist.

A glob that matches nothing is silently skipped by setuptools, so a stale entry (there
was one for a ``localpv/examples`` directory that never existed) hides in the config.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DATA: dict[str, list[str]] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-data"]


@pytest.mark.parametrize(("package", "pattern"), [(p, g) for p, globs in PACKAGE_DATA.items() for g in globs])
def test_each_package_data_glob_matches_a_file(package: str, pattern: str) -> None:
    directory = REPO.joinpath(*package.split("."))
    assert directory.is_dir(), f"package-data names package {package}, which has no directory"
    matches = [p for p in directory.glob(pattern) if p.is_file()]
    assert matches, f"package-data glob {pattern!r} of {package} matches no file under {directory.relative_to(REPO)}"


def test_the_cleaner_scripts_are_package_data() -> None:
    # localpv.config finds the default cleaner next to the package (PACKAGED_SCRIPTS_DIR).
    assert "scripts/*.sh" in PACKAGE_DATA["localpv"]

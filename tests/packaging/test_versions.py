"""One version, everywhere a user reads one (issue 26): the package's ``__version__`` is the
source; the distribution's version, the chart's ``version`` and ``appVersion`` (so the default
image tag), the image .ci/e2e builds and tests, ``localpv --version``, the newest CHANGELOG
entry and every image tag the docs and values files show follow it. ``python3 -m tools.version
X.Y.Z`` moves them all."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from localpv import __version__
from tools.version import check, set_version, version_files

REPO = Path(__file__).resolve().parents[2]


def test_the_chart_version_and_app_version_are_the_package_version() -> None:
    chart = yaml.safe_load((REPO / "helm" / "localpv" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)


def test_the_distribution_takes_its_version_from_the_package() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"], "pyproject.toml names a version of its own"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "localpv.__version__"}


def test_localpv_version_is_the_version_of_the_code_that_runs(tmp_path: Path) -> None:
    """Not an installed distribution's metadata, which an editable install keeps from whenever it
    was made: a copy of the package whose __version__ says 9.9.9 says 9.9.9."""
    shutil.copytree(REPO / "localpv", tmp_path / "localpv", ignore=shutil.ignore_patterns("__pycache__"))
    init = tmp_path / "localpv" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{__version__}"', '__version__ = "9.9.9"'))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    for argv in (["--version"], ["version"]):
        proc = subprocess.run([sys.executable, "-m", "localpv", *argv], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=60, check=False)
        assert (proc.returncode, proc.stdout) == (0, "localpv 9.9.9\n"), proc


def test_ci_builds_and_tests_the_image_of_this_version() -> None:
    """.ci/e2e names no version: it reads the package's, for the image it builds and the one the
    e2e tests install."""
    text = (REPO / ".ci" / "e2e").read_text()
    assert not re.search(r"localpv:\d", text), ".ci/e2e spells a version instead of reading it"
    [assignment] = re.findall(r"^VERSION=.*$", text, re.M)
    proc = subprocess.run(["bash", "-c", f"{assignment}; echo \"$VERSION\""], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    assert proc.stdout.strip() == __version__
    assert 'LOCALPV_IMAGE="localhost/localpv:$VERSION"' in text and 'LOCALPV_E2E_IMAGE="$LOCALPV_IMAGE"' in text


def test_every_version_a_user_reads_is_this_one() -> None:
    assert check(REPO, __version__) == [], f"run python3 -m tools.version {__version__}"


def test_the_version_tool_moves_every_place_at_once(tmp_path: Path) -> None:
    for path in version_files(REPO):
        target = tmp_path / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    set_version(tmp_path, "0.2.0")
    assert check(tmp_path, "0.2.0") == []
    assert check(tmp_path, __version__) != []
    chart = yaml.safe_load((tmp_path / "helm" / "localpv" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == ("0.2.0", "0.2.0")
    assert '__version__ = "0.2.0"' in (tmp_path / "localpv" / "__init__.py").read_text()

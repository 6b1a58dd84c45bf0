"""The README's test command on a machine with nothing but Python (issue 26): a test that runs a
system tool a minimal Debian lacks is skipped, in one line naming the tool and its Debian
package, and CI (.ci/run, which installs every tool) turns such a skip into a failure."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_TOOLS_ENV, SYSTEM_TOOLS

REPO = Path(__file__).resolve().parents[2]
CI_RUN = REPO / ".ci" / "run"
README = REPO / "README.md"
#: A test that runs sfdisk (a partition table on a loop device); needs root, as its module does.
SFDISK_TEST = "tests/host/test_identity.py::test_a_partition_is_known_by_its_partition_uuid"


def ci_tools() -> dict[str, str]:
    """The tool:package pairs .ci/run checks and installs."""
    match = re.search(r"for tool in (.*?); do", CI_RUN.read_text(), re.S)
    assert match, ".ci/run no longer has its `for tool in ...; do` list"
    pairs = match.group(1).replace("\\\n", " ").split()
    return dict(pair.split(":", 1) for pair in pairs)


def test_ci_installs_every_tool_a_test_may_skip_for() -> None:
    installed = ci_tools()
    for tool, package in SYSTEM_TOOLS.items():
        assert installed.get(tool) == package, f".ci/run must install {tool} ({package}), as tests/conftest.py says"


def test_ci_makes_a_skip_for_a_missing_tool_a_failure() -> None:
    text = CI_RUN.read_text()
    required = text.find(f"export {REQUIRE_TOOLS_ENV}=1")
    assert required != -1, f".ci/run must export {REQUIRE_TOOLS_ENV}=1"
    assert required < text.find("python3 -m pytest"), f"{REQUIRE_TOOLS_ENV}=1 must be set before the tests run"


def test_the_readme_says_first_what_a_full_run_needs() -> None:
    head = "\n".join(README.read_text().splitlines()[:20])
    assert "pip install -e '.[test]' && python -m pytest" in head
    for package in sorted(set(SYSTEM_TOOLS.values())):
        assert re.search(rf"\b{re.escape(package)}\b", head), f"README's first lines do not name {package}"
    assert REQUIRE_TOOLS_ENV in head


def path_without(tmp_path: Path, hidden: set[str]) -> str:
    """A PATH of one directory with a symlink to every program on this PATH but ``hidden``: the
    machine as a newcomer has it, without uninstalling anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = os.path.join(directory, name)
            link = bin_dir / name
            if name in hidden or link.exists() or link.is_symlink() or not os.access(target, os.X_OK):
                continue
            link.symlink_to(target)
    return str(bin_dir)


def run_pytest(test: str, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != REQUIRE_TOOLS_ENV}
    environ.update(PATH=path, PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", test], cwd=REPO,
                          capture_output=True, text=True, env=environ, timeout=300, check=False)


@pytest.mark.root
def test_a_missing_tool_is_one_skip_line_and_a_failure_where_required(tmp_path: Path) -> None:
    path = path_without(tmp_path, {"sfdisk"})
    why = (f"sfdisk not installed (Debian: apt-get install fdisk; {REQUIRE_TOOLS_ENV}=1 makes this a "
           "failure)")
    skipped = run_pytest(SFDISK_TEST, path)
    assert skipped.returncode == 0, skipped.stdout[-3000:]
    [line] = [ln for ln in skipped.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert line.endswith(why), line
    required = run_pytest(SFDISK_TEST, path, **{REQUIRE_TOOLS_ENV: "1"})
    assert required.returncode == 1, required.stdout[-3000:]
    assert "1 error" in required.stdout and why in required.stdout, required.stdout[-3000:]

"""``localpv config check`` tries each dynamic class's mkfsOptions on a scratch image with the
real mkfs (issue 23): what makes no filesystem is refused in one line, exit 2; a tool that is not
installed is said in one line, and the check goes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import NEEDS_XFS

REPO = Path(__file__).resolve().parents[2]


def config_check(tmp_path: Path, classes: dict[str, dict[str, Any]], *,
                 path: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python3 -m localpv config check`` on a file of these dynamic classes over one pool."""
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"dynamicPools": {"fast": {"hostDir": "/mnt/fast"}},
                                    "dynamicClassMap": {n: {"pool": "fast", **c} for n, c in classes.items()}}))
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "localpv", "config", "check", str(conf)], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


@pytest.mark.parametrize(("cls", "said"), [
    ({"mkfsOptions": "-b 999"}, "mkfs.ext4 failed (1): mkfs.ext4: invalid block size - 999"),
    ({"mkfsOptions": "-O no_such_feature"}, "mkfs.ext4 failed (1): Invalid filesystem option set: no_such_feature"),
    pytest.param({"fsType": "xfs", "mkfsOptions": "-m no_such_option=1"},
                 "mkfs.xfs failed (1): unknown option -m no_such_option=1", marks=NEEDS_XFS),
    pytest.param({"fsType": "xfs", "provisioning": "thick", "mkfsOptions": "-m crc=2"},
                 "mkfs.xfs failed (1): Invalid value 2 for -m crc option. Value is too large.", marks=NEEDS_XFS),
])
def test_options_mkfs_refuses_are_one_error_line_and_exit_2(tmp_path: Path, cls: dict[str, Any], said: str) -> None:
    result = config_check(tmp_path, {"d": cls})
    assert result.returncode == 2, result
    fs = cls.get("fsType", "ext4")
    size = 4 if fs == "ext4" else 300
    assert result.stderr.splitlines() == [
        f"error: dynamicClassMap.d.mkfsOptions: expected options with which mkfs.{fs} makes a filesystem (tried on a "
        f"scratch image of {size} MiB, the smallest claim of {fs}), got \"{cls['mkfsOptions']}\": {said}"], result
    assert result.stdout == "", "no effective configuration is printed for a refused one"
    assert os.listdir(tmp_path) == ["config.yaml"], "the scratch image is gone"


@NEEDS_XFS
def test_options_that_make_a_filesystem_pass(tmp_path: Path) -> None:
    result = config_check(tmp_path, {"e": {"mkfsOptions": "-m 0 -T small -E root_owner=1000:1000"},
                                     "t": {"provisioning": "thick", "mkfsOptions": "-E lazy_itable_init=1"},
                                     "x": {"fsType": "xfs", "mkfsOptions": "-m reflink=0 -i size=512"}})
    assert (result.returncode, result.stderr) == (0, ""), result
    assert yaml.safe_load(result.stdout)["dynamicClassMap"]["x"]["mkfsOptions"] == "-m reflink=0 -i size=512"


def test_a_tool_that_is_not_installed_is_one_warning_line(tmp_path: Path) -> None:
    """A check run where xfsprogs is missing (a workstation) says so and goes on."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mke2fs = subprocess.run(["sh", "-c", "command -v mkfs.ext4"], capture_output=True, text=True,
                            check=True).stdout.strip()
    (bin_dir / "mkfs.ext4").symlink_to(mke2fs)
    result = config_check(tmp_path, {"e": {"mkfsOptions": "-b 999"},
                                     "x": {"fsType": "xfs", "mkfsOptions": "-m crc=2"}}, path=str(bin_dir))
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: dynamicClassMap.e.mkfsOptions: expected options with which mkfs.ext4"), lines
    assert lines[1:] == ["warning: dynamicClassMap.x.mkfsOptions: mkfs.xfs is not installed here, so the options "
                         "were checked by their spelling only, not tried"], lines


def test_options_refused_by_their_spelling_are_not_tried(tmp_path: Path) -> None:
    result = config_check(tmp_path, {"e": {"mkfsOptions": "-n"}})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        'error: dynamicClassMap.e.mkfsOptions: expected no -n (a dry run: mke2fs writes nothing, and each claim '
        'would get an image without a filesystem), got "-n"'], result

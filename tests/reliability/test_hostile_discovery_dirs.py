"""Discovery directories that are really the root or a kernel mount, through the CLI.

Issue 11, finding 4: ``hostDir: /.`` with ``mountDir: /tmp/..`` passed ``config check``,
``discover --dry-run`` then listed PVs for ``/dev``, ``/proc`` and ``/sys``, and releasing the
``/srv`` PV wiped ``/srv``. Every command must now stop at the configuration with the key
named (no traceback), and a kernel filesystem mounted in a real discovery directory must be
skipped with its reason, never listed as a volume.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from localpv.cli import cli
from tests.host.conftest import ForkedNamespace
from tests.support.hostfs import MiB, sh

ROOT_ALIASES = [("/.", "/tmp/.."), ("//", "/"), ("/mnt/..", "/mnt/disks"), ("/mnt/disks", "/proc/self/..")]


def _config_dir(tmp_path: Path, host_dir: str, mount_dir: str) -> Path:
    conf = tmp_path / "config"
    conf.mkdir()
    (conf / "storageClassMap").write_text(f'sc:\n  hostDir: "{host_dir}"\n  mountDir: "{mount_dir}"\n')
    return conf


def _assert_clean_failure(result: Result, exit_code: int) -> None:
    """A refusal: the expected exit code, the key named, no exception escaping the command."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert result.exit_code == exit_code, result.output
    assert "storageClassMap.sc." in result.output, result.output


@pytest.mark.parametrize(("host_dir", "mount_dir"), ROOT_ALIASES)
def test_discover_dry_run_refuses_a_root_discovery_dir(tmp_path: Path, host_dir: str, mount_dir: str) -> None:
    conf = _config_dir(tmp_path, host_dir, mount_dir)
    result = CliRunner().invoke(cli, ["discover", "--dry-run", "--config", str(conf), "--node", "n1"])
    _assert_clean_failure(result, 2)
    assert "local-pv-" not in result.output  # no PV listed


@pytest.mark.parametrize(("host_dir", "mount_dir"), ROOT_ALIASES)
def test_config_check_refuses_a_root_discovery_dir(tmp_path: Path, host_dir: str, mount_dir: str) -> None:
    conf = _config_dir(tmp_path, host_dir, mount_dir)
    _assert_clean_failure(CliRunner().invoke(cli, ["config", "check", str(conf)]), 2)


@pytest.mark.parametrize(("host_dir", "mount_dir"), ROOT_ALIASES)
def test_doctor_refuses_a_root_discovery_dir(tmp_path: Path, host_dir: str, mount_dir: str) -> None:
    """The doctor reports the configuration as its finding (exit 1 is its "something is wrong")."""
    conf = _config_dir(tmp_path, host_dir, mount_dir)
    result = CliRunner().invoke(cli, ["doctor", "--no-cluster", "--on-host", "--config", str(conf)])
    _assert_clean_failure(result, 1)


def _run_commands_over_a_proc_mount(tmp_path: Path) -> tuple[tuple[int, str], tuple[int, str]]:
    """In a private mount namespace: a discovery dir with a tmpfs volume and a proc mount.

    Returns (exit code, stdout) of ``discover`` and ``doctor``: plain values, since the
    result crosses back from the forked child by pickle."""
    disks = tmp_path / "disks"
    for name in ("vol1", "proc"):
        (disks / name).mkdir(parents=True)
    sh("mount", "-t", "tmpfs", "-o", f"size={MiB}", "localpv-test", disks / "vol1")
    sh("mount", "-t", "proc", "proc", disks / "proc")
    conf = _config_dir(tmp_path, "/mnt/disks", str(disks))
    runner = CliRunner()
    discover = runner.invoke(cli, ["discover", "--dry-run", "--config", str(conf), "--node", "n1", "-o", "json"])
    doctor = runner.invoke(cli, ["doctor", "--no-cluster", "--on-host", "--config", str(conf)])
    return (discover.exit_code, discover.stdout), (doctor.exit_code, doctor.stdout)


@pytest.mark.root
def test_a_proc_mount_in_a_discovery_dir_is_skipped_with_its_reason(tmp_path: Path) -> None:
    import json

    (discover_exit, discovered), (doctor_exit, diagnosis) = ForkedNamespace(
        lambda: _run_commands_over_a_proc_mount(tmp_path)).result()
    assert discover_exit == 0, discovered
    doc = json.loads(discovered)
    assert [pv["spec"]["local"]["path"] for pv in doc["volumes"]] == ["/mnt/disks/vol1"]
    reasons = {s["path"]: s["reason"] for s in doc["skipped"]}
    proc = str(tmp_path / "disks" / "proc")
    assert reasons == {proc: f'path "{proc}" is a proc filesystem, not a volume'}, reasons
    assert doctor_exit == 1, diagnosis
    assert f'ERROR  class sc: path "{proc}" is a proc filesystem, not a volume: no PV' in diagnosis
    assert "umount /mnt/disks/proc" in diagnosis, diagnosis

"""The CLI skeleton: real subprocesses for the import-cost promise, CliRunner elsewhere."""

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from localpv import __version__
from localpv.cli import cli

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_version() -> None:
    result = CliRunner().invoke(cli, ["version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"localpv {__version__}"


def test_config_check_prints_effective_config_with_defaults() -> None:
    result = CliRunner().invoke(cli, ["config", "check", str(EXAMPLES / "config")])
    assert result.exit_code == 0, result.output
    assert "blockCleanerCommand:\n    - /scripts/quick_reset.sh" in result.output
    assert "useNodeNameOnly: true" in result.output


def test_broken_config_exits_2_naming_key_and_class_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "localpv", "config", "check", str(EXAMPLES / "broken-config.yaml")],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    assert 'storageClassMap.fast-disks.volumeMode: expected "Filesystem" or "Block", got "block"' in proc.stderr
    assert 'did you mean "mountDir"' in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_config_check_json_output() -> None:
    result = CliRunner().invoke(cli, ["config", "check", "-o", "json", str(EXAMPLES / "configmap-jobs.yaml")])
    assert result.exit_code == 0
    assert '"useJobForCleaning": true' in result.output


def test_help_does_not_import_the_kubernetes_client() -> None:
    code = "import sys; from localpv.cli import cli\ntry:\n    cli(['--help'])\nexcept SystemExit: pass\n" \
           "print('kubernetes' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().endswith("False")

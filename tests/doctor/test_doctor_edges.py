"""The doctor's advice is never dangerous: a symlink in a discovery directory (issue 14)."""

from __future__ import annotations

import os
from pathlib import Path

from localpv.config import ClassConfig, parse_config
from localpv.doctor import ERROR, ClassFacts, check_directory, diagnose, gather_host
from localpv.host.scan import Entry, EntryKind


def _findings_for(disks: Path) -> list[str]:
    config = parse_config({"storageClassMap": {"local": {"hostDir": str(disks), "mountDir": str(disks)}}}).config
    return [f"{f.level} {f.message} | {f.fix}" for f in diagnose(config, gather_host(config, in_pod=False), None)]


def test_a_symlink_to_etc_is_called_a_symlink_and_never_bind_mounted(tmp_path: Path) -> None:
    disks = tmp_path / "disks"
    disks.mkdir()
    os.symlink("/etc", disks / "link")
    findings = [f for f in _findings_for(disks) if "/link" in f]
    assert len(findings) == 1, findings
    [finding] = findings
    assert finding.startswith(ERROR)
    assert f"{disks}/link is a symlink to /etc" in finding
    assert "plain directory" not in finding
    assert "mount --bind" not in finding
    assert "`mount" not in finding and "umount" not in finding


def test_a_symlink_to_a_directory_inside_the_discovery_dir_gets_no_mount_advice(tmp_path: Path) -> None:
    disks = tmp_path / "disks"
    (disks / "real").mkdir(parents=True)
    os.symlink("real", disks / "alias")
    findings = _findings_for(disks)
    [alias] = [f for f in findings if "/alias" in f]
    assert "is a symlink to real" in alias and "mount --bind" not in alias
    [real] = [f for f in findings if "/real is a plain directory" in f]
    assert f"mount --bind {disks}/real {disks}/real" in real  # a real directory still gets the bind recipe


def test_a_symlink_to_a_file_is_called_a_symlink(tmp_path: Path) -> None:
    disks = tmp_path / "disks"
    disks.mkdir()
    os.symlink("/etc/hostname", disks / "f")
    [finding] = [f for f in _findings_for(disks) if "/f " in f]
    assert "is a symlink to /etc/hostname" in finding


def test_constructed_symlink_facts_are_pure() -> None:
    cls = ClassConfig(name="local", host_dir="/mnt/disks", mount_dir="/pod/disks")
    facts = ClassFacts(cls, None, (Entry("link", "/pod/disks/link", EntryKind.DIRECTORY, reason="not a mount point"),),
                       symlinks={"link": "/etc"})
    [_, problem] = check_directory(facts)
    assert problem.message == "/pod/disks/link is a symlink to /etc, not a mount point: no PV"
    assert "mount" not in problem.fix.replace("mount a disk on a real directory", "")

"""``localpv doctor`` looks at each dynamic pool as the agent will (issue 23): a pool that is
missing, not mounted, or in memory (tmpfs, ramfs) is an error with its fix; a ready one is ok."""

from __future__ import annotations

from pathlib import Path

import pytest

from localpv.config import parse_config
from localpv.doctor import ERROR, OK, Finding, PoolFacts, check_pools, diagnose, failed, gather_host
from tests.support.hostfs import LoopDevices, MiB, Mounter


def test_each_pool_state_is_a_finding_with_its_fix() -> None:
    findings = check_pools((
        PoolFacts("ready", "/mnt/ready", "ready", ""),
        PoolFacts("gone", "/mnt/gone", "missing", "pool gone: directory /mnt/gone does not exist on this node"),
        PoolFacts("bare", "/mnt/bare", "not-mounted", "pool bare: nothing is mounted at /mnt/bare"),
        PoolFacts("ram", "/mnt/ram", "volatile", "pool ram: /mnt/ram is on tmpfs, which is memory"),
    ))
    assert findings == [
        Finding(OK, "pool ready", "/mnt/ready is ready for images"),
        Finding(ERROR, "pool gone", "pool gone: directory /mnt/gone does not exist on this node",
                "create /mnt/gone on the pool's disk and mount that disk there"),
        Finding(ERROR, "pool bare", "pool bare: nothing is mounted at /mnt/bare",
                "mount the pool's disk at /mnt/bare (or set requireMount: false for a plain directory)"),
        Finding(ERROR, "pool ram", "pool ram: /mnt/ram is on tmpfs, which is memory",
                "give the pool a hostDir on a disk's filesystem, then move its images there"),
    ]


@pytest.mark.root
def test_a_pool_on_tmpfs_fails_the_doctor_and_one_on_a_disk_passes(tmp_path: Path, loops: LoopDevices,
                                                                  mounter: Mounter) -> None:
    memory = mounter.tmpfs(tmp_path / "memory")
    disk = mounter.device(loops.attach(16 * MiB, ext4=True).path, tmp_path / "disk")
    config = parse_config({"dynamicPools": {"ram": {"hostDir": str(memory)}, "disk": {"hostDir": str(disk)}},
                           "dynamicClassMap": {"d": {"pool": "disk"}}}).config
    findings = diagnose(config, gather_host(config, in_pod=False), None)
    pools = {f.subject: f for f in findings if f.subject.startswith("pool ")}
    assert pools["pool disk"].level == OK
    assert pools["pool ram"].level == ERROR and f"{memory} is on tmpfs, which is memory" in pools["pool ram"].message
    assert [f.subject for f in findings if f.level == ERROR] == ["pool ram"]
    assert failed(findings)


def test_a_configuration_of_dynamic_classes_only_is_not_called_empty() -> None:
    config = parse_config({"dynamicPools": {"fast": {"hostDir": "/mnt/fast"}},
                           "dynamicClassMap": {"local-dynamic": {"pool": "fast"}}}).config
    findings = diagnose(config, gather_host(config, in_pod=False), None)
    assert not [f for f in findings if f.subject == "config"], findings

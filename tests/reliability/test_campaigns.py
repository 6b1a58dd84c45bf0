"""The agent and the NFS provisioner under API faults and SIGKILL: a few cycles of each campaign."""

from __future__ import annotations

from pathlib import Path

import pytest

from localpv.testing.campaign import AgentCampaign, NfsCampaign

pytestmark = pytest.mark.root


def test_agent_keeps_its_promises_under_faults_and_kill9(tmp_path: Path) -> None:
    report = AgentCampaign(tmp_path, volumes=4, cycles=4, cycle_seconds=2.5, seed=7).run()
    assert report.cycles == 4
    assert report.kills == 4
    assert report.tenants >= 8, "the campaign must actually exercise the lifecycle"
    assert sum(report.faults.values()) >= 4


def test_nfs_provisioner_keeps_its_promises_under_faults_and_kill9(tmp_path: Path) -> None:
    report = NfsCampaign(tmp_path, cycles=3, cycle_seconds=3.0, seed=3).run()
    assert report.cycles == 3 and report.kills == 3
    assert report.tenants == 12

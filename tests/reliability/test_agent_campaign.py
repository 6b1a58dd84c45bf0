"""The node agent under API faults and SIGKILL: a few cycles of the full campaign."""

from __future__ import annotations

from pathlib import Path

import pytest

from localpv.testing.campaign import AgentCampaign

pytestmark = pytest.mark.root


def test_agent_keeps_its_promises_under_faults_and_kill9(tmp_path: Path) -> None:
    report = AgentCampaign(tmp_path, volumes=4, cycles=4, cycle_seconds=2.5, seed=7).run()
    assert report.cycles == 4
    assert report.kills == 4
    assert report.tenants >= 8, "the campaign must actually exercise the lifecycle"
    assert sum(report.faults.values()) >= 4

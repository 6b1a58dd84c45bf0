"""A busy node must not make the agent busy or noisy (issue 12, "Noise"): mounts made
elsewhere do not wake it, and a condition is logged when it starts and ends, not on
every pass."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.agent.conftest import AgentEnv
from tests.conftest import wait_for
from tests.support.hostfs import Mounter

pytestmark = pytest.mark.root


def trigger_count(agent: object, trigger: str) -> float:
    registry = agent.metrics.registry  # type: ignore[attr-defined]
    return registry.get_sample_value("localpv_reconcile_triggers_total", {"trigger": trigger}) or 0.0


def test_mounts_outside_the_discovery_dirs_do_not_wake_the_agent(
    agent_env: AgentEnv, mounter: Mounter, tmp_path: Path
) -> None:
    agent = agent_env.start_agent()
    wait_for(lambda: agent.passes >= 1, timeout=10)
    mounter.tmpfs(agent_env.fs_dir / "vol1")
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Available", timeout=10, what="a relevant mount is seen")
    woken = trigger_count(agent, "mount")
    for i in range(20):  # what a node running pods does all day long
        seen = trigger_count(agent, "mount-elsewhere")
        target = mounter.tmpfs(tmp_path / f"pod-volume-{i}")
        wait_for(lambda s=seen: trigger_count(agent, "mount-elsewhere") > s, timeout=5, what="the event seen")
        mounter.umount(target)
    assert trigger_count(agent, "mount") == woken, "woken by mounts that are none of its business"


def test_a_stray_directory_is_logged_when_it_appears_and_when_it_goes(
    agent_env: AgentEnv, caplog: pytest.LogCaptureFixture
) -> None:
    (agent_env.fs_dir / "stray").mkdir()
    agent = agent_env.start_agent(watch_host=False)
    caplog.set_level(logging.INFO, logger="localpv.agent.executor")
    for _ in range(10):
        agent.reconcile_once()
    warnings = [r for r in caplog.records if "stray" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(warnings) <= 1, [r.getMessage() for r in warnings]
    wait_for(lambda: any("stray" in r.getMessage() for r in caplog.records), timeout=5)
    (agent_env.fs_dir / "stray").rmdir()
    agent.reconcile_once()
    assert any("no longer skipping" in r.getMessage() and "stray" in r.getMessage() for r in caplog.records)

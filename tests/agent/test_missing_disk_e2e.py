"""A disk removed for good: its record stays, its warning is said once.

The disk is unmounted, its directory removed and its PV deleted while its cleanup kept
failing. The journal keeps its record in ``cleaning`` (if the same disk comes back still
holding the tenant's files, it must be cleaned before it is offered), and the agent used
to warn ``VolumeFailedDelete ... was not found`` on the Node at every pass, for ever.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localpv.agent.journal import Journal
from tests.agent.conftest import AgentEnv
from tests.agent.test_identity_e2e import events, never_offered_dirty, offered_again, use
from tests.conftest import wait_for
from tests.support.hostfs import Mounter

pytestmark = pytest.mark.root

HOST_PATH = "/mnt/disks/vol1"


def journal_state(env: AgentEnv, host_path: str = HOST_PATH) -> str | None:
    entry = Journal(env.state_dir / "journal.json").get(host_path)
    return entry.state if entry else None


def test_disk_removed_for_good_is_reported_once_and_cleaned_if_it_comes_back_dirty(
    agent_env: AgentEnv, mounter: Mounter, tmp_path: Path
) -> None:
    disk = tmp_path / "disk"  # a directory bind-mounted as the volume: its files outlive the mount
    disk.mkdir()
    target = agent_env.fs_dir / "vol1"
    vol = mounter.bind(disk, target)
    agent_env.start_agent()
    old = use(agent_env, HOST_PATH, "local-fs", lambda: (vol / "secret").write_text("tenant a"))
    inner = mounter.tmpfs(vol / "inner")
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    wait_for(lambda: events(agent_env, "VolumeFailedDelete"), timeout=15, what="the cleanup fails")
    agent_env.stop_agents()
    # The disk is taken out for good: unmounted, its directory removed, its PV deleted.
    mounter.umount(inner)
    mounter.umount(target)
    target.rmdir()
    agent_env.apiserver.delete("v1", "PersistentVolume", old["metadata"]["name"])
    agent = agent_env.start_agent()
    for _ in range(4):
        agent.reconcile_once()
    missing = [e for e in agent.recorder.history if e.reason == "VolumeFailedDelete" and "was not found" in e.message]
    assert len(missing) == 1, [e.message for e in missing]
    assert journal_state(agent_env) == "cleaning", "the record is kept: the disk may come back"
    # Plugged in again, still holding the tenant's file: cleaned before it is offered.
    target.mkdir()
    with never_offered_dirty(agent_env, HOST_PATH, (disk / "secret").exists):
        mounter.bind(disk, target)
        wait_for(lambda: offered_again(agent_env, HOST_PATH, {old["metadata"]["uid"]}), timeout=15,
                 what="offered once clean")
    assert os.listdir(disk) == []

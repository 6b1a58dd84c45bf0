"""The agent's PV writes whose answers are lost: the server committed them, the agent's
request failed with a reset connection, and its retry met the consequence.

A create retried into AlreadyExists must be taken as the agent's own PV (not a name
collision), and a delete retried into NotFound as done (not a failure); the volume's life
goes on as if the answers had arrived.
"""

from __future__ import annotations

import os
import threading

import pytest

from localpv.clock import Clock
from localpv.kube.metrics import AGENT
from tests.agent.conftest import AgentEnv
from tests.agent.test_cleanup_e2e import bind_and_release, recreated
from tests.conftest import wait_for
from tests.support.hostfs import Mounter

pytestmark = pytest.mark.root

PATH = "/mnt/disks/vol1"


class _Later:
    """A clock whose monotonic time can be moved on (wall time and waits are the real ones)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.skipped = 0.0

    def monotonic(self) -> float:
        return self.clock.monotonic() + self.skipped

    def now(self) -> float:
        return self.clock.now()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return self.clock.wait(event, timeout)


def test_pv_writes_whose_answers_are_lost_are_taken_as_done(agent_env: AgentEnv, mounter: Mounter,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    server = agent_env.apiserver
    server.faults.lose_responses("create", 1.0, resource="persistentvolumes")
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent = agent_env.start_agent()
    executor = agent.executor
    assert executor is not None
    later = _Later(executor.clock)
    monkeypatch.setattr(executor, "clock", later)

    pv = wait_for(lambda: agent_env.phase(PATH) == "Available" and agent_env.pv_for(PATH), timeout=10,
                  what="the PV whose create answer was lost")
    assert any(r.lost for r in server.requests.records() if r.verb == "create")
    wait_for(lambda: server.requests.count("create", "persistentvolumes", status=409), timeout=5,
             what="the agent's retry to meet the PV it had created")
    uid = pv["metadata"]["uid"]
    wait_for(lambda: (entry := agent.journal.get(PATH)) is not None and entry.pv_uid == uid, timeout=5,
             what="the journal to record the PV as the one the volume is offered as")

    # Deletes lose their answers from now on; creates are answered again.
    server.faults.lose_responses("create", 0.0, resource="persistentvolumes")
    server.faults.lose_responses("delete", 1.0, resource="persistentvolumes")
    later.skipped = 3600.0  # an hour between the first sight of the volume and its next PV

    def write() -> None:
        (vol / "data").write_text("tenant data")

    old = bind_and_release(agent_env, PATH, "local-fs", write)
    again = wait_for(lambda: recreated(agent_env, PATH, old), timeout=15, what="the volume offered again")
    assert os.listdir(vol) == []
    assert any(r.lost for r in server.requests.records() if r.verb == "delete")
    wait_for(lambda: server.requests.count("delete", "persistentvolumes", status=404), timeout=5,
             what="the agent's retry to find the PV gone")
    wait_for(lambda: (entry := agent.journal.get(PATH)) is not None and entry.pv_uid == again["metadata"]["uid"],
             timeout=5, what="the journal to follow the new PV")

    reasons = {e.reason for e in agent.recorder.history}
    assert not reasons & {"PVNameCollision", "VolumeFailedDelete"}, reasons
    registry = agent.metrics.registry
    assert registry.get_sample_value(f"{AGENT}_persistentvolume_delete_total",
                                     {"mode": "Filesystem", "type": "process"}) == 1
    assert registry.get_sample_value(f"{AGENT}_persistentvolume_delete_failed_total",
                                     {"mode": "Filesystem", "type": "process"}) in (None, 0)
    # The PV made after the clean was seen and created within one pass, not an hour after
    # the volume was first seen (the PV adopted after the lost answer ended that wait).
    created = registry.get_sample_value(f"{AGENT}_persistentvolume_discovery_duration_seconds_sum",
                                        {"mode": "Filesystem"})
    assert created is not None and created < 60, created

"""Hung storage on the node does not stop the agent (issue 12).

A FUSE mount whose daemon never answers (``hung_fuse``) sits in a discovery dir, or
inside a volume being cleaned. The rest of the node keeps working: the healthy volume
next to it gets its PV, passes complete (so liveness reflects the truth), the hung entry
is skipped with its reason, and a cleanup stuck on it gives up at its timeout and frees
its worker for other volumes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from localpv.host.probes import default_probes
from localpv_emulator.objects import claim
from tests.agent.conftest import AgentEnv
from tests.agent.test_cleanup_e2e import recreated
from tests.conftest import wait_for
from tests.support.hostfs import HungFuse, Mounter

pytestmark = pytest.mark.root


def claim_of(name: str, pv: dict[str, Any]) -> dict[str, Any]:
    """A claim asking for exactly this PV."""
    pvc = claim(name, "local-fs")
    pvc["spec"]["volumeName"] = pv["metadata"]["name"]
    return pvc


def test_a_hung_mount_in_a_discovery_dir_does_not_stop_discovery(
    agent_env: AgentEnv, mounter: Mounter, hung_fuse: HungFuse
) -> None:
    mounter.tmpfs(agent_env.fs_dir / "good", size=16 * 1024 * 1024)
    hung = hung_fuse.mount(agent_env.fs_dir / "hung")
    agent = agent_env.start_agent(discovery_period=0.5)
    pv = wait_for(lambda: agent_env.pv_for("/mnt/disks/good"), timeout=5, what="PV for the healthy volume")
    assert pv["spec"]["capacity"]["storage"] == "16Mi"
    assert agent_env.pv_for("/mnt/disks/hung") is None
    # Passes keep completing: liveness is not stuck at "starting".
    passes = agent.passes
    wait_for(lambda: agent.passes >= passes + 2, timeout=5, what="two more passes")
    assert agent.passes >= 1
    # The hung entry is skipped with its reason, where readiness and `localpv status` say it.
    skipped = {s["path"]: s for s in agent.status()["skipped"]}
    assert f'"{hung}" did not answer within' in skipped[str(hung)]["reason"]
    assert "hung storage" in skipped[str(hung)]["reason"]
    ok, why = agent.readiness()
    assert ok or "hung storage" in why
    # Known hung, it costs a pass nothing: no new thread is left behind on it.
    assert default_probes().hung().keys() >= {f"entry:{hung}"}
    # The operator is told once (an event on the Node), and a metric says how many are hung.
    events = wait_for(lambda: [e for e in agent_env.apiserver.list("v1", "Event", "default")
                               if e.get("reason") == "StorageHung"], timeout=5, what="StorageHung event")
    assert len(events) == 1 and events[0].get("count", 1) == 1
    assert events[0]["involvedObject"]["kind"] == "Node" and str(hung) in events[0]["message"]
    assert agent.metrics.registry.get_sample_value("localpv_hung_storage", {"class": "local-fs"}) == 1.0
    assert (agent.metrics.registry.get_sample_value("localpv_storage_probes_stuck") or 0) >= 1


def test_a_hung_mount_in_a_volume_being_cleaned_fails_the_cleanup_and_frees_the_worker(
    agent_env: AgentEnv, mounter: Mounter, hung_fuse: HungFuse
) -> None:
    vol1 = mounter.tmpfs(agent_env.fs_dir / "vol1")
    vol2 = mounter.tmpfs(agent_env.fs_dir / "vol2")
    config = agent_env.config(cleanupTimeout="2s", cleanupWorkers=1)
    agent = agent_env.start_agent(config, discovery_period=0.3)
    for vol in ("vol1", "vol2"):
        wait_for(lambda v=vol: agent_env.phase(f"/mnt/disks/{v}") == "Available", timeout=5, what=f"{vol} offered")
    # A tenant's volume ends up with a hung FUSE mount inside it, then is released.
    (vol1 / "data").mkdir()
    (vol1 / "data" / "secret").write_text("tenant data")
    hung = hung_fuse.mount(vol1 / "data" / "fuse")
    pv1 = agent_env.pv_for("/mnt/disks/vol1")
    assert pv1 is not None
    agent_env.apiserver.create(claim_of("c1", pv1))
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Bound", timeout=5, what="vol1 bound")
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    name1 = str(pv1["metadata"]["name"])
    failed = wait_for(lambda: (s := agent.procs.status(name1)) and s.state == "failed" and s, timeout=8,
                      what="the cleanup of vol1 to give up")
    assert "timed out after 2s" in failed.message
    assert agent_env.phase("/mnt/disks/vol1") == "Released"
    # The single cleanup worker is free: a second released volume is cleaned and offered again.
    pv2 = agent_env.pv_for("/mnt/disks/vol2")
    assert pv2 is not None
    (vol2 / "f").write_text("x")
    agent_env.apiserver.create(claim_of("c2", pv2))
    wait_for(lambda: agent_env.phase("/mnt/disks/vol2") == "Bound", timeout=5, what="vol2 bound")
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c2", "default")
    wait_for(lambda: recreated(agent_env, "/mnt/disks/vol2", str(pv2["metadata"]["uid"])), timeout=15,
             what="vol2 cleaned and offered again")
    assert os.listdir(vol2) == []
    # vol1 stays unoffered while the mount is hung; once it is gone, a retry cleans it.
    assert agent_env.phase("/mnt/disks/vol1") == "Released"
    hung_fuse.release_all()
    wait_for(lambda: recreated(agent_env, "/mnt/disks/vol1", str(pv1["metadata"]["uid"])), timeout=20,
             what="vol1 cleaned once the hung mount is gone")
    assert os.listdir(vol1) == [] and not Path(hung).exists()

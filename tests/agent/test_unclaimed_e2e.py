"""A PV put back on offer by hand while its volume holds a tenant's data, on real mounts.

Reproduced against the emulator: a tenant writes, a tmpfs mounted inside the volume makes
every cleanup fail (the cleaner never crosses a mount), the claim is deleted, and the
operator "unsticks" the Released PV with
``kubectl patch pv <pv> --type json -p '[{"op":"remove","path":"/spec/claimRef"}]'``.
The PV controller makes it Available, and the agent used to leave it on offer with the
previous tenant's file in it for good. Each test here failed on that agent.
"""

from __future__ import annotations

import os
import time

import pytest

from localpv.agent.journal import Journal
from localpv.kube.resources import PERSISTENT_VOLUMES
from localpv_emulator.binder import PVBinder
from tests.agent.conftest import AgentEnv
from tests.agent.test_identity_e2e import Obj, events, never_offered_dirty, offered_again, use
from tests.conftest import wait_for
from tests.support.hostfs import Mounter

pytestmark = pytest.mark.root

HOST_PATH = "/mnt/disks/vol1"
REMOVE_CLAIM_REF = [{"op": "remove", "path": "/spec/claimRef"}]


def written(env: AgentEnv) -> AgentEnv:
    """Wait until every agent's events reached the API (a worker thread writes them)."""
    for agent in env.agents:
        assert agent.recorder.flush(5)
    return env


def journal_state(env: AgentEnv, host_path: str = HOST_PATH) -> str | None:
    entry = Journal(env.state_dir / "journal.json").get(host_path)
    return entry.state if entry else None


def unclaim(env: AgentEnv, pv: Obj) -> None:
    """What the operator runs: remove the claimRef (the PV controller then makes it Available)."""
    env.api.patch(PERSISTENT_VOLUMES, pv["metadata"]["name"], REMOVE_CLAIM_REF, patch_type="json")


def binder(env: AgentEnv) -> PVBinder:
    return next(c for c in env.apiserver._controllers if isinstance(c, PVBinder))


def test_pv_unstuck_mid_cleanup_is_retracted_and_offered_again_only_once_clean(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent_env.start_agent()
    old = use(agent_env, HOST_PATH, "local-fs", lambda: (vol / "secret").write_text("tenant a"))
    inner = mounter.tmpfs(vol / "inner")  # every cleanup fails from now on
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    wait_for(lambda: any(HOST_PATH in e.get("message", "") for e in events(agent_env, "VolumeFailedDelete")),
             timeout=15, what="the cleanup fails")
    assert journal_state(agent_env) == "cleaning"
    unclaim(agent_env, old)
    unclaimed_at = time.monotonic()
    # On offer from the patch until the agent's next pass (the PV watch triggers it): one pass.
    wait_for(lambda: (p := agent_env.pv_for(HOST_PATH)) is None or p["metadata"]["uid"] != old["metadata"]["uid"],
             timeout=5, what="the unclaimed PV retracted")
    window = time.monotonic() - unclaimed_at
    assert window < 3, f"on offer dirty for {window:.2f}s"
    [retracted] = wait_for(lambda: events(agent_env, "VolumeRetracted"), timeout=5, what="VolumeRetracted")
    assert retracted["involvedObject"]["uid"] == old["metadata"]["uid"] and "claimRef was removed" in \
        retracted["message"]
    with never_offered_dirty(agent_env, HOST_PATH, (vol / "secret").exists):
        # Still failing, still not offered; the journal keeps the volume dirty.
        failures = len(events(agent_env, "VolumeFailedDelete"))
        wait_for(lambda: len(events(agent_env, "VolumeFailedDelete")) > failures, timeout=15,
                 what="the cleanup goes on (and fails) without a PV")
        assert agent_env.pv_for(HOST_PATH) is None and journal_state(agent_env) == "cleaning"
        mounter.umount(inner)
        new = wait_for(lambda: offered_again(agent_env, HOST_PATH, {old["metadata"]["uid"]}), timeout=15,
                       what="a fresh PV once the volume is clean")
    assert os.listdir(vol) == []
    assert new["metadata"]["name"] == old["metadata"]["name"]


def test_used_pv_unclaimed_while_the_agent_was_down_is_cleaned_before_it_is_offered(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    # The agent never saw the PV Released: its journal says "used" when it starts.
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent_env.start_agent()
    old = use(agent_env, HOST_PATH, "local-fs", lambda: (vol / "secret").write_text("tenant a"))
    agent_env.stop_agents()
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    wait_for(lambda: agent_env.phase(HOST_PATH) == "Released", timeout=10, what="Released")
    unclaim(agent_env, old)
    wait_for(lambda: agent_env.phase(HOST_PATH) == "Available", timeout=10, what="Available, dirty")
    assert journal_state(agent_env) == "used"
    agent_env.start_agent()
    wait_for(lambda: (p := agent_env.pv_for(HOST_PATH)) is None or p["status"].get("phase") != "Available"
             or p["metadata"]["uid"] != old["metadata"]["uid"], timeout=5, what="taken off offer")
    with never_offered_dirty(agent_env, HOST_PATH, (vol / "secret").exists):
        wait_for(lambda: offered_again(agent_env, HOST_PATH, {old["metadata"]["uid"]}), timeout=15,
                 what="offered again after the clean")
    assert os.listdir(vol) == []
    # Its claim was put back (and, gone, released the PV), rather than the PV deleted.
    [restored] = wait_for(lambda: events(agent_env, "VolumeClaimRestored"), timeout=5, what="VolumeClaimRestored")
    assert restored["involvedObject"]["uid"] == old["metadata"]["uid"]
    assert events(written(agent_env), "VolumeRetracted") == []


def test_bound_pv_unclaimed_by_mistake_stays_with_its_live_claim(agent_env: AgentEnv, mounter: Mounter) -> None:
    # The PV controller binds such a PV back to its claim at its next resync (up to 15 s
    # later on a real cluster). Deleting it instead would make the claim Lost and the
    # cleanup would wipe a volume a pod may be writing to. Here the binder is paused to
    # hold that window open; the PV controller's first step (Available) is done by hand.
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent_env.start_agent()
    old = use(agent_env, HOST_PATH, "local-fs", lambda: (vol / "data").write_text("tenant a, live"))
    live = agent_env.apiserver.get("v1", "PersistentVolumeClaim", "c1", "default")
    assert live is not None
    paused = binder(agent_env)
    paused.stop()
    try:
        unclaim(agent_env, old)
        pv = agent_env.apiserver.get("v1", "PersistentVolume", old["metadata"]["name"])
        assert pv is not None
        agent_env.apiserver.update({**pv, "status": {"phase": "Available"}}, subresource="status")
        wait_for(lambda: ((agent_env.pv_for(HOST_PATH) or {}).get("spec") or {}).get("claimRef"), timeout=5,
                 what="the claimRef put back")
        pv = agent_env.pv_for(HOST_PATH)
        assert pv is not None and pv["metadata"]["uid"] == old["metadata"]["uid"]
        assert {k: pv["spec"]["claimRef"][k] for k in ("namespace", "name", "uid")} == {
            "namespace": "default", "name": "c1", "uid": live["metadata"]["uid"]}
    finally:
        paused.start()
    wait_for(lambda: agent_env.phase(HOST_PATH) == "Bound", timeout=10, what="Bound to its claim again")
    assert (vol / "data").read_text() == "tenant a, live"
    assert journal_state(agent_env) == "used"
    wait_for(lambda: events(agent_env, "VolumeClaimRestored"), timeout=5, what="VolumeClaimRestored")
    assert events(written(agent_env), "VolumeRetracted") == []


def test_retain_pv_unclaimed_by_its_operator_keeps_its_data_and_says_so_once(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    agent = agent_env.start_agent()
    old = use(agent_env, HOST_PATH, "local-fs", lambda: (vol / "secret").write_text("tenant a"))
    agent_env.api.patch(PERSISTENT_VOLUMES, old["metadata"]["name"],
                        {"spec": {"persistentVolumeReclaimPolicy": "Retain"}})
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    wait_for(lambda: agent_env.phase(HOST_PATH) == "Released", timeout=10, what="Released")
    unclaim(agent_env, old)
    wait_for(lambda: events(agent_env, "VolumeRetainedReoffered"), timeout=10, what="the warning")
    for _ in range(3):
        agent.reconcile_once()
    pv = agent_env.pv_for(HOST_PATH)
    assert pv is not None and pv["metadata"]["uid"] == old["metadata"]["uid"] and pv["status"]["phase"] == "Available"
    assert (vol / "secret").read_text() == "tenant a"
    assert journal_state(agent_env) == "used", "the volume is not called clean"
    said = [e for e in agent.recorder.history if e.reason == "VolumeRetainedReoffered"]
    assert len(said) == 1, said
    assert events(written(agent_env), "VolumeRetracted") == [] and events(agent_env, "VolumeClaimRestored") == []

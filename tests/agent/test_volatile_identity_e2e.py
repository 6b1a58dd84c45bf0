"""Volumes with no stable identity (tmpfs) are known by their device and inode numbers within one
boot, and a record is never re-pointed to another volume (issue 24, item 1).

Each test swaps two real tmpfs mounts while no agent runs, with ``mount --move``: each keeps its
data and its device number, nothing reboots - what an operator's remount script or a hand
``mount --move`` does. The promise checked: no cleanup meant for one volume runs on another,
nothing that may hold data is offered, and the journal keeps a record of every volume that may
hold data.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from localpv.agent.journal import Journal
from tests.agent.conftest import AgentEnv
from tests.conftest import wait_for
from tests.support.agentenv import bound_claim, events, numbers, swap
from tests.support.hostfs import Mounter, sh

pytestmark = pytest.mark.root

Obj = dict[str, Any]


def journal(env: AgentEnv) -> dict[str, Any]:
    return Journal(env.state_dir / "journal.json").snapshot()


def test_swapped_tmpfs_mounts_never_clean_the_bound_tenant_and_are_held(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    path_a, path_b = agent_env.fs_dir / "a", agent_env.fs_dir / "b"
    mounter.tmpfs(path_a)
    mounter.tmpfs(path_b)
    volume_a, volume_b = numbers(path_a), numbers(path_b)
    agent_env.start_agent()
    pv_a = bound_claim(agent_env, "tenant-a", "/mnt/disks/a")
    pv_b = bound_claim(agent_env, "tenant-b", "/mnt/disks/b")
    (path_a / "a-data").write_text("tenant a")
    (path_b / "b-data").write_text("tenant b")
    agent_env.stop_agents()
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "tenant-a", "default")
    wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Released", timeout=10, what="a Released")
    swap(path_a, path_b, agent_env.root / "spare")
    assert (path_a / "b-data").exists() and numbers(path_a) == volume_b
    agent = agent_env.start_agent()
    node_events = wait_for(lambda: [e for e in events(agent_env, "VolumeIdentityMismatch")
                                    if e["involvedObject"]["kind"] == "Node"], timeout=15,
                           what="a mismatch event on the Node")
    assert any(volume_a in e["message"] and volume_b in e["message"] for e in node_events), node_events
    for _ in range(3):  # a few more passes, in case one of them would act
        agent.reconcile_once()
    assert (path_a / "b-data").read_text() == "tenant b", "the bound tenant's volume was wiped"
    assert (path_b / "a-data").read_text() == "tenant a", "not cleaned anywhere while the mounts are swapped"
    assert agent_env.pv_for("/mnt/disks/a")["metadata"]["uid"] == pv_a["metadata"]["uid"], "PV a kept"
    on = {(e["involvedObject"]["kind"], e["involvedObject"]["name"])
          for e in events(agent_env, "VolumeIdentityMismatch")}
    assert ("PersistentVolume", pv_a["metadata"]["name"]) in on
    assert ("PersistentVolumeClaim", "tenant-b") in on, "the live tenant's claim says it too"
    held = {v["path"] for v in agent.status()["volumes"] if v["held"]}
    assert held == {"/mnt/disks/a", "/mnt/disks/b"}
    assert agent.metrics.registry.get_sample_value("localpv_volume_identity_mismatches", {"class": "local-fs"}) == 2
    records = journal(agent_env)
    assert records["/mnt/disks/a"].ident == volume_a and records["/mnt/disks/a"].state in ("used", "cleaning")
    assert records["/mnt/disks/b"].ident == volume_b and records["/mnt/disks/b"].state == "used"
    # The operator moves each mount back: the held cleanup goes on, on the volume it was for.
    swap(path_a, path_b, agent_env.root / "spare")
    wait_for(lambda: (pv := agent_env.pv_for("/mnt/disks/a")) is not None
             and pv["metadata"]["uid"] != pv_a["metadata"]["uid"] and pv["status"]["phase"] == "Available",
             timeout=20, what="a cleaned and offered again")
    assert os.listdir(path_a) == []
    assert (path_b / "b-data").read_text() == "tenant b"
    assert agent_env.phase("/mnt/disks/b") == "Bound" and pv_b["metadata"]["name"]


def test_swapped_tmpfs_mounts_never_leave_a_pv_on_offer_over_a_released_tenants_files(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    path_a, path_b = agent_env.fs_dir / "a", agent_env.fs_dir / "b"
    mounter.tmpfs(path_a)
    mounter.tmpfs(path_b)
    volume_a = numbers(path_a)
    agent_env.start_agent()
    pv_a = bound_claim(agent_env, "tenant-a", "/mnt/disks/a")
    wait_for(lambda: agent_env.phase("/mnt/disks/b") == "Available", timeout=10, what="b on offer")
    (path_a / "a-data").write_text("tenant a")
    agent_env.stop_agents()
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "tenant-a", "default")
    wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Released", timeout=10, what="a Released")
    swap(path_a, path_b, agent_env.root / "spare")
    agent = agent_env.start_agent()
    wait_for(lambda: [e for e in events(agent_env, "VolumeIdentityMismatch")
                      if e["involvedObject"]["kind"] == "Node"], timeout=15, what="a mismatch event on the Node")
    for _ in range(3):
        agent.reconcile_once()
    assert (path_b / "a-data").read_text() == "tenant a", "the released tenant's files are kept while held"
    assert agent_env.phase("/mnt/disks/b") != "Available", "a PV on offer over the released tenant's files"
    assert agent_env.pv_for("/mnt/disks/a")["metadata"]["uid"] == pv_a["metadata"]["uid"], "PV a kept"
    dirty = [r for r in journal(agent_env).values() if r.ident == volume_a]
    assert len(dirty) == 1 and dirty[0].state in ("used", "cleaning"), "the journal keeps that volume dirty"
    # Moved back: each volume is cleaned or offered as the volume it is.
    swap(path_a, path_b, agent_env.root / "spare")
    wait_for(lambda: (pv := agent_env.pv_for("/mnt/disks/a")) is not None
             and pv["metadata"]["uid"] != pv_a["metadata"]["uid"] and pv["status"]["phase"] == "Available",
             timeout=20, what="a cleaned and offered again")
    wait_for(lambda: agent_env.phase("/mnt/disks/b") == "Available", timeout=20, what="b on offer again")
    assert os.listdir(path_a) == [] and os.listdir(path_b) == []


def released_before_a_reboot(env: AgentEnv, mounter: Mounter) -> tuple[Path, Obj]:
    """A tmpfs volume used by a tenant, its claim deleted while the node is down."""
    path_a = env.fs_dir / "a"
    mounter.tmpfs(path_a)
    env.start_agent(boot="boot-1")
    pv_a = bound_claim(env, "tenant-a", "/mnt/disks/a")
    (path_a / "a-data").write_text("tenant a")
    env.stop_agents()
    env.apiserver.delete("v1", "PersistentVolumeClaim", "tenant-a", "default")
    wait_for(lambda: env.phase("/mnt/disks/a") == "Released", timeout=10, what="a Released")
    return path_a, pv_a


def test_after_a_reboot_a_volume_without_identity_that_holds_data_waits_for_the_operators_word(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    """Numbers of another boot prove nothing (a disk without WWN keeps its data across a reboot,
    under numbers dealt out again): the volume is not cleaned as the released one until the
    operator says it is, with the annotation the event names."""
    path_a, pv_a = released_before_a_reboot(agent_env, mounter)
    agent = agent_env.start_agent(boot="boot-2")
    [node_event] = wait_for(lambda: [e for e in events(agent_env, "VolumeIdentityMismatch")
                                     if e["involvedObject"]["kind"] == "Node"], timeout=15,
                            what="a mismatch event on the Node")
    for _ in range(3):
        agent.reconcile_once()
    assert (path_a / "a-data").exists(), "cleaned on numbers of another boot"
    assert agent_env.pv_for("/mnt/disks/a")["metadata"]["uid"] == pv_a["metadata"]["uid"]
    assert [v["path"] for v in agent.status()["volumes"] if v["held"]] == ["/mnt/disks/a"]
    command = node_event["message"].split("kubectl annotate node ", 1)[1].split(" - ", 1)[0]
    node_name, annotation = command.split(" ", 1)
    key, value = annotation.split("=", 1)
    assert value == f"{numbers(path_a)}@boot-2"
    node_obj = agent_env.apiserver.get("v1", "Node", node_name)
    node_obj["metadata"].setdefault("annotations", {})[key] = value
    agent_env.apiserver.update(node_obj)
    wait_for(lambda: (pv := agent_env.pv_for("/mnt/disks/a")) is not None
             and pv["metadata"]["uid"] != pv_a["metadata"]["uid"] and pv["status"]["phase"] == "Available",
             timeout=20, what="a cleaned and offered again once the operator said so")
    assert os.listdir(path_a) == []
    wait_for(lambda: events(agent_env, "VolumeAccepted"), timeout=10, what="VolumeAccepted on the Node")


def test_after_a_reboot_an_empty_volume_without_identity_is_cleaned_without_a_word(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    """A tmpfs comes back empty from a reboot: nothing of anyone's can be lost by cleaning it."""
    path_a, pv_a = released_before_a_reboot(agent_env, mounter)
    mounter.umount(path_a)  # the reboot: tmpfs comes back empty
    mounter.tmpfs(path_a)
    agent_env.start_agent(boot="boot-2")
    wait_for(lambda: (pv := agent_env.pv_for("/mnt/disks/a")) is not None
             and pv["metadata"]["uid"] != pv_a["metadata"]["uid"] and pv["status"]["phase"] == "Available",
             timeout=20, what="a cleaned and offered again")
    assert events(agent_env, "VolumeIdentityMismatch") == []
    assert Journal(agent_env.state_dir / "journal.json").get("/mnt/disks/a").boot == "boot-2"


def test_a_cleanup_that_starts_after_the_mounts_were_swapped_refuses_the_other_volume(
    tmp_path: Path, mounter: Mounter
) -> None:
    """A cleanup waits for a free worker, or is retried minutes later: the volume at the path
    when it starts must still be the one it was decided for (its numbers of this boot)."""
    from localpv.agent.cleaning import filesystem_cleaner

    disks = tmp_path / "disks"
    path_a, path_b = mounter.tmpfs(disks / "a"), mounter.tmpfs(disks / "b")
    (path_a / "released").write_text("tenant a")
    (path_b / "bound").write_text("tenant b")
    clean = filesystem_cleaner(str(path_a), str(disks), timeout=30, expect_numbers=numbers(path_a))
    swap(path_a, path_b, tmp_path / "spare")
    outcome = clean(threading.Event())
    assert not outcome.ok and numbers(path_b) in outcome.message and "swapped" in outcome.message, outcome
    assert (path_a / "bound").read_text() == "tenant b"
    swap(path_a, path_b, tmp_path / "spare")
    assert clean(threading.Event()).ok and os.listdir(path_a) == []


def test_a_volume_on_offer_moved_to_another_path_is_not_offered_twice(agent_env: AgentEnv, mounter: Mounter) -> None:
    """An Available tmpfs volume moved to a new path (``mount --move``) while no agent runs keeps
    its numbers: it is the volume its PV offers, wherever it is. A second PV for it at the new
    path offered one volume twice, and once it was moved back the first PV, still on offer, showed
    whatever the second one's tenant wrote (found by tests/reliability/test_swaps.py)."""
    path_a, path_e = agent_env.fs_dir / "a", agent_env.fs_dir / "e"
    mounter.tmpfs(path_a)
    agent_env.start_agent()
    pv_a = wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Available" and agent_env.pv_for("/mnt/disks/a"),
                    timeout=10, what="a on offer")
    agent_env.stop_agents()
    path_e.mkdir()
    sh("mount", "--move", path_a, path_e)
    try:
        agent = agent_env.start_agent()
        wait_for(lambda: agent.passes >= 1, timeout=10, what="a pass")
        for _ in range(3):
            agent.reconcile_once()
        assert agent_env.pv_for("/mnt/disks/e") is None, "one volume offered under two PVs"
        [skip] = [s for s in agent.status()["skipped"] if s["path"] == str(path_e)]
        assert "same volume as /mnt/disks/a" in skip["reason"], skip
        agent_env.stop_agents()
    finally:
        sh("mount", "--move", path_e, path_a)
    agent = agent_env.start_agent()
    wait_for(lambda: agent.passes >= 1, timeout=10, what="a pass")
    agent.reconcile_once()
    assert agent_env.pv_for("/mnt/disks/a")["metadata"]["uid"] == pv_a["metadata"]["uid"]
    assert agent_env.pv_for("/mnt/disks/e") is None and agent_env.phase("/mnt/disks/a") == "Available"


def swapped_at_a_reboot(env: AgentEnv, mounter: Mounter) -> tuple[Path, Path, Obj]:
    """b Bound with its tenant's data, a on offer; both without identity (a disk without WWN keeps
    its data across a reboot, modelled by tmpfs); at the reboot they come up at each other's paths."""
    path_a, path_b = env.fs_dir / "a", env.fs_dir / "b"
    mounter.tmpfs(path_a)
    mounter.tmpfs(path_b)
    env.start_agent(boot="boot-1")
    pv_b = bound_claim(env, "tenant-b", "/mnt/disks/b")
    wait_for(lambda: env.phase("/mnt/disks/a") == "Available", timeout=10, what="a on offer")
    (path_b / "b-data").write_text("tenant b")
    env.stop_agents()
    swap(path_a, path_b, env.root / "spare")
    return path_a, path_b, pv_b


def test_after_a_reboot_a_pv_on_offer_over_a_volume_holding_data_is_taken_off_offer(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    """Numbers of an earlier boot prove nothing: a PV on offer whose path now shows a volume that is
    not empty (here the bound tenant's, swapped at the reboot) stayed on offer - any claim would
    have got the tenant's data (found by tests/reliability/test_swaps.py)."""
    path_a, path_b, _ = swapped_at_a_reboot(agent_env, mounter)
    agent = agent_env.start_agent(boot="boot-2")
    wait_for(lambda: agent.passes >= 1, timeout=10, what="a pass")
    for _ in range(3):
        agent.reconcile_once()
    assert agent_env.phase("/mnt/disks/a") != "Available", "on offer over the bound tenant's data"
    assert (path_a / "b-data").read_text() == "tenant b"
    assert "/mnt/disks/a" in {v["path"] for v in agent.status()["volumes"] if v["held"]}
    swap(path_a, path_b, agent_env.root / "spare")


def test_after_a_reboot_a_bound_volume_does_not_take_the_empty_volume_swapped_onto_its_path(
    agent_env: AgentEnv, mounter: Mounter
) -> None:
    """A Bound record is left as it is across a reboot. It used to take the empty volume swapped
    onto its path (empty: nothing to lose by cleaning it) - and once the operator put the mounts
    back, it claimed that other volume by this boot's numbers: both paths held, the empty volume
    never offered again without the operator's word (found by the swaps suite)."""
    path_a, path_b, pv_b = swapped_at_a_reboot(agent_env, mounter)
    agent = agent_env.start_agent(boot="boot-2")
    wait_for(lambda: agent.passes >= 1, timeout=10, what="a pass")
    for _ in range(3):
        agent.reconcile_once()
    agent_env.stop_agents()
    swap(path_a, path_b, agent_env.root / "spare")  # the operator puts them back
    agent = agent_env.start_agent(boot="boot-2")
    wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Available", timeout=20, what="a on offer again")
    agent.reconcile_once()
    assert [v["path"] for v in agent.status()["volumes"] if v["held"]] == []
    assert agent_env.pv_for("/mnt/disks/b")["metadata"]["uid"] == pv_b["metadata"]["uid"]
    assert agent_env.phase("/mnt/disks/b") == "Bound" and (path_b / "b-data").read_text() == "tenant b"
    assert events(agent_env, "VolumeAccepted") == []

"""Our own PV put on offer by hand while its volume is not known clean.

An operator "unsticks" a PV whose cleanup keeps failing by removing its ``claimRef``; the
PV controller then makes it Available, and the next claim would get the previous
tenant's files. The planner used to leave such a PV alone for ever (the journal said
``used`` or ``cleaning``, the PV uid was ours, nothing was Released). Each test below
fails on that planner.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, USED, JournalEntry
from localpv.agent.model import FAILED, SUCCEEDED, World
from localpv.agent.planner import plan
from localpv.kube.events import WARNING
from tests.unit.test_reconcile import (
    CLAIM_NAME,
    NOW,
    Sim,
    _pass,
    jentry,
    make_config,
    make_pv,
    make_world,
    mnt,
    name_of,
    on_offer,
    status,
)

PATH = "/mnt/disks/vol1"


def unclaimed(phase: str = "Available", policy: str = "Delete", uid: str = "uid-1") -> dict:
    """What ``kubectl patch pv --type json -p '[{"op":"remove","path":"/spec/claimRef"}]'``
    leaves once the PV controller has seen it."""
    return make_pv("vol1", phase=phase, policy=policy, uid=uid, claim=False)


def world_with(pv: dict, record: JournalEntry, **kw: object) -> World:
    return make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal={PATH: record}, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- Delete, cleaning


@pytest.mark.parametrize("phase", ["Available", "Pending", "Failed", ""])
def test_cleaning_volume_whose_pv_lost_its_claimref_is_retracted(phase: str) -> None:
    pv = unclaimed(phase)
    record = jentry(CLEANING, since=90.0, claim="claim-of-uid-1")
    result = plan(world_with(pv, record, cleanups={name_of("vol1"): status(FAILED, retry_at=NOW - 1)}))
    [retract] = result.retracts
    assert (retract.pv, retract.host_path) == (pv, PATH)
    assert "claimRef was removed" in retract.reason and "cleaning" in retract.reason
    # The record, and the failed cleanup's backoff that started at 90.0, still count.
    assert PATH not in result.journal and result.forget_cleanups == []
    # Nothing is wiped under a PV that is on offer, and nothing else is offered.
    assert result.cleanups == [] and result.deletes == [] and result.creates == [] and result.restores == []


def test_after_the_retract_the_volume_is_cleaned_before_it_is_offered() -> None:
    record = jentry(CLEANING, since=90.0, claim="claim-of-uid-1")
    gone = make_world(scans={"sc1": [mnt("vol1")]}, journal={PATH: record},
                      cleanups={name_of("vol1"): status(FAILED, started=95.0, retry_at=NOW - 1)})
    failing = plan(gone)
    assert [(c.host_path, c.pv) for c in failing.cleanups] == [(PATH, None)] and failing.creates == []
    done = plan(replace(gone, cleanups={name_of("vol1"): status(SUCCEEDED, uid=None, started=NOW - 5)}))
    assert done.journal[PATH].state == OFFERED and [c.host_path for c in done.creates] == [PATH]


def test_a_released_pv_whose_claimref_was_just_removed_is_still_being_reclaimed() -> None:
    # The patch arrives before the PV controller turns the PV Available: not on offer yet.
    pv = unclaimed("Released")
    result = plan(world_with(pv, jentry(CLEANING, since=90.0, claim="claim-of-uid-1")))
    assert result.retracts == [] and [c.pv for c in result.cleanups] == [pv]


# --------------------------------------------------------------------------- Delete, used


def test_used_volume_whose_pv_lost_its_claimref_gets_that_claim_back() -> None:
    # The claim may still exist (the PV controller would bind the PV back to it, a pod may
    # use it): deleting the PV would make the claim Lost and the cleanup wipe live data.
    pv = unclaimed()
    result = plan(world_with(pv, jentry(USED, claim="claim-of-uid-1")))
    [restore] = result.restores
    assert (restore.pv, restore.host_path) == (pv, PATH)
    assert restore.claim_ref == {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "ns",
                                 "name": "data", "uid": "claim-of-uid-1"}
    assert result.retracts == [] and result.journal == {} and result.cleanups == [] and result.creates == []


def test_restored_claim_that_is_gone_releases_the_pv_and_it_is_cleaned() -> None:
    # What the PV controller does with a claimRef whose claim no longer exists: Released.
    released = make_pv("vol1", phase="Released")
    result = plan(world_with(released, jentry(USED, claim="claim-of-uid-1")))
    assert [c.pv for c in result.cleanups] == [released] and result.journal[PATH].state == CLEANING


def test_used_record_that_does_not_know_its_claims_name_is_retracted() -> None:
    # Written by an agent that kept only claim uids: nothing to put back.
    record = jentry(USED, claim="claim-of-uid-1", claim_name="")
    pv = unclaimed()
    result = plan(world_with(pv, record))
    assert [r.pv for r in result.retracts] == [pv] and result.restores == []
    assert result.journal[PATH] == replace(record, state=CLEANING, since=NOW)


def test_the_claims_name_is_recorded_when_it_binds_and_learnt_by_older_records() -> None:
    bound = make_pv("vol1", phase="Bound")
    first = plan(world_with(bound, jentry(OFFERED)))
    assert first.journal[PATH].claim_name == CLAIM_NAME == "ns/data"
    older = plan(world_with(bound, jentry(USED, claim="claim-of-uid-1", claim_name="")))
    assert older.journal[PATH] == jentry(USED, claim="claim-of-uid-1")


# --------------------------------------------------------------------------- claimed meanwhile


@pytest.mark.parametrize("state", [USED, CLEANING])
def test_pv_bound_by_another_claim_before_the_agent_acted_is_tracked_as_used_and_reported(state: str) -> None:
    # The retract's preconditions failed: the PV was bound to a new claim first.
    bound = make_pv("vol1", phase="Bound", uid="uid-1")
    bound["spec"]["claimRef"].update(uid="claim-b", name="other")
    result = plan(world_with(bound, jentry(state, since=90.0, claim="claim-a", claim_name="ns/data")))
    assert result.retracts == [] and result.restores == [] and result.cleanups == []
    assert result.journal[PATH] == jentry(USED, since=NOW, claim="claim-b", claim_name="ns/other")
    [event] = result.events
    assert (event.obj, event.type, event.reason) == (bound, WARNING, "VolumeNotCleaned")
    assert "ns/data" in event.message and "claim-a" in event.message
    # ... and it is cleaned when that claim releases it.
    released = copy.deepcopy(bound)
    released["status"]["phase"] = "Released"
    later = plan(world_with(released, result.journal[PATH], now=NOW + 10))
    assert [c.pv for c in later.cleanups] == [released] and later.deletes == []


def test_a_cleaning_record_without_a_claim_seeing_its_pv_bound_again_counts_it_as_a_new_use() -> None:
    bound = make_pv("vol1", phase="Bound")
    result = plan(world_with(bound, jentry(CLEANING, since=90.0, claim="")))
    assert result.journal[PATH].state == USED and result.journal[PATH].since == NOW
    assert [e.reason for e in result.events] == ["VolumeNotCleaned"]


@pytest.mark.parametrize("ref", [{"uid": "claim-of-uid-1"}, {}], ids=["binding", "pre-bound-by-name"])
def test_a_pv_with_a_claimref_is_claimed_whatever_its_phase(ref: dict) -> None:
    # claimRef written, phase not yet Bound (a bind in progress), or an operator reserving
    # the PV for a claim by name: deleting either would take the volume from that claim.
    pv = make_pv("vol1", phase="Available", claim=True)
    pv["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "data", **ref}
    result = plan(world_with(pv, jentry(USED, claim="claim-of-uid-1")))
    assert result.retracts == [] and result.restores == [] and result.events == []


def test_a_pv_being_deleted_is_left_to_go() -> None:
    pv = make_pv("vol1", phase="Available", claim=False, deleting=True)
    result = plan(world_with(pv, jentry(CLEANING, claim="claim-of-uid-1")))
    assert result.retracts == [] and result.restores == []


# --------------------------------------------------------------------------- Retain


@pytest.mark.parametrize("state", [USED, CLEANING])
def test_retain_pv_put_back_on_offer_is_left_alone_with_a_warning(state: str) -> None:
    # The operator owns a Retain volume's data: clearing the claimRef is upstream's way to
    # hand it to a new claim. The agent neither deletes the PV nor calls the volume clean.
    pv = unclaimed(policy="Retain")
    result = plan(world_with(pv, jentry(state, claim="claim-of-uid-1")))
    assert result.retracts == [] and result.restores == [] and result.cleanups == [] and result.journal == {}
    [event] = result.events
    assert (event.obj, event.type, event.reason, event.once) == (pv, WARNING, "VolumeRetainedReoffered", True)
    assert "ns/data" in event.message and "Retain" in event.message


def test_retain_pv_bound_again_then_deleted_is_cleaned_before_a_new_pv_is_offered() -> None:
    bound = make_pv("vol1", phase="Bound", policy="Retain")
    bound["spec"]["claimRef"].update(uid="claim-b")
    record = jentry(USED, claim="claim-of-uid-1")
    result = plan(world_with(bound, record))
    assert [e.reason for e in result.events] == ["VolumeNotCleaned"]
    # The operator deletes the PV later: the orphan check, then a clean, then a new PV.
    after = make_world(scans={"sc1": [mnt("vol1")]}, journal={PATH: result.journal[PATH]})
    assert [o.host_path for o in plan(after).orphans] == [PATH] and plan(after).creates == []


# --------------------------------------------------------------------------- siblings


@pytest.mark.parametrize("state", [OFFERED, CLEAN])
def test_a_released_pv_whose_record_says_offered_or_clean_is_reclaimed_as_before(state: str) -> None:
    released = make_pv("vol1", phase="Released")
    result = plan(world_with(released, jentry(state, claim="claim-of-uid-1")))
    assert result.retracts == [] and result.restores == []
    if state == CLEAN:
        assert [d.pv for d in result.deletes] == [released]
    else:
        assert [c.pv for c in result.cleanups] == [released]


@pytest.mark.parametrize("state", [OFFERED, CLEAN])
def test_an_unclaimed_pv_over_a_volume_known_clean_stays_on_offer(state: str) -> None:
    result = plan(world_with(unclaimed(), jentry(state)))
    assert result.retracts == [] and result.restores == [] and result.events == []


def test_a_duplicate_pv_offering_a_volume_in_use_through_another_pv_is_retracted() -> None:
    # Upstream made one PV per class for a hostDir two classes share; one is Bound.
    config = make_config({"a": {"hostDir": "/mnt/disks", "mountDir": "/discovery/disks"},
                          "b": {"hostDir": "/mnt/disks", "mountDir": "/discovery/disks"}})
    bound = make_pv("vol1", "a", config=config, phase="Bound", uid="u-a")
    other = make_pv("vol1", "b", config=config, phase="Available", uid="u-b")
    record = JournalEntry(name_of("vol1", "a"), "a", USED, 50.0, "claim-of-u-a", "u-a", claim_name="ns/data")
    for pvs in ([bound, other], [other, bound]):
        result = plan(make_world(config, {"a": [mnt("vol1")], "b": [mnt("vol1")]}, pvs=pvs,
                                 journal={PATH: record}))
        assert [r.pv for r in result.retracts] == [other] and result.restores == [] and result.journal == {}


# --------------------------------------------------------------------------- many passes


def _unclaim(sim: Sim, name: str) -> None:
    pv = sim.api[name]
    pv["spec"].pop("claimRef")
    pv["status"] = {"phase": "Available"}
    sim.history.append(f"t={sim.now} unclaim {name}")


def _offered_dirty(sim: Sim) -> list[str]:
    return [n for n, pv in sim.api.items() if on_offer(pv) and pv["spec"]["local"]["path"] in sim.dirty]


@pytest.mark.parametrize("bound_when_unclaimed", [False, True], ids=["released", "bound"])
@pytest.mark.parametrize("cleanup_fails", [False, True])
def test_story_unclaimed_pv_is_never_left_on_offer_dirty_and_a_live_claim_keeps_its_volume(
    bound_when_unclaimed: bool, cleanup_fails: bool
) -> None:
    sim = Sim(make_config(), {"sc1": [mnt("v1")]})
    name = name_of("v1")
    _pass(sim)
    pv = sim.api[name]
    pv["spec"]["claimRef"] = {"name": "data", "namespace": "ns", "uid": "tenant-a"}
    pv["status"] = {"phase": "Bound"}
    sim.dirty.add("/mnt/disks/v1")
    sim.live["tenant-a"] = "/mnt/disks/v1"  # the Sim's PV controller binds a restored claimRef to it
    _pass(sim)
    if not bound_when_unclaimed:
        del sim.live["tenant-a"]  # the claim is deleted: Released, its cleanup starts (and fails)
        pv["status"] = {"phase": "Released"}
        assert [c.host_path for c in _pass(sim).cleanups] == ["/mnt/disks/v1"]
        if cleanup_fails:
            sim.running.clear()
            sim.cleanups[name] = replace(sim.cleanups[name], state=FAILED, finished=sim.now, retry_at=sim.now + 5)
    _unclaim(sim, name)
    result = _pass(sim)
    assert _offered_dirty(sim) == [], sim.history
    if bound_when_unclaimed:
        # The tenant's claim still exists: its PV is given back to it, nothing is wiped.
        assert sim.api[name]["status"]["phase"] == "Bound" and result.cleanups == [] and result.retracts == []
        return
    for _ in range(6):
        _pass(sim)
        assert _offered_dirty(sim) == [], sim.history
        sim.finish_all()
    assert "/mnt/disks/v1" not in sim.dirty
    assert [p["status"]["phase"] for p in sim.api.values()] == ["Available"]
    assert sim.journal["/mnt/disks/v1"].state in (OFFERED, CLEAN)


# --------------------------------------------------------------------------- a use the agent never saw


def marked(pv: dict) -> dict:
    """The PV controller's mark of a past bind, left on a PV whose claimRef was removed."""
    pv = copy.deepcopy(pv)
    pv["metadata"].setdefault("annotations", {})["pv.kubernetes.io/bound-by-controller"] = "yes"
    return pv


def test_an_offered_pv_the_controller_had_bound_is_recorded_as_used() -> None:
    """Offered, bound, written, released and unclaimed between two passes: the journal says
    offered, but the PV controller's mark says a claim had it (found by the campaign)."""
    result = plan(world_with(marked(unclaimed()), jentry(OFFERED)))
    assert result.journal[PATH] == jentry(USED, since=NOW, claim="", claim_name="")
    [event] = [e for e in result.events if e.reason == "VolumeUseUnseen"]
    assert event.type == WARNING
    assert result.retracts == [] and result.creates == [] and result.cleanups == []


def test_an_offered_pv_never_bound_is_trusted() -> None:
    result = plan(world_with(unclaimed(), jentry(OFFERED)))
    assert PATH not in result.journal and result.retracts == [] and result.events == []


def test_a_use_without_a_claim_name_waits_for_the_pv_controller_then_is_retracted() -> None:
    """A live claim is bound back by the PV controller at its resync: retracting first would
    make it Lost and wipe its volume. Nobody back after the grace: retract, then clean."""
    pv = marked(unclaimed())
    waiting = plan(world_with(pv, jentry(USED, since=NOW - 10, claim="", claim_name="")))
    assert waiting.retracts == [] and waiting.restores == [] and waiting.creates == []
    late = plan(world_with(pv, jentry(USED, since=NOW - 31, claim="", claim_name="")))
    assert [r.pv for r in late.retracts] == [pv]
    assert late.journal[PATH].state == CLEANING


def test_a_claim_bound_to_it_during_the_grace_keeps_it() -> None:
    bound = marked(make_pv("vol1", phase="Bound", uid="uid-1"))
    result = plan(world_with(bound, jentry(USED, since=NOW - 10, claim="", claim_name="")))
    assert result.retracts == [] and result.cleanups == []
    assert result.journal.get(PATH, jentry(USED)).state == USED

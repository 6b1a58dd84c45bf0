"""The planner knows volumes by stable identities (issue 17, part 2): every rule, on plain data.

Each test is one thing that happens to disks between two passes - renumbered, swapped,
replaced, mounted elsewhere, unreadable - and checks the plan never cleans, offers or
deletes the PV of a volume that is not the recorded one, and says so.
"""

from __future__ import annotations

from dataclasses import replace

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, USED, JournalEntry, detached_key
from localpv.agent.model import Plan, World
from localpv.agent.planner import plan
from localpv.host.identity import Identity
from localpv.host.scan import Entry, EntryKind
from localpv.naming import GiB
from tests.unit.test_reconcile import jentry, journal_after, make_pv, make_world, name_of

UUID_A, UUID_B, UUID_C = "fs:uuid=aaaa", "fs:uuid=bbbb", "fs:uuid=cccc"


def vol(name: str, identity: str, *, ident: str | None = None, error: str | None = None) -> Entry:
    return Entry(name, f"/discovery/disks/{name}", EntryKind.MOUNTPOINT, 10 * GiB,
                 ident=ident or f"fs:2049:{name}", identity=Identity(identity, "filesystem UUID (libblkid)", error))


def rec(state: str, name: str, identity: str, **kw: object) -> JournalEntry:
    return replace(jentry(state, name, **kw), identity=identity, ident=f"fs:2049:{name}")  # type: ignore[arg-type]


def paths(result: Plan) -> set[str]:
    return {c.host_path for c in result.cleanups}


def reasons(result: Plan) -> list[str]:
    return [e.reason for e in result.events]


def swapped_world(pv_a_phase: str = "Released", pv_b_phase: str = "Bound") -> World:
    """a was Released (its record cleaning), b Bound; after a reboot each path shows the other disk."""
    pvs = [make_pv("a", phase=pv_a_phase, uid="uid-a", claim=True),
           make_pv("b", phase=pv_b_phase, uid="uid-b", claim=True)]
    journal = {"/mnt/disks/a": rec(CLEANING, "a", UUID_A, pv_uid="uid-a", claim="claim-a"),
               "/mnt/disks/b": rec(USED, "b", UUID_B, pv_uid="uid-b", claim="claim-of-uid-b")}
    return make_world(scans={"sc1": [vol("a", UUID_B), vol("b", UUID_A)]}, pvs=pvs, journal=journal)


def test_swapped_disks_are_held_nothing_cleaned_offered_or_deleted_and_everyone_told() -> None:
    result = plan(swapped_world())
    assert result.cleanups == [] and result.deletes == [] and result.retracts == [] and result.creates == []
    assert set(result.held) == {"/mnt/disks/a", "/mnt/disks/b"}
    mismatch = [e for e in result.events if e.reason == "VolumeIdentityMismatch"]
    kinds = {(e.obj["kind"], e.obj["metadata"]["name"]) for e in mismatch}
    assert ("Node", "test-node") in kinds
    assert ("PersistentVolume", name_of("a")) in kinds and ("PersistentVolume", name_of("b")) in kinds
    assert ("PersistentVolumeClaim", "data") in kinds, "the live claim is told"
    assert all(UUID_A in e.message and UUID_B in e.message and "by UUID or WWN" in e.message for e in mismatch)
    assert all(e.once for e in mismatch), "said when it starts, not every pass"


def test_swapped_back_the_cleanup_goes_on_where_the_disk_really_is() -> None:
    world = swapped_world()
    fixed = replace(world, scans={"sc1": [vol("a", UUID_A), vol("b", UUID_B)]})
    result = plan(fixed)
    assert result.held == {}
    assert paths(result) == {"/mnt/disks/a"}
    assert [c.identity for c in result.cleanups] == [UUID_A], "the cleaner is told which disk to find"


def test_renumbered_disk_without_pv_is_followed_and_cleaned_at_its_new_path() -> None:
    journal = {"/mnt/disks/a": rec(CLEANING, "a", UUID_A)}
    world = make_world(scans={"sc1": [vol("c", UUID_A)]}, journal=journal)
    result = plan(world)
    after = journal_after(world, result)
    assert "/mnt/disks/a" not in after and after["/mnt/disks/c"].state == CLEANING
    assert after["/mnt/disks/c"].identity == UUID_A
    assert "VolumeMoved" in reasons(result)
    assert paths(result) == {"/mnt/disks/c"} and result.creates == []


def test_a_released_pv_whose_disk_moved_is_deleted_first_then_the_record_follows() -> None:
    pv = make_pv("a", phase="Released", uid="uid-a", claim=True)
    journal = {"/mnt/disks/a": rec(CLEANING, "a", UUID_A, pv_uid="uid-a")}
    world = make_world(scans={"sc1": [vol("c", UUID_A)]}, pvs=[pv], journal=journal)
    result = plan(world)
    assert [r.pv for r in result.retracts] == [pv] and result.cleanups == []
    assert {"/mnt/disks/a", "/mnt/disks/c"} <= set(result.held), "nothing at c is offered meanwhile"
    assert result.creates == []
    second = plan(replace(world, pvs=[], journal=journal_after(world, result)))
    assert paths(second) == {"/mnt/disks/c"}


def test_a_moved_disk_never_follows_onto_a_path_a_live_claim_uses() -> None:
    # a's disk (dirty) now shows at b, whose PV is Bound to another claim; b's disk is nowhere.
    pvs = [make_pv("b", phase="Bound", uid="uid-b", claim=True)]
    journal = {"/mnt/disks/a": rec(CLEANING, "a", UUID_A),
               "/mnt/disks/b": rec(USED, "b", UUID_B, pv_uid="uid-b", claim="claim-of-uid-b")}
    result = plan(make_world(scans={"sc1": [vol("b", UUID_A)]}, pvs=pvs, journal=journal))
    assert result.cleanups == [] and result.retracts == [] and result.deletes == []
    assert "/mnt/disks/b" in result.held
    assert "VolumeIdentityMismatch" in reasons(result)


def test_a_replaced_disk_is_not_wiped_the_old_pv_goes_and_the_record_waits_for_the_old_disk() -> None:
    pv = make_pv("a", phase="Released", uid="uid-a", claim=True)
    journal = {"/mnt/disks/a": rec(USED, "a", UUID_A, pv_uid="uid-a", claim="claim-of-uid-a")}
    world = make_world(scans={"sc1": [vol("a", UUID_C)]}, pvs=[pv], journal=journal)
    first = plan(world)
    assert first.cleanups == [] and [r.pv for r in first.retracts] == [pv]
    assert "/mnt/disks/a" in first.held
    # The PV is gone: the record is detached, and the new disk is a new volume.
    world2 = replace(world, pvs=[], journal=journal_after(world, first))
    second = plan(world2)
    after = journal_after(world2, second)
    kept = after[detached_key(UUID_A)]
    assert kept.state == CLEANING and kept.identity == UUID_A and kept.ident == ""
    assert after["/mnt/disks/a"].identity == UUID_C and after["/mnt/disks/a"].state == OFFERED
    assert [c.host_path for c in second.creates] == ["/mnt/disks/a"] and second.cleanups == []
    assert "VolumeReplaced" in reasons(second)
    # The old disk comes back at another path: cleaned there before it is offered.
    world3 = replace(world2, journal=after, scans={"sc1": [vol("a", UUID_C), vol("d", UUID_A)]},
                     pvs=[make_pv("a", uid="uid-new")])
    third = plan(world3)
    after3 = journal_after(world3, third)
    assert detached_key(UUID_A) not in after3 and after3["/mnt/disks/d"].state == CLEANING
    assert paths(third) == {"/mnt/disks/d"} and [c.host_path for c in third.creates] == []


def test_a_replaced_disk_under_a_live_claim_is_only_reported() -> None:
    pv = make_pv("a", phase="Bound", uid="uid-a", claim=True)
    journal = {"/mnt/disks/a": rec(USED, "a", UUID_A, pv_uid="uid-a", claim="claim-of-uid-a")}
    result = plan(make_world(scans={"sc1": [vol("a", UUID_C)]}, pvs=[pv], journal=journal))
    assert result.retracts == [] and result.cleanups == [] and result.journal == {}
    assert "/mnt/disks/a" in result.held and "VolumeIdentityMismatch" in reasons(result)


def test_retain_pvs_are_never_deleted_for_a_mismatch() -> None:
    pv = make_pv("a", phase="Released", policy="Retain", uid="uid-a", claim=True)
    journal = {"/mnt/disks/a": rec(USED, "a", UUID_A, pv_uid="uid-a", claim="claim-of-uid-a")}
    result = plan(make_world(scans={"sc1": [vol("a", UUID_C)]}, pvs=[pv], journal=journal))
    assert result.retracts == [] and "/mnt/disks/a" in result.held


def test_an_unreadable_identity_proves_nothing_the_volume_is_held() -> None:
    pv = make_pv("a", phase="Released", uid="uid-a", claim=True)
    journal = {"/mnt/disks/a": rec(CLEANING, "a", UUID_A, pv_uid="uid-a")}
    scans = {"sc1": [vol("a", "", error="cannot read the filesystem UUID of device 8:16: Input/output error")]}
    result = plan(make_world(scans=scans, pvs=[pv], journal=journal))
    assert result.cleanups == [] and result.deletes == [] and result.retracts == []
    assert "cannot be read" in result.held["/mnt/disks/a"].reason


def test_a_record_without_identity_learns_it_from_its_path_then_is_held_to_it() -> None:
    """An older agent's record (device numbers only) learns the stable identity its path shows
    (the first pass after an upgrade trusts the path, as the older agent did: see the runbook);
    from then on another disk at the path is a mismatch."""
    legacy = replace(jentry(USED, "a"), ident="fs:2049:a")
    world = make_world(scans={"sc1": [vol("a", UUID_A)]}, pvs=[make_pv("a", phase="Bound", claim=True)],
                       journal={"/mnt/disks/a": legacy})
    after = journal_after(world, plan(world))
    assert after["/mnt/disks/a"].identity == UUID_A
    later = plan(replace(world, journal=after, scans={"sc1": [vol("a", UUID_B)]}))
    assert "/mnt/disks/a" in later.held


def test_a_new_volume_is_recorded_with_its_identity_and_a_dirty_one_is_not_offered_twice() -> None:
    result = plan(make_world(scans={"sc1": [vol("a", UUID_A)]}))
    assert result.journal["/mnt/disks/a"].identity == UUID_A
    # A detached record's disk shows at two paths (an alias): offered at neither.
    journal = {detached_key(UUID_A): replace(rec(CLEANING, "a", UUID_A), ident="")}
    result = plan(make_world(scans={"sc1": [vol("x", UUID_A, ident="fs:1:1"), vol("y", UUID_A, ident="fs:1:1")]},
                             journal=journal))
    assert result.creates == [] and result.cleanups == []


def test_clean_records_and_volatile_volumes_keep_the_older_rules() -> None:
    # tmpfs: no identity; a clean record with another disk at its path: nothing is held.
    world = make_world(scans={"sc1": [vol("a", ""), vol("b", UUID_C)]},
                       journal={"/mnt/disks/a": rec(CLEAN, "a", ""), "/mnt/disks/b": rec(CLEAN, "b", UUID_B)})
    result = plan(world)
    assert result.held == {}
    assert {c.host_path for c in result.creates} == {"/mnt/disks/a", "/mnt/disks/b"}


def test_a_pv_on_offer_for_a_path_that_now_shows_another_disk_is_taken_off_offer() -> None:
    """a was Available (offered, unused), b Bound with its tenant's data; after a reboot a
    shows b's disk. A claim binding a's PV now would get b's tenant's data."""
    world = swapped_world(pv_a_phase="Available")
    world = replace(world, pvs=[make_pv("a", phase="Available", uid="uid-a"), world.pvs[1]],
                    journal={**world.journal, "/mnt/disks/a": rec(OFFERED, "a", UUID_A, pv_uid="uid-a")})
    result = plan(world)
    assert [r.pv["metadata"]["uid"] for r in result.retracts] == ["uid-a"]
    assert "no claim gets a disk nobody proved clean" in result.retracts[0].reason
    assert result.cleanups == [] and result.creates == [] and "/mnt/disks/b" in result.held
    # Its PV gone, a's record (nobody used it) waits for its disk: b's path is held by b's claim.
    second = plan(replace(world, pvs=[world.pvs[1]], journal=journal_after(world, result)))
    assert second.cleanups == [] and second.creates == [] and {"/mnt/disks/a", "/mnt/disks/b"} <= set(second.held)


def test_a_record_that_follows_its_disk_takes_the_pv_name_of_its_new_path() -> None:
    """Cleanups are tracked by PV name: under its old name, the cleanup of the moved disk
    would be taken for the cleanup of the next volume offered at the old path (found by the
    renumber campaign: that volume was offered with its tenant's data)."""
    journal = {"/mnt/disks/a": rec(CLEANING, "a", UUID_A)}
    world = make_world(scans={"sc1": [vol("a", UUID_C), vol("c", UUID_A)]}, journal=journal)
    result = plan(world)
    after = journal_after(world, result)
    assert after["/mnt/disks/c"].pv == name_of("c") and after["/mnt/disks/c"].pv_uid == ""
    # The disk now at a is a new volume under a's name; c's cleanup runs under c's name.
    assert [c.pv_name for c in result.cleanups] == [name_of("c")]
    assert [c.pv["metadata"]["name"] for c in result.creates] == [name_of("a")]

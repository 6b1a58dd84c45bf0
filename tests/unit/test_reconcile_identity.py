"""The planner trusts identities, not names (issue 11, findings 1-3).

A PV object is trusted only if it is the one the volume was offered as (its uid); a
volume is what it is on the host (device and inode, major:minor), whatever path names
it; a journal that did not exist at start cannot prove any volume clean. Each test
below failed on the planner before these rules existed.
"""

from __future__ import annotations

from dataclasses import replace

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, USED, JournalEntry
from localpv.agent.model import ConfirmOrphan, World
from localpv.agent.planner import plan
from localpv.host.scan import Entry, EntryKind
from localpv.kube.events import WARNING
from localpv.naming import GiB
from tests.unit.test_reconcile import NOW, jentry, make_config, make_pv, make_world, name_of

IDENT = "fs:2049:131"
ALIAS = {"hostDir": "/mnt/alias", "mountDir": "/discovery/alias"}


def vol(name: str = "vol1", ident: str = IDENT, mount_dir: str = "/discovery/disks") -> Entry:
    return Entry(name, f"{mount_dir}/{name}", EntryKind.MOUNTPOINT, 10 * GiB, ident=ident)


def without_pv(world: World) -> World:
    return replace(world, pvs=[])


# --------------------------------------------------------------------------- finding 1: PV uid


def test_pv_recreated_by_hand_over_a_used_volume_is_retracted_then_the_volume_cleaned() -> None:
    # The PV the tenant used was deleted and applied again (same name and spec, no claimRef).
    recreated = make_pv("vol1", uid="uid-2")
    journal = {"/mnt/disks/vol1": jentry(USED, claim="claim-a", pv_uid="uid-1")}
    world = make_world(scans={"sc1": [vol()]}, pvs=[recreated], journal=journal)
    result = plan(world)
    assert [(r.pv, r.host_path) for r in result.retracts] == [(recreated, "/mnt/disks/vol1")]
    assert "re-created" in result.retracts[0].reason
    assert result.journal["/mnt/disks/vol1"].state == CLEANING
    assert result.creates == [] and result.cleanups == []
    # Once the PV is gone, the volume is cleaned before anything is offered.
    after = plan(make_world(scans={"sc1": [vol()]}, journal={**journal, **result.journal}))
    assert [c.host_path for c in after.cleanups] == ["/mnt/disks/vol1"] and after.creates == []


def test_pv_recreated_while_its_volume_is_being_cleaned_is_retracted_and_the_clean_goes_on() -> None:
    recreated = make_pv("vol1", uid="uid-2")
    record = jentry(CLEANING, since=90.0, pv_uid="uid-1")
    result = plan(make_world(scans={"sc1": [vol()]}, pvs=[recreated], journal={"/mnt/disks/vol1": record}))
    assert [r.pv for r in result.retracts] == [recreated]
    after = result.journal["/mnt/disks/vol1"]
    assert (after.state, after.since) == (CLEANING, 90.0), "the clean running since 90.0 still counts"


def test_pv_recreated_over_an_offered_volume_is_not_trusted_either() -> None:
    # While the agent was down the old PV may have been bound, written, released, deleted.
    recreated = make_pv("vol1", uid="uid-2")
    result = plan(make_world(scans={"sc1": [vol()]}, pvs=[recreated],
                             journal={"/mnt/disks/vol1": jentry(OFFERED, pv_uid="uid-1")}))
    assert [r.pv for r in result.retracts] == [recreated]
    assert result.journal["/mnt/disks/vol1"].state == CLEANING


def test_recreated_pv_already_claimed_is_tracked_as_used_and_reported_not_deleted() -> None:
    recreated = make_pv("vol1", phase="Bound", uid="uid-2")
    result = plan(make_world(scans={"sc1": [vol()]}, pvs=[recreated],
                             journal={"/mnt/disks/vol1": jentry(USED, claim="claim-a", pv_uid="uid-1")}))
    assert result.retracts == [] and result.cleanups == []
    record = result.journal["/mnt/disks/vol1"]
    assert (record.state, record.pv_uid, record.claim) == (USED, "uid-2", "claim-of-uid-2")
    [event] = result.events
    assert (event.obj, event.type, event.reason) == (recreated, WARNING, "VolumeNotCleaned")


def test_recreated_pv_over_a_clean_volume_is_simply_the_pv_on_offer() -> None:
    recreated = make_pv("vol1", uid="uid-2")
    result = plan(make_world(scans={"sc1": [vol()]}, pvs=[recreated],
                             journal={"/mnt/disks/vol1": jentry(CLEAN, pv_uid="uid-1")}))
    assert result.retracts == []
    assert (result.journal["/mnt/disks/vol1"].state, result.journal["/mnt/disks/vol1"].pv_uid) == (OFFERED, "uid-2")


def test_released_pv_recreated_over_a_clean_record_is_cleaned_not_just_deleted() -> None:
    # Clean record awaiting deletion of uid-1; someone replaced the PV by one that was
    # bound and released: deleting it without a clean would re-offer its data.
    recreated = make_pv("vol1", phase="Released", uid="uid-2")
    result = plan(make_world(scans={"sc1": [vol()]}, pvs=[recreated],
                             journal={"/mnt/disks/vol1": jentry(CLEAN, pv_uid="uid-1")}))
    assert result.deletes == []
    assert [c.host_path for c in result.cleanups] == ["/mnt/disks/vol1"]


def test_another_name_publishing_a_dirty_volume_whose_pv_is_gone_is_retracted() -> None:
    stranger = make_pv("vol1", uid="uid-9")
    stranger["metadata"]["name"] = "restored-from-backup"
    result = plan(make_world(scans={"sc1": [vol()]}, pvs=[stranger],
                             journal={"/mnt/disks/vol1": jentry(USED, pv_uid="uid-1")}))
    assert [r.pv for r in result.retracts] == [stranger]


def test_record_without_a_uid_learns_it_on_first_sight() -> None:
    pv = make_pv("vol1", uid="uid-1")
    result = plan(make_world(scans={"sc1": [vol()]}, pvs=[pv],
                             journal={"/mnt/disks/vol1": jentry(OFFERED, pv_uid="")}))
    assert result.retracts == []
    assert result.journal["/mnt/disks/vol1"].pv_uid == "uid-1"


# --------------------------------------------------------------------------- finding 2: identity


def test_dirty_volume_follows_its_identity_to_a_new_host_dir() -> None:
    # Cleanup kept failing; the operator pointed the class at an alias of the same
    # directory and deleted the stuck PV. The new path must not be offered dirty.
    config = make_config({"sc1": ALIAS})
    record = replace(jentry(CLEANING, pv_uid="uid-1"), ident=IDENT)
    result = plan(make_world(config, {"sc1": [vol(mount_dir="/discovery/alias")]},
                             journal={"/mnt/disks/vol1": record}))
    assert result.creates == []
    assert result.journal["/mnt/disks/vol1"] is None
    assert result.journal["/mnt/alias/vol1"].state == CLEANING
    assert [(c.host_path, c.container_path) for c in result.cleanups] == [("/mnt/alias/vol1",
                                                                            "/discovery/alias/vol1")]
    assert [e.reason for e in result.events] == ["VolumeMoved"]


def test_second_spelling_of_a_volume_in_use_gets_no_pv() -> None:
    config = make_config({"sc1": {"hostDir": "/mnt/disks", "mountDir": "/discovery/disks"}, "sc2": ALIAS})
    bound = make_pv("vol1", phase="Bound", uid="uid-1", config=config)
    record = replace(jentry(USED, claim="claim-of-uid-1", pv_uid="uid-1"), ident=IDENT)
    result = plan(make_world(config, {"sc1": [vol()], "sc2": [vol(mount_dir="/discovery/alias")]},
                             pvs=[bound], journal={"/mnt/disks/vol1": record}))
    assert result.creates == []
    [skip] = [s for s in result.skipped if s.cls == "sc2"]
    assert "same volume" in skip.reason and "/mnt/disks/vol1" in skip.reason


def test_two_new_spellings_of_one_volume_get_one_pv() -> None:
    config = make_config({"sc1": {"hostDir": "/mnt/disks", "mountDir": "/discovery/disks"}, "sc2": ALIAS})
    result = plan(make_world(config, {"sc1": [vol()], "sc2": [vol(mount_dir="/discovery/alias")]}))
    assert len(result.creates) == 1


def test_identity_that_moved_away_from_a_dirty_record_is_cleaned_where_it_went() -> None:
    # Mounts moved: the dirty filesystem (no PV) now sits at vol2, another one at vol1. The
    # record follows its volume; it is never re-pointed to the one now at its old path.
    record = replace(jentry(CLEANING, pv_uid="uid-1"), ident=IDENT)
    result = plan(make_world(scans={"sc1": [vol("vol1", ident="fs:2050:2"), vol("vol2", ident=IDENT)]},
                             journal={"/mnt/disks/vol1": record}))
    assert result.journal["/mnt/disks/vol2"].state == CLEANING
    assert result.journal["/mnt/disks/vol2"].ident == IDENT
    assert result.journal["/mnt/disks/vol1"] is None or result.journal["/mnt/disks/vol1"].ident == "fs:2050:2"
    assert "/mnt/disks/vol2" not in [c.host_path for c in result.creates]
    assert {c.host_path for c in result.cleanups} == {"/mnt/disks/vol2"}
    assert "VolumeMoved" in [e.reason for e in result.events]


def test_a_published_volume_whose_path_shows_nothing_owns_its_numbers_of_this_boot() -> None:
    # An offered volume moved with `mount --move` keeps its numbers: a mount at another path that
    # shows them is that volume (or an unrelated tmpfs reusing a freed anonymous number: nothing
    # tells them apart). While its PV is published it is not offered a second time, and it is said.
    pv = make_pv("vol1", uid="uid-1")
    record = replace(jentry(OFFERED, pv_uid="uid-1"), ident=IDENT)
    world = make_world(scans={"sc1": [Entry("vol1", "/discovery/disks/vol1", EntryKind.DIRECTORY,
                                            reason="not a mount point"), vol("vol2")]},
                       pvs=[pv], journal={"/mnt/disks/vol1": record})
    result = plan(world)
    assert result.creates == []
    [skip] = [s for s in result.skipped if s.path == "/discovery/disks/vol2"]
    assert "same volume as /mnt/disks/vol1" in skip.reason and "already published" in skip.reason


def test_numbers_of_a_published_volume_of_an_earlier_boot_block_nothing() -> None:
    # After a reboot the numbers were dealt out again: they name nothing.
    pv = make_pv("vol1", uid="uid-1")
    record = replace(jentry(OFFERED, pv_uid="uid-1"), ident=IDENT, boot="boot-0")
    world = replace(make_world(scans={"sc1": [Entry("vol1", "/discovery/disks/vol1", EntryKind.DIRECTORY,
                                                    reason="not a mount point"), vol("vol2")]},
                               pvs=[pv], journal={"/mnt/disks/vol1": record}), boot="boot-1")
    assert [c.host_path for c in plan(world).creates] == ["/mnt/disks/vol2"]


# --------------------------------------------------------------------------- finding 3: journal lost


def test_recovering_journal_cleans_every_volume_without_a_pv_before_offering_it() -> None:
    world = replace(make_world(scans={"sc1": [vol("vol1"), vol("vol2", ident="fs:2049:7")]}), recovering=True)
    result = plan(world)
    assert result.creates == []
    assert {p: e.state for p, e in result.journal.items() if e} == {"/mnt/disks/vol1": CLEANING,
                                                                   "/mnt/disks/vol2": CLEANING}
    assert {c.host_path for c in result.cleanups} == {"/mnt/disks/vol1", "/mnt/disks/vol2"}
    assert all("journal is new" in s.reason for s in result.skipped)


def test_recovering_journal_keeps_existing_pvs_as_they_are() -> None:
    pv = make_pv("vol1", uid="uid-1")
    result = plan(replace(make_world(scans={"sc1": [vol()]}, pvs=[pv]), recovering=True))
    assert result.retracts == [] and result.cleanups == [] and result.creates == []
    assert result.journal["/mnt/disks/vol1"] == JournalEntry(name_of("vol1"), "sc1", OFFERED, NOW, "", "uid-1",
                                                             ident=IDENT)


def test_without_recovery_a_volume_without_record_is_offered() -> None:
    assert [c.host_path for c in plan(make_world(scans={"sc1": [vol()]})).creates] == ["/mnt/disks/vol1"]


def test_orphan_confirmation_still_applies_to_a_used_record_without_pv() -> None:
    record = replace(jentry(USED, pv_uid="uid-1"), ident=IDENT)
    result = plan(make_world(scans={"sc1": [vol()]}, journal={"/mnt/disks/vol1": record}))
    assert result.orphans == [ConfirmOrphan(name_of("vol1"), "/mnt/disks/vol1", record)]
    assert result.creates == []


def test_offered_record_whose_pv_is_gone_is_not_offered_under_an_alias() -> None:
    # Found by the campaign: the agent never saw the PV bound (down, or its cache lagged),
    # the tenant wrote and left, the operator changed hostDir and deleted the PV.
    config = make_config({"sc1": ALIAS})
    record = replace(jentry(OFFERED, pv_uid="uid-1"), ident=IDENT)
    result = plan(make_world(config, {"sc1": [vol(mount_dir="/discovery/alias")]},
                             journal={"/mnt/disks/vol1": record}))
    assert result.creates == []
    assert result.journal["/mnt/alias/vol1"] is not None and result.journal["/mnt/disks/vol1"] is None
    assert [o.host_path for o in result.orphans] == ["/mnt/alias/vol1"], "confirmed gone, then cleaned"

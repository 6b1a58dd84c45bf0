"""Records without a stable identity know their volume by device and inode numbers within one
boot (issue 24, items 1 and 2): every rule on plain data, and a property over random swaps.

A volume without identity is a tmpfs here (``fs:<dev>:1``); the swaps are what ``mount --move``
does (each volume keeps its numbers), the reboots what a boot does (numbers dealt out again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, USED, JournalEntry, JournalState
from localpv.agent.model import Plan, World
from localpv.agent.planner import plan
from localpv.agent.planner.volatile import emptiness_wanted
from localpv.agent.pvbuilder import ACCEPT_VOLUME_PREFIX, NodeInfo
from localpv.host.identity import Identity
from localpv.host.scan import Entry, EntryKind
from localpv.naming import GiB
from tests.unit.test_reconcile import NODE, jentry, journal_after, make_pv, make_world, name_of

Obj = dict[str, Any]
BOOT, EARLIER = "boot-2", "boot-1"
TMPFS = Identity("", "volatile: tmpfs has no device to identify it by")


def tmpfs(name: str, dev: int) -> Entry:
    return Entry(name, f"/discovery/disks/{name}", EntryKind.MOUNTPOINT, 1 * GiB, ident=f"fs:{dev}:1",
                 identity=TMPFS)


def rec(state: str, name: str, dev: int, *, boot: str = BOOT, pv_uid: str = "uid-1", claim: str = "") -> JournalEntry:
    return replace(jentry(state, name, pv_uid=pv_uid, claim=claim), ident=f"fs:{dev}:1", boot=boot)


def world(scan: list[Entry], journal: dict[str, JournalEntry], pvs: Sequence[Obj] = (), *,
          empty: frozenset[str] = frozenset(), node: NodeInfo = NODE) -> World:
    w = make_world(scans={"sc1": scan}, pvs=pvs, journal=journal, node=node)
    return replace(w, boot=BOOT, empty=empty)


def reasons(result: Plan) -> list[str]:
    return [e.reason for e in result.events]


def swapped() -> World:
    """a Released (its tenant gone), b Bound; the two tmpfs mounts traded places (same boot)."""
    return world([tmpfs("a", 41), tmpfs("b", 40)],
                 {"/mnt/disks/a": rec(USED, "a", 40, pv_uid="uid-a", claim="claim-of-uid-a"),
                  "/mnt/disks/b": rec(USED, "b", 41, pv_uid="uid-b", claim="claim-of-uid-b")},
                 [make_pv("a", phase="Released", uid="uid-a"), make_pv("b", phase="Bound", uid="uid-b")])


def test_swapped_in_one_boot_nothing_is_cleaned_both_are_held_and_everyone_is_told() -> None:
    result = plan(swapped())
    assert result.cleanups == [] and result.deletes == [] and result.retracts == [] and result.creates == []
    assert set(result.held) == {"/mnt/disks/a", "/mnt/disks/b"}
    mismatch = [e for e in result.events if e.reason == "VolumeIdentityMismatch"]
    kinds = {(e.obj["kind"], e.obj["metadata"]["name"]) for e in mismatch}
    assert {("Node", NODE.name), ("PersistentVolume", name_of("a")), ("PersistentVolume", name_of("b")),
            ("PersistentVolumeClaim", "data")} <= kinds
    assert all("fs:40:1" in e.message and "fs:41:1" in e.message and e.once for e in mismatch)
    assert all(r is None or r.ident in ("fs:40:1", "fs:41:1") for r in result.journal.values())
    after = journal_after(swapped(), result)
    assert (after["/mnt/disks/a"].ident, after["/mnt/disks/b"].ident) == ("fs:40:1", "fs:41:1"), "never re-pointed"


def test_swapped_back_the_held_cleanup_goes_on_on_its_own_volume() -> None:
    fixed = replace(swapped(), scans={"sc1": [tmpfs("a", 40), tmpfs("b", 41)]})
    result = plan(fixed)
    assert result.held == {} and [c.host_path for c in result.cleanups] == ["/mnt/disks/a"]
    assert [(c.identity, c.numbers) for c in result.cleanups] == [("", "fs:40:1")], "the cleaner checks them"


def test_a_pv_on_offer_over_another_volume_is_taken_off_offer_and_its_old_volume_held() -> None:
    w = world([tmpfs("a", 41), tmpfs("b", 40)],
              {"/mnt/disks/a": rec(USED, "a", 40, pv_uid="uid-a", claim="claim-of-uid-a"),
               "/mnt/disks/b": rec(OFFERED, "b", 41, pv_uid="uid-b")},
              [make_pv("a", phase="Released", uid="uid-a"), make_pv("b", uid="uid-b")])
    result = plan(w)
    assert [r.pv["metadata"]["uid"] for r in result.retracts] == ["uid-b"]
    assert result.cleanups == [] and result.creates == [] and set(result.held) == {"/mnt/disks/a", "/mnt/disks/b"}


def test_a_volume_replaced_in_one_boot_is_not_cleaned_as_the_old_one() -> None:
    # a tmpfs unmounted and another mounted in its place while the PV was Released: the old
    # one's data went with it, or it is mounted elsewhere; either way the new one is not it.
    w = world([tmpfs("a", 45)], {"/mnt/disks/a": rec(USED, "a", 40, pv_uid="uid-a", claim="claim-of-uid-a")},
              [make_pv("a", phase="Released", uid="uid-a")])
    result = plan(w)
    assert result.cleanups == [] and result.deletes == [] and "/mnt/disks/a" in result.held
    assert "at no path now" in result.held["/mnt/disks/a"].reason
    mismatch = next(e for e in result.events if e.reason == "VolumeIdentityMismatch")
    assert f"{ACCEPT_VOLUME_PREFIX}{name_of('a')}=fs:45:1@{BOOT}" in mismatch.message


def test_a_dirty_record_without_pv_follows_its_numbers_and_its_old_path_is_a_new_volume() -> None:
    w = world([tmpfs("a", 45), tmpfs("c", 40)], {"/mnt/disks/a": rec(CLEANING, "a", 40)})
    result = plan(w)
    after = journal_after(w, result)
    assert after["/mnt/disks/c"].state == CLEANING and after["/mnt/disks/c"].ident == "fs:40:1"
    assert after["/mnt/disks/c"].boot == BOOT
    assert [c.host_path for c in result.cleanups] == ["/mnt/disks/c"]
    assert [c.host_path for c in result.creates] == ["/mnt/disks/a"] and "VolumeMoved" in reasons(result)


def test_a_clean_record_takes_whatever_is_at_its_path() -> None:
    w = world([tmpfs("a", 45)], {"/mnt/disks/a": rec(CLEAN, "a", 40)})
    result = plan(w)
    assert result.held == {} and journal_after(w, result)["/mnt/disks/a"].ident == "fs:45:1"


# --------------------------------------------------------------------------- across a reboot


def rebooted(*, empty: bool = False, accepted: str | None = None) -> World:
    """a was Released before a reboot; after it, a tmpfs with data (a disk without identity
    keeps its data) shows other - or the same - numbers: they prove nothing either way."""
    node = NODE if accepted is None else replace(NODE, accepted={name_of("a"): accepted})
    return world([tmpfs("a", 40)],
                 {"/mnt/disks/a": rec(USED, "a", 40, boot=EARLIER, pv_uid="uid-a", claim="claim-of-uid-a")},
                 [make_pv("a", phase="Released", uid="uid-a")],
                 empty=frozenset({"/mnt/disks/a"}) if empty else frozenset(), node=node)


def test_after_a_reboot_a_released_volume_with_data_is_not_cleaned_without_the_operators_word() -> None:
    result = plan(rebooted())
    assert result.cleanups == [] and result.deletes == [] and "/mnt/disks/a" in result.held
    mismatch = [e for e in result.events if e.reason == "VolumeIdentityMismatch"]
    assert mismatch and all("earlier boot" in e.message for e in mismatch)
    assert f"kubectl annotate node {NODE.name} {ACCEPT_VOLUME_PREFIX}{name_of('a')}=fs:40:1@{BOOT}" in \
        mismatch[0].message


def test_after_a_reboot_an_empty_volume_is_taken_and_cleaned() -> None:
    w = rebooted(empty=True)
    result = plan(w)
    assert result.held == {} and [c.host_path for c in result.cleanups] == ["/mnt/disks/a"]
    assert journal_after(w, result)["/mnt/disks/a"].boot == BOOT


def test_after_a_reboot_the_operators_word_for_this_volume_in_this_boot_releases_it() -> None:
    w = rebooted(accepted=f"fs:40:1@{BOOT}")
    result = plan(w)
    assert result.held == {} and [c.host_path for c in result.cleanups] == ["/mnt/disks/a"]
    assert "VolumeAccepted" in reasons(result)
    assert journal_after(w, result)["/mnt/disks/a"].boot == BOOT


def test_the_operators_word_of_another_boot_or_for_another_volume_says_nothing() -> None:
    for stale in (f"fs:40:1@{EARLIER}", f"fs:41:1@{BOOT}", "yes"):
        result = plan(rebooted(accepted=stale))
        assert result.cleanups == [] and "/mnt/disks/a" in result.held, stale


def test_after_a_reboot_a_bound_volume_is_left_alone_and_keeps_its_earlier_boot() -> None:
    w = world([tmpfs("a", 40)], {"/mnt/disks/a": rec(USED, "a", 40, boot=EARLIER, pv_uid="uid-a",
                                                     claim="claim-of-uid-a")},
              [make_pv("a", phase="Bound", uid="uid-a")])
    result = plan(w)
    assert result.held == {} and result.journal == {} and result.events == []


def test_after_a_reboot_a_pv_on_offer_over_a_volume_that_is_not_empty_is_taken_off_offer() -> None:
    w = world([tmpfs("a", 40)], {"/mnt/disks/a": rec(OFFERED, "a", 40, boot=EARLIER, pv_uid="uid-a")},
              [make_pv("a", phase="Available", uid="uid-a")])
    result = plan(w)
    assert [r.host_path for r in result.retracts] == ["/mnt/disks/a"] and "/mnt/disks/a" in result.held
    assert result.cleanups == [] and result.creates == []


def test_after_a_reboot_a_pv_on_offer_over_an_empty_volume_stays_on_offer() -> None:
    w = world([tmpfs("a", 40)], {"/mnt/disks/a": rec(OFFERED, "a", 40, boot=EARLIER, pv_uid="uid-a")},
              [make_pv("a", phase="Available", uid="uid-a")], empty=frozenset({"/mnt/disks/a"}))
    result = plan(w)
    assert result.retracts == [] and result.held == {}
    assert journal_after(w, result)["/mnt/disks/a"].boot == BOOT


def test_after_a_reboot_a_bound_record_does_not_take_an_empty_volume_at_its_path() -> None:
    w = world([tmpfs("a", 41)], {"/mnt/disks/a": rec(USED, "a", 40, boot=EARLIER, pv_uid="uid-a",
                                                     claim="claim-of-uid-a")},
              [make_pv("a", phase="Bound", uid="uid-a")], empty=frozenset({"/mnt/disks/a"}))
    result = plan(w)
    assert result.held == {} and result.journal == {} and result.events == []


def test_only_volumes_known_by_another_boots_numbers_are_looked_at_for_emptiness() -> None:
    w = world([tmpfs("a", 40), tmpfs("b", 41), tmpfs("c", 42)],
              {"/mnt/disks/a": rec(USED, "a", 40, boot=EARLIER), "/mnt/disks/b": rec(USED, "b", 41),
               "/mnt/disks/c": replace(rec(USED, "c", 42, boot=EARLIER), identity="fs:uuid=cc")})
    assert emptiness_wanted(w) == {"/mnt/disks/a": ("/discovery/disks/a", "/discovery/disks")}


def test_another_boots_numbers_of_a_dirty_record_do_not_block_an_unrelated_volume() -> None:
    # The record's disk is not mounted now; its old numbers went to another volume at boot.
    w = world([Entry("a", "/discovery/disks/a", EntryKind.DIRECTORY, reason="not a mount point"), tmpfs("b", 40)],
              {"/mnt/disks/a": rec(CLEANING, "a", 40, boot=EARLIER)})
    assert [c.host_path for c in plan(w).creates] == ["/mnt/disks/b"]


def test_a_record_from_before_boot_ids_that_matches_learns_this_boot() -> None:
    w = world([tmpfs("a", 40)], {"/mnt/disks/a": rec(USED, "a", 40, boot="", pv_uid="uid-a",
                                                     claim="claim-of-uid-a")},
              [make_pv("a", phase="Released", uid="uid-a")])
    result = plan(w)
    assert result.held == {} and [c.host_path for c in result.cleanups] == ["/mnt/disks/a"]
    assert journal_after(w, result)["/mnt/disks/a"].boot == BOOT


# --------------------------------------------------------------------------- item 2: learning identities


def disk(name: str, dev: int, uuid: str) -> Entry:
    return Entry(name, f"/discovery/disks/{name}", EntryKind.MOUNTPOINT, 10 * GiB, ident=f"fs:{dev}:2",
                 identity=Identity(f"fs:uuid={uuid}", "filesystem UUID (libblkid)"))


def test_a_record_from_before_identities_learns_the_disk_its_numbers_show_not_the_one_at_its_path() -> None:
    journal = {"/mnt/disks/a": replace(jentry(USED, "a", pv_uid="uid-a", claim="claim-of-uid-a"), ident="fs:2049:2"),
               "/mnt/disks/b": replace(jentry(USED, "b", pv_uid="uid-b", claim="claim-of-uid-b"), ident="fs:2050:2")}
    w = world([disk("a", 2050, "bbbb"), disk("b", 2049, "aaaa")], journal,
              [make_pv("a", phase="Released", uid="uid-a"), make_pv("b", phase="Bound", uid="uid-b")])
    result = plan(w)
    after = journal_after(w, result)
    assert after["/mnt/disks/a"].identity == "fs:uuid=aaaa" and after["/mnt/disks/b"].identity == "fs:uuid=bbbb"
    assert result.cleanups == [] and set(result.held) == {"/mnt/disks/a", "/mnt/disks/b"}
    assert "VolumeIdentityMismatch" in reasons(result)


def test_a_record_from_before_identities_learns_its_own_disk_in_place() -> None:
    journal = {"/mnt/disks/a": replace(jentry(USED, "a", pv_uid="uid-a", claim="claim-of-uid-a"), ident="fs:2049:2")}
    w = world([disk("a", 2049, "aaaa")], journal, [make_pv("a", phase="Released", uid="uid-a")])
    result = plan(w)
    assert journal_after(w, result)["/mnt/disks/a"].identity == "fs:uuid=aaaa"
    assert [c.host_path for c in result.cleanups] == ["/mnt/disks/a"] and result.held == {}


def test_another_boots_numbers_teach_no_identity() -> None:
    journal = {"/mnt/disks/a": rec(USED, "a", 2049, boot=EARLIER, pv_uid="uid-a", claim="claim-of-uid-a")}
    w = world([disk("a", 2050, "bbbb"), disk("b", 2049, "aaaa")], journal,
              [make_pv("a", phase="Released", uid="uid-a")])
    result = plan(w)
    assert journal_after(w, result)["/mnt/disks/a"].identity == ""
    assert result.cleanups == [] and "/mnt/disks/a" in result.held


# --------------------------------------------------------------------------- property


STATES = [USED, CLEANING, OFFERED, CLEAN]
PHASES = ["Released", "Bound", "Available", None]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_within_one_boot_no_cleanup_ever_runs_on_a_volume_its_record_did_not_see(data: st.DataObject) -> None:
    """Any number of tmpfs volumes, each with a record in any state and a PV in any phase (or
    none), shuffled across the paths (some unmounted): every cleanup the plan starts is on a
    path showing the numbers recorded for it, and nothing that a dirty record names is offered."""
    n = data.draw(st.integers(2, 5))
    names = [f"v{i}" for i in range(n)]
    states = data.draw(st.lists(st.sampled_from(STATES), min_size=n, max_size=n))
    phases = data.draw(st.lists(st.sampled_from(PHASES), min_size=n, max_size=n))
    order = data.draw(st.permutations(range(n)))
    mounted = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    journal = {f"/mnt/disks/{name}": rec(state, name, 100 + i, pv_uid=f"uid-{i}",
                                         claim=f"claim-of-uid-{i}" if state != OFFERED else "")
               for i, (name, state) in enumerate(zip(names, states, strict=True))}
    pvs = [make_pv(name, phase=phase, uid=f"uid-{i}") for i, (name, phase) in enumerate(zip(names, phases, strict=True))
           if phase is not None]
    scan = [tmpfs(names[i], 100 + order[i]) if mounted[i] else
            Entry(names[i], f"/discovery/disks/{names[i]}", EntryKind.DIRECTORY, reason="not a mount point")
            for i in range(n)]
    w = world(scan, journal, pvs)
    result = plan(w)
    shows = {f"/mnt/disks/{names[i]}": f"fs:{100 + order[i]}:1" for i in range(n) if mounted[i]}
    after = journal_after(w, result)
    for cleanup in result.cleanups:
        record = after[cleanup.host_path]
        assert record.ident == shows.get(cleanup.host_path), (cleanup.host_path, record)
        assert cleanup.host_path not in result.held
    dirty_numbers = {r.ident for r in w.journal.values() if r.state in (USED, CLEANING)}
    for create in result.creates:
        assert shows[create.host_path] not in dirty_numbers, create.host_path
    for path, record in after.items():
        if record.state in (JournalState.USED, JournalState.CLEANING) and w.journal.get(path) is not None \
                and w.journal[path].state in (USED, CLEANING):
            assert record.ident, f"{path}: a dirty record forgot its volume"

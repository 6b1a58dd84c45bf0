"""The cleanup journal: durable, atomic, and refusing to guess when it cannot be read."""

from __future__ import annotations

import json
import os
import stat
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localpv.agent import journal as journal_mod
from localpv.agent.journal import CLEAN, CLEANING, OFFERED, STATES, USED, Journal, JournalEntry, JournalError


def entry(state: str = OFFERED, pv: str = "local-pv-1", cls: str = "sc1", since: float = 100.0) -> JournalEntry:
    return JournalEntry(pv, cls, state, since)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.json"


def read_doc(path: Path) -> dict[str, object]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


# --------------------------------------------------------------------------- entries


def test_with_state_changes_state_and_since_only() -> None:
    e = entry(OFFERED, since=1.0)
    changed = e.with_state(USED, 2.0)
    assert changed == JournalEntry("local-pv-1", "sc1", USED, 2.0, e.claim)
    assert e.state == OFFERED  # immutable


def test_states_are_the_four_documented_ones() -> None:
    assert STATES == ("offered", "used", "cleaning", "clean")


# --------------------------------------------------------------------------- persistence


def test_missing_file_is_an_empty_journal_and_nothing_is_written(path: Path) -> None:
    j = Journal(path)
    assert j.snapshot() == {}
    assert j.get("/mnt/disks/a") is None
    assert not path.exists()
    assert j.writes == 0


def test_round_trip_through_a_new_instance(path: Path) -> None:
    j = Journal(path)
    changes = {
        "/mnt/disks/a": entry(OFFERED, "local-pv-a", since=1.5),
        "/mnt/disks/b": entry(USED, "local-pv-b", "sc2", since=2.25),
        "/mnt/disks/c": entry(CLEANING, "local-pv-c", since=3.0),
        "/mnt/disks/d": entry(CLEAN, "local-pv-d", since=1e9 + 0.125),
    }
    j.apply(changes)
    assert j.snapshot() == changes
    again = Journal(path)
    assert again.snapshot() == changes
    assert dict(iter(again)) == changes
    assert again.get("/mnt/disks/b") == changes["/mnt/disks/b"]


def test_file_format_is_versioned_json_sorted_by_path(path: Path) -> None:
    j = Journal(path)
    j.apply({"/z": entry(USED, "pv-z"), "/a": entry(OFFERED, "pv-a")})
    doc = read_doc(path)
    assert doc["version"] == journal_mod.FORMAT_VERSION
    volumes = doc["volumes"]
    assert isinstance(volumes, dict)
    assert list(volumes) == ["/a", "/z"]
    assert volumes["/z"] == {"pv": "pv-z", "cls": "sc1", "state": "used", "since": 100.0, "claim": "",
                             "pv_uid": "", "ident": "", "claim_name": "", "identity": "", "boot": ""}
    assert doc["recovering"] is True  # it did not exist when this agent started


def test_claim_uid_round_trips(path: Path) -> None:
    e = JournalEntry("pv-a", "sc1", USED, 5.0, claim="3f2a-claim-uid")
    Journal(path).apply({"/a": e})
    assert Journal(path).get("/a") == e
    # with_state keeps the claim: the cleaned data belonged to that claim.
    assert e.with_state(CLEAN, 6.0).claim == "3f2a-claim-uid"


def test_journal_written_before_claims_were_recorded_still_reads(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(
        {"version": 1, "volumes": {"/a": {"pv": "p", "cls": "c", "state": "clean", "since": 1.5}}}), encoding="utf-8")
    assert Journal(path).get("/a") == JournalEntry("p", "c", CLEAN, 1.5, "")


def test_file_is_private(path: Path) -> None:
    Journal(path).apply({"/a": entry()})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_removal_with_none(path: Path) -> None:
    j = Journal(path)
    j.apply({"/a": entry(), "/b": entry(USED)})
    j.apply({"/a": None})
    assert j.snapshot() == {"/b": entry(USED)}
    assert Journal(path).snapshot() == {"/b": entry(USED)}


def test_removing_an_absent_entry_does_not_write(path: Path) -> None:
    j = Journal(path)
    j.apply({"/a": entry()})
    writes = j.writes
    j.apply({"/nope": None})
    assert j.writes == writes


def test_apply_with_no_effective_change_does_not_write(path: Path) -> None:
    j = Journal(path)
    j.apply({})
    assert j.writes == 0
    assert not path.exists()
    j.apply({"/a": entry(OFFERED)})
    assert j.writes == 1
    mtime = path.stat().st_mtime_ns
    j.apply({"/a": entry(OFFERED)})  # equal value
    j.apply({})
    assert j.writes == 1
    assert path.stat().st_mtime_ns == mtime
    j.apply({"/a": entry(USED)})
    assert j.writes == 2


def test_several_changes_are_one_write(path: Path) -> None:
    j = Journal(path)
    j.apply({f"/v{i}": entry(since=float(i)) for i in range(20)})
    assert j.writes == 1
    assert len(Journal(path).snapshot()) == 20


def test_in_memory_journal_counts_writes_but_touches_no_file(tmp_path: Path) -> None:
    j = Journal(None)
    j.apply({"/a": entry()})
    j.apply({"/a": entry()})
    assert j.writes == 1
    assert j.snapshot() == {"/a": entry()}
    assert list(tmp_path.iterdir()) == []


def test_snapshot_is_a_copy(path: Path) -> None:
    j = Journal(path)
    j.apply({"/a": entry()})
    snap = j.snapshot()
    snap["/b"] = entry()
    assert j.get("/b") is None


def test_creates_the_state_directory(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "journal.json"
    Journal(path).apply({"/a": entry()})
    assert path.is_file()


# --------------------------------------------------------------------------- atomicity


def test_file_is_valid_json_after_every_apply(path: Path) -> None:
    j = Journal(path)
    expected: dict[str, JournalEntry] = {}
    for i in range(30):
        key = f"/mnt/disks/v{i % 7}"
        new = None if i % 5 == 4 else entry(STATES[i % 4], f"pv-{i}", since=float(i))
        j.apply({key: new})
        if new is None:
            expected.pop(key, None)
        else:
            expected[key] = new
        read_doc(path)  # parses
        assert Journal(path).snapshot() == expected
        assert not path.with_name(path.name + ".tmp").exists()


def test_leftover_tmp_file_from_a_crashed_write_is_ignored(path: Path) -> None:
    Journal(path).apply({"/a": entry(USED)})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text('{"version": 1, "volumes": {"/a": {"pv": "x", "cls"', encoding="utf-8")  # torn
    j = Journal(path)
    assert j.snapshot() == {"/a": entry(USED)}
    j.apply({"/b": entry()})
    assert not tmp.exists()
    assert Journal(path).snapshot() == {"/a": entry(USED), "/b": entry()}


def test_leftover_tmp_file_without_a_journal_is_not_read(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.with_name(path.name + ".tmp").write_text(
        json.dumps({"version": 1, "volumes": {"/a": {"pv": "p", "cls": "c", "state": "used", "since": 1}}}),
        encoding="utf-8")
    assert Journal(path).snapshot() == {}


def test_crash_before_rename_keeps_old_file_and_old_memory(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    j = Journal(path)
    j.apply({"/a": entry(USED)})

    def crash(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_mod.os, "replace", crash)
    with pytest.raises(OSError):
        j.apply({"/a": entry(CLEAN)})
    # Neither the file nor the in-memory copy claims a change that is not on disk.
    assert j.get("/a") == entry(USED)
    assert Journal(path).snapshot() == {"/a": entry(USED)}
    monkeypatch.undo()
    j.apply({"/a": entry(CLEAN)})
    assert Journal(path).get("/a") == entry(CLEAN)


def test_write_fsyncs_file_and_directory(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(journal_mod.os, "fsync", fsync)
    Journal(path).apply({"/a": entry()})
    assert len(synced) == 2  # the temp file before the rename, the directory after


def test_concurrent_applies_lose_nothing(path: Path) -> None:
    j = Journal(path)
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        barrier.wait(timeout=10)
        for i in range(10):
            j.apply({f"/w{n}/v{i}": entry(since=float(i))})

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
    assert len(Journal(path).snapshot()) == 80


# --------------------------------------------------------------------------- refusing to guess


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{",
        "not json",
        "[]",
        '{"version": 1}',
        '{"version": 1, "volumes": []}',
        '{"version": 1, "volumes": {"/a": {"pv": "p", "cls": "c", "state": "used"}}}',
        '{"version": 1, "volumes": {"/a": {"pv": "p", "cls": "c", "state": "used", "since": "soon"}}}',
        '{"version": 1, "volumes": {"/a": "used"}}',
    ],
)
def test_corrupt_file_raises_journal_error_naming_the_path(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8")
    with pytest.raises(JournalError) as info:
        Journal(path)
    assert str(path) in str(info.value)


def test_unknown_state_raises_journal_error(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(
        {"version": 1, "volumes": {"/a": {"pv": "p", "cls": "c", "state": "dirty", "since": 1}}}), encoding="utf-8")
    with pytest.raises(JournalError) as info:
        Journal(path)
    assert str(path) in str(info.value)
    assert "dirty" in str(info.value)
    assert "/a" in str(info.value)


@pytest.mark.parametrize("version", [0, 3, "1", None])
def test_unsupported_version_raises_journal_error(path: Path, version: object) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": version, "volumes": {}}), encoding="utf-8")
    with pytest.raises(JournalError) as info:
        Journal(path)
    assert str(path) in str(info.value)


def test_unreadable_path_raises_journal_error(path: Path) -> None:
    path.mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(JournalError) as info:
        Journal(path)
    assert str(path) in str(info.value)


def test_non_utf8_file_raises_journal_error(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"version": 1, "volumes": {"\xff": 1}}')
    with pytest.raises(JournalError):
        Journal(path)


# --------------------------------------------------------------------------- property


_paths = st.sampled_from([f"/mnt/disks/v{i}" for i in range(5)])
_entries = st.builds(
    JournalEntry,
    pv=st.text(min_size=1, max_size=12),
    cls=st.text(max_size=8),
    state=st.sampled_from(STATES),
    since=st.floats(min_value=0, max_value=1e12, allow_nan=False),
    claim=st.text(max_size=8),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.dictionaries(_paths, st.none() | _entries, max_size=4), max_size=6))
def test_reload_equals_memory_after_any_sequence(tmp_path_factory: pytest.TempPathFactory,
                                                 batches: list[dict[str, JournalEntry | None]]) -> None:
    path = tmp_path_factory.mktemp("journal") / "journal.json"
    j = Journal(path)
    model: dict[str, JournalEntry] = {}
    for batch in batches:
        before = dict(model)
        for key, value in batch.items():
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        writes = j.writes
        j.apply(batch)
        assert j.writes == writes + (model != before)
        assert j.snapshot() == model
    if path.exists():
        assert Journal(path).snapshot() == model
    else:
        assert model == {}


# --------------------------------------------------------------------------- identity and recovery


def test_pv_uid_and_identity_round_trip(path: Path) -> None:
    e = JournalEntry("pv-a", "sc1", USED, 5.0, claim="c", pv_uid="pv-uid-1", ident="fs:2049:131")
    Journal(path).apply({"/a": e})
    assert Journal(path).get("/a") == e


def test_a_missing_journal_is_recovering_until_told_otherwise_even_across_restarts(path: Path) -> None:
    j = Journal(path)
    assert j.recovering, "a missing journal may be a lost one: nothing proves volumes without records clean"
    j.apply({"/a": entry(CLEANING, "pv-a")})
    assert Journal(path).recovering, "a restart before the first complete pass is still recovering"
    j.end_recovery()
    assert not j.recovering and not Journal(path).recovering
    assert Journal(path).snapshot() == {"/a": entry(CLEANING, "pv-a")}


def test_initialise_writes_a_journal_with_nothing_to_recover(path: Path) -> None:
    Journal.initialise(path)
    assert not Journal(path).recovering and Journal(path).snapshot() == {}


def test_in_memory_journal_is_not_recovering() -> None:
    assert not Journal(None).recovering


def test_version_1_journal_is_read_without_uids_and_not_recovering(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(
        {"version": 1, "volumes": {"/a": {"pv": "p", "cls": "c", "state": "used", "since": 1.5, "claim": "x"}}}),
        encoding="utf-8")
    j = Journal(path)
    assert j.get("/a") == JournalEntry("p", "c", USED, 1.5, "x", pv_uid="", ident="")
    assert not j.recovering


def test_corrupt_journal_advice_is_safe(path: Path) -> None:
    """The message used to say "inspect or remove it", and removing it silently re-offered
    dirty volumes. Now a missing journal is safe (it cleans), and the advice says so. It
    also used to suggest restoring a backup: an older journal can say ``clean`` for a volume
    used since, which would then be offered dirty; the advice now warns against that."""
    path.parent.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(JournalError) as info:
        Journal(path)
    message = str(info.value)
    assert "move it aside (always safe)" in message and "cleans every volume that has no PV" in message
    assert "restore it from a backup" not in message and "Do not put back an older copy" in message


def test_stable_identity_round_trips_and_older_files_read_without_one(path: Path) -> None:
    e = JournalEntry("pv-a", "sc1", USED, 5.0, ident="fs:2049:2", identity="fs:uuid=0b7e")
    Journal(path).apply({"/a": e, journal_mod.detached_key("fs:uuid=77aa"): replace(e, identity="fs:uuid=77aa")})
    again = Journal(path)
    assert again.get("/a") == e
    assert again.get("detached:fs:uuid=77aa") is not None and journal_mod.is_detached("detached:fs:uuid=77aa")
    # Additive, so that the previous release reads the file: same version, same keys, one more.
    doc = read_doc(path)
    assert doc["version"] == 2
    raw = doc["volumes"]["/a"]
    assert {k: raw[k] for k in ("pv", "cls", "state", "since", "claim", "pv_uid", "ident")} == {
        "pv": "pv-a", "cls": "sc1", "state": "used", "since": 5.0, "claim": "", "pv_uid": "", "ident": "fs:2049:2"}
    del raw["identity"]
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert Journal(path).get("/a") == replace(e, identity="")

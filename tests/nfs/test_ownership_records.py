"""Ownership records on a real directory, and the provisioner's decisions from them, without a cluster:
records are strict (a doubtful one proves nothing), live outside tenant directories, follow no links."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from localpv.nfs.export import Export
from localpv.nfs.ownership import (
    RECORD_FILE,
    Claimant,
    ClaimIdentity,
    CorruptRecord,
    OwnerRecord,
    OwnershipStore,
    RecordError,
    decode,
    encode,
    placement,
    record_location,
)
from localpv.nfs.provisioner import NfsProvisioner, NfsSource, ProvisionFailed, ProvisionRequest
from tests.nfs.conftest import NFS_PATH, SERVER, Layout

Obj = dict[str, Any]

TEAM_A = ClaimIdentity("team-a", "db")
TEAM_B = ClaimIdentity("team-b", "db")
#: The cluster the provisioner under test runs in, and another on the same export.
HERE = "cluster-here"
THERE = "cluster-there"


@pytest.fixture
def store(layout: Layout) -> OwnershipStore:
    return OwnershipStore(Export(str(layout.export)))


def record_file(layout: Layout, path: str) -> Path:
    return layout.export.joinpath(*record_location(path.split("/")), RECORD_FILE)


def all_records(layout: Layout) -> list[str]:
    return sorted(str(p.relative_to(layout.export)) for p in (layout.export / ".localpv").rglob(RECORD_FILE))


# ---------------------------------------------------------------- identities and rules


def test_identity_is_namespace_and_name_not_uid() -> None:
    old = {"metadata": {"namespace": "team-a", "name": "db", "uid": "1"}}
    new = {"metadata": {"namespace": "team-a", "name": "db", "uid": "2"}}
    assert ClaimIdentity.of_claim(old) == ClaimIdentity.of_claim(new) == TEAM_A
    assert str(TEAM_A) == "team-a/db"


@pytest.mark.parametrize("ref", [None, {}, {"namespace": "team-a"}, {"namespace": "", "name": "db"},
                                 {"namespace": 1, "name": "db"}])
def test_a_volume_without_a_complete_claim_ref_names_no_one(ref: Obj | None) -> None:
    assert ClaimIdentity.of_volume({"spec": {"claimRef": ref}}) is None


@pytest.mark.parametrize(
    ("recorded_by", "other_clusters", "expected"),
    [(HERE, False, True), (THERE, False, False), (None, False, False), (THERE, True, True), (None, True, True)],
)
def test_another_clusters_directory_is_used_only_by_a_class_that_opts_in(
        recorded_by: str | None, other_clusters: bool, expected: bool) -> None:
    """A record without a cluster (version 1) is another cluster's here, until the provisioner
    attributes it; the opt-in does not lift the claim identity rule."""
    record = OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=recorded_by)
    assert Claimant(TEAM_A, HERE, "nfs", False, other_clusters).may_use(record) is expected
    assert not Claimant(TEAM_B, HERE, "nfs", False, other_clusters).may_use(record)


def test_sharing_needs_both_the_directory_and_the_claimant_to_opt_in() -> None:
    private = OwnerRecord("d", TEAM_A, "private", shared=False, cluster=HERE)
    shared = OwnerRecord("d", TEAM_A, "shared", shared=True, cluster=HERE)
    assert Claimant(TEAM_A, HERE, "private", shares=False).may_use(private)
    assert not Claimant(TEAM_B, HERE, "shared", shares=True).may_use(private)
    assert not Claimant(TEAM_B, HERE, "private", shares=False).may_use(shared)
    assert Claimant(TEAM_B, HERE, "shared", shares=True).may_use(shared)


@pytest.mark.parametrize(
    ("path", "other", "expected"),
    [("a", "a", "is"), ("a/b", "a", "is inside"), ("a", "a/b", "contains"), ("a", "ab", None), ("ab", "a", None),
     ("a/b", "a/c", None)],
)
def test_placement_compares_whole_segments(path: str, other: str, expected: str | None) -> None:
    assert placement(path, other) == expected


# ---------------------------------------------------------------- the format


def test_a_record_round_trips() -> None:
    record = OwnerRecord("ns/é data", TEAM_A, "nfs", shared=True, cluster=HERE)
    assert decode(encode(record), "x") == record
    assert json.loads(encode(record))["version"] == 2


def test_a_version_1_record_reads_as_it_is_without_a_cluster() -> None:
    """What the previous release wrote: still read, the cluster unknown (never guessed)."""
    old = {"version": 1, "path": "d", "namespace": "team-a", "name": "db", "storageClass": "nfs", "shared": False}
    assert decode(json.dumps(old).encode(), "x") == OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=None)


def test_every_record_written_names_its_cluster() -> None:
    with pytest.raises(ValueError, match="names no cluster"):
        encode(OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=None))


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        json.dumps({"version": 2, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": False}).encode(),
        json.dumps({"version": 1, "path": "d", "namespace": "a", "name": "b", "storageClass": "c"}).encode(),
        json.dumps({"version": 1, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": "true"}).encode(),
        json.dumps({"version": 1, "path": "d", "namespace": "", "name": "b", "storageClass": "c",
                    "shared": False}).encode(),
        json.dumps({"version": 1, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": False, "extra": 1}).encode(),
        json.dumps({"version": 1, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": False, "cluster": "x"}).encode(),
        json.dumps({"version": 2, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": False, "cluster": ""}).encode(),
        json.dumps({"version": 2, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": False, "cluster": 7}).encode(),
        json.dumps({"version": 2, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": False, "cluster": "x", "extra": 1}).encode(),
        json.dumps({"version": 3, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": False, "cluster": "x"}).encode(),
        json.dumps({"version": True, "path": "d", "namespace": "a", "name": "b", "storageClass": "c",
                    "shared": False}).encode(),
    ],
)
def test_anything_but_a_well_formed_record_is_corrupt_never_guessed(body: bytes) -> None:
    with pytest.raises(CorruptRecord):
        decode(body, "x")


# ---------------------------------------------------------------- the store


def test_records_live_in_the_reserved_directory_one_per_path(layout: Layout, store: OwnershipStore) -> None:
    store.write(OwnerRecord("a", TEAM_A, "nfs", shared=False, cluster=HERE))
    store.write(OwnerRecord("a/b/c", TEAM_B, "nfs", shared=False, cluster=HERE))
    assert sorted(os.listdir(layout.export)) == [".localpv"]
    assert store.read(["a"]) == OwnerRecord("a", TEAM_A, "nfs", shared=False, cluster=HERE)
    assert store.read(["a", "b"]) is None
    assert [r.path for r in store.lineage(["a", "b", "c", "d"])] == ["a", "a/b/c"]
    assert [r.path for r in store.below(["a"])] == ["a/b/c"]
    assert store.below(["a", "b", "c"]) == []
    assert [r.path for r in store.around(["a", "b"])] == ["a", "a/b/c"]
    assert all_records(layout) == sorted(str(record_file(layout, p).relative_to(layout.export)) for p in ("a", "a/b/c"))
    store.forget(["a"])
    assert store.read(["a"]) is None and store.read(["a", "b", "c"]) is not None
    store.forget(["a", "b", "c"])
    assert all_records(layout) == [] and os.listdir(layout.export / ".localpv" / "owners") == []


def test_a_record_copied_to_another_directorys_key_is_corrupt(layout: Layout, store: OwnershipStore) -> None:
    store.write(OwnerRecord("mine", TEAM_B, "nfs", shared=False, cluster=HERE))
    theirs = record_file(layout, "x/theirs")
    theirs.parent.mkdir(parents=True)
    os.rename(record_file(layout, "mine"), theirs)
    with pytest.raises(CorruptRecord, match="names 'mine'"):
        store.read(["x", "theirs"])
    with pytest.raises(CorruptRecord, match="not its place"):
        store.below(["x"])


@pytest.mark.parametrize("plant", ["reserved-link", "owners-link", "record-link"])
def test_links_planted_among_the_records_are_refused(layout: Layout, store: OwnershipStore, plant: str) -> None:
    decoy = layout.outside / "decoy"
    decoy.mkdir()
    forged = encode(OwnerRecord("d", TEAM_B, "nfs", shared=False, cluster=HERE))
    location = record_location(["d"])
    decoy.joinpath(*location[1:]).mkdir(parents=True)
    decoy.joinpath(*location[1:], RECORD_FILE).write_bytes(forged)
    if plant == "reserved-link":
        os.symlink(decoy, layout.export / ".localpv")
    elif plant == "owners-link":
        (layout.export / ".localpv").mkdir()
        os.symlink(decoy / "owners", layout.export / ".localpv" / "owners")
    else:
        record_file(layout, "d").parent.mkdir(parents=True)
        os.symlink(decoy.joinpath(*location[1:], RECORD_FILE), record_file(layout, "d"))
    before = layout.outside_snapshot()
    with pytest.raises(RecordError, match="symbolic link"):
        store.read(["d"])
    mine = OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=HERE)
    if plant == "record-link":  # rename(2) replaces the link itself, never what it points at
        store.write(mine)
        assert store.read(["d"]) == mine and not record_file(layout, "d").is_symlink()
    else:
        with pytest.raises(RecordError, match="symbolic link"):
            store.write(mine)
    assert layout.outside_snapshot() == before


# ---------------------------------------------------------------- the provisioner's decisions


class View:
    """A fixed cluster: one class, some PVs."""

    def __init__(self, volumes: Iterable[Obj] = (), on_delete: str = "delete") -> None:
        self.pvs = list(volumes)
        self.on_delete = on_delete

    def storage_class(self, name: str) -> Obj | None:
        return {"metadata": {"name": name}, "parameters": {"onDelete": self.on_delete}}

    def volumes(self) -> list[Obj]:
        return self.pvs

    def on_volume_change(self, handler: Callable[[str, Obj | None, Obj | None], None]) -> None:
        """The volumes here do not change after the provisioner is made."""


def provisioner(layout: Layout, view: View | None = None) -> NfsProvisioner:
    return NfsProvisioner(NfsSource(SERVER, NFS_PATH, str(layout.export)), Export(str(layout.export)),
                          view or View(), cluster=HERE)


def request(identity: ClaimIdentity, directory: str, pv_name: str = "pvc-new", **parameters: str) -> ProvisionRequest:
    claim = {"metadata": {"namespace": identity.namespace, "name": identity.name, "annotations": {"x": directory}},
             "spec": {"accessModes": ["ReadWriteMany"]}}
    sc = {"metadata": {"name": "nfs"}, "parameters": {"pathPattern": "${.PVC.annotations.x}", **parameters}}
    return ProvisionRequest(claim, sc, pv_name)


def volume(directory: str, name: str = "pvc-old", claim: ClaimIdentity | None = TEAM_A) -> Obj:
    ref = {"namespace": claim.namespace, "name": claim.name} if claim else None
    return {"metadata": {"name": name},
            "spec": {"nfs": {"server": SERVER, "path": f"{NFS_PATH}/{directory}"}, "storageClassName": "nfs",
                     "claimRef": ref}}


def test_a_corrupt_record_refuses_the_directory_to_everyone(layout: Layout) -> None:
    p = provisioner(layout)
    p.provision(request(TEAM_A, "d"))
    record_file(layout, "d").write_bytes(b"{garbage")
    with pytest.raises(ProvisionFailed, match="not JSON") as exc:
        p.provision(request(TEAM_A, "d"))
    assert exc.value.final
    notes = p.delete(volume("d"))
    assert [n.reason for n in notes] == ["DirectoryRetained"] and (layout.export / "d").is_dir()


def test_an_unusable_records_directory_fails_provisioning_without_touching_the_path(layout: Layout) -> None:
    (layout.export / ".localpv").write_text("a file where the records directory belongs")
    with pytest.raises(ProvisionFailed, match="ownership records") as exc:
        provisioner(layout).provision(request(TEAM_A, "d"))
    assert not exc.value.final
    assert not (layout.export / "d").exists()


def test_a_static_pv_of_a_parent_directory_blocks_a_claim_inside_it(layout: Layout) -> None:
    p = provisioner(layout, View([volume("backups", "static-backups", claim=None)]))
    with pytest.raises(ProvisionFailed, match="is inside 'backups', the directory of PV static-backups"):
        p.provision(request(TEAM_A, "backups/db"))
    assert not (layout.export / "backups").exists()


def test_a_pv_of_the_whole_export_blocks_nothing(layout: Layout) -> None:
    whole = volume("x", "whole", claim=None)
    whole["spec"]["nfs"]["path"] = NFS_PATH
    provisioner(layout, View([whole])).provision(request(TEAM_A, "d"))
    assert (layout.export / "d").is_dir()


@pytest.mark.parametrize(("basename", "retained"), [("team-a-db-pvc-old", False), ("team-a-db-pvc-other", True),
                                                     ("pvc-old", True)])
def test_an_unrecorded_directory_is_released_only_under_upstreams_default_name_for_this_pv(
        layout: Layout, basename: str, retained: bool) -> None:
    """``<namespace>-<claim>-<pv>`` ends with the PV's name, ``pvc-<claim uid>``: made for this PV
    before records existed, as nobody could know the uid beforehand."""
    (layout.export / basename).mkdir()
    notes = provisioner(layout).delete(volume(basename, "pvc-old"))
    assert (layout.export / basename).exists() is retained
    assert [n.reason for n in notes] == (["DirectoryRetained"] if retained else [])


def test_a_directory_that_appears_between_the_check_and_mkdir_is_not_handed_over(
        layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    p = provisioner(layout)
    real_exists = p.export.exists

    def racing_exists(parts: Any) -> bool:
        found = real_exists(parts)
        (layout.export / "d").mkdir(exist_ok=True)  # someone else makes it right after the check
        return found

    monkeypatch.setattr(p.export, "exists", racing_exists)
    with pytest.raises(ProvisionFailed, match="appeared") as exc:
        p.provision(request(TEAM_A, "d"))
    assert not exc.value.final
    assert p.owners.read(["d"]) is None  # the record written for a new directory is taken back


def test_concurrent_claims_for_one_directory_give_it_to_one_and_record_that_one(
        layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller runs several workers: checking, recording and making must be one step,
    or the slower worker's take-back erases the winner's record (or the loser's record stays)."""
    p = provisioner(layout)
    real_make = p.export.make_directory
    first_may_go = threading.Event()

    def slow_for_the_first(parts: Any, mode: int) -> bool:
        if threading.current_thread().name == "first":
            first_may_go.wait(2.0)
        return real_make(parts, mode)

    monkeypatch.setattr(p.export, "make_directory", slow_for_the_first)
    outcome: dict[str, str] = {}

    def attempt(identity: ClaimIdentity) -> None:
        try:
            p.provision(request(identity, "d"))
            outcome[threading.current_thread().name] = "bound"
        except ProvisionFailed as err:
            outcome[threading.current_thread().name] = str(err)

    first = threading.Thread(target=attempt, args=(TEAM_A,), name="first")
    second = threading.Thread(target=attempt, args=(TEAM_B,), name="second")
    first.start()
    threading.Event().wait(0.1)  # the first is inside, waiting to mkdir
    second.start()
    second.join(0.5)
    first_may_go.set()
    first.join()
    second.join()

    winners = [name for name, result in outcome.items() if result == "bound"]
    assert winners == ["first"], outcome
    assert "team-a/db" in outcome["second"]
    assert p.owners.read(["d"]) == OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=HERE)


def test_releasing_never_forgets_the_record_of_a_directory_made_again_meanwhile(layout: Layout) -> None:
    p = provisioner(layout)
    p.provision(request(TEAM_A, "d"))
    real_remove = p.export.remove

    def remove_then_someone_claims_it_again(parts: Any) -> bool:
        removed = real_remove(parts)
        p.provision(request(TEAM_B, "d"))  # a fresh empty directory is anyone's
        return removed

    p.export.remove = remove_then_someone_claims_it_again  # type: ignore[method-assign]
    p.delete(volume("d", claim=TEAM_A))
    assert p.owners.read(["d"]) == OwnerRecord("d", TEAM_B, "nfs", shared=False, cluster=HERE)


# ---------------------------------------------------------------- records of other clusters, and from before clusters


def version_1(layout: Layout, path: str, identity: ClaimIdentity = TEAM_A) -> None:
    """A directory with its record as the previous release wrote it (no cluster)."""
    (layout.export / path).mkdir(parents=True, exist_ok=True)
    record_file(layout, path).parent.mkdir(parents=True, exist_ok=True)
    record_file(layout, path).write_text(json.dumps({
        "version": 1, "path": path, "namespace": identity.namespace, "name": identity.name, "storageClass": "nfs",
        "shared": False}))


def test_a_version_1_record_nothing_here_vouches_for_is_refused_even_to_the_claim_it_names(layout: Layout) -> None:
    """It may be another cluster's ``team-a/db``: the records before this release cannot say."""
    version_1(layout, "d")
    with pytest.raises(ProvisionFailed, match="recorded before records named their cluster") as exc:
        provisioner(layout).provision(request(TEAM_A, "d"))
    assert exc.value.final and "allowOtherClusters" in str(exc.value)
    assert decode(record_file(layout, "d").read_bytes(), "x").cluster is None


def test_a_version_1_record_goes_to_a_class_that_allows_other_clusters_and_stays_unattributed(
        layout: Layout) -> None:
    version_1(layout, "d")
    provisioned = provisioner(layout).provision(request(TEAM_A, "d", allowOtherClusters="true"))
    assert [n.reason for n in provisioned.notes] == ["DirectoryOfOtherCluster", "DirectoryReused"]
    assert decode(record_file(layout, "d").read_bytes(), "x").cluster is None


def test_a_version_1_record_a_pv_here_vouches_for_becomes_this_clusters(layout: Layout) -> None:
    """A Retained PV of this cluster names the directory and the claim: the claim gets it, and the
    record says this cluster from now on."""
    version_1(layout, "d")
    p = provisioner(layout, View([volume("d", "pvc-retained", claim=TEAM_A)]))
    with pytest.raises(ProvisionFailed, match="team-a/db"):
        p.provision(request(TEAM_B, "d"))
    p.provision(request(TEAM_A, "d"))
    assert p.owners.read(["d"]) == OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=HERE)


@pytest.mark.parametrize(("claim", "kept"), [(TEAM_A, False), (TEAM_B, True)])
def test_a_version_1_record_is_released_by_the_pv_that_names_its_claim(layout: Layout, claim: ClaimIdentity,
                                                                       kept: bool) -> None:
    """Volumes provisioned before the upgrade are deleted as before, by the claim the record names."""
    version_1(layout, "d")
    notes = provisioner(layout).delete(volume("d", claim=claim))
    assert (layout.export / "d").exists() is kept
    assert [n.reason for n in notes] == (["DirectoryRetained"] if kept else [])


def test_retaining_a_version_1_directory_records_this_cluster_while_its_pv_vouches(layout: Layout) -> None:
    version_1(layout, "d")
    p = provisioner(layout, View(on_delete="retain"))
    assert p.delete(volume("d", claim=TEAM_A)) == []
    assert p.owners.read(["d"]) == OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=HERE)
    p.view = View()  # the PV is gone: the re-created claim gets its directory from the record alone
    p.provision(request(TEAM_A, "d"))


@pytest.mark.parametrize("on_delete", ["delete", "archive"])
def test_another_clusters_directory_is_never_disposed_of_here(layout: Layout, on_delete: str) -> None:
    (layout.export / "d").mkdir()
    OwnershipStore(Export(str(layout.export))).write(OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=THERE))
    p = provisioner(layout, View(on_delete=on_delete))
    notes = p.delete(volume("d", claim=TEAM_A))
    assert [n.reason for n in notes] == ["DirectoryRetained"] and THERE in notes[0].message
    assert sorted(os.listdir(layout.export)) == [".localpv", "d"]  # neither removed nor archived
    assert p.owners.read(["d"]) == OwnerRecord("d", TEAM_A, "nfs", shared=False, cluster=THERE)

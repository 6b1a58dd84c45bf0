"""The agent's pure planner: discovery, usage tracking, deletion, orphans, journal transitions.

Every rule of ``localpv.agent.reconcile`` is exercised with plain data. The product's
promise is "never expose dirty data": a volume that may hold a tenant's data is never
offered again before a cleanup of it succeeded, and a volume in use is never wiped.
The property tests at the end check exactly that over random worlds and over random
multi-pass histories with lagging caches, restarts and admins deleting PVs.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, STATES, USED, JournalEntry
from localpv.agent.model import (
    FAILED,
    RUNNING,
    SUCCEEDED,
    CleanupStatus,
    ConfirmOrphan,
    CreatePV,
    Plan,
    StartCleanup,
    World,
)
from localpv.agent.planner import plan
from localpv.agent.pvbuilder import NodeInfo, StorageClassInfo, VolumeSpec, build_pv
from localpv.config import ProvisionerConfig, parse_config
from localpv.host.scan import Entry, EntryKind
from localpv.kube.events import NORMAL, WARNING
from localpv.kube.objects import pv_claim_uid, pv_host_path, pv_is_claimed, pv_phase
from localpv.naming import HOSTNAME_LABEL_KEY, GiB, MiB, provisioner_name, pv_name, round_capacity

Obj = dict[str, Any]

NODE = NodeInfo("test-node", "node-uid", {HOSTNAME_LABEL_KEY: "test-node-host"})
PROVISIONER = provisioner_name(NODE.name, NODE.uid, use_node_name_only=False)
NOW = 10_000.0

#: namespace/name of the claim ``make_pv`` puts in a claimRef.
CLAIM_NAME = "ns/data"
FS = {"hostDir": "/mnt/disks", "mountDir": "/discovery/disks"}
BLK = {"hostDir": "/dev/localblk", "mountDir": "/discovery/blk", "volumeMode": "Block"}


# --------------------------------------------------------------------------- builders


def make_config(classes: Mapping[str, Mapping[str, Any]] | None = None, **top: Any) -> ProvisionerConfig:
    data: dict[str, Any] = {"storageClassMap": {k: dict(v) for k, v in (classes or {"sc1": FS}).items()}}
    data.update(top)
    return parse_config(data).config


def entry(name: str, kind: EntryKind = EntryKind.MOUNTPOINT, *, mount_dir: str = "/discovery/disks",
          capacity: int | None = 10 * GiB, reason: str | None = None) -> Entry:
    path = f"{mount_dir}/{name}"
    if kind in (EntryKind.DIRECTORY, EntryKind.OTHER, EntryKind.BROKEN):
        capacity = None
        if reason is None:
            reason = {
                EntryKind.DIRECTORY: f'path "{path}" is not a valid mount point',
                EntryKind.OTHER: f'path "{path}" is neither a directory nor a block device',
                EntryKind.BROKEN: f'cannot stat "{path}": No such file or directory',
            }[kind]
    return Entry(name, path, kind, capacity, reason)


def mnt(name: str, capacity: int | None = 10 * GiB, mount_dir: str = "/discovery/disks") -> Entry:
    return entry(name, EntryKind.MOUNTPOINT, mount_dir=mount_dir, capacity=capacity)


def blk(name: str, capacity: int | None = 100 * GiB, mount_dir: str = "/discovery/blk") -> Entry:
    return entry(name, EntryKind.BLOCK, mount_dir=mount_dir, capacity=capacity)


def make_world(
    config: ProvisionerConfig | None = None,
    scans: Mapping[str, Sequence[Entry] | str] | None = None,
    *,
    pvs: Iterable[Obj] = (),
    journal: Mapping[str, JournalEntry] | None = None,
    cleanups: Mapping[str, CleanupStatus] | None = None,
    collisions: Mapping[str, str] | None = None,
    storage_classes: Mapping[str, StorageClassInfo | None] | None = None,
    now: float = NOW,
    node: NodeInfo = NODE,
) -> World:
    config = config or make_config()
    if storage_classes is None:
        storage_classes = {name: StorageClassInfo(name) for name in config.classes}
    if scans is None:
        scans = {name: [] for name in config.classes}
    return World(
        config=config, node=node, provisioner=PROVISIONER, storage_classes=storage_classes, scans=scans,
        pvs=list(pvs), journal=dict(journal or {}), cleanups=dict(cleanups or {}),
        collisions=dict(collisions or {}), now=now,
    )


def make_pv(
    name: str,
    cls: str = "sc1",
    *,
    config: ProvisionerConfig | None = None,
    phase: str = "Available",
    policy: str = "Delete",
    uid: str = "uid-1",
    claim: bool | None = None,
    mode: str | None = None,
    capacity: int = 10 * GiB,
    deleting: bool = False,
    host_dir: str | None = None,
) -> Obj:
    """A PV as our agent creates it, as the API returns it (uid, status, maybe a claimRef)."""
    config = config or make_config()
    class_config = config.classes.get(cls) or next(iter(config.classes.values()))
    class_config = replace(class_config, name=cls)
    host = (host_dir or class_config.host_dir).rstrip("/")
    spec = VolumeSpec(pv_name(name, NODE.name, cls), f"{host}/{name}", capacity,
                      mode or class_config.volume_mode, class_config)
    pv = build_pv(spec, NODE, StorageClassInfo(cls, reclaim_policy=policy), config, PROVISIONER)
    pv["metadata"]["uid"] = uid
    pv["metadata"]["resourceVersion"] = "1"
    if deleting:
        pv["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    if claim is None:
        claim = phase in ("Bound", "Released")
    if claim:
        pv["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "data",
                                  "uid": f"claim-of-{uid}"}
    pv["status"] = {"phase": phase}
    return pv


def jentry(state: str, name: str = "vol1", cls: str = "sc1", since: float = 50.0, claim: str = "",
           pv_uid: str = "uid-1", claim_name: str | None = None) -> JournalEntry:
    """A record as the agent keeps it for the PV ``make_pv`` builds (same uid by default; a
    claim uid made by ``make_pv`` comes with the claim name ``make_pv`` puts in its claimRef)."""
    if claim_name is None:
        claim_name = CLAIM_NAME if claim.startswith("claim-of-") else ""
    return JournalEntry(pv_name(name, NODE.name, cls), cls, state, since, claim, pv_uid, claim_name=claim_name)


def status(state: str, *, uid: str | None = "uid-1", started: float = 100.0, retry_at: float | None = None,
           attempts: int = 1, message: str = "") -> CleanupStatus:
    finished = None if state == RUNNING else started + 1
    return CleanupStatus(state, started, uid, finished, retry_at, attempts, message)


def name_of(vol: str, cls: str = "sc1") -> str:
    return pv_name(vol, NODE.name, cls)


def journal_after(world: World, result: Plan) -> dict[str, JournalEntry]:
    after = dict(world.journal)
    for path, value in result.journal.items():
        if value is None:
            after.pop(path, None)
        else:
            after[path] = value
    return after


def on_offer(pv: Obj) -> bool:
    """Any claim may bind it: no claimRef, not Bound or Released, not being deleted."""
    return not pv_is_claimed(pv) and not pv["metadata"].get("deletionTimestamp")


def skipped_for(result: Plan, path: str) -> list[Any]:
    return [s for s in result.skipped if s.path == path]


# --------------------------------------------------------------------------- discovery


def test_mountpoint_in_filesystem_class_becomes_a_pv() -> None:
    config = make_config()
    entry = mnt("vol1", 10 * GiB + 123)
    world = make_world(config, {"sc1": [entry]})
    result = plan(world)
    assert len(result.creates) == 1
    create = result.creates[0]
    expected = build_pv(VolumeSpec(name_of("vol1"), "/mnt/disks/vol1", 10 * GiB + 123, "Filesystem",
                                   config.classes["sc1"]), NODE, StorageClassInfo("sc1"), config, PROVISIONER)
    assert create == CreatePV(expected, "/mnt/disks/vol1", "Filesystem", 10 * GiB + 123, entry)
    assert create.pv["spec"]["local"]["path"] == "/mnt/disks/vol1"  # host path, not /discovery/...
    assert create.pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0][
        "values"] == ["test-node-host"]
    assert result.journal == {"/mnt/disks/vol1": JournalEntry(name_of("vol1"), "sc1", OFFERED, NOW)}
    assert result.capacity == {"Filesystem": 10 * GiB, "Block": 0}
    assert result.ready
    assert result.skipped == [] and result.cleanups == [] and result.deletes == [] and result.events == []


def test_block_device_in_block_class_becomes_a_block_pv() -> None:
    config = make_config({"blk": BLK})
    result = plan(make_world(config, {"blk": [blk("sdb", 100 * GiB + 7)]}))
    assert [c.host_path for c in result.creates] == ["/dev/localblk/sdb"]
    create = result.creates[0]
    assert create.mode == "Block"
    assert create.pv["spec"]["volumeMode"] == "Block"
    assert create.pv["metadata"]["name"] == name_of("sdb", "blk")
    assert result.capacity == {"Filesystem": 0, "Block": 100 * GiB}
    assert result.ready


def test_block_device_in_filesystem_class_becomes_fs_on_block() -> None:
    config = make_config({"sc1": {**FS, "fsType": "ext4"}})
    sc = StorageClassInfo("sc1", mount_options=("noatime",))
    result = plan(make_world(config, {"sc1": [blk("sdc", mount_dir="/discovery/disks")]},
                             storage_classes={"sc1": sc}))
    assert len(result.creates) == 1
    pv = result.creates[0].pv
    assert result.creates[0].mode == "Filesystem"
    assert pv["spec"]["volumeMode"] == "Filesystem"
    assert pv["spec"]["local"] == {"path": "/mnt/disks/sdc", "fsType": "ext4"}
    assert pv["spec"]["mountOptions"] == ["noatime"]
    assert result.capacity == {"Filesystem": 100 * GiB, "Block": 0}


def test_mountpoint_in_block_class_is_skipped_with_error() -> None:
    config = make_config({"blk": BLK})
    e = mnt("fs1", mount_dir="/discovery/blk")
    result = plan(make_world(config, {"blk": [e]}))
    assert result.creates == []
    assert result.journal == {}
    [skip] = result.skipped
    assert (skip.path, skip.cls, skip.error) == (e.path, "blk", True)
    assert "Block" in skip.reason
    assert not result.ready


def test_plain_directory_is_not_a_valid_mount_point() -> None:
    e = entry("notbindmount", EntryKind.DIRECTORY)
    result = plan(make_world(scans={"sc1": [e]}))
    assert result.creates == [] and result.journal == {}
    [skip] = result.skipped
    # Upstream's e2e test greps the log for exactly this wording.
    assert skip.reason == 'path "/discovery/disks/notbindmount" is not a valid mount point'
    assert skip.error
    assert not result.ready
    assert result.errors == 1


def test_plain_directory_reason_when_the_scanner_gave_none() -> None:
    e = Entry("d", "/discovery/disks/d", EntryKind.DIRECTORY)
    [skip] = plan(make_world(scans={"sc1": [e]})).skipped
    assert "is not a valid mount point" in skip.reason


@pytest.mark.parametrize("kind", [EntryKind.OTHER, EntryKind.BROKEN])
def test_regular_file_or_broken_entry_is_an_error(kind: EntryKind) -> None:
    e = entry("x", kind)
    result = plan(make_world(scans={"sc1": [e]}))
    assert result.creates == [] and result.journal == {}
    [skip] = result.skipped
    assert skip.error and skip.reason == e.reason
    assert not result.ready


@pytest.mark.parametrize("kind", [EntryKind.MOUNTPOINT, EntryKind.BLOCK])
def test_unmeasurable_volume_is_an_error(kind: EntryKind) -> None:
    e = Entry("v", "/discovery/disks/v", kind, None, 'cannot measure capacity of "/discovery/disks/v": EIO')
    result = plan(make_world(scans={"sc1": [e]}))
    assert result.creates == [] and result.journal == {}
    [skip] = result.skipped
    assert skip.error and "cannot measure capacity" in skip.reason


def test_name_pattern_filters_entries() -> None:
    config = make_config({"sc1": {**FS, "namePattern": "vol-*,ssd?"}})
    scan = [mnt("vol-1"), mnt("ssd1"), mnt("ssd10"), mnt("other"), entry("junk", EntryKind.OTHER)]
    result = plan(make_world(config, {"sc1": scan}))
    assert sorted(c.host_path for c in result.creates) == ["/mnt/disks/ssd1", "/mnt/disks/vol-1"]
    # Non-matching entries are not even considered: no skip, no error.
    assert result.skipped == []
    assert result.ready


def test_second_pass_with_the_pv_in_the_cache_creates_nothing() -> None:
    config = make_config({"sc1": FS, "blk": BLK})
    scans = {"sc1": [mnt("vol1"), mnt("vol2", 5 * GiB + 3)], "blk": [blk("sdb")]}
    first = plan(make_world(config, scans))
    assert len(first.creates) == 3
    pvs = []
    for i, create in enumerate(first.creates):
        pv = copy.deepcopy(create.pv)
        pv["metadata"]["uid"] = f"uid-{i}"
        pv["status"] = {"phase": "Available"}
        pvs.append(pv)
    recorded = journal_after(make_world(config, scans), first)
    second = plan(make_world(config, scans, pvs=pvs, journal=recorded))
    assert second.creates == []
    # The only news: which PV object each volume is offered as (the executor normally
    # records it from the create's answer; without it, first sight does).
    uids = {pv["spec"]["local"]["path"]: pv["metadata"]["uid"] for pv in pvs}
    assert second.journal == {path: replace(recorded[path], pv_uid=uid) for path, uid in uids.items()}
    assert second.skipped == []
    assert second.orphans == [] and second.cleanups == [] and second.deletes == [] and second.events == []
    assert second.ready
    # The capacity gauge keeps reporting the volumes in steady state (upstream's reads 0).
    assert first.capacity == {"Filesystem": 15 * GiB, "Block": 100 * GiB}
    assert second.capacity == first.capacity


def test_capacity_counts_existing_and_new_volumes_per_mode() -> None:
    config = make_config({"sc1": FS, "blk": BLK})
    existing_fs = make_pv("old", config=config, capacity=20 * GiB)
    existing_blk = make_pv("sdb", "blk", config=config, capacity=50 * GiB)
    scans = {"sc1": [mnt("old", 20 * GiB + 99), mnt("new", 15 * MiB + 5)],
             "blk": [blk("sdb", 50 * GiB + 1), blk("sdc", 7 * GiB + 1)]}
    result = plan(make_world(config, scans, pvs=[existing_fs, existing_blk]))
    assert sorted(c.host_path for c in result.creates) == ["/dev/localblk/sdc", "/mnt/disks/new"]
    assert result.capacity == {
        "Filesystem": 20 * GiB + 15 * MiB,
        "Block": 50 * GiB + round_capacity(7 * GiB + 1),
    }


def test_existing_pv_for_a_vanished_entry_is_not_counted() -> None:
    pv = make_pv("gone", capacity=20 * GiB)
    result = plan(make_world(scans={"sc1": []}, pvs=[pv]))
    assert result.capacity == {"Filesystem": 0, "Block": 0}


def test_two_classes_sharing_a_host_dir_make_exactly_one_pv() -> None:
    config = make_config({"b-class": FS, "a-class": FS})
    scan = [mnt("vol1")]
    result = plan(make_world(config, {"a-class": scan, "b-class": scan}))
    assert len(result.creates) == 1
    create = result.creates[0]
    assert create.pv["spec"]["storageClassName"] == "a-class"  # first in sorted order
    assert create.pv["metadata"]["name"] == name_of("vol1", "a-class")
    [skip] = result.skipped
    assert (skip.cls, skip.error) == ("b-class", False)
    assert "/mnt/disks/vol1" in skip.reason
    assert result.ready

    # Next pass, with a-class's PV in the cache: still one PV, still not an error.
    pv = copy.deepcopy(create.pv)
    pv["metadata"]["uid"] = "u"
    pv["status"] = {"phase": "Available"}
    again = plan(make_world(config, {"a-class": scan, "b-class": scan}, pvs=[pv],
                            journal={"/mnt/disks/vol1": result.journal["/mnt/disks/vol1"]}))
    assert again.creates == []
    [skip] = again.skipped
    assert (skip.cls, skip.error) == ("b-class", False)
    assert again.ready
    assert again.capacity == {"Filesystem": 10 * GiB, "Block": 0}  # counted once


def test_shared_host_dir_where_the_first_class_cannot_use_the_entry() -> None:
    # a-class wants Block; the mount point is an error there, and b-class gets it.
    config = make_config({"a-class": {**FS, "volumeMode": "Block"}, "b-class": FS})
    scan = [mnt("vol1")]
    result = plan(make_world(config, {"a-class": scan, "b-class": scan}))
    assert [c.pv["spec"]["storageClassName"] for c in result.creates] == ["b-class"]


def test_pv_in_cache_with_our_name_but_another_path_is_a_collision() -> None:
    other = make_pv("vol1", host_dir="/mnt/elsewhere")
    assert other["metadata"]["name"] == name_of("vol1")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[other]))
    assert result.creates == []
    [skip] = result.skipped
    assert skip.error
    assert name_of("vol1") in skip.reason and "/mnt/elsewhere/vol1" in skip.reason
    assert "/mnt/disks/vol1" not in result.journal
    assert not result.ready


def test_collisions_input_is_honoured() -> None:
    name = name_of("vol1")
    result = plan(make_world(scans={"sc1": [mnt("vol1"), mnt("vol2")]},
                             collisions={name: "/mnt/disks/vol9 on node-b"}))
    assert [c.host_path for c in result.creates] == ["/mnt/disks/vol2"]
    [skip] = result.skipped
    assert skip.error and "/mnt/disks/vol9 on node-b" in skip.reason
    assert "/mnt/disks/vol1" not in result.journal


def test_missing_storage_class_is_a_class_error() -> None:
    config = make_config({"sc1": FS, "blk": BLK})
    result = plan(make_world(config, {"sc1": [mnt("vol1")], "blk": [blk("sdb")]},
                             storage_classes={"sc1": None, "blk": StorageClassInfo("blk")}))
    assert [c.host_path for c in result.creates] == ["/dev/localblk/sdb"]
    assert set(result.class_errors) == {"sc1"}
    assert "not found" in result.class_errors["sc1"]
    assert not result.ready


def test_storage_class_absent_from_the_map_is_a_class_error() -> None:
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, storage_classes={}))
    assert result.creates == [] and "sc1" in result.class_errors


@pytest.mark.parametrize("policy", ["Recycle", "Bogus"])
def test_storage_class_with_unsupported_reclaim_policy_is_a_class_error(policy: str) -> None:
    result = plan(make_world(scans={"sc1": [mnt("vol1")]},
                             storage_classes={"sc1": StorageClassInfo("sc1", reclaim_policy=policy)}))
    assert result.creates == []
    assert policy in result.class_errors["sc1"]
    assert not result.ready


def test_retain_storage_class_makes_retain_pvs() -> None:
    result = plan(make_world(scans={"sc1": [mnt("vol1")]},
                             storage_classes={"sc1": StorageClassInfo("sc1", reclaim_policy="Retain")}))
    assert result.creates[0].pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"


def test_scan_error_is_a_class_error() -> None:
    config = make_config({"sc1": FS, "blk": BLK})
    message = 'cannot list discovery directory "/discovery/disks": Permission denied'
    result = plan(make_world(config, {"sc1": message, "blk": [blk("sdb")]}))
    assert result.class_errors == {"sc1": message}
    assert [c.host_path for c in result.creates] == ["/dev/localblk/sdb"]
    assert not result.ready
    assert result.errors == 1


def test_class_without_scan_is_a_class_error() -> None:
    result = plan(make_world(scans={}))
    assert "sc1" in result.class_errors and not result.ready


def test_empty_discovery_dir_is_ready() -> None:
    result = plan(make_world(scans={"sc1": []}))
    assert result.ready and result.creates == [] and result.journal == {}


@pytest.mark.parametrize("state", [OFFERED, USED, CLEANING])
def test_non_clean_journal_entry_without_pv_is_not_offered(state: str) -> None:
    journal = {"/mnt/disks/vol1": jentry(state, since=50.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal=journal))
    assert result.creates == []
    [skip] = skipped_for(result, "/discovery/disks/vol1")
    assert not skip.error  # waiting is not a discovery error
    assert state in skip.reason
    assert result.ready


def test_clean_journal_entry_is_offered() -> None:
    journal = {"/mnt/disks/vol1": jentry(CLEAN, since=50.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal=journal))
    assert [c.host_path for c in result.creates] == ["/mnt/disks/vol1"]
    assert result.journal == {"/mnt/disks/vol1": JournalEntry(name_of("vol1"), "sc1", OFFERED, NOW)}
    assert result.orphans == [] and result.cleanups == []


def test_existing_pv_means_no_create_even_without_journal_entry() -> None:
    pv = make_pv("vol1")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv]))
    assert result.creates == []
    assert result.journal == {"/mnt/disks/vol1": JournalEntry(name_of("vol1"), "sc1", OFFERED, NOW, "", "uid-1")}


def test_pv_for_the_path_under_another_name_blocks_discovery() -> None:
    # e.g. a PV adopted from upstream under a renamed class.
    pv = make_pv("vol1", "old-class")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv]))
    assert result.creates == []
    [skip] = result.skipped
    assert not skip.error and pv["metadata"]["name"] in skip.reason


def test_clean_before_first_discovery_cleans_instead_of_offering() -> None:
    config = make_config({"sc1": FS, "blk": BLK}, cleanBeforeFirstDiscovery=True)
    result = plan(make_world(config, {"sc1": [mnt("vol1")], "blk": [blk("sdb")]}))
    assert result.creates == []
    by_path = {c.host_path: c for c in result.cleanups}
    assert set(by_path) == {"/mnt/disks/vol1", "/dev/localblk/sdb"}
    fs, block = by_path["/mnt/disks/vol1"], by_path["/dev/localblk/sdb"]
    assert (fs.pv_name, fs.container_path, fs.block, fs.pv, fs.retry) == (
        name_of("vol1"), "/discovery/disks/vol1", False, None, False)
    assert (block.pv_name, block.container_path, block.block, block.pv) == (
        name_of("sdb", "blk"), "/discovery/blk/sdb", True, None)
    assert block.cls == config.classes["blk"]
    assert result.journal == {
        "/mnt/disks/vol1": JournalEntry(name_of("vol1"), "sc1", CLEANING, NOW),
        "/dev/localblk/sdb": JournalEntry(name_of("sdb", "blk"), "blk", CLEANING, NOW),
    }
    assert all(not s.error for s in result.skipped) and len(result.skipped) == 2
    assert result.ready


def test_clean_before_first_discovery_then_offer_once_clean() -> None:
    config = make_config(cleanBeforeFirstDiscovery=True)
    scans = {"sc1": [mnt("vol1")]}
    first = plan(make_world(config, scans))
    journal = journal_after(make_world(config, scans), first)
    # Running: nothing new.
    running = plan(make_world(config, scans, journal=journal,
                              cleanups={name_of("vol1"): status(RUNNING, uid=None, started=NOW + 1)}, now=NOW + 5))
    assert running.creates == [] and running.cleanups == [] and running.journal == {}
    # Succeeded: clean, forget, and offer in the same pass.
    done = plan(make_world(config, scans, journal=journal,
                           cleanups={name_of("vol1"): status(SUCCEEDED, uid=None, started=NOW + 1)}, now=NOW + 10))
    assert done.forget_cleanups == [name_of("vol1")]
    assert [c.host_path for c in done.creates] == ["/mnt/disks/vol1"]
    assert done.journal == {"/mnt/disks/vol1": JournalEntry(name_of("vol1"), "sc1", OFFERED, NOW + 10)}


def test_clean_before_first_discovery_skips_known_volumes() -> None:
    config = make_config(cleanBeforeFirstDiscovery=True)
    clean = plan(make_world(config, {"sc1": [mnt("vol1")]}, journal={"/mnt/disks/vol1": jentry(CLEAN)}))
    assert [c.host_path for c in clean.creates] == ["/mnt/disks/vol1"] and clean.cleanups == []
    existing = plan(make_world(config, {"sc1": [mnt("vol1")]}, pvs=[make_pv("vol1")]))
    assert existing.cleanups == [] and existing.creates == []


def test_clean_before_first_discovery_does_not_clean_ineligible_entries() -> None:
    config = make_config(cleanBeforeFirstDiscovery=True)
    result = plan(make_world(config, {"sc1": [entry("plain", EntryKind.DIRECTORY)]}))
    assert result.cleanups == [] and result.journal == {}


def test_block_pv_whose_path_is_now_a_mounted_filesystem_warns() -> None:
    config = make_config({"blk": BLK})
    pv = make_pv("sdb", "blk", config=config)
    result = plan(make_world(config, {"blk": [mnt("sdb", mount_dir="/discovery/blk")]}, pvs=[pv]))
    assert result.creates == []
    [event] = result.events
    assert (event.obj, event.type, event.reason) == (pv, WARNING, "VolumeFailedDelete")


def test_discovery_is_deterministic_and_sorted_by_class() -> None:
    config = make_config({"zz": {"hostDir": "/mnt/z", "mountDir": "/d/z"}, "aa": {"hostDir": "/mnt/a",
                                                                                     "mountDir": "/d/a"}})
    scans = {"zz": [mnt("v", mount_dir="/d/z")], "aa": [mnt("v", mount_dir="/d/a")]}
    first = plan(make_world(config, scans))
    assert [c.host_path for c in first.creates] == ["/mnt/a/v", "/mnt/z/v"]
    assert plan(make_world(config, scans)) == first


def test_plan_does_not_mutate_its_inputs() -> None:
    config = make_config({"sc1": FS}, cleanBeforeFirstDiscovery=False)
    pvs = [make_pv("vol1", phase="Released"), make_pv("vol2", phase="Bound", uid="u2")]
    journal = {"/mnt/disks/vol3": jentry(CLEANING, "vol3")}
    cleanups = {name_of("vol1"): status(SUCCEEDED)}
    world = make_world(config, {"sc1": [mnt("vol1"), mnt("vol2"), mnt("vol3"), mnt("vol4")]}, pvs=pvs,
                       journal=journal, cleanups=cleanups)
    snapshot = copy.deepcopy((world.pvs, dict(world.journal), dict(world.cleanups)))
    plan(world)
    assert (world.pvs, dict(world.journal), dict(world.cleanups)) == snapshot


# --------------------------------------------------------------------------- usage tracking


@pytest.mark.parametrize(
    ("phase", "claim", "expected"),
    [
        ("Available", False, OFFERED),
        ("Pending", False, OFFERED),
        ("Available", True, USED),  # pre-bound / reserved for a claim
        ("Bound", True, USED),
        ("Released", True, USED),
        ("Released", False, USED),
        ("Failed", True, USED),
    ],
)
def test_usage_is_recorded_for_every_pv(phase: str, claim: bool, expected: str) -> None:
    pv = make_pv("vol1", phase=phase, claim=claim, policy="Retain")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv]))
    # The claim's UID is remembered, so a later, different claim is recognised.
    claim_uid = "claim-of-uid-1" if claim else ""
    assert result.journal == {"/mnt/disks/vol1": JournalEntry(name_of("vol1"), "sc1", expected, NOW, claim_uid,
                                                              pv_uid="uid-1",
                                                              claim_name=CLAIM_NAME if claim else "")}


def test_offered_becomes_used_when_bound() -> None:
    journal = {"/mnt/disks/vol1": jentry(OFFERED, since=50.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[make_pv("vol1", phase="Bound")], journal=journal))
    assert result.journal == {"/mnt/disks/vol1": jentry(USED, since=NOW, claim="claim-of-uid-1")}


def test_offered_stays_offered_while_available() -> None:
    journal = {"/mnt/disks/vol1": jentry(OFFERED, since=50.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[make_pv("vol1")], journal=journal))
    assert result.journal == {}


@pytest.mark.parametrize("state", [USED, CLEANING])
def test_dirty_state_is_never_downgraded_by_an_available_pv(state: str) -> None:
    journal = {"/mnt/disks/vol1": jentry(state, since=50.0)}
    world = make_world(scans={"sc1": [mnt("vol1")]}, pvs=[make_pv("vol1")], journal=journal)
    result = plan(world)
    assert journal_after(world, result)["/mnt/disks/vol1"].state in (USED, CLEANING)
    # ... nor is that PV left on offer (tests/unit/test_reconcile_unclaimed.py).
    assert [r.pv["metadata"]["uid"] for r in [*result.retracts, *result.restores]] == ["uid-1"]


def test_clean_entry_with_a_released_pv_stays_clean() -> None:
    journal = {"/mnt/disks/vol1": jentry(CLEAN, since=50.0)}
    pv = make_pv("vol1", phase="Released", policy="Retain")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal))
    assert result.journal == {}


def test_clean_entry_with_a_bound_pv_becomes_used() -> None:
    # How: cleanup succeeded (journal clean), the DELETE of the PV failed, and an admin
    # cleared the claimRef of the Released PV so it was bound again (a common way to
    # "reuse" a Released PV). The new tenant's data is on the volume now.
    journal = {"/mnt/disks/vol1": jentry(CLEAN, since=50.0, claim="first-tenant")}
    bound = make_pv("vol1", phase="Bound", uid="uid-1")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[bound], journal=journal))
    assert result.journal == {"/mnt/disks/vol1": jentry(USED, since=NOW, claim="claim-of-uid-1")}
    # ... and when that tenant releases it, it must be cleaned, not deleted at once.
    released = make_pv("vol1", phase="Released", uid="uid-1")
    after = journal_after(make_world(pvs=[bound], journal=journal), result)
    release = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[released], journal=after, now=NOW + 10))
    assert release.deletes == [] and [c.pv for c in release.cleanups] == [released]
    assert release.journal["/mnt/disks/vol1"].state == CLEANING


def test_clean_entry_with_a_pv_released_by_another_claim_is_cleaned_again() -> None:
    # Bound and released again between two passes: the agent never saw it Bound, but
    # the claimRef names another claim than the one whose data was cleaned.
    journal = {"/mnt/disks/vol1": jentry(CLEAN, since=50.0, claim="first-tenant")}
    released = make_pv("vol1", phase="Released", uid="uid-1")  # claimRef uid claim-of-uid-1
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[released], journal=journal,
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid="uid-1", started=60.0)}))
    assert result.deletes == []
    assert [c.pv for c in result.cleanups] == [released]
    assert result.journal["/mnt/disks/vol1"] == jentry(CLEANING, since=NOW, claim="claim-of-uid-1")
    assert result.forget_cleanups == [name_of("vol1")]  # the old success is stale now


def test_clean_entry_with_the_same_claim_is_deleted() -> None:
    journal = {"/mnt/disks/vol1": jentry(CLEAN, since=50.0, claim="claim-of-uid-1")}
    released = make_pv("vol1", phase="Released", uid="uid-1")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[released], journal=journal))
    assert [d.pv for d in result.deletes] == [released]
    assert result.cleanups == [] and result.journal == {}


def test_clean_entry_with_a_claimless_available_pv_is_not_cleaned_or_deleted() -> None:
    # An admin cleared the claimRef of the cleaned PV: it is clean and on offer again.
    journal = {"/mnt/disks/vol1": jentry(CLEAN, since=50.0, claim="first-tenant")}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[make_pv("vol1", phase="Available")],
                             journal=journal))
    assert result.cleanups == [] and result.deletes == [] and result.creates == []
    assert all(v is not None and v.state in (CLEAN, OFFERED) for v in result.journal.values())


# --------------------------------------------------------------------------- deletion


@pytest.mark.parametrize("phase", ["Pending", "Available", "Bound", "Failed"])
def test_only_released_pvs_are_cleaned(phase: str) -> None:
    pv = make_pv("vol1", phase=phase)
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv]))
    assert result.cleanups == [] and result.deletes == [] and result.events == []


def test_released_pv_with_deletion_timestamp_is_left_alone() -> None:
    pv = make_pv("vol1", phase="Released", deleting=True)
    journal = {"/mnt/disks/vol1": jentry(USED)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("vol1"): status(SUCCEEDED)}))
    assert result.cleanups == [] and result.deletes == [] and result.events == []
    assert result.journal == {}


def test_retain_does_nothing() -> None:
    pv = make_pv("vol1", phase="Released", policy="Retain")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal={"/mnt/disks/vol1": jentry(USED)}))
    assert result.cleanups == [] and result.deletes == [] and result.events == [] and result.journal == {}
    assert result.creates == []


def test_recycle_is_unsupported() -> None:
    pv = make_pv("vol1", phase="Released", policy="Recycle")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal={"/mnt/disks/vol1": jentry(USED)}))
    [event] = result.events
    assert (event.obj, event.type, event.reason) == (pv, WARNING, "VolumeUnsupportedReclaimPolicy")
    assert "Recycle" in event.message
    assert result.cleanups == [] and result.deletes == [] and result.journal == {}


def test_unknown_policy_is_reported() -> None:
    pv = make_pv("vol1", phase="Released", policy="Shred")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal={"/mnt/disks/vol1": jentry(USED)}))
    [event] = result.events
    assert (event.obj, event.type, event.reason) == (pv, WARNING, "VolumeUnknownReclaimPolicy")
    assert "Shred" in event.message
    assert result.cleanups == [] and result.deletes == []


def test_pv_of_a_class_no_longer_configured_fails_delete_and_nothing_else() -> None:
    pv = make_pv("vol1", "removed-class", phase="Released")
    journal = {"/mnt/disks/vol1": JournalEntry(pv["metadata"]["name"], "removed-class", USED, 50.0, pv_uid="uid-1")}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal,
                             cleanups={pv["metadata"]["name"]: status(SUCCEEDED)}))
    [event] = result.events
    assert (event.obj, event.type, event.reason) == (pv, WARNING, "VolumeFailedDelete")
    assert "removed-class" in event.message
    assert result.cleanups == [] and result.deletes == [] and result.forget_cleanups == []
    assert result.journal == {}
    assert result.creates == []  # sc1 shares the host dir but the path is taken


def test_released_non_local_pv_fails_delete() -> None:
    pv = make_pv("vol1", phase="Released")
    del pv["spec"]["local"]
    pv["spec"]["hostPath"] = {"path": "/mnt/disks/vol1"}
    result = plan(make_world(scans={"sc1": []}, pvs=[pv]))
    [event] = result.events
    assert event.reason == "VolumeFailedDelete" and "not a local volume" in event.message
    assert result.cleanups == [] and result.deletes == [] and result.journal == {}


def test_released_delete_pv_starts_a_filesystem_cleanup() -> None:
    config = make_config()
    pv = make_pv("vol1", phase="Released", uid="uid-7")
    journal = {"/mnt/disks/vol1": jentry(USED, since=50.0, pv_uid="uid-7")}
    result = plan(make_world(config, {"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal))
    assert result.cleanups == [StartCleanup(
        pv_name=name_of("vol1"), host_path="/mnt/disks/vol1", container_path="/discovery/disks/vol1",
        cls=config.classes["sc1"], block=False, reason="released", pv=pv, retry=False)]
    assert result.journal == {"/mnt/disks/vol1": jentry(CLEANING, since=NOW, pv_uid="uid-7")}
    assert result.deletes == [] and result.creates == []
    assert result.events == []  # the VolumeDelete event is for block cleaning, as upstream


def test_released_pv_never_seen_before_goes_straight_to_cleaning() -> None:
    pv = make_pv("vol1", phase="Released")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv]))
    assert result.journal == {"/mnt/disks/vol1": jentry(CLEANING, since=NOW, claim="claim-of-uid-1")}
    assert len(result.cleanups) == 1


def test_released_block_pv_starts_a_block_cleanup_with_event() -> None:
    config = make_config({"blk": BLK})
    pv = make_pv("sdb", "blk", config=config, phase="Released")
    result = plan(make_world(config, {"blk": [blk("sdb")]}, pvs=[pv]))
    [cleanup] = result.cleanups
    assert (cleanup.block, cleanup.container_path, cleanup.pv) == (True, "/discovery/blk/sdb", pv)
    [event] = result.events
    assert (event.obj, event.type, event.reason) == (pv, NORMAL, "VolumeDelete")


def test_cleaner_kind_follows_the_scanned_entry_not_the_pv_mode() -> None:
    # A Filesystem PV on a raw device (fs-on-block) is wiped as a block device.
    pv = make_pv("sdc", phase="Released", mode="Filesystem")
    result = plan(make_world(scans={"sc1": [blk("sdc", mount_dir="/discovery/disks")]}, pvs=[pv]))
    assert [c.block for c in result.cleanups] == [True]


def test_running_cleanup_means_nothing_to_do() -> None:
    pv = make_pv("vol1", phase="Released")
    journal = {"/mnt/disks/vol1": jentry(CLEANING, since=50.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("vol1"): status(RUNNING)}))
    assert result.cleanups == [] and result.deletes == [] and result.journal == {} and result.events == []
    assert result.forget_cleanups == []


def test_failed_cleanup_waits_for_its_backoff() -> None:
    pv = make_pv("vol1", phase="Released")
    journal = {"/mnt/disks/vol1": jentry(CLEANING, since=50.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("vol1"): status(FAILED, retry_at=NOW + 1)}))
    assert result.cleanups == [] and result.deletes == [] and result.journal == {}


@pytest.mark.parametrize("retry_at", [NOW, NOW - 1, None])
def test_failed_cleanup_is_retried_when_due(retry_at: float | None) -> None:
    config = make_config({"blk": BLK})
    pv = make_pv("sdb", "blk", config=config, phase="Released")
    journal = {"/dev/localblk/sdb": jentry(CLEANING, "sdb", "blk", since=50.0)}
    result = plan(make_world(config, {"blk": [blk("sdb")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("sdb", "blk"): status(FAILED, retry_at=retry_at, attempts=2,
                                                                      message="exit status 10")}))
    [cleanup] = result.cleanups
    assert cleanup.retry and cleanup.pv == pv
    assert result.deletes == [] and result.journal == {}
    [failed] = [e for e in result.events if e.reason == "VolumeFailedDelete"]
    assert (failed.obj, failed.type) == (pv, WARNING) and "exit status 10" in failed.message
    [retry] = [e for e in result.events if e.reason == "VolumeDelete"]
    assert retry.type == NORMAL and "attempt 3" in retry.message and "exit status 10" in retry.message


def test_failed_cleanup_is_reported_while_backing_off() -> None:
    pv = make_pv("vol1", phase="Released")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv],
                             journal={"/mnt/disks/vol1": jentry(CLEANING, since=50.0)},
                             cleanups={name_of("vol1"): status(FAILED, retry_at=NOW + 60, attempts=4,
                                                                message="shred: I/O error")}))
    [event] = result.events
    assert (event.obj, event.type, event.reason) == (pv, WARNING, "VolumeFailedDelete")
    assert "attempt 4" in event.message and "shred: I/O error" in event.message
    assert result.cleanups == []


def test_failed_orphan_cleanup_is_reported_on_the_node() -> None:
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal={"/mnt/disks/vol1": jentry(CLEANING, since=50)},
                             cleanups={name_of("vol1"): status(FAILED, uid=None, retry_at=NOW + 60)}))
    [event] = result.events
    assert event.reason == "VolumeFailedDelete" and event.obj["kind"] == "Node"


def test_succeeded_cleanup_marks_clean_and_deletes_the_pv() -> None:
    pv = make_pv("vol1", phase="Released", uid="uid-1")
    journal = {"/mnt/disks/vol1": jentry(CLEANING, since=50.0)}
    done = status(SUCCEEDED, uid="uid-1")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("vol1"): done}))
    assert result.journal == {"/mnt/disks/vol1": jentry(CLEAN, since=NOW)}
    [delete] = result.deletes
    assert (delete.pv, delete.host_path, delete.block, delete.cleanup) == (pv, "/mnt/disks/vol1", False, done)
    assert result.cleanups == [] and result.creates == []


def test_succeeded_block_cleanup_delete_reports_block() -> None:
    config = make_config({"blk": BLK})
    pv = make_pv("sdb", "blk", config=config, phase="Released")
    journal = {"/dev/localblk/sdb": jentry(CLEANING, "sdb", "blk")}
    result = plan(make_world(config, {"blk": [blk("sdb")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("sdb", "blk"): status(SUCCEEDED)}))
    assert [d.block for d in result.deletes] == [True]


def test_succeeded_status_of_an_earlier_pv_incarnation_is_forgotten_not_trusted() -> None:
    pv = make_pv("vol1", phase="Released", uid="uid-NEW")
    journal = {"/mnt/disks/vol1": jentry(USED, since=50.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid="uid-OLD")}))
    assert result.deletes == []
    assert result.forget_cleanups == [name_of("vol1")]
    # The PV object was replaced (a new uid) and used: tracked as that PV, cleaned anew.
    assert result.journal == {"/mnt/disks/vol1": jentry(CLEANING, since=NOW, claim="claim-of-uid-NEW",
                                                        pv_uid="uid-NEW")}
    [cleanup] = result.cleanups
    assert cleanup.pv == pv and not cleanup.retry


def test_running_cleanup_of_an_earlier_incarnation_is_waited_for() -> None:
    pv = make_pv("vol1", phase="Released", uid="uid-NEW")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal={"/mnt/disks/vol1": jentry(CLEANING)},
                             cleanups={name_of("vol1"): status(RUNNING, uid="uid-OLD")}))
    assert result.cleanups == [] and result.deletes == [] and result.forget_cleanups == []


def test_journal_clean_after_restart_deletes_the_pv() -> None:
    # The agent died after recording "clean" and before deleting: no tracker status now.
    pv = make_pv("vol1", phase="Released", uid="uid-1")
    journal = {"/mnt/disks/vol1": jentry(CLEAN, since=70.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal))
    [delete] = result.deletes
    assert delete.pv == pv and delete.host_path == "/mnt/disks/vol1"
    assert delete.cleanup.state == SUCCEEDED and delete.cleanup.pv_uid == "uid-1"
    assert result.cleanups == [] and result.journal == {}
    assert result.creates == []  # the old PV still holds the name and the path


@pytest.mark.parametrize(
    ("scan", "why"),
    [
        ([], "was not found"),
        ([entry("vol1", EntryKind.DIRECTORY)], "not a valid mount point"),  # the disk is unmounted
        ([entry("vol1", EntryKind.BROKEN)], "cannot stat"),
        ("cannot list discovery directory", "was not found"),
    ],
)
def test_volume_missing_or_unusable_is_never_cleaned_nor_deleted(scan: Any, why: str) -> None:
    pv = make_pv("vol1", phase="Released")
    journal = {"/mnt/disks/vol1": jentry(USED, since=50.0)}
    result = plan(make_world(scans={"sc1": scan}, pvs=[pv], journal=journal))
    assert result.cleanups == [] and result.deletes == []
    [event] = [e for e in result.events if e.reason == "VolumeFailedDelete"]
    assert event.obj == pv and event.type == WARNING and why in event.message
    # It stays "cleaning": it will be cleaned when it comes back, never offered dirty.
    assert result.journal == {"/mnt/disks/vol1": jentry(CLEANING, since=NOW)}


def test_pv_outside_the_class_host_dir_is_not_cleaned() -> None:
    pv = make_pv("vol1", phase="Released", host_dir="/somewhere/else")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv]))
    assert result.cleanups == [] and result.deletes == []
    assert any(e.reason == "VolumeFailedDelete" and "outside" in e.message for e in result.events)


def test_pv_path_with_dot_dot_is_not_cleaned() -> None:
    pv = make_pv("vol1", phase="Released")
    pv["spec"]["local"]["path"] = "/mnt/disks/.."
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv]))
    assert result.cleanups == [] and result.deletes == []


# --------------------------------------------------------------------------- orphans


@pytest.mark.parametrize("state", [OFFERED, USED])
def test_offered_or_used_without_pv_asks_for_confirmation_only(state: str) -> None:
    record = jentry(state, since=50.0)
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal={"/mnt/disks/vol1": record}))
    assert result.orphans == [ConfirmOrphan(name_of("vol1"), "/mnt/disks/vol1", record)]
    assert result.journal == {}  # the plan alone must not decide: the cache may lag
    assert result.cleanups == [] and result.creates == [] and result.deletes == []


def test_cleaning_without_pv_starts_an_orphan_cleanup() -> None:
    config = make_config()
    result = plan(make_world(config, {"sc1": [mnt("vol1")]}, journal={"/mnt/disks/vol1": jentry(CLEANING)}))
    [cleanup] = result.cleanups
    assert (cleanup.pv_name, cleanup.host_path, cleanup.container_path, cleanup.pv, cleanup.block) == (
        name_of("vol1"), "/mnt/disks/vol1", "/discovery/disks/vol1", None, False)
    assert cleanup.cls == config.classes["sc1"]
    assert "disappeared" in cleanup.reason
    assert result.creates == [] and result.journal == {}


def test_orphan_block_cleanup_emits_no_pv_event() -> None:
    config = make_config({"blk": BLK})
    result = plan(make_world(config, {"blk": [blk("sdb")]},
                             journal={"/dev/localblk/sdb": jentry(CLEANING, "sdb", "blk")}))
    assert [c.block for c in result.cleanups] == [True]
    assert result.events == []


def test_orphan_cleanup_running_or_backing_off_does_nothing() -> None:
    journal = {"/mnt/disks/vol1": jentry(CLEANING)}
    for st_ in (status(RUNNING, uid=None), status(FAILED, uid=None, retry_at=NOW + 30)):
        result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal=journal, cleanups={name_of("vol1"): st_}))
        assert result.cleanups == [] and result.creates == [] and result.journal == {}


def test_orphan_cleanup_failed_and_due_is_retried() -> None:
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal={"/mnt/disks/vol1": jentry(CLEANING)},
                             cleanups={name_of("vol1"): status(FAILED, uid=None, retry_at=NOW - 1)}))
    [cleanup] = result.cleanups
    assert cleanup.retry and cleanup.pv is None
    assert result.creates == []


def test_orphan_cleanup_succeeded_marks_clean_and_forgets() -> None:
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal={"/mnt/disks/vol1": jentry(CLEANING, since=50)},
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid=None, started=60.0)}))
    assert result.forget_cleanups == [name_of("vol1")]
    assert result.deletes == [] and result.cleanups == []
    # Clean now, and offered again in the same pass.
    assert [c.host_path for c in result.creates] == ["/mnt/disks/vol1"]
    assert result.journal["/mnt/disks/vol1"].state == OFFERED


def test_orphan_cleanup_succeeded_but_volume_gone_is_just_clean() -> None:
    result = plan(make_world(scans={"sc1": []}, journal={"/mnt/disks/vol1": jentry(CLEANING, since=50)},
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid=None, started=60.0)}))
    assert result.journal == {"/mnt/disks/vol1": jentry(CLEAN, since=NOW)}
    assert result.forget_cleanups == [name_of("vol1")] and result.creates == []


def test_orphan_whose_volume_is_missing_warns_on_the_node() -> None:
    result = plan(make_world(scans={"sc1": []}, journal={"/mnt/disks/vol1": jentry(CLEANING)}))
    assert result.cleanups == []
    [event] = result.events
    assert event.reason == "VolumeFailedDelete" and event.type == WARNING
    assert event.obj["kind"] == "Node" and event.obj["metadata"]["name"] == NODE.name


def test_a_cleanup_that_cannot_find_its_volume_is_reported_once_not_every_pass() -> None:
    # The disk was removed for good: the record stays (a dirty disk plugged in again is
    # cleaned first), but the warning is a standing condition, emitted when it starts.
    world = make_world(scans={"sc1": []}, journal={"/mnt/disks/vol1": jentry(CLEANING)},
                       cleanups={name_of("vol1"): status(FAILED, retry_at=NOW - 1, attempts=3, message="gone")})
    result = plan(world)
    assert result.journal == {} and result.cleanups == []
    assert [(e.reason, e.once) for e in result.events] == [("VolumeFailedDelete", True)] * 2
    back = plan(replace(world, scans={"sc1": [mnt("vol1")]}))
    assert [c.host_path for c in back.cleanups] == ["/mnt/disks/vol1"] and back.creates == []


@pytest.mark.parametrize("state", [OFFERED, USED, CLEANING])
def test_entry_of_a_removed_class_is_left_alone_and_not_offered(state: str) -> None:
    # "old" used to discover /mnt/disks too; sc1 now sees the same entry.
    record = JournalEntry(name_of("vol1", "old"), "old", state, 50.0)
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal={"/mnt/disks/vol1": record}))
    assert result.orphans == [] and result.cleanups == [] and result.journal == {}
    assert result.creates == []


def test_clean_entry_without_pv_is_not_an_orphan() -> None:
    result = plan(make_world(scans={"sc1": []}, journal={"/mnt/disks/vol1": jentry(CLEAN)}))
    assert result.orphans == [] and result.cleanups == [] and result.journal == {} and result.events == []


def test_orphan_check_is_per_path_not_per_name() -> None:
    # The journal's PV name differs from the cached PV (e.g. adopted under another class),
    # but the path has a PV: not an orphan.
    record = jentry(USED, "vol1", "sc1")
    pv = make_pv("vol1", "old-class", phase="Bound")
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal={"/mnt/disks/vol1": record}))
    assert result.orphans == [] and result.cleanups == []


# --------------------------------------------------------------------------- suspected bugs


def test_stale_success_does_not_clean_an_orphan() -> None:
    # A success recorded at t=100..101 (an earlier release whose PV DELETE failed, so the
    # tracker never forgot it) says nothing about the tenant data written after t=500,
    # when the volume was offered again, bound, and its PV deleted by an admin.
    journal = {"/mnt/disks/vol1": jentry(CLEANING, since=900.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal=journal,
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid="uid-OLD", started=100.0)}))
    assert result.creates == []
    assert result.journal.get("/mnt/disks/vol1", journal["/mnt/disks/vol1"]).state == CLEANING
    assert [c.pv_name for c in result.cleanups] == [name_of("vol1")]
    assert result.forget_cleanups == [name_of("vol1")]
    assert not result.cleanups[0].retry


def test_stale_success_does_not_clean_a_released_pv() -> None:
    # Same PV uid, but the success predates the moment the volume was seen used.
    pv = make_pv("vol1", phase="Released", uid="uid-1")
    journal = {"/mnt/disks/vol1": jentry(USED, since=900.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid="uid-1", started=100.0)}))
    assert result.deletes == []
    assert result.forget_cleanups == [name_of("vol1")]
    assert [c.pv for c in result.cleanups] == [pv]
    assert result.journal == {"/mnt/disks/vol1": jentry(CLEANING, since=NOW)}


@pytest.mark.parametrize(("started", "trusted"), [(899.9995, True), (900.0, True), (950.0, True), (899.99, False)])
def test_staleness_allows_for_job_annotation_rounding(started: float, trusted: bool) -> None:
    journal = {"/mnt/disks/vol1": jentry(CLEANING, since=900.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal=journal,
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid=None, started=started)}))
    assert bool(result.creates) is trusted
    assert bool(result.cleanups) is not trusted


def test_stale_failure_does_not_delay_a_new_cleanup() -> None:
    # A failure (and its backoff) from an earlier dirt: start afresh, not as a retry.
    journal = {"/mnt/disks/vol1": jentry(CLEANING, since=900.0)}
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal=journal,
                             cleanups={name_of("vol1"): status(FAILED, uid=None, started=100.0,
                                                                retry_at=NOW + 500)}))
    assert [c.retry for c in result.cleanups] == [False]
    assert result.forget_cleanups == [name_of("vol1")]


def test_clean_before_first_discovery_does_not_trust_a_stale_success() -> None:
    config = make_config(cleanBeforeFirstDiscovery=True)
    result = plan(make_world(config, {"sc1": [mnt("vol1")]},
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid="uid-OLD", started=100.0)}))
    assert result.journal["/mnt/disks/vol1"].state == CLEANING
    assert [c.pv_name for c in result.cleanups] == [name_of("vol1")]


@pytest.mark.parametrize("other_phase", ["Bound", "Available", "Pending"])
def test_never_wipe_a_volume_another_pv_still_publishes(other_phase: str) -> None:
    # Two PVs for one path (upstream duplicates from two classes sharing a hostDir, adopted).
    config = make_config({"a": FS, "b": FS})
    released = make_pv("vol1", "a", config=config, phase="Released", uid="u-a")
    other = make_pv("vol1", "b", config=config, phase=other_phase, uid="u-b")
    scan = [mnt("vol1")]
    for pvs in ([other, released], [released, other]):
        result = plan(make_world(config, {"a": scan, "b": scan}, pvs=pvs))
        assert result.cleanups == [] and result.deletes == [] and result.creates == []
        [event] = [e for e in result.events if e.obj is released]
        assert event.reason == "VolumeFailedDelete" and other["metadata"]["name"] in event.message


def test_no_delete_while_the_pvs_own_cleanup_runs() -> None:
    # Both duplicates were released, so both got a cleanup (neither blocks the other).
    # a's cleaner finished first; b's is still wiping. Deleting b now lets the next pass
    # offer the volume (journal clean, no PV, a's status forgotten) while b's cleaner
    # is still wiping it: the next tenant's data is destroyed under it.
    config = make_config({"a": FS, "b": FS})
    a = make_pv("vol1", "a", config=config, phase="Released", uid="u-a")
    b = make_pv("vol1", "b", config=config, phase="Released", uid="u-b")
    journal = {"/mnt/disks/vol1": JournalEntry(name_of("vol1", "a"), "a", CLEANING, 50.0, "claim-of-u-a")}
    cleanups = {name_of("vol1", "a"): status(SUCCEEDED, uid="u-a", started=100.0),
                name_of("vol1", "b"): status(RUNNING, uid="u-b", started=100.0)}
    result = plan(make_world(config, {"a": [mnt("vol1")], "b": [mnt("vol1")]}, pvs=[a, b], journal=journal,
                             cleanups=cleanups))
    assert b not in [d.pv for d in result.deletes]


def test_cleanup_that_predates_a_new_claim_is_not_trusted() -> None:
    # The cleaner of claim-A's data was running (or backing off) when an admin cleared
    # the Released PV's claimRef; claim-B bound it, wrote, and released it. The success
    # at t=100 says nothing about claim-B's data.
    journal = {"/mnt/disks/vol1": jentry(CLEANING, since=50.0, claim="claim-A")}
    pv = make_pv("vol1", phase="Released", uid="uid-1")
    pv["spec"]["claimRef"]["uid"] = "claim-B"
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, pvs=[pv], journal=journal,
                             cleanups={name_of("vol1"): status(SUCCEEDED, uid="uid-1", started=100.0)}))
    assert result.deletes == []
    assert [c.pv for c in result.cleanups] == [pv]


def test_no_pv_for_a_volume_being_wiped() -> None:
    # Upstream too skips entries whose cleanup is in progress; here it is defence in depth.
    result = plan(make_world(scans={"sc1": [mnt("vol1")]}, journal={"/mnt/disks/vol1": jentry(CLEAN)},
                             cleanups={name_of("vol1"): status(RUNNING, uid=None)}))
    assert result.creates == []
    [skip] = result.skipped
    assert not skip.error and "cleanup in progress" in skip.reason


# --------------------------------------------------------------------------- invariants over random worlds

ENTRY_NAMES = ("a", "b", "c")
UIDS = ("u1", "u2")
PHASES = ("Pending", "Available", "Bound", "Released", "Failed")
POLICIES = ("Delete", "Delete", "Retain", "Recycle", "Bogus")
GONE_CLASS = "gone"


@st.composite
def random_worlds(draw: st.DrawFn) -> World:
    n_classes = draw(st.integers(1, 2))
    shared = n_classes == 2 and draw(st.booleans())
    classes: dict[str, dict[str, Any]] = {}
    for i in range(n_classes):
        host = "/mnt/shared" if shared else f"/mnt/sc{i}"
        classes[f"sc{i}"] = {"hostDir": host, "mountDir": f"/disc{host}",
                             "volumeMode": draw(st.sampled_from(["Filesystem", "Block"]))}
    config = make_config(classes, cleanBeforeFirstDiscovery=draw(st.booleans()))
    host_dirs = sorted({c["hostDir"] for c in classes.values()})

    scans_by_dir: dict[str, list[Entry] | str] = {}
    for host in host_dirs:
        if draw(st.integers(0, 9)) == 0:
            scans_by_dir[host] = "cannot list discovery directory"
            continue
        entries = []
        for name in ENTRY_NAMES:
            if draw(st.booleans()):
                kind = draw(st.sampled_from(list(EntryKind)))
                capacity = draw(st.sampled_from([None, 5 * MiB, 20 * GiB + 7]))
                entries.append(entry(name, kind, mount_dir=f"/disc{host}", capacity=capacity))
        scans_by_dir[host] = entries
    scans = {name: scans_by_dir[c["hostDir"]] for name, c in classes.items()}
    storage_classes = {
        name: draw(st.sampled_from([StorageClassInfo(name), StorageClassInfo(name, "Retain"), None,
                                    StorageClassInfo(name, "Recycle")]))
        for name in classes
    }

    pvs: list[Obj] = []
    journal: dict[str, JournalEntry] = {}
    names: list[str] = []
    for host in host_dirs:
        owners = [n for n, c in classes.items() if c["hostDir"] == host] + [GONE_CLASS]
        for vol in ENTRY_NAMES:
            names += [pv_name(vol, NODE.name, o) for o in owners]
            if draw(st.integers(0, 2)) == 0:  # a PV for this path (never two)
                owner = draw(st.sampled_from(owners))
                phase = draw(st.sampled_from(PHASES))
                pvs.append(make_pv(vol, owner, config=config, host_dir=host, phase=phase,
                                   policy=draw(st.sampled_from(POLICIES)), uid=draw(st.sampled_from(UIDS)),
                                   claim=phase in ("Bound", "Released") or draw(st.booleans()),
                                   deleting=draw(st.integers(0, 5)) == 0))
            if draw(st.booleans()):
                owner = draw(st.sampled_from(owners))
                journal[f"{host}/{vol}"] = JournalEntry(pv_name(vol, NODE.name, owner), owner,
                                                        draw(st.sampled_from(STATES)),
                                                        draw(st.floats(0, 100)))
    cleanups: dict[str, CleanupStatus] = {}
    for name in names:
        if draw(st.integers(0, 2)) == 0:
            state = draw(st.sampled_from([RUNNING, SUCCEEDED, FAILED]))
            # Statuses started after the generated journal transitions (staleness has its own tests).
            cleanups[name] = CleanupStatus(
                state, draw(st.floats(200, 300)), draw(st.sampled_from([None, *UIDS])),
                retry_at=draw(st.sampled_from([None, NOW - 5, NOW + 5])) if state == FAILED else None,
                attempts=draw(st.integers(1, 3)))
    collisions = {draw(st.sampled_from(names)): "elsewhere on node-x"} if draw(st.integers(0, 4)) == 0 else {}
    return make_world(config, scans, pvs=pvs, journal=journal, cleanups=cleanups, collisions=collisions,
                      storage_classes=storage_classes)


# Journal transitions one plan may make (the final value per path). Anything that ends
# clean or offered out of a dirty state needs a succeeded cleanup (checked separately).
_ALLOWED = {
    None: {OFFERED, USED, CLEANING, CLEAN},
    OFFERED: {USED, CLEANING, CLEAN},
    USED: {CLEANING, CLEAN},
    CLEANING: {CLEAN, OFFERED, USED},  # USED: claimed again through a re-created PV
    CLEAN: {OFFERED, USED, CLEANING},  # USED/CLEANING: re-claimed before its PV was deleted
}


def _succeeded_for(world: World, path: str, *names: str) -> bool:
    """A succeeded cleanup is known under any name this path goes by."""
    candidates = set(names) | {pv["metadata"]["name"] for pv in world.pvs if pv_host_path(pv) == path}
    old = world.journal.get(path)
    if old is not None:
        candidates.add(old.pv)
    return any((s := world.cleanups.get(n)) is not None and s.state == SUCCEEDED for n in candidates)


def check_invariants(world: World, result: Plan) -> None:
    """The safety rules every plan must satisfy, whatever the world."""
    before = world.journal
    after = journal_after(world, result)
    pvs_by_path: dict[str, list[Obj]] = {}
    for pv in world.pvs:
        path = pv_host_path(pv)
        if path is not None:
            pvs_by_path.setdefault(path, []).append(pv)
    pv_names = {pv["metadata"]["name"] for pv in world.pvs}
    cleanup_paths = {c.host_path for c in result.cleanups}

    # The planner never forgets a volume, and only moves along the allowed transitions.
    for path, value in result.journal.items():
        assert value is not None, f"plan removed the journal entry of {path}"
        assert value.state in STATES
        old = before.get(path)
        if old is not None and value.state == old.state:
            continue  # the record learnt the PV's uid or the volume's identity, nothing else
        assert value.state in _ALLOWED[old.state if old else None], (path, old, value)
        if value.state == CLEAN or (old is not None and old.state != CLEAN and value.state == OFFERED):
            assert _succeeded_for(world, path, value.pv), f"{path} became {value.state} without a cleanup"

    # Creates.
    create_paths = [c.host_path for c in result.creates]
    assert len(create_paths) == len(set(create_paths)), "two PVs for one path"
    create_names = [c.pv["metadata"]["name"] for c in result.creates]
    assert len(create_names) == len(set(create_names))
    for create in result.creates:
        path = create.host_path
        name = create.pv["metadata"]["name"]
        assert create.pv["spec"]["local"]["path"] == path
        assert path not in pvs_by_path, f"create over an existing PV for {path}"
        assert name not in pv_names and name not in world.collisions
        old = before.get(path)
        assert old is None or old.state in (CLEAN, CLEANING), f"create for {path} in state {old}"
        if old is not None and old.state == CLEANING:
            assert _succeeded_for(world, path, name)
        if old is None:
            assert not world.config.clean_before_first_discovery
        assert result.journal.get(path) == JournalEntry(name, create.pv["spec"]["storageClassName"], OFFERED,
                                                        world.now)
        running = world.cleanups.get(name)
        assert running is None or running.state != RUNNING, f"PV for {path} while it is being wiped"
        assert path not in cleanup_paths
        assert create.mode in ("Filesystem", "Block")

    # Deletes.
    for delete in result.deletes:
        assert after.get(delete.host_path) is not None and after[delete.host_path].state == CLEAN
        assert pv_phase(delete.pv) == "Released"
        assert delete.pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
        assert not delete.pv["metadata"].get("deletionTimestamp")
        assert delete.host_path not in cleanup_paths

    # Cleanups.
    for cleanup in result.cleanups:
        path = cleanup.host_path
        for pv in pvs_by_path.get(path, []):
            assert pv_phase(pv) == "Released", f"wiping {path} while its PV is {pv_phase(pv)}"
        if cleanup.pv is None:
            assert path not in pvs_by_path
        assert after[path].state == CLEANING
        status_ = world.cleanups.get(cleanup.pv_name)
        if status_ is not None and cleanup.pv_name not in result.forget_cleanups:
            assert status_.state != RUNNING
            if status_.state == FAILED:
                assert (status_.retry_at or 0) <= world.now
            assert cleanup.retry
        assert cleanup.container_path.startswith(cleanup.cls.mount_dir.rstrip("/") + "/")
        scan = world.scans[cleanup.cls.name]
        assert not isinstance(scan, str)
        [scanned] = [e for e in scan if e.path == cleanup.container_path]
        assert scanned.kind in (EntryKind.MOUNTPOINT, EntryKind.BLOCK)
        assert cleanup.block == (scanned.kind is EntryKind.BLOCK)

    # Orphans: confirmation only.
    for orphan in result.orphans:
        assert orphan.host_path not in result.journal
        assert orphan.host_path not in pvs_by_path
        assert before[orphan.host_path].state in (OFFERED, USED)

    # Every PV that was ever claimed is recorded as possibly holding data.
    for path, pvs in pvs_by_path.items():
        if any(pv_is_claimed(pv) for pv in pvs) and before.get(path) is None:
            assert after[path].state in (USED, CLEANING)

    # Readiness is exactly "no errors".
    assert result.ready == (not result.class_errors and not any(s.error for s in result.skipped))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_worlds())
def test_invariants_hold_for_random_worlds(world: World) -> None:
    result = plan(world)
    check_invariants(world, result)
    assert plan(world) == result  # pure and deterministic


# --------------------------------------------------------------------------- multi-pass simulation


class Sim:
    """The planner driven through many passes against a model of the cluster and the disks.

    Executors behave like ``localpv.agent.node``: journal changes are applied before the
    actions, an orphan is confirmed with a live GET, deletes carry a UID precondition,
    creates may find the name taken. ``dirty`` is the ground truth: paths whose disk
    holds tenant data that no completed cleanup has wiped since.
    """

    def __init__(self, config: ProvisionerConfig, scans: Mapping[str, Sequence[Entry]]) -> None:
        self.config = config
        self.scans = scans
        self.api: dict[str, Obj] = {}  # the API server's PVs by name
        self.cache: dict[str, Obj] = {}  # the informer's view: the API at some earlier moment
        self.journal: dict[str, JournalEntry] = {}
        self.cleanups: dict[str, CleanupStatus] = {}
        self.running: dict[str, str] = {}  # pv name -> host path being wiped
        self.collisions: dict[str, str] = {}
        self.now = 1000.0
        self.uids = itertools.count(1)
        all_paths = {f"{c.host_dir}/{e.name}" for n, c in config.classes.items() for e in scans[n]}
        # Volumes never seen have an unknown past: with cleanBeforeFirstDiscovery they count as dirty.
        self.dirty: set[str] = set(all_paths) if config.clean_before_first_discovery else set()
        self.history: list[str] = []
        self.fail_deletes = False
        # Event order, to tell whether a tenant wrote before or after a cleanup started.
        self.seq = itertools.count()
        self.dirtied_at: dict[str, int] = {}
        self.started_at: dict[str, int] = {}
        #: Claims that exist and use a volume (claim uid -> host path): never wiped under them.
        self.live: dict[str, str] = {}
        #: PVs whose claimRef an admin removed while their claim lived (name -> claim uid):
        #: the PV controller binds them back to that claim at its next resync.
        self.unclaimed_live: dict[str, str] = {}
        #: PVs unclaimed by an admin that no pass has seen yet: no claim binds them before one
        #: does (the PV watch triggers a pass at once; a bind inside that window is the
        #: residual risk docs/reliability.md states, not something the agent can see).
        self.unclaimed_unseen: set[str] = set()

    def world(self) -> World:
        return make_world(self.config, self.scans, pvs=copy.deepcopy(list(self.cache.values())),
                          journal=self.journal, cleanups=self.cleanups, collisions=self.collisions, now=self.now)

    def api_pvs_for(self, path: str) -> list[Obj]:
        return [pv for pv in self.api.values() if pv_host_path(pv) == path]

    def reconcile(self) -> Plan:
        world = self.world()
        self.unclaimed_unseen -= {n for n in self.unclaimed_unseen if self.cache.get(n) == self.api.get(n)}
        result = plan(world)
        check_invariants(world, result)
        for create in result.creates:
            assert create.host_path not in self.dirty, (
                f"dirty volume {create.host_path} offered again; history: {self.history}")
        for cleanup in result.cleanups:
            for pv in self.api_pvs_for(cleanup.host_path):
                seen = self.cache.get(pv["metadata"]["name"])
                if seen is not None and pv_phase(seen) == "Released" and \
                        pv["spec"].get("claimRef") != seen["spec"].get("claimRef"):
                    # An admin cleared the claimRef (and maybe a claim bound it) after the cache
                    # saw it Released: a race the agent cannot see; the next pass takes it back.
                    continue
                assert pv_phase(pv) == "Released", f"wiping {cleanup.host_path} under a {pv_phase(pv)} PV"
            # Never wipe under a claim the agent knows of (journal or cache) that still lives.
            record = world.journal.get(cleanup.host_path)
            known = {pv_claim_uid(pv) for pv in world.pvs if pv_host_path(pv) == cleanup.host_path}
            known |= {record.claim} if record is not None else set()
            assert not any(self.live.get(c) == cleanup.host_path for c in known if c), (
                f"wiping {cleanup.host_path} while a claim uses it; history: {self.history}")
        # Executors, in node.py's order.
        self.journal = journal_after(world, result)
        for name in result.forget_cleanups:
            if name in self.cleanups and self.cleanups[name].state != RUNNING:
                del self.cleanups[name]
        for orphan in result.orphans:
            live = self.api.get(orphan.pv_name)
            if live is None:
                self.journal[orphan.host_path] = orphan.entry.with_state(CLEANING, self.now)
        for retract in result.retracts:
            live = self.api.get(retract.pv["metadata"]["name"])
            if live is not None and live["metadata"]["uid"] == retract.pv["metadata"]["uid"] and \
                    live == retract.pv:  # the uid and resourceVersion preconditions
                del self.api[retract.pv["metadata"]["name"]]
                self.unclaimed_live.pop(retract.pv["metadata"]["name"], None)
        for restore in result.restores:
            name = restore.pv["metadata"]["name"]
            live = self.api.get(name)
            if live is not None and live == restore.pv:  # same preconditions; then the PV controller
                uid = restore.claim_ref["uid"]
                live["spec"]["claimRef"] = dict(restore.claim_ref)
                live["status"] = {"phase": "Bound" if uid in self.live else "Released"}
                self.unclaimed_live.pop(name, None)
        # Our own PV over a volume the journal says is not clean is never left on offer.
        for pv in world.pvs:
            path = pv_host_path(pv)
            record = world.journal.get(path or "")
            if record is not None and record.state in (USED, CLEANING) and record.pv == pv["metadata"]["name"] \
                    and on_offer(pv):
                assert self.api.get(record.pv) != pv, f"{path} left on offer while {record.state}: {self.history}"
        for cleanup in result.cleanups:
            previous = self.cleanups.get(cleanup.pv_name)
            if previous is not None and previous.state == RUNNING:
                continue
            attempts = previous.attempts + 1 if previous and previous.state == FAILED else 1
            uid = (cleanup.pv or {}).get("metadata", {}).get("uid")
            self.cleanups[cleanup.pv_name] = CleanupStatus(RUNNING, self.now, uid, attempts=attempts)
            self.running[cleanup.pv_name] = cleanup.host_path
            self.started_at[cleanup.pv_name] = next(self.seq)
        for delete in result.deletes:
            name = delete.pv["metadata"]["name"]
            if self.fail_deletes:
                continue  # node.py: an API error leaves the PV and the tracker's status in place
            live = self.api.get(name)
            if live is not None and live != delete.pv:
                continue  # Conflict (the uid and resourceVersion preconditions): the next pass decides
            if live is not None:
                del self.api[name]
            if name in self.cleanups and self.cleanups[name].state != RUNNING:
                del self.cleanups[name]  # ProcTable.forget
        for create in result.creates:
            name = create.pv["metadata"]["name"]
            if name in self.api:
                if pv_host_path(self.api[name]) != create.host_path:
                    self.journal.pop(create.host_path, None)
                    self.collisions[name] = "taken"
                continue
            pv = copy.deepcopy(create.pv)
            pv["metadata"]["uid"] = f"uid-{next(self.uids)}"
            pv["status"] = {"phase": "Available"}
            self.api[name] = pv
            record = self.journal.get(create.host_path)
            if record is not None and record.pv == name and not record.pv_uid:  # Executor._remember_uid
                self.journal[create.host_path] = replace(record, pv_uid=pv["metadata"]["uid"])
        return result

    def finish_cleanups(self, data: st.DataObject) -> None:
        for name, path in sorted(self.running.items()):
            outcome = data.draw(st.sampled_from(["running", "ok", "ok", "fail"]), label=f"cleanup {name}")
            if outcome == "running":
                continue
            del self.running[name]
            current = self.cleanups[name]
            if outcome == "ok":
                self._wiped(name, path)
                self.cleanups[name] = replace(current, state=SUCCEEDED, finished=self.now)
            else:
                self.cleanups[name] = replace(current, state=FAILED, finished=self.now, retry_at=self.now + 15)
            self.history.append(f"t={self.now} cleanup {name} {outcome}")

    def _wiped(self, name: str, path: str) -> None:
        # Data written after the cleaner started may survive it.
        if self.dirtied_at.get(path, -1) < self.started_at[name]:
            self.dirty.discard(path)

    def finish_all(self) -> None:
        for name, path in list(self.running.items()):
            self._wiped(name, path)
            self.cleanups[name] = replace(self.cleanups[name], state=SUCCEEDED, finished=self.now)
            del self.running[name]

    def tenants_and_admins(self, data: st.DataObject) -> None:
        for name, claim_uid in sorted(self.unclaimed_live.items()):
            pv = self.api.get(name)
            if pv is None or pv["spec"].get("claimRef") or claim_uid not in self.live:
                del self.unclaimed_live[name]
            elif data.draw(st.booleans(), label=f"PV controller rebinds {name}"):  # its claim resync
                pv["spec"]["claimRef"] = {"name": "data", "namespace": "ns", "uid": claim_uid}
                pv["status"] = {"phase": "Bound"}
                del self.unclaimed_live[name]
        for name in sorted(self.api):
            pv = self.api[name]
            phase = pv_phase(pv)
            choices = ["none", "none", "admin-delete"]
            if phase == "Available" and name not in self.unclaimed_unseen:
                choices += ["bind", "bind"]
            elif phase == "Bound":
                choices += ["release", "release"]
            path = pv_host_path(pv)
            assert path is not None
            # Admins clearing a claimRef are simulated; some such stories expose data the agent
            # never saw written (bound, written, released and unclaimed between two passes).
            if phase in ("Bound", "Released"):
                choices.append("unclaim")  # an admin "unsticks" it: kubectl patch ... remove /spec/claimRef
            action = data.draw(st.sampled_from(choices), label=f"{name} {phase}")
            claim_uid = str(pv["spec"].get("claimRef", {}).get("uid", ""))
            if action == "bind":
                old = self.unclaimed_live.pop(name, None)
                if old is not None:
                    self.live.pop(old, None)  # that claim is Lost now: another one has its PV
                claim_uid = f"claim-{next(self.uids)}"
                pv["spec"]["claimRef"] = {"name": "data", "namespace": "ns", "uid": claim_uid}
                pv["status"] = {"phase": "Bound"}
                self.dirty.add(path)
                self.dirtied_at[path] = next(self.seq)
                self.live[claim_uid] = path
            elif action == "release":
                pv["status"] = {"phase": "Released"}
                self.live.pop(claim_uid, None)
            elif action == "unclaim":
                pv["spec"].pop("claimRef", None)
                pv["status"] = {"phase": "Available"}
                self.unclaimed_unseen.add(name)
                if claim_uid in self.live:
                    self.unclaimed_live[name] = claim_uid
            elif action == "admin-delete":
                del self.api[name]
                # The claim is Lost (its pod gone with it): the agent then cleans the orphan.
                self.live.pop(self.unclaimed_live.pop(name, claim_uid), None)
            if action != "none":
                self.history.append(f"t={self.now} {action} {name} ({phase})")

    def restart(self) -> None:
        """The agent is killed: running cleaners die with it, the tracker is empty, caches relist."""
        self.cleanups.clear()
        self.running.clear()
        self.collisions.clear()
        self.cache = copy.deepcopy(self.api)
        self.history.append(f"t={self.now} restart")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans(), st.booleans())
def test_no_dirty_volume_is_ever_offered_over_many_passes(data: st.DataObject, block_class: bool,
                                                         clean_first: bool) -> None:
    classes: dict[str, Mapping[str, Any]] = {"sc1": FS}
    scans: dict[str, list[Entry]] = {"sc1": [mnt("v1"), mnt("v2")]}
    if block_class:
        classes["blk"] = BLK
        scans["blk"] = [blk("sdb")]
    config = make_config(classes, cleanBeforeFirstDiscovery=clean_first)
    sim = Sim(config, scans)
    for _ in range(14):
        if data.draw(st.integers(0, 9), label="restart") == 0:
            sim.restart()
        elif data.draw(st.booleans(), label="cache syncs"):
            sim.cache = copy.deepcopy(sim.api)
        sim.fail_deletes = data.draw(st.integers(0, 3), label="DELETE fails") == 0
        sim.reconcile()
        sim.finish_cleanups(data)
        sim.tenants_and_admins(data)
        sim.now += 10
    # Liveness: left alone (cache in sync, cleaners succeeding), every volume comes back.
    sim.fail_deletes = False
    sim.live.clear()  # every tenant deletes its claim (below: its PV becomes Released)
    for _ in range(8):
        sim.cache = copy.deepcopy(sim.api)
        sim.reconcile()
        sim.finish_all()
        for pv in sim.api.values():
            if pv_phase(pv) == "Bound":
                pv["status"] = {"phase": "Released"}
        sim.now += 100
    offered = {pv_host_path(pv) for pv in sim.api.values() if pv_phase(pv) == "Available"}
    expected = {f"{c.host_dir}/{e.name}" for n, c in config.classes.items() for e in scans[n]}
    assert offered == expected, sim.history


def _bind(sim: Sim, name: str, claim: str) -> None:
    pv = sim.api[name]
    pv["spec"]["claimRef"] = {"name": claim, "namespace": "ns", "uid": claim}
    pv["status"] = {"phase": "Bound"}
    path = pv_host_path(pv)
    assert path is not None
    sim.dirty.add(path)
    sim.dirtied_at[path] = next(sim.seq)


def _pass(sim: Sim) -> Plan:
    sim.cache = copy.deepcopy(sim.api)
    sim.now += 10
    return sim.reconcile()


def _run_stale_success_story(sim: Sim) -> None:
    """A failed PV DELETE leaves a SUCCEEDED status behind; later the same PV name is orphaned."""
    path = "/mnt/disks/v1"
    name = name_of("v1")
    assert [c.host_path for c in _pass(sim).creates] == [path]
    _bind(sim, name, "tenant-a")
    sim.api[name]["status"] = {"phase": "Released"}
    assert [c.host_path for c in _pass(sim).cleanups] == [path]
    sim.finish_all()
    sim.fail_deletes = True  # the DELETE after the successful cleanup fails (API error)
    assert [d.host_path for d in _pass(sim).deletes] == [path]
    sim.fail_deletes = False
    del sim.api[name]  # an admin removes the stuck Released PV by hand
    assert [c.host_path for c in _pass(sim).creates] == [path]  # clean: offered again, correctly
    _bind(sim, name, "tenant-b")  # a new tenant writes data
    _pass(sim)
    del sim.api[name]  # ... and the PV object is deleted (admin, node-cleanup, GC of the Node)
    for _ in range(4):
        _pass(sim)  # must clean before offering; must never offer tenant-b's data


def test_scripted_stale_success_after_failed_delete_never_offers_dirty_data() -> None:
    sim = Sim(make_config(), {"sc1": [mnt("v1")]})
    _run_stale_success_story(sim)


def test_scripted_failed_delete_then_orphan_is_cleaned_before_offering() -> None:
    # The same story without the stale status (the tracker lost it in a restart): safe.
    sim = Sim(make_config(), {"sc1": [mnt("v1")]})
    name = name_of("v1")
    _pass(sim)
    _bind(sim, name, "tenant-a")
    sim.api[name]["status"] = {"phase": "Released"}
    _pass(sim)
    sim.finish_all()
    sim.fail_deletes = True
    _pass(sim)
    sim.fail_deletes = False
    sim.restart()
    del sim.api[name]
    _pass(sim)
    _bind(sim, name, "tenant-b")
    _pass(sim)
    del sim.api[name]
    orphan = _pass(sim)
    assert [o.host_path for o in orphan.orphans] == ["/mnt/disks/v1"]
    cleaning = _pass(sim)
    assert [c.host_path for c in cleaning.cleanups] == ["/mnt/disks/v1"] and cleaning.creates == []
    sim.finish_all()
    assert [c.host_path for c in _pass(sim).creates] == ["/mnt/disks/v1"]


def test_scripted_reused_clean_pv_deleted_unseen_is_cleaned_before_offering() -> None:
    # Found by the multi-pass simulation: the cleaned PV's DELETE fails, an admin clears
    # its claimRef to reuse it, a tenant binds it and writes, and the PV is deleted before
    # any pass saw it Bound (cache lag, or an agent restart in between). The journal still
    # says clean, so the next pass re-offers the tenant's data.
    sim = Sim(make_config(), {"sc1": [mnt("v1")]})
    name = name_of("v1")
    _pass(sim)
    _bind(sim, name, "tenant-a")
    _pass(sim)
    sim.api[name]["status"] = {"phase": "Released"}
    _pass(sim)
    sim.finish_all()
    sim.fail_deletes = True
    assert [d.pv["metadata"]["name"] for d in _pass(sim).deletes] == [name]  # fails: PV stays Released
    sim.fail_deletes = False
    sim.api[name]["spec"].pop("claimRef")  # the admin "reuses" the stuck PV
    sim.api[name]["status"] = {"phase": "Available"}
    _pass(sim)  # seen Available: fine, the volume is clean
    _bind(sim, name, "tenant-b")  # bound and written ...
    del sim.api[name]  # ... and gone before the agent's cache showed it Bound
    for _ in range(3):
        _pass(sim)


def test_sim_reaches_steady_state_without_actions() -> None:
    sim = Sim(make_config({"sc1": FS, "blk": BLK}), {"sc1": [mnt("v1")], "blk": [blk("sdb")]})
    sim.reconcile()
    sim.cache = copy.deepcopy(sim.api)
    second = sim.reconcile()
    assert second.creates == [] and second.journal == {} and second.orphans == []
    assert {pv_host_path(pv) for pv in sim.api.values()} == {"/mnt/disks/v1", "/dev/localblk/sdb"}

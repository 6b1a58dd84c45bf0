"""Rule 5: discovery offers one PV per eligible entry - never two for one path or one volume,
never over another node's name, and, while the journal is recovering, only after a clean."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, JournalEntry, is_detached
from localpv.agent.model import DIRTY, RUNNING, CreatePV, EventSpec, Plan, Skipped, World
from localpv.agent.planner.common import _classify_for, _set, _Volume
from localpv.agent.planner.release import _current_status, _plan_cleanup_step
from localpv.agent.pvbuilder import StorageClassInfo, VolumeSpec, build_pv
from localpv.config import ClassConfig
from localpv.host.scan import Entry, EntryKind
from localpv.kube.events import WARNING
from localpv.kube.objects import (
    Obj,
    pv_host_path,
)
from localpv.kube.objects import meta as pv_meta
from localpv.naming import parse_quantity, pv_name, round_capacity


def _plan_discovery(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], volumes: Mapping[str, _Volume],
    out: Plan,
) -> None:
    by_name = {str(pv_meta(pv).get("name")): pv for pv in world.pvs}
    claimed: set[str] = set(by_path)
    owners = _ident_owners(world, journal, by_path, volumes)
    for cls_name in sorted(world.config.classes):
        cls = world.config.classes[cls_name]
        scan = world.scans.get(cls_name)
        if isinstance(scan, str) or scan is None:
            out.class_errors[cls_name] = scan or "not scanned"
            continue
        sc = world.storage_classes.get(cls_name)
        if sc is None:
            out.class_errors[cls_name] = f'StorageClass "{cls_name}" not found'
            continue
        if sc.reclaim_policy not in ("Delete", "Retain"):
            out.class_errors[cls_name] = (f'StorageClass "{cls_name}" has reclaim policy {sc.reclaim_policy}; '
                                          "only Delete and Retain are supported")
            continue
        for entry in scan:
            if cls.name_pattern.matches(entry.name):
                _discover_entry(world, journal, cls, sc, entry, by_name, claimed, owners, out)


def _discover_entry(
    world: World,
    journal: dict[str, JournalEntry],
    cls: ClassConfig,
    sc: StorageClassInfo,
    entry: Entry,
    by_name: Mapping[str, Obj],
    claimed: set[str],
    owners: dict[str, str],
    out: Plan,
) -> None:
    bad_name = _name_problem(entry.name)
    if bad_name:
        out.skipped.append(Skipped(entry.path, cls.name, bad_name, True))
        return
    host_path = f"{cls.host_dir.rstrip('/')}/{entry.name}"
    name = pv_name(entry.name, world.node.name, cls.name)
    existing = by_name.get(name)
    held = out.held.get(host_path)
    if held is not None:
        out.skipped.append(Skipped(entry.path, cls.name, f"held: {held.reason}", False))
        claimed.add(host_path)
        return
    if existing is not None and pv_host_path(existing) == host_path:
        _account_existing(existing, entry, out)
        return
    if host_path in claimed:
        owner = next((p for p in world.pvs if pv_host_path(p) == host_path), None)
        record = journal.get(host_path)
        who = (f"PV {pv_meta(owner).get('name')}" if owner else
               f"volume {record.pv} ({record.state})" if record else "another class in this pass")
        out.skipped.append(Skipped(entry.path, cls.name, f"path {host_path} is already used by {who}", False))
        return
    if existing is not None or name in world.collisions:
        other = world.collisions.get(name) or f"path {pv_host_path(existing or {})}"
        out.skipped.append(Skipped(entry.path, cls.name,
                                   f"PV name {name} already belongs to another volume ({other})", True))
        return
    mode, problem = _classify_for(entry, cls)
    if mode is None or entry.capacity is None:
        out.skipped.append(Skipped(entry.path, cls.name, problem or entry.reason or "capacity unknown", True))
        return
    twin = owners.get(entry.identity.value) if entry.identity.value else None
    twin = twin or owners.get(entry.ident or "")
    if twin is not None and twin != host_path:
        where = "a record kept for it after it was replaced at its old path" if is_detached(twin) else twin
        out.skipped.append(Skipped(entry.path, cls.name, f"it is the same volume as {where}: "
                                   f"{_owner_state(journal, twin)}", False))
        claimed.add(host_path)
        return
    running = world.cleanups.get(name)
    if running is not None and running.state == RUNNING:
        out.skipped.append(Skipped(entry.path, cls.name, "cleanup in progress", False))
        claimed.add(host_path)
        return
    record = journal.get(host_path)
    if record is not None and record.state != CLEAN:
        out.skipped.append(Skipped(entry.path, cls.name, f"waiting for cleanup ({record.state})", False))
        claimed.add(host_path)
        return
    if record is None and (world.config.clean_before_first_discovery or world.recovering):
        fresh = JournalEntry(name, cls.name, CLEANING, world.now, ident=entry.ident or "",
                             identity=entry.identity.value, boot=world.boot if entry.ident else "")
        _set(journal, out, host_path, fresh)
        status = _current_status(world, out, name, fresh, None)
        _plan_cleanup_step(world, journal, out, name, host_path, cls, None, status)
        why = ("cleaning before first discovery" if world.config.clean_before_first_discovery else
               "cleaning before first offer: the cleanup journal is new (first start, or the state dir was lost), "
               "so nothing proves this volume clean")
        out.skipped.append(Skipped(entry.path, cls.name, why, False))
        claimed.add(host_path)
        return
    claimed.add(host_path)
    for key in (entry.ident, entry.identity.value):
        if key:
            owners[key] = host_path
    spec = VolumeSpec(name, host_path, entry.capacity, mode, cls)
    pv = build_pv(spec, world.node, sc, world.config, world.provisioner)
    _set(journal, out, host_path, JournalEntry(name, cls.name, OFFERED, world.now, ident=entry.ident or "",
                                               identity=entry.identity.value,
                                               boot=world.boot if entry.ident else ""))
    out.creates.append(CreatePV(pv, host_path, mode, entry.capacity, entry))
    out.capacity[mode] += round_capacity(entry.capacity)


def _ident_owners(
    world: World, journal: Mapping[str, JournalEntry], by_path: Mapping[str, Obj], visible: Mapping[str, _Volume]
) -> dict[str, str]:
    """Identity -> the path under which the journal holds that volume.

    Another spelling of such a volume must not get a PV of its own: while it may hold
    data (used, cleaning) it must not be offered at all, and while it is on offer or
    in use under one path a second PV would let two claims share it. A record whose
    path names nothing now (the volume was unmounted) owns its identity only while it
    may hold data: an anonymous device number (tmpfs) is reused by unrelated mounts. Numbers
    of another boot own nothing: a reboot deals them out to other volumes.
    """
    owners: dict[str, str] = {}
    for path, record in sorted(journal.items()):
        if record.state == CLEAN:
            continue
        unknown_past = record.state == OFFERED and path not in by_path  # its PV is gone: may hold data
        if record.state in DIRTY or unknown_past or (path in visible and path in by_path):
            keys = (record.identity, record.numbers_in(world.boot))
        elif path in by_path and not record.identity:
            # Published, its path showing nothing now, and known by its numbers only: those numbers
            # at another path are this volume (a `mount --move` keeps them) as far as anything can
            # tell - or an unrelated mount that reuses a freed anonymous number. A second PV for it
            # would offer one volume twice, and once it is moved back the first PV is on offer over
            # whatever the second one's tenant wrote. Refused while the PV is there, and said.
            keys = ("", record.numbers_in(world.boot))
        else:
            continue
        for key in keys:
            if key:
                owners.setdefault(key, path)
    return owners


def _owner_state(journal: Mapping[str, JournalEntry], path: str) -> str:
    record = journal.get(path)
    if record is None:
        return "published under that path in this pass"
    if record.state in DIRTY:
        return f"waiting for its cleanup ({record.state})"
    return f"already published as PV {record.pv}"


def _name_problem(name: str) -> str | None:
    """Entry names end up in ``spec.local.path`` and in the kubelet's mount calls: refuse
    names that cannot travel as UTF-8 JSON unchanged or that hold control characters."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return f"entry name {name!a} is not valid UTF-8; rename it"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"entry name {name!a} contains control characters; rename it"
    return None


def _account_existing(pv: Obj, entry: Entry, out: Plan) -> None:
    """An existing PV for this entry: count its capacity; flag a Block PV now a directory."""
    mode = str((pv.get("spec") or {}).get("volumeMode") or "Filesystem")
    if mode == "Block" and entry.kind is EntryKind.MOUNTPOINT:
        out.events.append(EventSpec(pv, WARNING, "VolumeFailedDelete",
                                    f"Block volume {pv_host_path(pv)} is now a mounted filesystem"))
    storage = ((pv.get("spec") or {}).get("capacity") or {}).get("storage")
    with contextlib.suppress(ValueError):
        out.capacity[mode if mode in out.capacity else "Filesystem"] += parse_quantity(str(storage))

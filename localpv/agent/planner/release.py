"""Rules 1 and 4: a volume that may hold data is cleaned before it is offered again; a
Released PV with reclaim policy Delete is deleted only once its cleanup succeeded."""

from __future__ import annotations

from collections.abc import Mapping

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, USED, JournalEntry, is_detached
from localpv.agent.model import (
    CLOCK_TOLERANCE,
    FAILED,
    RUNNING,
    SUCCEEDED,
    CleanupStatus,
    ConfirmOrphan,
    DeletePV,
    EventSpec,
    Plan,
    StartCleanup,
    World,
)
from localpv.agent.planner.common import _find_entry, _node_event_target, _set
from localpv.config import ClassConfig
from localpv.host.scan import EntryKind
from localpv.kube.events import NORMAL, WARNING
from localpv.kube.objects import (
    Obj,
    pv_host_path,
    pv_phase,
)
from localpv.kube.objects import meta as pv_meta


def _plan_deletions(world: World, journal: dict[str, JournalEntry], out: Plan) -> None:
    for pv in world.pvs:
        meta = pv_meta(pv)
        if pv_phase(pv) != "Released" or meta.get("deletionTimestamp"):
            continue
        policy = str((pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") or "")
        if policy == "Retain":
            continue
        if policy == "Recycle":
            out.events.append(EventSpec(pv, WARNING, "VolumeUnsupportedReclaimPolicy",
                                        "Volume has unsupported PersistentVolumeReclaimPolicy: Recycle"))
            continue
        if policy != "Delete":
            out.events.append(EventSpec(pv, WARNING, "VolumeUnknownReclaimPolicy",
                                        f"Volume has unrecognized PersistentVolumeReclaimPolicy: {policy}"))
            continue
        _plan_release(world, journal, pv, out)


def _plan_release(world: World, journal: dict[str, JournalEntry], pv: Obj, out: Plan) -> None:
    """A Released+Delete PV: clean, then delete it once the journal says clean."""
    name = str(pv_meta(pv).get("name"))
    path = pv_host_path(pv)
    cls_name = str((pv.get("spec") or {}).get("storageClassName") or "")
    cls = world.config.classes.get(cls_name)
    if path is None or cls is None:
        why = "it is not a local volume" if path is None else f"Unknown storage class name {cls_name!r}"
        out.events.append(EventSpec(pv, WARNING, "VolumeFailedDelete", f"Cannot clean volume: {why}"))
        return
    if path in out.held:
        return  # what the path shows is not the volume this PV is about: see _follow_identities
    same_path = [other for other in world.pvs if other is not pv and pv_host_path(other) == path]
    sharing = [other for other in same_path if pv_phase(other) != "Released"]
    if any(str(pv_meta(other).get("name")) < name for other in same_path) and not sharing:
        return  # duplicates for one volume are reclaimed one at a time, in name order
    if sharing:
        # Duplicate PVs for one path (e.g. made by upstream under two class names): the
        # volume is in use or on offer through the other one; wiping it would destroy or
        # expose that tenant's data.
        others = ", ".join(sorted(str(pv_meta(o).get("name")) for o in sharing))
        out.events.append(EventSpec(pv, WARNING, "VolumeFailedDelete",
                                    f"Not cleaning {path}: the same volume is also published as PV {others}"))
        return
    entry = journal.get(path) or JournalEntry(name, cls_name, USED, world.now)
    uid = str(pv_meta(pv).get("uid") or "")
    status = _current_status(world, out, name, entry, uid)
    if entry.state != CLEAN:
        _set(journal, out, path, entry.with_state(CLEANING, world.now) if entry.state != CLEANING else entry)
    if status is not None and status.state == RUNNING:
        return  # never delete (or re-offer) while this volume is being wiped
    if entry.state == CLEAN and status is not None and status.state == SUCCEEDED:
        out.deletes.append(DeletePV(pv, path, _is_block(world, cls, path), status))
        return
    if entry.state == CLEAN:
        # Clean per the journal but the tracker forgot (agent restart after the clean,
        # before the delete): deleting is safe, the volume was verified clean.
        out.deletes.append(DeletePV(pv, path, _is_block(world, cls, path),
                                    CleanupStatus(SUCCEEDED, entry.since, uid, entry.since)))
        return
    _plan_cleanup_step(world, journal, out, name, path, cls, pv, status)


def _current_status(world: World, out: Plan, name: str, entry: JournalEntry, uid: str | None) -> CleanupStatus | None:
    """The tracker's status for ``name`` if it concerns the volume's current dirt.

    A finished cleanup that started before the volume was last marked offered, used or
    to-be-cleaned (or that belongs to another incarnation of the PV) says nothing about
    the data on it now: it is forgotten rather than trusted.
    """
    status = world.cleanups.get(name)
    if status is None or status.state == RUNNING or entry.state == CLEAN:
        return status
    stale = status.started < entry.since - CLOCK_TOLERANCE or (uid is not None and status.pv_uid not in (None, uid))
    if stale:
        out.forget_cleanups.append(name)
        return None
    return status


def _is_block(world: World, cls: ClassConfig, host_path: str) -> bool:
    container = cls.container_path(host_path)
    entry = _find_entry(world, cls, container) if container else None
    return entry is not None and entry.kind is EntryKind.BLOCK


def _plan_cleanup_step(
    world: World,
    journal: dict[str, JournalEntry],
    out: Plan,
    name: str,
    path: str,
    cls: ClassConfig,
    pv: Obj | None,
    status: CleanupStatus | None,
) -> None:
    """Advance the cleanup of one volume that is in state ``cleaning``."""
    if status is not None and status.state == RUNNING:
        return
    if status is not None and status.state == SUCCEEDED:
        entry = journal[path]
        _set(journal, out, path, entry.with_state(CLEAN, world.now))
        if pv is not None:
            block = _is_block(world, cls, path)
            out.deletes.append(DeletePV(pv, path, block, status))
        else:
            out.forget_cleanups.append(name)
        return
    if status is not None and status.state == FAILED:
        target = pv or _node_event_target(world.node)
        out.events.append(EventSpec(target, WARNING, "VolumeFailedDelete",
                                    f"Cleanup of {path} failed (attempt {status.attempts}): {status.message}; "
                                    "the volume is not offered until a cleanup succeeds", once=True))
        if (status.retry_at or 0) > world.now:
            return
    container = cls.container_path(path)
    volume = _find_entry(world, cls, container) if container else None
    target = pv or _node_event_target(world.node)
    if container is None or volume is None or volume.kind not in (EntryKind.MOUNTPOINT, EntryKind.BLOCK):
        why = ("it is outside the class's hostDir" if container is None else
               f'volume "{container}" was not found' if volume is None else
               volume.reason or f'"{container}" is neither a mounted filesystem nor a block device')
        # Said once, not on every pass: a disk removed for good keeps its record (if it is
        # plugged in again, still dirty, it must be cleaned before it is offered) and would
        # otherwise warn every few seconds for ever. ``localpv status`` still lists it.
        out.events.append(EventSpec(target, WARNING, "VolumeFailedDelete",
                                    f"Cannot clean volume {path}: {why}; it stays unavailable until it can be",
                                    once=True))
        return
    block = volume.kind is EntryKind.BLOCK
    reason = "released" if pv is not None else "its PV disappeared before the volume was cleaned"
    if pv is not None and block:
        out.events.append(EventSpec(pv, NORMAL, "VolumeDelete",
                                    "Deleting volume, this may take a while" if status is None else
                                    f"Retrying cleanup (attempt {status.attempts + 1}): {status.message}"))
    record = journal.get(path)
    identity = record.identity if record is not None else ""
    numbers = record.numbers_in(world.boot) if record is not None and not identity else ""
    out.cleanups.append(StartCleanup(name, path, container, cls, block, reason, pv, retry=status is not None,
                                     identity=identity, numbers=numbers))


def _plan_orphans(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], out: Plan
) -> None:
    """Journal entries without a PV: the volume may hold data nobody cleaned."""
    for path, entry in sorted(journal.items()):
        if path in by_path or entry.state == CLEAN or is_detached(path) or path in out.held:
            continue
        cls = world.config.classes.get(entry.cls)
        if cls is None:
            # The class was removed from the config: leave the record, do not offer it.
            continue
        if entry.state in (OFFERED, USED):
            out.orphans.append(ConfirmOrphan(entry.pv, path, entry))
            continue
        status = _current_status(world, out, entry.pv, entry, None)
        _plan_cleanup_step(world, journal, out, entry.pv, path, cls, None, status)

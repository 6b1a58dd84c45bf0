"""What the planner's rules share: the journal under change, the scanned volumes, and the
small verdicts several rules ask (is a PV on offer, was it ever bound)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from localpv.agent.journal import CLEAN, CLEANING, JournalEntry
from localpv.agent.model import BOUND_BY_CONTROLLER, Plan, RetractPV, World
from localpv.agent.pvbuilder import NodeInfo
from localpv.config import ClassConfig
from localpv.host.scan import Entry, EntryKind
from localpv.kube.objects import (
    Obj,
    pv_claim_uid,
    pv_is_claimed,
)
from localpv.kube.objects import meta as pv_meta
from localpv.naming import pv_name


def pv_was_bound(pv: Obj) -> bool:
    """The PV controller bound it to a claim at some time (see :data:`BOUND_BY_CONTROLLER`)."""
    return BOUND_BY_CONTROLLER in (pv_meta(pv).get("annotations") or {})


def pv_on_offer(pv: Obj) -> bool:
    """Any claim may bind it now: no claimRef at all, not Bound or Released, not being deleted.

    A claimRef, even without a uid (pre-bound by an operator to a claim by name), means the
    PV is claimed: the PV controller binds it to that claim only. The phase alone is not
    enough: a bind writes the claimRef first and the phase ``Bound`` after it.
    """
    return not pv_is_claimed(pv) and not pv_meta(pv).get("deletionTimestamp")


def _node_event_target(node: NodeInfo) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "uid": node.uid}}


def _classify_for(entry: Entry, cls: ClassConfig) -> tuple[str | None, str | None]:
    """(volume mode of the PV, or None) and the skip reason (None when eligible)."""
    if entry.kind is EntryKind.MOUNTPOINT:
        if cls.volume_mode == "Block":
            return None, f'path "{entry.path}" is a mounted filesystem but class {cls.name} wants Block volumes'
        return "Filesystem", None
    if entry.kind is EntryKind.BLOCK:
        # A Filesystem class over a raw device is "filesystem on block": kubelet formats it.
        return cls.volume_mode, None
    if entry.kind is EntryKind.DIRECTORY:
        return None, entry.reason or f'path "{entry.path}" is not a valid mount point'
    return None, entry.reason or f'path "{entry.path}" is not a directory nor block device'


def _set(journal: dict[str, JournalEntry], out: Plan, path: str, entry: JournalEntry | None) -> None:
    if journal.get(path) == entry:
        return
    if entry is None:
        journal.pop(path, None)
    else:
        journal[path] = entry
    out.journal[path] = entry


def _previous_claim(entry: JournalEntry) -> str:
    if not entry.claim:
        return "a previous claim"
    return f"claim {entry.claim_name} (uid {entry.claim})" if entry.claim_name else f"claim {entry.claim}"


def _retract(
    world: World, journal: dict[str, JournalEntry], out: Plan, path: str, entry: JournalEntry, pv: Obj, reason: str
) -> None:
    """Delete a PV that offers a volume not known clean; the record says the volume must be
    cleaned, so the next PV for it comes only after a successful cleanup."""
    if entry.state != CLEANING:
        _set(journal, out, path, entry.with_state(CLEANING, world.now))
    out.retracts.append(RetractPV(pv, path, reason))


def _new_claim(pv: Obj, entry: JournalEntry) -> bool:
    """The PV names a claim other than the one the journal recorded."""
    return bool(entry.claim) and pv_claim_uid(pv) not in ("", entry.claim)


@dataclass(frozen=True)
class _Volume:
    """A scanned entry that is a volume of a class (mount point or block device)."""

    host_path: str
    cls: ClassConfig
    entry: Entry

    @property
    def ident(self) -> str:
        return self.entry.ident or ""

    @property
    def identity(self) -> str:
        return self.entry.identity.value


def _scanned_volumes(world: World) -> dict[str, _Volume]:
    """Every entry of every class that could be a volume, by host path."""
    found: dict[str, _Volume] = {}
    for cls_name in sorted(world.config.classes):
        cls = world.config.classes[cls_name]
        scan = world.scans.get(cls_name)
        if isinstance(scan, str) or scan is None:
            continue
        for entry in scan:
            if entry.kind in (EntryKind.MOUNTPOINT, EntryKind.BLOCK) and cls.name_pattern.matches(entry.name):
                host_path = f"{cls.host_dir.rstrip('/')}/{entry.name}"
                found.setdefault(host_path, _Volume(host_path, cls, entry))
    return found


def _find_entry(world: World, cls: ClassConfig, container_path: str) -> Entry | None:
    scan = world.scans.get(cls.name)
    if isinstance(scan, str) or scan is None:
        return None
    for entry in scan:
        if entry.path == container_path:
            return entry
    return None


def _replaceable(record: JournalEntry | None) -> bool:
    return record is None or record.state == CLEAN


def _by_ident(volumes: Mapping[str, _Volume]) -> dict[str, list[_Volume]]:
    """The scanned volumes by the numbers of this boot (several paths: one volume's aliases)."""
    index: dict[str, list[_Volume]] = {}
    for volume in volumes.values():
        if volume.ident:
            index.setdefault(volume.ident, []).append(volume)
    return index


def _seen_as(world: World, record: JournalEntry, volume: _Volume) -> JournalEntry:
    """``record`` knowing its volume by the numbers ``volume`` shows in this boot."""
    return replace(record, ident=volume.ident, boot=world.boot if volume.ident else "")


def _moved(world: World, record: JournalEntry, target: _Volume) -> JournalEntry:
    """The record of a volume that moved to ``target`` (it has no PV: a record moves only then).

    It takes the PV name of its new path. Cleanups are tracked by PV name (threads and Jobs,
    as upstream), and the old name is the one the next volume at the old path gets: a
    cleanup of this volume under the old name would be taken for a cleanup of that one.
    """
    name = pv_name(target.entry.name, world.node.name, target.cls.name)
    return replace(_seen_as(world, record, target), pv=name, pv_uid="", cls=target.cls.name)

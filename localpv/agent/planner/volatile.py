"""Rule 3 for records without a stable identity: ``volatile`` volumes (tmpfs, overlay, a whole
disk that reports no WWN or serial), and records whose identity is not known yet.

Such a record knows its volume only by the device and inode numbers the kernel dealt out
(``ident``), and those are the kernel's of one boot: the record carries the boot it saw them
in (``boot``). So a record is re-pointed only to the volume it recorded:

* its path shows its numbers of this boot: nothing to do;
* its path shows other numbers, while its own are this boot's (mounts swapped or moved with
  ``mount --move``, a volume unmounted and another mounted in its place): the path is *held*
  - not cleaned, offered, nor its PV deleted - and people are told as for any identity
  mismatch. A record without a PV follows its numbers to the one other path that shows them,
  if nobody else has that path (``VolumeMoved``); a clean record takes the volume now there;
* its numbers are another boot's: they prove nothing either way (a reboot deals them out
  again, in the order devices answer). A record whose PV is Bound is left as it is; another
  takes the volume at its path only when that volume is empty - nothing of anyone's to lose - or
  when the operator says it is the one
  (:data:`~localpv.agent.pvbuilder.ACCEPT_VOLUME_PREFIX`, :func:`acceptance`); until then a
  cleanup it would need (a Released PV, a record that may hold data without a PV) is held, and a
  PV on offer over a volume that is not empty is taken off offer (mounts swapped at the reboot
  may have put a tenant's volume there);
* it has no numbers (a record made from a PV at first sight): it takes the volume at its path.

Records of an older agent have no boot: their numbers are taken as this boot's
(:meth:`~localpv.agent.journal.JournalEntry.numbers_in`).
"""

from __future__ import annotations

from collections.abc import Mapping

from localpv.agent.journal import CLEAN, OFFERED, JournalEntry, is_detached
from localpv.agent.model import DIRTY, EventSpec, Held, Plan, RetractPV, World
from localpv.agent.planner.common import (
    _by_ident,
    _moved,
    _node_event_target,
    _replaceable,
    _scanned_volumes,
    _seen_as,
    _set,
    _Volume,
    pv_on_offer,
)
from localpv.agent.planner.identities import _hold, _live
from localpv.agent.pvbuilder import ACCEPT_VOLUME_PREFIX
from localpv.host.scan import EntryKind
from localpv.kube.events import NORMAL, WARNING
from localpv.kube.objects import Obj, pv_phase
from localpv.kube.objects import meta as pv_meta


def acceptance(world: World, volume: _Volume) -> str:
    """The value by which an operator accepts ``volume`` as a record's volume: its numbers and
    this boot's id, so that an annotation left behind names no other volume, ever."""
    return f"{volume.ident}@{world.boot}"


def _accepted(world: World, record: JournalEntry, pv: Obj | None, volume: _Volume) -> bool:
    names = {record.pv, str(pv_meta(pv).get("name") or "") if pv is not None else ""} - {""}
    return any(world.node.accepted.get(name) == acceptance(world, volume) for name in names)


def emptiness_wanted(world: World) -> dict[str, tuple[str, str]]:
    """Host path -> (container path, the class's mountDir) of every mounted volume whose record
    knows it by the numbers of another boot: whether it is empty decides whether the record may
    take it. (Only those are looked at: the look is a read of the volume's root directory.)"""
    wanted = {}
    for path, volume in _scanned_volumes(world).items():
        record = world.journal.get(path)
        if (volume.entry.kind is EntryKind.MOUNTPOINT and record is not None and not record.identity
                and record.ident and not record.numbers_in(world.boot) and not is_detached(path)):
            wanted[path] = (volume.entry.path, volume.cls.mount_dir)
    return wanted


def _follow_volumes(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], volumes: Mapping[str, _Volume],
    out: Plan,
) -> None:
    """Keep each record without a stable identity attached to the volume it recorded (see the
    module docstring): follow it, hold its path, or let it take what is there."""
    by_ident = _by_ident(volumes)
    for path in sorted(journal):
        record = journal.get(path)  # an earlier record of this pass may have moved here
        if record is None or record.identity or is_detached(path):
            continue  # known by what it is: see identities.py
        here = volumes.get(path)
        if here is None:
            _follow(world, journal, by_path, by_ident, out, path, record)
        elif here.ident:
            _at_its_path(world, journal, by_path, by_ident, out, path, record, here)


def _follow(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], by_ident: Mapping[str, list[_Volume]],
    out: Plan, path: str, record: JournalEntry,
) -> bool:
    """A record without a PV that may hold data follows its numbers of this boot to the one
    other path that shows them, unless that path is published or recorded as another volume
    (``hostDir`` changed to an alias, a mount moved). An offered record whose PV is gone may
    hold data too: the claim may have come and gone while the agent was down (the orphan check
    then cleans it where it is now). True when it moved."""
    known = record.numbers_in(world.boot)
    if record.state not in (*DIRTY, OFFERED) or not known or path in by_path:
        return False
    targets = [v for v in by_ident.get(known, [])
               if v.host_path != path and v.host_path not in by_path and _replaceable(journal.get(v.host_path))]
    if len(targets) != 1:
        return False
    target = targets[0]
    _set(journal, out, path, None)
    _set(journal, out, target.host_path, _moved(world, record, target))
    out.events.append(EventSpec(_node_event_target(world.node), WARNING, "VolumeMoved",
                                f"volume {path} ({record.state}) is now found at {target.host_path} (same "
                                "device and inode); it is cleaned there before it is offered"))
    return True


def _at_its_path(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], by_ident: Mapping[str, list[_Volume]],
    out: Plan, path: str, record: JournalEntry, here: _Volume,
) -> None:
    """``path`` shows ``here``: is it the volume ``record`` recorded?"""
    known = record.numbers_in(world.boot)
    if known == here.ident:
        if record.boot != world.boot:
            _set(journal, out, path, _seen_as(world, record, here))  # a record from before boot ids
        return
    pv = by_path.get(path)
    accepted = _accepted(world, record, pv, here)
    # An empty volume is taken only by a record whose PV is not in use: one Bound to its claim is
    # left as it is across a reboot - mounts swapped at boot would have it claim the empty volume
    # of another path, which, once put back, it would hold as its own by this boot's numbers.
    empty = not known and path in world.empty and not (pv is not None and _live(pv))
    if not record.ident or record.state == CLEAN or accepted or empty:
        # Nothing recorded to be wrong about, nothing dirty to mistake, the operator's word, or
        # an empty volume: nobody's data can be lost by taking it.
        _set(journal, out, path, _seen_as(world, record, here))
        if accepted:
            out.events.append(EventSpec(_node_event_target(world.node), NORMAL, "VolumeAccepted",
                                        f"the record of {path} ({record.state}) takes the volume now there "
                                        f"({here.ident}) as its own, as the annotation "
                                        f"{ACCEPT_VOLUME_PREFIX}{record.pv} says", once=True))
        return
    if not known:
        if _would_clean(record, pv):
            _hold_unproven(world, out, path, record, here, pv)
        elif pv is not None and pv_on_offer(pv):
            _retract_unproven(world, out, path, record, here, pv)
        return
    if pv is None and _follow(world, journal, by_path, by_ident, out, path, record):
        return
    _hold_other(world, out, by_path, by_ident, path, record, here, pv)


def _would_clean(record: JournalEntry, pv: Obj | None) -> bool:
    """Something would clean the volume at the record's path for it: a Released PV with reclaim
    policy Delete, or (no PV) a record that may hold data."""
    if pv is None:
        return record.state != CLEAN
    policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy")
    return pv_phase(pv) == "Released" and policy == "Delete" and not pv_meta(pv).get("deletionTimestamp")


def _hold_other(
    world: World, out: Plan, by_path: Mapping[str, Obj], by_ident: Mapping[str, list[_Volume]], path: str,
    record: JournalEntry, here: _Volume, pv: Obj | None,
) -> None:
    """``path`` shows another volume than the one its record saw in this boot: hold it, and the
    path its recorded volume is at now (if any), which must not be offered as a new volume."""
    elsewhere = [v for v in by_ident.get(record.ident, []) if v.host_path != path]
    where = (f"which is now at {', '.join(v.host_path for v in elsewhere)}" if elsewhere else
             "which is at no path now")
    why = (f"{path} shows the volume numbered {here.ident} in this boot, not the volume {record.ident} "
           f"({record.state}) recorded there, {where}")
    remedy = ("put each volume back at the path it was recorded at (e.g. `mount --move`; `localpv status` lists "
              "each held path with the numbers it shows and the ones recorded); or, if the volume now at the path "
              "is to be taken as the recorded one, cleaned and offered, say so: "
              f"kubectl annotate node {world.node.name} "
              f"{ACCEPT_VOLUME_PREFIX}{record.pv}={acceptance(world, here)}. Nothing on either path is cleaned, "
              "offered or deleted meanwhile")
    _hold(world, out, path, record, why, [pv, *(by_path.get(v.host_path) for v in elsewhere)], remedy=remedy)
    for other in elsewhere:
        out.held.setdefault(other.host_path, Held(other.host_path, other.cls.name,
                                                  f"it holds volume {record.ident}, recorded at {path} "
                                                  f"({record.state})"))
    if pv is not None and pv_on_offer(pv):
        # As for a disk with an identity: a PV on offer must not stay on offer over a volume
        # nobody proved clean (the volume now at the path may hold another tenant's data).
        out.held[path] = Held(path, record.cls, f"{why}; its PV is taken off offer")
        out.retracts.append(RetractPV(pv, path, f"{why} (mounts swapped or moved?): the PV is deleted so that no "
                                                "claim gets a volume nobody proved clean"))


def _hold_unproven(world: World, out: Plan, path: str, record: JournalEntry, here: _Volume, pv: Obj | None) -> None:
    """The record's numbers are another boot's and the volume at its path is not empty: it is
    not cleaned as the record's volume until the operator says it is."""
    why = (f"{path} shows the volume numbered {here.ident} in this boot; its record ({record.state}) knows its "
           f"volume only by the numbers of an earlier boot ({record.ident}), which prove nothing after a reboot, "
           "and it is not empty: it is not cleaned as that volume")
    remedy = (f"if it is the recorded volume (or its data may go), say so: kubectl annotate node {world.node.name} "
              f"{ACCEPT_VOLUME_PREFIX}{record.pv}={acceptance(world, here)} - or empty it yourself; the agent then "
              "cleans it and goes on")
    _hold(world, out, path, record, why, [pv], remedy=remedy)


def _retract_unproven(world: World, out: Plan, path: str, record: JournalEntry, here: _Volume, pv: Obj) -> None:
    """A PV on offer whose record knows its volume by the numbers of an earlier boot, over a volume
    that is not empty: mounts swapped at the reboot may have put a tenant's volume there (the
    numbers cannot tell), and any claim would get its data. The PV is taken off offer; the record,
    its PV gone, waits for the proof any cleanup after a reboot waits for (empty, or the operator's
    word)."""
    why = (f"{path} shows the volume numbered {here.ident} in this boot, which is not empty; its record "
           f"({record.state}) knows its volume only by the numbers of an earlier boot ({record.ident}), which "
           "prove nothing after a reboot")
    out.held[path] = Held(path, record.cls, f"{why}; its PV is taken off offer")
    out.retracts.append(RetractPV(pv, path, f"{why} (mounts swapped at the reboot?): the PV is deleted so that no "
                                            "claim gets a volume nobody proved clean"))

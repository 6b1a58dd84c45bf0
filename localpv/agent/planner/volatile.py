"""Rule 3 for volumes without a stable identity (tmpfs and other ``volatile`` volumes, and
records an older agent wrote): they are known by the device and inode numbers the kernel dealt
out. Records follow their volumes across paths by those numbers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from localpv.agent.journal import CLEANING, OFFERED, JournalEntry, is_detached
from localpv.agent.model import DIRTY, EventSpec, Plan, World
from localpv.agent.planner.common import _moved, _node_event_target, _replaceable, _set, _Volume
from localpv.kube.events import WARNING
from localpv.kube.objects import Obj
from localpv.naming import pv_name


def _by_ident(volumes: Mapping[str, _Volume]) -> dict[str, list[_Volume]]:
    index: dict[str, list[_Volume]] = {}
    for volume in volumes.values():
        if volume.ident:
            index.setdefault(volume.ident, []).append(volume)
    return index


def _follow_volumes(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], volumes: Mapping[str, _Volume],
    out: Plan,
) -> None:
    """Keep each record attached to its volume, whatever path names it now.

    This is the rule for records with no stable identity (volatile volumes such as tmpfs,
    and records an older agent wrote): they know their volume by the numbers of this boot.
    A record whose path still names a volume learns that volume's identity (the path is
    what the PV offers). If the identity changed while the record says the volume may
    hold data, the old identity is suspect wherever it now appears (disks renumbered,
    mounts swapped): such an entry without a PV is cleaned before it is offered. A dirty
    record whose path names nothing any more (``hostDir`` changed to an alias, the class
    renamed) follows its volume to the one path that now shows the same identity, so the
    cleanup carries on there instead of the volume being offered dirty under a new name.
    """
    by_ident = _by_ident(volumes)
    for path, record in sorted(journal.items()):
        if record.identity or is_detached(path):
            continue  # known by what it is: see _follow_identities
        here = volumes.get(path)
        if here is not None:
            if here.ident and here.ident != record.ident:
                if record.ident and record.state in DIRTY:
                    for other in by_ident.get(record.ident, []):
                        _suspect(world, journal, by_path, out, other, path)
                _set(journal, out, path, replace(journal[path], ident=here.ident))
            continue
        # An offered record whose PV is gone may hold data too: the claim may have come and
        # gone while the agent was down (the orphan check then cleans it where it is now).
        if record.state not in (*DIRTY, OFFERED) or not record.ident or path in by_path:
            continue
        targets = [v for v in by_ident.get(record.ident, [])
                   if v.host_path not in by_path and _replaceable(journal.get(v.host_path))]
        if len(targets) != 1:
            continue
        target = targets[0]
        _set(journal, out, path, None)
        _set(journal, out, target.host_path, _moved(world, record, target))
        out.events.append(EventSpec(_node_event_target(world.node), WARNING, "VolumeMoved",
                                    f"volume {path} ({record.state}) is now found at {target.host_path} (same "
                                    "device and inode); it is cleaned there before it is offered"))


def _suspect(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], out: Plan, volume: _Volume,
    previous: str,
) -> None:
    """``volume`` carries the identity a dirty volume at ``previous`` had: clean it first."""
    if volume.host_path in by_path or not _replaceable(journal.get(volume.host_path)):
        return
    name = pv_name(volume.entry.name, world.node.name, volume.cls.name)
    _set(journal, out, volume.host_path, JournalEntry(name, volume.cls.name, CLEANING, world.now,
                                                      ident=volume.ident))
    out.events.append(EventSpec(_node_event_target(world.node), WARNING, "VolumeSuspect",
                                f"{volume.host_path} has the identity the volume at {previous} had while it held "
                                "data; it is cleaned before it is offered"))

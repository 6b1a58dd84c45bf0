"""Rule 3: a volume is what it is, not how it is spelled or numbered. Records follow their
volumes across paths; a path that shows another volume than the recorded one is held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from localpv.agent.journal import CLEAN, CLEANING, JournalEntry, detached_key, is_detached
from localpv.agent.model import EventSpec, Held, Plan, RetractPV, World
from localpv.agent.planner.common import (
    _by_ident,
    _moved,
    _node_event_target,
    _replaceable,
    _seen_as,
    _set,
    _Volume,
    pv_on_offer,
)
from localpv.kube.events import WARNING
from localpv.kube.objects import (
    Obj,
    claim_event_target,
    pv_claim_name,
    pv_is_claimed,
    pv_phase,
)
from localpv.kube.objects import meta as pv_meta


def _learn_identities(
    world: World, journal: dict[str, JournalEntry], volumes: Mapping[str, _Volume], out: Plan
) -> None:
    """A record without a stable identity (written before identities, or its volume's could
    not be read) learns the identity of the volume it recorded: the one that shows its numbers
    of this boot, wherever that is now. From then on it is known by what it is.

    Never from what its path shows instead: two disks swapped before the first pass after an
    upgrade (``mount --move``, a remount by label) each keep their numbers, which then prove the
    swap; a record that took the identity at its path would know the other tenant's disk as
    its own, for good, and clean it. Learnt from where its numbers are, the record finds its
    disk at the other path, and :func:`_follow_identities` holds both paths or follows it. A
    record without numbers (made from a PV at first sight) learns what its path shows; one
    whose numbers are another boot's learns nothing here (see :mod:`.volatile`).
    """
    by_ident = _by_ident(volumes)
    for path, record in sorted(journal.items()):
        if record.identity or record.state == CLEAN or is_detached(path):
            continue
        known = record.numbers_in(world.boot)
        if known:
            found = {volume.identity for volume in by_ident.get(known, [])}
            if len(found) == 1 and (identity := found.pop()):
                _set(journal, out, path, replace(record, identity=identity, boot=world.boot))
        elif not record.ident and (here := volumes.get(path)) is not None and here.identity:
            _set(journal, out, path, replace(_seen_as(world, record, here), identity=here.identity))


def _by_identity(volumes: Mapping[str, _Volume]) -> dict[str, list[_Volume]]:
    index: dict[str, list[_Volume]] = {}
    for volume in volumes.values():
        if volume.identity:
            index.setdefault(volume.identity, []).append(volume)
    return index


def _follow_identities(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], volumes: Mapping[str, _Volume],
    out: Plan,
) -> None:
    """Never act on a volume that is not the recorded one; let records follow their volumes.

    For every record that may hold data (or whose PV is on offer) and knows its volume by a
    stable identity, what its path shows now is one of:

    * the recorded volume: nothing to do;
    * a volume whose identity cannot be read now: held (nothing proves it is the recorded one);
    * another volume, or nothing, while the recorded one is at exactly one other path
      (disks renumbered): the record follows it there (:func:`_on_moved`), unless that path
      is published or recorded as another volume, or a live claim's PV still names the old
      path - then both paths are held and people are told;
    * another volume while the recorded one is nowhere (the disk was replaced, or is not
      mounted now): :func:`_on_replaced`;
    * nothing, and the recorded volume nowhere either: as before (its cleanup says "not found").

    A held path is not cleaned, offered, nor its PV deleted, in this pass (``out.held``).
    Records detached from their path (:func:`_on_replaced`) follow their volume back to any
    path it shows up at (:func:`_on_return`).
    """
    index = _by_identity(volumes)
    moved: list[tuple[str, JournalEntry, _Volume]] = []
    replaced: list[tuple[str, JournalEntry, _Volume]] = []
    for path, record in sorted(journal.items()):
        if not record.identity or record.state == CLEAN or is_detached(path):
            continue
        here = volumes.get(path)
        if here is not None and here.identity == record.identity:
            if here.ident != record.ident or (here.ident and record.boot != world.boot):
                _set(journal, out, path, _seen_as(world, record, here))  # this boot's numbers, for aliases
            continue
        pv = by_path.get(path)
        if here is not None and pv is not None and pv_on_offer(pv):
            # Whatever else holds, a PV on offer must not stay on offer for a disk nobody
            # proved clean (the disk now at the path may hold another tenant's data).
            shows = here.entry.identity.error or f"volume {here.identity or 'without identity'}"
            out.held[path] = Held(path, record.cls, f"it shows {shows}, not the recorded volume {record.identity}; "
                                                    "its PV is taken off offer")
            out.retracts.append(RetractPV(pv, path, f"{path} shows {shows}, not the volume {record.identity} this PV "
                                                    "offers (disks renumbered, swapped or replaced?): the PV is "
                                                    "deleted so that no claim gets a disk nobody proved clean"))
            continue
        if here is not None and here.entry.identity.error:
            _hold(world, out, path, record, f"the identity of {path} cannot be read ({here.entry.identity.error}), so "
                                            f"nothing proves it is the recorded volume {record.identity}", [pv])
            continue
        elsewhere = [v for v in index.get(record.identity, []) if v.host_path != path]
        if len(elsewhere) > 1:
            paths = ", ".join(v.host_path for v in elsewhere)
            _hold(world, out, path, record, f"volume {record.identity} ({record.state}, recorded at {path}) is found "
                                            f"at several paths ({paths}); it is not cleaned anywhere until it is at "
                                            "one", [by_path.get(path)])
        elif elsewhere:
            moved.append((path, record, elsewhere[0]))
        elif here is not None:
            replaced.append((path, record, here))
    for path, record, here in replaced:
        _on_replaced(world, journal, by_path, out, path, record, here)
    for path, record, target in moved:
        _on_moved(world, journal, by_path, volumes, out, path, record, target)
    for key, record in sorted(journal.items()):
        if is_detached(key):
            _on_return(world, journal, by_path, out, key, record, index.get(record.identity, []))


def _live(pv: Obj) -> bool:
    """A claim holds this PV (Bound, or reserved for a claim), or its data is kept on purpose
    (Retain): the agent must not delete it, whatever is at its path."""
    retain = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Retain"
    return (pv_is_claimed(pv) and pv_phase(pv) != "Released") or (retain and pv_is_claimed(pv))


#: What an operator does about a held volume, said with every mismatch.
_REMEDY = ("mount each disk at its own path again, by UUID or WWN rather than by device name "
           "(e.g. UUID=... in /etc/fstab; `localpv status` lists the identity of each volume): the agent then goes "
           "on by itself. Nothing on either path is cleaned, offered or deleted meanwhile")


def _hold(world: World, out: Plan, path: str, record: JournalEntry, why: str, pvs: Sequence[Obj | None],
          remedy: str = _REMEDY) -> None:
    """Hold ``path`` for this pass and say why on the Node, the PVs and their live claims."""
    out.held[path] = Held(path, record.cls, why)
    message = f"{why}. What to do: {remedy}"
    targets: list[Obj] = [_node_event_target(world.node)]
    for pv in pvs:
        if pv is not None:
            targets.append(pv)
            claim = claim_event_target(pv)
            if claim is not None:
                targets.append(claim)
    for target in targets:
        out.events.append(EventSpec(target, WARNING, "VolumeIdentityMismatch", message, once=True))


def _shows(volumes: Mapping[str, _Volume], path: str) -> str:
    here = volumes.get(path)
    if here is None:
        return "no volume"
    return f"volume {here.identity}" if here.identity else "a volume without identity"


def _on_moved(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], volumes: Mapping[str, _Volume],
    out: Plan, path: str, record: JournalEntry, target: _Volume,
) -> None:
    """The recorded volume is now at ``target`` (disks renumbered, or mounted elsewhere)."""
    pv, pv_there = by_path.get(path), by_path.get(target.host_path)
    there = journal.get(target.host_path)
    where = (f"volume {record.identity} ({record.state}, recorded at {path}) is now at {target.host_path}, and "
             f"{path} shows {_shows(volumes, path)}")
    if pv_there is not None or not _replaceable(there):
        who = (f"PV {pv_meta(pv_there).get('name')}" + (f" (claim {pv_claim_name(pv_there)})"
                                                        if pv_claim_name(pv_there) else "")
               if pv_there is not None else f"the record of another volume ({there.state if there else ''})")
        _hold(world, out, path, record, f"{where}; {target.host_path} is published as {who}", [pv, pv_there])
        out.held[target.host_path] = Held(target.host_path, target.cls.name, f"it holds volume {record.identity}, "
                                          f"recorded at {path} ({record.state})")
        return
    if pv is None:
        _set(journal, out, path, None)
        _set(journal, out, target.host_path, _moved(world, record, target))
        out.events.append(EventSpec(_node_event_target(world.node), WARNING, "VolumeMoved",
                                    f"{where} (disks renumbered?): its record follows it, and it is cleaned there "
                                    "before it is offered"))
        return
    out.held[target.host_path] = Held(target.host_path, target.cls.name,
                                      f"it holds volume {record.identity}, recorded at {path} ({record.state})")
    if _live(pv):
        _hold(world, out, path, record, f"{where}; PV {pv_meta(pv).get('name')} still names {path} for "
                                        f"{pv_claim_name(pv) or 'its claim'}", [pv])
        return
    out.held[path] = Held(path, record.cls, f"{where}; its PV is deleted first")
    out.retracts.append(RetractPV(pv, path, f"{where}: this PV names a path that no longer holds its volume, and "
                                            "its claim is gone; it is deleted, and the volume is cleaned at its new "
                                            "path before it is offered there"))


def _on_replaced(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], out: Plan, path: str,
    record: JournalEntry, here: _Volume,
) -> None:
    """``path`` shows another volume and the recorded one is nowhere: a replaced disk (or the
    recorded one is not mounted now). The new volume is never cleaned by the old record.

    While a live claim's PV names the path, everything is held and reported (the claim's pod
    may be writing to the other volume). Otherwise the PV, whose claim is gone, is deleted;
    then the record is *detached* from the path (kept under its identity, so the old disk is
    cleaned before it is offered if it ever returns) and the path is an ordinary new volume.
    """
    pv = by_path.get(path)
    what = (f"{path} holds volume {here.identity or 'without identity'} ({here.entry.identity.how}), not the "
            f"recorded volume {record.identity} ({record.state}), which is found at no path")
    if pv is not None and _live(pv):
        _hold(world, out, path, record, f"{what}; PV {pv_meta(pv).get('name')} names it for "
                                        f"{pv_claim_name(pv) or 'a claim'}", [pv])
        return
    if pv is not None:
        out.held[path] = Held(path, record.cls, f"{what}; its PV is deleted first")
        out.retracts.append(RetractPV(pv, path, f"{what}: the disk was replaced, or the recorded one is not "
                                                "mounted now. This PV's claim is gone; the PV is deleted, and "
                                                f"{path} is then offered as a new volume"))
        return
    _set(journal, out, path, None)
    state = CLEANING if record.state != CLEANING else record.state
    since = world.now if state != record.state else record.since
    _set(journal, out, detached_key(record.identity), replace(record, state=state, since=since, ident="", boot=""))
    out.events.append(EventSpec(_node_event_target(world.node), WARNING, "VolumeReplaced",
                                f"{what}: the disk was replaced, or the recorded one is not mounted now. Its record "
                                "is kept: wherever it appears again it is cleaned before it is offered. The volume "
                                f"at {path} is treated as a new one", once=True))


def _on_return(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], out: Plan, key: str,
    record: JournalEntry, found: Sequence[_Volume],
) -> None:
    """A detached record's volume is seen again: the record takes the path it is at."""
    if len(found) != 1:
        return
    target = found[0]
    there = journal.get(target.host_path)
    if by_path.get(target.host_path) is not None or not _replaceable(there):
        out.held[target.host_path] = Held(target.host_path, target.cls.name,
                                          f"it holds volume {record.identity}, which may hold data ({record.state}) "
                                          "and whose record was detached from its old path")
        return
    _set(journal, out, key, None)
    _set(journal, out, target.host_path, _moved(world, record, target))
    out.events.append(EventSpec(_node_event_target(world.node), WARNING, "VolumeMoved",
                                f"volume {record.identity} ({record.state}), which was replaced at its old path, is "
                                f"back at {target.host_path}; it is cleaned there before it is offered"))

"""Rule 2: which PV objects are trusted, and every claim noted (a volume that was claimed may
hold data). A PV that is not the object a volume was offered as, or our own PV put on offer
by hand over a volume not known clean, is never left on offer."""

from __future__ import annotations

from dataclasses import replace

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, USED, JournalEntry
from localpv.agent.model import DIRTY, UNKNOWN_CLAIM_GRACE, EventSpec, Plan, RestoreClaim, RetractPV, World
from localpv.agent.planner.common import _new_claim, _previous_claim, _retract, _set, pv_on_offer, pv_was_bound
from localpv.kube.events import WARNING
from localpv.kube.objects import (
    Obj,
    pv_claim_name,
    pv_claim_uid,
    pv_host_path,
    pv_is_claimed,
    pv_phase,
)
from localpv.kube.objects import meta as pv_meta


def _track_usage(world: World, journal: dict[str, JournalEntry], out: Plan) -> None:
    """Record in the journal every PV that was ever claimed (its volume may hold data)."""
    names = {str(pv_meta(pv).get("name")) for pv in world.pvs}
    for pv in world.pvs:
        path = pv_host_path(pv)
        if path is None:
            continue
        meta = pv_meta(pv)
        entry = journal.get(path)
        cls = str((pv.get("spec") or {}).get("storageClassName") or "")
        claim = pv_claim_uid(pv)
        uid = str(meta.get("uid") or "")
        if entry is None:
            state = USED if pv_is_claimed(pv) else OFFERED
            _set(journal, out, path, JournalEntry(str(meta.get("name")), cls, state, world.now, claim, uid,
                                                  claim_name=pv_claim_name(pv)))
        elif _is_stranger(entry, pv, names):
            _track_stranger(world, journal, out, path, entry, pv)
        elif str(meta.get("name")) != entry.pv:
            _track_duplicate(world, journal, out, path, pv)
        elif not entry.pv_uid and uid and entry.state != CLEAN:
            # First sight of the PV we created (the create's answer was lost) or a record
            # from a journal that kept no uids: this object is the one on offer.
            _set(journal, out, path, replace(entry, pv_uid=uid))
            _track_usage_of(world, journal, out, path, pv)
        else:
            _track_usage_of(world, journal, out, path, pv)


def _track_duplicate(world: World, journal: dict[str, JournalEntry], out: Plan, path: str, pv: Obj) -> None:
    """A second PV for a recorded volume while the recorded PV still exists (upstream made
    one per class when two classes share a ``hostDir``). Its claims count as uses of the
    volume; while the volume may hold data it must not be on offer through this PV: a claim
    binding it would get (or share) another tenant's data. Such a PV is deleted; the record
    stays with the recorded PV, and no PV is made again for the path while that one exists."""
    entry = journal[path]
    if entry.state in DIRTY and pv_on_offer(pv):
        name = pv_meta(pv).get("name")
        out.retracts.append(RetractPV(pv, path, f"PV {name} offers volume {path}, which is also published as PV "
                                                f"{entry.pv} and is {entry.state} (may hold data of "
                                                f"{_previous_claim(entry)}); the duplicate is deleted"))
        return
    _track_usage_of(world, journal, out, path, pv, own=False)


def _is_stranger(entry: JournalEntry, pv: Obj, names: set[str]) -> bool:
    """The PV is not the object the volume was offered as: the recorded PV was replaced by
    one of the same name and another uid, or is gone and another name now claims the path.
    (A second PV while the recorded one still exists is a duplicate, handled as such.)"""
    meta = pv_meta(pv)
    uid = str(meta.get("uid") or "")
    if str(meta.get("name")) == entry.pv:
        return bool(entry.pv_uid) and bool(uid) and uid != entry.pv_uid
    return entry.pv not in names


def _track_usage_of(
    world: World, journal: dict[str, JournalEntry], out: Plan, path: str, pv: Obj, *, own: bool = True
) -> None:
    """The PV is the object the journal knows (or, ``own`` False, a duplicate of it): note a
    first claim or a new claim."""
    entry = journal[path]
    claim = pv_claim_uid(pv)
    claim_name = pv_claim_name(pv)
    if own and entry.state in DIRTY and pv_on_offer(pv):
        _unclaimed_while_dirty(world, journal, out, path, entry, pv)
    elif own and entry.state == OFFERED and pv_on_offer(pv) and pv_was_bound(pv):
        # Bound, used and unclaimed all between two passes (or while the agent was down):
        # the journal never saw the claim, but the PV controller's mark says there was one.
        _set(journal, out, path, replace(entry, state=USED, since=world.now, claim="", claim_name=""))
        out.events.append(EventSpec(pv, WARNING, "VolumeUseUnseen",
                                    f"PV is on offer but was bound to a claim the agent never saw (its claimRef "
                                    f"was removed): volume {path} may hold that claim's data. It is taken back "
                                    f"and cleaned unless a claim is bound to it within {UNKNOWN_CLAIM_GRACE:.0f} s"))
    elif entry.state == OFFERED and pv_is_claimed(pv):
        _set(journal, out, path, replace(entry, state=USED, since=world.now, claim=claim, claim_name=claim_name))
    elif entry.state == CLEAN and (pv_phase(pv) != "Released" or _new_claim(pv, entry)):
        # A clean entry with a PV is normally the cleaned PV awaiting deletion. If that
        # PV is on offer or bound again (an admin cleared its claimRef), it may hold or
        # soon hold a new tenant's data: track it like any other offered volume.
        state = USED if pv_is_claimed(pv) else OFFERED
        uid = str(pv_meta(pv).get("uid") or "") if own else entry.pv_uid  # a duplicate is not the PV recorded
        _set(journal, out, path, replace(entry, state=state, since=world.now, claim=claim, pv_uid=uid,
                                         claim_name=claim_name))
    elif entry.state in DIRTY and _claimed_by_another(pv, entry):
        # Another claim got the volume while it was not known clean (its claimRef was
        # cleared and another claim bound before the agent took it back): that tenant may
        # see the previous one's data, and cleanups that started before now say nothing
        # about it. It is cleaned when that claim releases it.
        _set(journal, out, path, replace(entry, state=USED, since=world.now, claim=claim, claim_name=claim_name))
        if not own:
            return  # duplicates take turns in the record; the sharing itself is reported on release
        previous = _previous_claim(entry)
        retain = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Retain"
        then = ("reclaim policy Retain keeps it when this claim releases it" if retain else
                "it is cleaned when this claim releases it")
        out.events.append(EventSpec(pv, WARNING, "VolumeNotCleaned",
                                    f"PV was bound to claim {claim_name or claim} while its volume {path} was "
                                    f"{entry.state} (not cleaned since {previous} used it): it may hold data of "
                                    f"{previous}; {then}"))
    elif entry.state in DIRTY and claim and claim == entry.claim and claim_name != entry.claim_name:
        # A record written before claim names were kept: learn it while the PV still shows it.
        _set(journal, out, path, replace(entry, claim_name=claim_name))


def _claimed_by_another(pv: Obj, entry: JournalEntry) -> bool:
    """The PV is claimed by another claim than the one whose data the volume may hold."""
    if _new_claim(pv, entry):
        return True
    # A record that never knew its claim: ``cleaning`` comes from a Released PV (its claim
    # gone), so the PV Bound again means a new claim.
    return entry.state == CLEANING and not entry.claim and pv_phase(pv) == "Bound" and bool(pv_claim_uid(pv))


def _unclaimed_while_dirty(
    world: World, journal: dict[str, JournalEntry], out: Plan, path: str, entry: JournalEntry, pv: Obj
) -> None:
    """Our own PV is on offer (no claimRef) while its volume is not known clean.

    Nothing in the agent's own flow does this: the volume was offered clean, then bound
    (journal ``used``) and maybe released (``cleaning``). Someone removed the claimRef by
    hand - typically to "unstick" a PV whose cleanup keeps failing - and the PV controller
    made it Available: the next claim would get the previous tenant's data. By reclaim
    policy and journal state:

    * ``Delete``, ``cleaning``: the PV was Released, its claim is gone. The PV is deleted
      (retracted, with uid and resourceVersion preconditions: a PV bound meanwhile is
      kept and tracked as used), the cleanup goes on for the volume without a PV, and a
      fresh PV is offered once it succeeds - the operator's "unstick", done safely.
    * ``Delete``, ``used``: the claim may still exist and be in use (the PV controller binds
      such a PV back to its claim at its next resync; a pod may have it mounted). Deleting
      the PV would make that claim Lost and the cleanup would wipe a live tenant's volume.
      So the claimRef the journal recorded is put back (same preconditions): a live claim
      is Bound again, as the PV controller itself would do; a claim that is gone makes the
      PV Released, and the ordinary reclaim cleans it before it is offered again. A record
      that does not know the claim's name (an older agent's, or a use the agent only knows
      from the PV controller's mark) is retracted instead, once the claim, if it still
      exists, had :data:`UNKNOWN_CLAIM_GRACE` to be bound back.
    * ``Retain``: the data is kept on purpose, and an operator who clears the claimRef of a
      Retain PV usually means to hand that data to a new claim (upstream's documented way
      to reuse a retained volume). The PV is left on offer, the journal keeps saying the
      volume is not clean (so it is cleaned before any *new* PV is offered for it, and when
      a later claim releases it under Delete), and a warning says who gets what.
    """
    policy = str((pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") or "")
    uid = str(pv_meta(pv).get("uid") or "")
    previous = _previous_claim(entry)
    if policy == "Retain":
        out.events.append(EventSpec(pv, WARNING, "VolumeRetainedReoffered",
                                    f"PV is on offer (its claimRef was removed) while its volume {path} holds data "
                                    f"of {previous} that was never cleaned (reclaim policy Retain): the next claim "
                                    "to bind it gets that data. To offer it clean instead, set its reclaim policy "
                                    "to Delete or delete the PV: the agent cleans the volume before offering it",
                                    once=True))
        return
    if entry.state == USED and entry.claim and "/" in entry.claim_name:
        namespace, _, name = entry.claim_name.partition("/")
        ref = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": namespace, "name": name,
               "uid": entry.claim}
        out.restores.append(RestoreClaim(pv, path, ref,
                                         f"claimRef was removed while volume {path} holds data of {previous} (used, "
                                         "not cleaned): it is put back, so the PV is not offered to another claim; "
                                         "it is Bound again if that claim still exists, or Released and cleaned "
                                         "before it is offered again"))
        return
    if entry.state == USED and world.now - entry.since < UNKNOWN_CLAIM_GRACE:
        # No claim name to put back. If the claim still exists, the PV controller binds the
        # PV back to it at its next resync; retracting first would make that claim Lost and
        # wipe its volume. After the grace, nobody came back for it: retract.
        return
    _retract(world, journal, out, path, entry, pv,
             f"PV (uid {uid}) was put on offer (its claimRef was removed) while its volume {path} was "
             f"{entry.state} and may hold data of {previous}; it is deleted and offered again once the volume is "
             "cleaned")


def _track_stranger(
    world: World, journal: dict[str, JournalEntry], out: Plan, path: str, entry: JournalEntry, pv: Obj
) -> None:
    """A PV for a recorded volume that is not the object the volume was offered as.

    Someone deleted our PV and created one with the same name and path (a GitOps
    re-apply, a restore from backup). If the volume is known clean, the newcomer is simply
    the PV now on offer. Otherwise it offers a volume that may hold a previous tenant's
    data: unclaimed, it is retracted and the volume cleaned first; already claimed, the
    harm is done and deleting it would hurt the new tenant too, so it is tracked as used
    (cleaned on release) and the operator told.
    """
    uid = str(pv_meta(pv).get("uid") or "")
    claim = pv_claim_uid(pv)
    if entry.state == CLEAN:
        state = USED if pv_is_claimed(pv) else OFFERED
        _set(journal, out, path, replace(entry, state=state, since=world.now, claim=claim, pv_uid=uid,
                                         claim_name=pv_claim_name(pv)))
        return
    previous = f"claim {entry.claim}" if entry.claim else "a previous claim"
    if pv_is_claimed(pv) or pv_meta(pv).get("deletionTimestamp"):
        _set(journal, out, path, replace(entry, state=USED, since=world.now, claim=claim, pv_uid=uid,
                                         claim_name=pv_claim_name(pv)))
        out.events.append(EventSpec(pv, WARNING, "VolumeNotCleaned",
                                    f"PV was re-created (uid {uid}, was {entry.pv_uid}) for {path} while the "
                                    f"volume was {entry.state} and it was claimed before it could be cleaned: it "
                                    f"may hold data of {previous}"))
        return
    _retract(world, journal, out, path, entry, pv,
             f"PV was re-created (uid {uid}, was {entry.pv_uid}) while its volume {path} was {entry.state}; it is "
             "deleted and offered again once the volume is cleaned")

"""The node agent's decisions, as one pure function: inputs in, a plan out.

``plan(world)`` looks at everything the agent knows - configuration, this node, the
StorageClasses, a snapshot of every discovery directory, the label-filtered PV cache,
the cleanup journal and the state of running cleanups - and returns what to do: PVs to
create, cleanups to start, PVs to delete, journal changes, events, and the reasons for
every entry it skipped. It never touches the OS or the API, so every rule below is
tested directly with plain data.

The rules, in order of precedence for each volume path:

1. A path whose journal entry is not ``clean`` and that has no PV is never offered: it is
   cleaned first (its PV vanished while it may hold data, or it is being cleaned now).
2. A PV object for a recorded volume that is not the object the volume was offered as
   (another uid: deleted and applied again by hand or by a GitOps tool) is not trusted:
   while the volume is not known clean, an unclaimed such PV is deleted (retracted), the
   volume cleaned, and a fresh PV created; a claimed one is tracked as used.
   Our own PV (the recorded uid) is not left on offer either while its volume is not
   known clean (journal ``used`` or ``cleaning``: its ``claimRef`` was removed by hand):
   see :func:`_unclaimed_while_dirty` for what is done, by state and reclaim policy.
3. A volume is what it is, not how it is spelled: an entry whose identity (device and
   inode, or major:minor) belongs to a recorded volume under another path is that volume.
   It is not offered while that record is not clean; a record whose own path is gone
   (``hostDir`` changed to an alias) follows its volume to the new path.
4. Released + Delete PVs are cleaned; only a succeeded cleanup (journal ``clean``) lets
   the PV be deleted, after which discovery offers the volume again under the same name.
5. Discovery creates one PV per eligible entry, never two for one path (across classes)
   or for one volume, never over a name that belongs to another node's PV (a hash
   collision). While the journal is recovering (it did not exist at start: first start
   or lost state dir), a volume without any record is cleaned before its first offer.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from localpv.agent.journal import CLEAN, CLEANING, OFFERED, USED, JournalEntry, detached_key, is_detached
from localpv.agent.pvbuilder import NodeInfo, StorageClassInfo, VolumeSpec, build_pv
from localpv.config import ClassConfig, ProvisionerConfig
from localpv.host.scan import Entry, EntryKind
from localpv.kube.events import NORMAL, WARNING
from localpv.kube.objects import (
    Obj,
    claim_event_target,
    pv_claim_name,
    pv_claim_uid,
    pv_host_path,
    pv_is_claimed,
    pv_phase,
)
from localpv.kube.objects import meta as pv_meta
from localpv.naming import parse_quantity, pv_name, round_capacity

#: Start times travel through Job annotations (microseconds); allow for that rounding.
CLOCK_TOLERANCE = 0.001

class CleanupState(enum.StrEnum):
    """Where a cleanup of a volume is (threads and Jobs report the same states)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


RUNNING = CleanupState.RUNNING
SUCCEEDED = CleanupState.SUCCEEDED
FAILED = CleanupState.FAILED


@dataclass(frozen=True)
class CleanupStatus:
    """What the cleanup tracker (threads or Jobs) knows about one volume."""

    state: CleanupState
    started: float
    pv_uid: str | None = None
    finished: float | None = None
    retry_at: float | None = None
    attempts: int = 1
    message: str = ""


@dataclass(frozen=True)
class World:
    """Every input of one reconcile pass."""

    config: ProvisionerConfig
    node: NodeInfo
    provisioner: str
    storage_classes: Mapping[str, StorageClassInfo | None]
    scans: Mapping[str, Sequence[Entry] | str]
    pvs: Sequence[Obj]
    journal: Mapping[str, JournalEntry]
    cleanups: Mapping[str, CleanupStatus]
    collisions: Mapping[str, str]
    now: float
    #: The journal did not exist at start and has not yet seen every discovery directory.
    recovering: bool = False


@dataclass(frozen=True)
class CreatePV:
    pv: Obj
    host_path: str
    mode: str
    capacity: int


@dataclass(frozen=True)
class StartCleanup:
    """Clean ``container_path``; ``pv`` is None when the PV object is already gone."""

    pv_name: str
    host_path: str
    container_path: str
    cls: ClassConfig
    block: bool
    reason: str
    pv: Obj | None = None
    retry: bool = False
    #: The stable identity the volume must have when the cleaner starts ("" when it has none):
    #: a cleanup Job may start minutes after this plan, and the disk at the path may have
    #: changed meanwhile.
    identity: str = ""


@dataclass(frozen=True)
class ConfirmOrphan:
    """A journal entry whose PV is not in the cache: if a live GET confirms the PV is
    gone, the volume must be cleaned before it is offered again. (The cache may simply
    lag behind a PV we just created, so the plan does not decide this alone.)"""

    pv_name: str
    host_path: str
    entry: JournalEntry


@dataclass(frozen=True)
class RetractPV:
    """Delete an unclaimed PV that is on offer for a volume not known to be clean; the
    preconditions (uid, resourceVersion) make it fail if the PV was bound meanwhile."""

    pv: Obj
    host_path: str
    reason: str


@dataclass(frozen=True)
class RestoreClaim:
    """Put ``claim_ref`` back into a PV whose claimRef was removed while its volume holds that
    claim's data; guarded by the PV's uid and resourceVersion, so a PV bound meanwhile (or
    changed in any way) is left as it is."""

    pv: Obj
    host_path: str
    claim_ref: Obj
    reason: str


@dataclass(frozen=True)
class DeletePV:
    pv: Obj
    host_path: str
    block: bool
    cleanup: CleanupStatus


@dataclass(frozen=True)
class EventSpec:
    obj: Obj
    type: str
    reason: str
    message: str
    #: A condition the planner sees again on every pass until it changes: the executor
    #: emits it when it appears, not on each pass (it is emitted again if it goes and comes back).
    once: bool = False


@dataclass(frozen=True)
class Skipped:
    """An entry that got no PV, and why. ``error`` entries make the agent not ready."""

    path: str
    cls: str
    reason: str
    error: bool


@dataclass(frozen=True)
class Held:
    """A path the agent does not clean, offer, nor delete the PV of in this pass: what it shows
    is not (provably) the volume its record or PV is about. Not an error of discovery (the
    rest of the node goes on), but reported: events, ``localpv status``, a metric."""

    path: str
    cls: str
    reason: str


@dataclass
class Plan:
    creates: list[CreatePV] = field(default_factory=list)
    cleanups: list[StartCleanup] = field(default_factory=list)
    deletes: list[DeletePV] = field(default_factory=list)
    retracts: list[RetractPV] = field(default_factory=list)
    restores: list[RestoreClaim] = field(default_factory=list)
    orphans: list[ConfirmOrphan] = field(default_factory=list)
    forget_cleanups: list[str] = field(default_factory=list)
    journal: dict[str, JournalEntry | None] = field(default_factory=dict)
    events: list[EventSpec] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    capacity: dict[str, int] = field(default_factory=lambda: {"Filesystem": 0, "Block": 0})
    class_errors: dict[str, str] = field(default_factory=dict)
    held: dict[str, Held] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return len(self.class_errors) + sum(1 for s in self.skipped if s.error)

    @property
    def ready(self) -> bool:
        """Upstream's readiness: the discovery pass had no errors."""
        return self.errors == 0


# --------------------------------------------------------------------------- helpers










#: The PV controller's mark on a PV it bound to a claim. It stays when the claimRef is
#: removed by hand, and the controller deletes it itself when it rolls back a bind it made.
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
#: How long an unclaimed PV used by a claim the agent cannot name is left for that claim
#: to be bound back to (two of the PV controller's 15 s resyncs) before it is retracted.
UNKNOWN_CLAIM_GRACE = 30.0


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


# --------------------------------------------------------------------------- the plan


def plan(world: World) -> Plan:
    """Decide everything for one pass. Pure."""
    out = Plan()
    journal = dict(world.journal)
    by_path: dict[str, Obj] = {}
    for pv in world.pvs:
        path = pv_host_path(pv)
        if path is not None:
            by_path.setdefault(path, pv)
    volumes = _scanned_volumes(world)
    _track_usage(world, journal, out)
    _follow_volumes(world, journal, by_path, volumes, out)
    _learn_identities(journal, volumes, out)
    _follow_identities(world, journal, by_path, volumes, out)
    _plan_deletions(world, journal, out)
    _plan_orphans(world, journal, by_path, out)
    _plan_discovery(world, journal, by_path, volumes, out)
    return out


def _set(journal: dict[str, JournalEntry], out: Plan, path: str, entry: JournalEntry | None) -> None:
    if journal.get(path) == entry:
        return
    if entry is None:
        journal.pop(path, None)
    else:
        journal[path] = entry
    out.journal[path] = entry






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


def _previous_claim(entry: JournalEntry) -> str:
    if not entry.claim:
        return "a previous claim"
    return f"claim {entry.claim_name} (uid {entry.claim})" if entry.claim_name else f"claim {entry.claim}"


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


def _by_ident(volumes: Mapping[str, _Volume]) -> dict[str, list[_Volume]]:
    index: dict[str, list[_Volume]] = {}
    for volume in volumes.values():
        if volume.ident:
            index.setdefault(volume.ident, []).append(volume)
    return index


#: States in which a volume may hold a tenant's data.
DIRTY = (USED, CLEANING)


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


def _moved(world: World, record: JournalEntry, target: _Volume) -> JournalEntry:
    """The record of a volume that moved to ``target`` (it has no PV: a record moves only then).

    It takes the PV name of its new path. Cleanups are tracked by PV name (threads and Jobs,
    as upstream), and the old name is the one the next volume at the old path gets: a
    cleanup of this volume under the old name would be taken for a cleanup of that one.
    """
    name = pv_name(target.entry.name, world.node.name, target.cls.name)
    return replace(record, pv=name, pv_uid="", cls=target.cls.name, ident=target.ident)


def _replaceable(record: JournalEntry | None) -> bool:
    return record is None or record.state == CLEAN


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


def _learn_identities(journal: dict[str, JournalEntry], volumes: Mapping[str, _Volume], out: Plan) -> None:
    """A record without a stable identity (written before identities, or its volume's could
    not be read) learns the one its path shows, when that is the volume it recorded by the
    numbers of this boot (or it recorded none). From then on it is known by what it is."""
    for path, record in sorted(journal.items()):
        here = volumes.get(path)
        if record.identity or here is None or not here.identity or record.state == CLEAN:
            continue
        if not record.ident or record.ident == here.ident:
            _set(journal, out, path, replace(record, identity=here.identity, ident=here.ident))


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
            if here.ident != record.ident:  # the numbers of this boot, for aliases and older agents
                _set(journal, out, path, replace(record, ident=here.ident))
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


def _hold(world: World, out: Plan, path: str, record: JournalEntry, why: str, pvs: Sequence[Obj | None]) -> None:
    """Hold ``path`` for this pass and say why on the Node, the PVs and their live claims."""
    out.held[path] = Held(path, record.cls, why)
    message = f"{why}. What to do: {_REMEDY}"
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
    _set(journal, out, detached_key(record.identity), replace(record, state=state, since=since, ident=""))
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


def _find_entry(world: World, cls: ClassConfig, container_path: str) -> Entry | None:
    scan = world.scans.get(cls.name)
    if isinstance(scan, str) or scan is None:
        return None
    for entry in scan:
        if entry.path == container_path:
            return entry
    return None


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
    out.cleanups.append(StartCleanup(name, path, container, cls, block, reason, pv, retry=status is not None,
                                     identity=record.identity if record is not None else ""))


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


def _plan_discovery(
    world: World, journal: dict[str, JournalEntry], by_path: Mapping[str, Obj], volumes: Mapping[str, _Volume],
    out: Plan,
) -> None:
    by_name = {str(pv_meta(pv).get("name")): pv for pv in world.pvs}
    claimed: set[str] = set(by_path)
    owners = _ident_owners(journal, by_path, volumes)
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
                             identity=entry.identity.value)
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
                                               identity=entry.identity.value))
    out.creates.append(CreatePV(pv, host_path, mode, entry.capacity))
    out.capacity[mode] += round_capacity(entry.capacity)


def _ident_owners(
    journal: Mapping[str, JournalEntry], by_path: Mapping[str, Obj], visible: Mapping[str, _Volume]
) -> dict[str, str]:
    """Identity -> the path under which the journal holds that volume.

    Another spelling of such a volume must not get a PV of its own: while it may hold
    data (used, cleaning) it must not be offered at all, and while it is on offer or
    in use under one path a second PV would let two claims share it. A record whose
    path names nothing now (the volume was unmounted) owns its identity only while it
    may hold data: an anonymous device number (tmpfs) is reused by unrelated mounts.
    """
    owners: dict[str, str] = {}
    for path, record in sorted(journal.items()):
        if record.state == CLEAN:
            continue
        unknown_past = record.state == OFFERED and path not in by_path  # its PV is gone: may hold data
        if record.state in DIRTY or unknown_past or (path in visible and path in by_path):
            for key in (record.identity, record.ident):
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

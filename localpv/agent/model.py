"""The node agent's planning vocabulary: what one pass knows (:class:`World`) and decides
(:class:`Plan` and its actions), and the states cleanups report.

The planner (:mod:`localpv.agent.planner`) turns a World into a Plan; the executor
(:mod:`localpv.agent.executor`) carries the Plan out; the cleanup trackers (threads and Jobs)
report in :class:`CleanupStatus`. All of them speak this module, none of them owns it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from localpv.agent.journal import CLEANING, USED, JournalEntry
from localpv.agent.pvbuilder import NodeInfo, StorageClassInfo
from localpv.config import ClassConfig, ProvisionerConfig
from localpv.host.scan import Entry
from localpv.kube.objects import (
    Obj,
)

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
    #: This boot's id (:func:`localpv.host.identity.boot_id`): device and inode numbers recorded
    #: in another boot name nothing now.
    boot: str = ""
    #: Host paths of volumes looked at in this pass and found empty (only those whose record knows
    #: them by the numbers of another boot are looked at: see :mod:`localpv.agent.planner.volatile`).
    empty: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CreatePV:
    pv: Obj
    host_path: str
    mode: str
    capacity: int
    #: The entry the PV was planned from: what the path must still show when it is created.
    entry: Entry | None = None


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
    #: For a volume without one: its device and inode (or major:minor) numbers of this boot, which
    #: the in-process cleaner checks when it starts ("" when not known).
    numbers: str = ""


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


#: States in which a volume may hold a tenant's data.
DIRTY = (USED, CLEANING)


#: The PV controller's mark on a PV it bound to a claim. It stays when the claimRef is
#: removed by hand, and the controller deletes it itself when it rolls back a bind it made.
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"


#: How long an unclaimed PV used by a claim the agent cannot name is left for that claim
#: to be bound back to (two of the PV controller's 15 s resyncs) before it is retracted.
UNKNOWN_CLAIM_GRACE = 30.0

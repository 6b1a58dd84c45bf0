"""Volume health: what the agent sees of every volume it handed out, as conditions per PV.

A volume handed to a tenant keeps being looked at. A disk that dies, is unmounted, goes
read-only after filesystem errors, or is swapped under a Bound PV is otherwise invisible: the
tenant's pod writes into the node's root filesystem or fails with EIO, and nothing on its
claim says why (upstream local-static-provisioner issue #10). Kubernetes' answer for CSI
drivers is the external health monitor, which posts ``VolumeConditionAbnormal`` events on the
claim; the agent does the same for its local volumes, so ``kubectl describe pvc`` and existing
tooling show it.

This module is pure: :func:`assess` reads the pass's snapshot (scans, PVs, journal) and says,
for each PV of the node that is Bound or Available, which conditions are abnormal and why. The
node agent turns changes into events and the ``localpv_volume_condition`` gauge
(:class:`HealthReporter`). Nothing here (nor there) cleans, deletes or re-creates anything.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from localpv.agent.journal import JournalEntry
from localpv.config import ProvisionerConfig
from localpv.host.scan import Entry, EntryKind
from localpv.kube.objects import Obj, claim_event_target, pv_host_path

#: The phases in which a PV's volume is someone's (Bound) or about to be (Available).
WATCHED_PHASES = ("Bound", "Available")


class Condition(enum.StrEnum):
    """What can be wrong with a volume in use; each is a label value of ``localpv_volume_condition``."""

    NOT_MOUNTED = "NotMounted"  # nothing is mounted at the path: writes go to the node's own disk
    MISSING = "Missing"  # nothing usable at the path at all
    DEVICE_MISSING = "DeviceMissing"  # the block device behind the volume is gone
    IDENTITY_CHANGED = "IdentityChanged"  # another disk than the one handed out is at the path
    READ_ONLY = "ReadOnly"  # the mount or device is read-only (e.g. remounted after errors)
    UNRESPONSIVE = "Unresponsive"  # statfs/stat did not answer in time (hung storage)
    UNREADABLE = "Unreadable"  # looking at it fails (EIO, ENOTCONN...)
    FILESYSTEM_ERRORS = "FilesystemErrors"  # ext4's error count grew


@dataclass(frozen=True)
class VolumeHealth:
    """One PV's abnormal conditions (empty: normal), with a message for each."""

    pv: Obj
    conditions: Mapping[Condition, str] = field(default_factory=dict)

    @property
    def abnormal(self) -> bool:
        return bool(self.conditions)

    def message(self) -> str:
        return "; ".join(f"{c.value}: {why}" for c, why in sorted(self.conditions.items()))


@dataclass(frozen=True)
class Assessment:
    """Every watched PV's health by name, and the error-count baselines to keep for the next one."""

    volumes: Mapping[str, VolumeHealth]
    baselines: Mapping[str, int]



def assess(
    config: ProvisionerConfig,
    scans: Mapping[str, Sequence[Entry] | str],
    pvs: Sequence[Obj],
    journal: Mapping[str, JournalEntry],
    baselines: Mapping[str, int],
    boot: str = "",
) -> Assessment:
    """The health of every Bound or Available PV of a configured class, from this pass's look.

    ``baselines`` holds, by PV uid, the ext4 error count first seen for its volume: a count
    that grew since is abnormal; one that went down (``e2fsck`` resets it) becomes the new
    baseline. The counts are kept in memory: after an agent restart the current count is the
    baseline (the event of the earlier growth stays on the claim). ``boot`` is this boot's id:
    a record without a stable identity knows its volume by the numbers of that boot only.
    """
    volumes: dict[str, VolumeHealth] = {}
    kept: dict[str, int] = {}
    for pv in pvs:
        meta = pv.get("metadata") or {}
        phase = str((pv.get("status") or {}).get("phase") or "")
        path = pv_host_path(pv)
        cls = config.classes.get(str((pv.get("spec") or {}).get("storageClassName") or ""))
        if phase not in WATCHED_PHASES or path is None or cls is None or meta.get("deletionTimestamp"):
            continue
        container = cls.container_path(path)
        scan = scans.get(cls.name)
        if container is None or scan is None:
            continue
        uid = str(meta.get("uid") or "")
        block = (pv.get("spec") or {}).get("volumeMode") == "Block"
        conditions: dict[Condition, str] = {}
        if isinstance(scan, str):
            condition = Condition.UNRESPONSIVE if "hung storage" in scan else Condition.UNREADABLE
            conditions[condition] = f"the discovery directory cannot be looked at: {scan}"
        else:
            entry = next((e for e in scan if e.path == container), None)
            conditions.update(_entry_conditions(entry, path, block, journal.get(path), boot))
            if entry is not None and entry.fs_errors is not None and uid:
                base = min(baselines.get(uid, entry.fs_errors), entry.fs_errors)
                kept[uid] = base
                if entry.fs_errors > base:
                    conditions[Condition.FILESYSTEM_ERRORS] = (
                        f"the filesystem recorded {entry.fs_errors - base} new error(s) ({entry.fs_errors} in all): "
                        "check the kernel log and the disk; run e2fsck when it can be unmounted")
        volumes[str(meta.get("name"))] = VolumeHealth(pv, conditions)
    return Assessment(volumes, kept)


def _entry_conditions(
    entry: Entry | None, path: str, block: bool, record: JournalEntry | None, boot: str
) -> dict[Condition, str]:
    """The conditions one scanned entry shows for the PV of ``path``."""
    if entry is None:
        return {Condition.MISSING: f"{path} no longer exists on the node"}
    if entry.kind is EntryKind.HUNG:
        return {Condition.UNRESPONSIVE: entry.reason or f"{path} does not answer"}
    if entry.kind is EntryKind.BROKEN:
        return {Condition.UNREADABLE: entry.reason or f"{path} cannot be looked at"}
    if entry.kind is EntryKind.DIRECTORY:
        if block:
            return {Condition.DEVICE_MISSING: f"{path} is a directory now, not the block device it was"}
        return {Condition.NOT_MOUNTED: f"nothing is mounted at {path}: the tenant's writes go to the node's own "
                                       "filesystem, not to the volume"}
    if entry.kind not in (EntryKind.MOUNTPOINT, EntryKind.BLOCK):
        return {Condition.MISSING: entry.reason or f"{path} is no volume now"}
    found: dict[Condition, str] = {}
    if entry.device_missing:
        found[Condition.DEVICE_MISSING] = f"the block device behind {path} is gone from the node"
    if record is not None and record.identity:
        if entry.identity.error:
            found[Condition.IDENTITY_CHANGED] = (f"the identity of {path} cannot be read ({entry.identity.error}); "
                                                 f"it was {record.identity}")
        elif entry.identity.value and entry.identity.value != record.identity:
            found[Condition.IDENTITY_CHANGED] = (f"{path} holds volume {entry.identity.value}, not the volume "
                                                 f"{record.identity} this PV was offered with (disks renumbered or "
                                                 "swapped?): mount each disk at its own path, by UUID or WWN")
    elif record is not None and (known := record.numbers_in(boot)) and entry.ident and entry.ident != known:
        found[Condition.IDENTITY_CHANGED] = (f"{path} holds the volume numbered {entry.ident}, not the volume "
                                             f"{known} this PV was offered with (mounts swapped or moved?): put "
                                             "each volume back at its own path")
    if entry.read_only:
        found[Condition.READ_ONLY] = (f"{path} is read-only (remounted read-only after errors?): writes fail; check "
                                      "the kernel log and the disk")
    return found


class HealthReporter:
    """Turns successive assessments into events on the claim and PV, and the gauge's values.

    An event is sent when a PV's conditions change: ``VolumeConditionAbnormal`` (Warning,
    the reason Kubernetes' own health monitor uses) when they appear or change, and
    ``VolumeConditionNormal`` when they are gone. A restarted agent says again what is
    abnormal, once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[str, ...]] = {}
        self._current: dict[str, VolumeHealth] = {}
        self.baselines: dict[str, int] = {}

    def update(self, assessment: Assessment) -> list[tuple[Obj, str, str, str]]:
        """The events to send for this assessment, as (object, type, reason, message)."""
        events: list[tuple[Obj, str, str, str]] = []
        with self._lock:
            self.baselines = dict(assessment.baselines)
            seen: dict[str, tuple[str, ...]] = {}
            for name, health in assessment.volumes.items():
                uid = str((health.pv.get("metadata") or {}).get("uid") or name)
                key = tuple(f"{c.value}:{m}" for c, m in sorted(health.conditions.items()))
                seen[uid] = key
                before = self._last.get(uid, ())
                if key == before:
                    continue
                claim = claim_event_target(health.pv)
                targets = [health.pv] if claim is None else [health.pv, claim]
                if health.abnormal:
                    for target in targets:
                        events.append((target, "Warning", "VolumeConditionAbnormal", health.message()))
                elif before:
                    for target in targets:
                        events.append((target, "Normal", "VolumeConditionNormal", "the volume is healthy again"))
            self._last = {uid: key for uid, key in seen.items() if key}
            self._current = dict(assessment.volumes)
        return events

    def gauge(self) -> dict[tuple[str, str], float]:
        """``localpv_volume_condition`` samples: (PV name, condition) -> 1 for each abnormal one."""
        with self._lock:
            return {(name, c.value): 1.0 for name, health in self._current.items() for c in health.conditions}

    def of(self, pv_name: str) -> list[str]:
        """The abnormal conditions of one PV (for ``localpv status``)."""
        with self._lock:
            health = self._current.get(pv_name)
            return [c.value for c in sorted(health.conditions)] if health is not None else []


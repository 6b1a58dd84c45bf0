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
(:class:`~localpv.kube.volumehealth.HealthReporter`, shared with dynamic volumes). Nothing here
(nor there) cleans, deletes or re-creates anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from localpv.agent.journal import JournalEntry
from localpv.config import ProvisionerConfig
from localpv.host.scan import Entry, EntryKind
from localpv.kube.objects import Obj, pv_host_path
from localpv.kube.volumehealth import Assessment, Condition, VolumeHealth

#: The phases in which a PV's volume is someone's (Bound) or about to be (Available).
WATCHED_PHASES = ("Bound", "Available")


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

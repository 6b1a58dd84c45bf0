"""What can be wrong with a volume in use, and how it is said: the conditions, one PV's
health, and the reporter that turns successive assessments into events and gauge values.

Shared by the static volumes' health (:mod:`localpv.agent.health`) and the dynamic ones'
(:mod:`localpv.csi.health`): both say it the same way, with the reason Kubernetes' own
health monitor uses (``VolumeConditionAbnormal``) on the claim and the PV, and the same
``localpv_volume_condition`` gauge.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from localpv.kube.objects import Obj, claim_event_target


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
    # Dynamic volumes (localpv.csi.health):
    POOL_UNAVAILABLE = "PoolUnavailable"  # the image's pool cannot be looked at (its disk is not mounted)
    POOL_OVERCOMMITTED = "PoolOvercommitted"  # the pool cannot hold what its thin volumes may still write
    ALLOCATION_LOST = "AllocationLost"  # a thick image lost blocks (discarded) that cannot be taken back


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


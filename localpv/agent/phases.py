"""How many of this node's PVs are in each phase, and how long the oldest has been Released.

A volume stuck Released is the situation an operator most needs to hear about: its disk is
out of service and, with reclaim policy Delete, a cleanup is failing or waiting. The API
server does not say when a PV became Released (``status.lastPhaseTransitionTime`` only
exists from Kubernetes 1.28), so the agent remembers when it first saw each PV (by uid)
Released. After a restart the count starts again from the restart: the figure is a lower
bound, which is the safe side for an alert ("at least this long").
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from localpv.kube import objects as k8s
from localpv.kube.objects import PV_PHASES, Obj

#: The phases a PV reports, each exported even at 0 so that a panel or an alert sees a phase
#: appear rather than a series being born.
PHASES = PV_PHASES


@dataclass(frozen=True)
class VolumeFigures:
    """One scrape's worth: PV counts by (class, phase), and by class the seconds the longest
    Released PV has been Released (0 when none is)."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    released_for: dict[str, float] = field(default_factory=dict)


class ReleasedTracker:
    """Remembers, per PV uid, the monotonic time it was first seen Released."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()

    def figures(self, pvs: Iterable[Obj], classes: Iterable[str], now: float) -> VolumeFigures:
        """Count ``pvs`` (this node's, from the agent's cache) and age the Released ones.

        Every configured class is reported, with zeros, so that its series exist from the
        first scrape; a PV of a class no longer configured is still counted under its class."""
        counts = {(cls, phase): 0 for cls in classes for phase in PHASES}
        released_for = {cls: 0.0 for cls, _ in counts}
        seen: set[str] = set()
        with self._lock:
            for pv in pvs:
                cls = k8s.pv_class(pv)
                phase = k8s.pv_phase(pv) or "Pending"
                counts[(cls, phase)] = counts.get((cls, phase), 0) + 1
                if phase != "Released":
                    continue
                pv_uid = k8s.uid(pv)
                seen.add(pv_uid)
                since = self._since.setdefault(pv_uid, now)
                released_for[cls] = max(released_for.get(cls, 0.0), now - since)
            for uid in set(self._since) - seen:  # deleted, or bound/available again
                del self._since[uid]
        return VolumeFigures(counts, released_for)

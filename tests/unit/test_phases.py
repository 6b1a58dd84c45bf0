"""localpv.agent.phases: PV counts by class and phase, and the Released clock."""

from __future__ import annotations

from typing import Any

from localpv.agent.phases import PHASES, ReleasedTracker


def pv(uid: str, cls: str, phase: str | None) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "spec": {"storageClassName": cls},
            "status": {"phase": phase} if phase else {}}


def test_every_configured_class_and_phase_is_reported_even_at_zero() -> None:
    figures = ReleasedTracker().figures([], ["fast", "slow"], now=5.0)
    assert figures.counts == {(cls, phase): 0 for cls in ("fast", "slow") for phase in PHASES}
    assert figures.released_for == {"fast": 0.0, "slow": 0.0}


def test_counts_by_class_and_phase_with_no_phase_as_pending_and_unconfigured_classes_kept() -> None:
    figures = ReleasedTracker().figures(
        [pv("a", "fast", "Bound"), pv("b", "fast", "Bound"), pv("c", "fast", None), pv("d", "gone", "Available")],
        ["fast"], now=0.0)
    assert figures.counts[("fast", "Bound")] == 2
    assert figures.counts[("fast", "Pending")] == 1
    assert figures.counts[("gone", "Available")] == 1


def test_the_oldest_released_pv_of_each_class_is_aged_from_when_it_was_first_seen() -> None:
    tracker = ReleasedTracker()
    tracker.figures([pv("a", "fast", "Released")], ["fast"], now=100.0)
    figures = tracker.figures([pv("a", "fast", "Released"), pv("b", "fast", "Released")], ["fast"], now=160.0)
    assert figures.released_for == {"fast": 60.0}
    figures = tracker.figures([pv("b", "fast", "Released")], ["fast"], now=170.0)
    assert figures.released_for == {"fast": 10.0}, "a deleted PV is forgotten; the next oldest counts"


def test_a_pv_released_again_later_starts_from_zero() -> None:
    tracker = ReleasedTracker()
    tracker.figures([pv("a", "fast", "Released")], ["fast"], now=0.0)
    tracker.figures([pv("a", "fast", "Available")], ["fast"], now=50.0)
    figures = tracker.figures([pv("a", "fast", "Released")], ["fast"], now=60.0)
    assert figures.released_for == {"fast": 0.0}
    assert tracker.figures([pv("a", "fast", "Released")], ["fast"], now=90.0).released_for == {"fast": 30.0}

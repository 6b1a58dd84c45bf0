"""Crash points, enumerated (issue 24): every durable step of every scenario - each half of a
journal or record write, each API write - killed there once, the daemon started again, the
invariants checked and the scenario driven to its end (tests/support/crashpoints.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.crashpoints import SCENARIOS, enumerate_crashes, named_points, occurrences, run_scenario

pytestmark = pytest.mark.root

#: The points each scenario passed, for the coverage test (filled by the runs below).
_TRACED: dict[str, list[str]] = {}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_crash_point_of_the_scenario_is_survived(scenario: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    runs, points = enumerate_crashes(scenario, tmp_path, report=lines.append)
    _TRACED[scenario] = points
    assert runs == len(occurrences(points)) and runs >= 6, f"{scenario} passed too few durable steps: {points}"
    with capsys.disabled():
        print(f"\n{lines[-1]}")


def test_every_point_the_code_names_is_reached_by_a_scenario(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A crash point added to the code without a scenario that passes it fails here."""
    for scenario in SCENARIOS:
        if scenario not in _TRACED:
            _TRACED[scenario] = run_scenario(SCENARIOS[scenario], None, tmp_path)[1]
    reached = {point for points in _TRACED.values() for point in points}
    assert named_points() <= reached, f"no scenario reaches {sorted(named_points() - reached)}"
    total = sum(len(points) for points in _TRACED.values())
    with capsys.disabled():
        print(f"\ncrash points: {len(reached)} distinct ({len(named_points())} named in the code, the rest API "
              f"writes) x {len(SCENARIOS)} scenarios = {total} crash runs")

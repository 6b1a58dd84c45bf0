"""Passes are spaced only in a storm: a mount soon after an unrelated pass is served at once."""

from __future__ import annotations

import pytest

from localpv.agent.pacing import PassPacing


def test_a_trigger_soon_after_a_quiet_pass_starts_a_pass_at_once() -> None:
    pacing = PassPacing(interval=0.1, storm_passes=3)
    assert pacing.pause_before_pass(10.0) == 0.0
    pacing.pass_ended(10.02)
    # A mount 10 ms after that pass: the old fixed spacing made it wait 90 ms.
    assert pacing.pause_before_pass(10.03) == 0.0


def test_a_storm_is_held_to_one_pass_per_interval_after_a_few_back_to_back_passes() -> None:
    pacing = PassPacing(interval=0.1, storm_passes=3)
    now = 0.0
    pauses = []
    for _ in range(6):
        pause = pacing.pause_before_pass(now)
        pauses.append(round(pause, 3))
        now += pause + 0.02  # a 20 ms pass
        pacing.pass_ended(now)
        now += 0.001  # the next trigger is already waiting
    assert pauses[:4] == [0.0, 0.0, 0.0, 0.0]
    assert pauses[4:] == [pytest.approx(0.099), pytest.approx(0.099)]


def test_a_quiet_interval_ends_the_storm() -> None:
    pacing = PassPacing(interval=0.1, storm_passes=1)
    pacing.pause_before_pass(0.0)
    pacing.pass_ended(0.01)
    assert pacing.pause_before_pass(0.02) == 0.0
    pacing.pass_ended(0.03)
    assert pacing.pause_before_pass(0.04) == pytest.approx(0.09)
    pacing.pass_ended(0.15)
    assert pacing.pause_before_pass(0.30) == 0.0
    assert pacing.back_to_back == 0

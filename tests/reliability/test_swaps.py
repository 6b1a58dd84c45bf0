"""Swaps, enumerated (issue 24, item 3): on a node of volumes in every state, every swap of two
mounts and every move of one to an empty path while the agent is stopped, with and without a
stable identity, a reboot, an upgrade from a journal without identities: the same invariants as
the crash-point suite and the campaigns (tests/support/swaps.py says what is enumerated and
what is pruned, and why)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agentenv import AgentEnv
from tests.support.campaign import Violation
from tests.support.hostfs import LoopDevices
from tests.support.swaps import KNOWN_RESIDUALS, VARIANTS, Op, SwapNode, operations, run_swaps

pytestmark = pytest.mark.root


@pytest.mark.parametrize("kind", ["ext4", "tmpfs"])
def test_every_swap_and_move_keeps_the_promises(kind: str, loops: LoopDevices, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    report = run_swaps(kind, tmp_path, monkeypatch, loops)
    cases = len(VARIANTS) * len(operations()) + (1 if kind == "tmpfs" else 0)  # + reboot-empty
    residuals = {label: broken for label, broken in KNOWN_RESIDUALS.items() if label.startswith(f"{kind} ")}
    assert report.residuals == residuals, "a known residual no longer breaks its invariant (fixed?), or moved"
    assert len(report.cases) == cases and report.runs == cases - len(residuals), report.cases
    assert report.held >= len(VARIANTS) * len(operations()) // 2, "most cases must hold something (h at least)"
    with capsys.disabled():
        print(f"\nswaps ({kind}): {len(operations())} operations (the control, 10 swaps, 5 moves) x {len(VARIANTS)} "
              f"variants ({', '.join('/'.join(v) for v in VARIANTS)}){' + reboot-empty' if kind == 'tmpfs' else ''}"
              f" = {cases} runs, {report.checks} checks: {report.runs} held every invariant, "
              f"{len(residuals)} known residuals; {report.nodes} nodes, {report.seconds:.0f} s")


def test_the_harness_catches_a_record_re_pointed_by_its_path(agent_env: AgentEnv, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A harness that cannot fail proves nothing: put back the rule of before issue 24 (a record
    without identity takes whatever its path shows) and swap the bound volume with the one whose
    cleanup fails: the harness must report it."""
    from localpv.agent.planner import volatile
    from localpv.agent.planner.common import _seen_as, _set

    def by_path(world, journal, by_path, by_ident, out, path, record, here):  # type: ignore[no-untyped-def]
        if here.ident != record.ident:
            _set(journal, out, path, _seen_as(world, record, here))

    node = SwapNode(agent_env, "tmpfs", tmp_path / "swaps", monkeypatch)
    node.setup()
    monkeypatch.setattr(volatile, "_at_its_path", by_path)
    try:
        with pytest.raises(Violation) as found:
            node.run_case(Op("swap", "b", "f"), "same", "current")
    finally:
        node.teardown()
    assert found.value.invariant in ("cleaned-while-bound", "lost-record"), found.value

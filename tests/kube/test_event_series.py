"""Event series: repeats within the window update one Event; older series are forgotten."""

from __future__ import annotations

from localpv.clock import ManualClock
from localpv.kube.events import WARNING, EventRecorder


def pv(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name, "uid": f"u-{name}"}}


def test_series_older_than_the_window_are_forgotten_and_newer_ones_kept() -> None:
    clock = ManualClock()
    recorder = EventRecorder(None, component="test", clock=clock, dedupe_window=60.0)
    for i in range(5):
        recorder.event(pv(f"old-{i}"), WARNING, "Reason", "message")
    clock.advance(30)
    recorder.event(pv("middle"), WARNING, "Reason", "message")
    recorder.event(pv("old-0"), WARNING, "Reason", "message")  # a repeat: the same series
    clock.advance(31)  # the old ones are 61 s old now, "middle" 31 s
    recorder.event(pv("new"), WARNING, "Reason", "message")
    assert sorted(key[0] for key in recorder._series) == ["u-middle", "u-new"]
    # A repeat after its series expired starts a new one, which goes last and is kept.
    recorder.event(pv("old-1"), WARNING, "Reason", "message")
    clock.advance(40)
    recorder.event(pv("newest"), WARNING, "Reason", "message")
    assert [key[0] for key in recorder._series] == ["u-new", "u-old-1", "u-newest"]

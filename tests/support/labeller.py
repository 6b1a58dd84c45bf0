"""The real claim labeller, run in the test process against the emulator.

The agent's controller sees a claim only once the labeller has labelled it with its selected
node (localpv/csi/claimlabels.py); the tests that play the scheduler (they set the selected
node) run the real labeller beside it, as the chart runs it beside the agents.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from localpv.claimlabeller.controller import ClaimLabeller, LabellerSettings
from localpv.claimlabeller.metrics import LabellerMetrics
from localpv.kube.api import KubeApi
from localpv.kube.events import EventRecorder

DRIVER = "local.csi.localpv.dev"


@contextmanager
def running_labeller(api: KubeApi, driver: str = DRIVER, *, report_after: float = 60.0,
                     report_period: float = 10.0, timeout: float = 30.0) -> Iterator[ClaimLabeller]:
    """A labeller with synced caches (every claim present at its start is queued), stopped after."""
    recorder = EventRecorder(api.for_events(), component=f"{driver}_claim-labeller")
    recorder.start()
    labeller = ClaimLabeller(api, LabellerSettings(driver, report_after=report_after, report_period=report_period),
                             recorder=recorder, metrics=LabellerMetrics())
    labeller.start()
    try:
        if not labeller.synced.wait(timeout):
            raise TimeoutError("the claim labeller's caches did not sync")
        yield labeller
    finally:
        labeller.stop()
        recorder.flush(2.0)
        recorder.stop()

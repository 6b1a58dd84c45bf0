"""What a cleaning function is and what it reports, apart from the table that runs it.

The cleanup Job's command (``localpv cleanup``) runs one cleaning function without a
:class:`~localpv.agent.proctable.ProcTable`; importing the table would import the whole
reconcile planner with it, a tenth of a second of that short-lived process's start-up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CleanFn", "CleanOutcome"]


@dataclass(frozen=True)
class CleanOutcome:
    """What a cleaning function reports: success, and a one-line message."""

    ok: bool
    message: str
    progress: str = ""


#: A cleaning function: gets a cancel event, returns an outcome (exceptions mean failure).
CleanFn = Callable[[threading.Event], CleanOutcome]

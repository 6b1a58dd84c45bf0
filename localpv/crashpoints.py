"""Named durable steps: where the crash-point tests kill the process (issue 24).

Every durable step of localpv's protocols - each half of a journal or record write (temporary
file written, flushed, renamed, directory flushed) and each API write - calls :func:`reached`
with its name. Normally that is one comparison. A test that sets ``LOCALPV_CRASH_AT=<name>``
(or ``<name>@<n>``: the n-th time it is reached) has the process SIGKILL itself exactly there,
as a power cut or an OOM kill would, and then checks what a restarted process makes of it.
``LOCALPV_CRASH_TRACE=<file>`` appends the name of every point reached to that file: the test
first runs a scenario to learn its points, then once per point.

The environment is read once, at import: the daemons are started with it, and a process that
has it unset pays nothing else.
"""

from __future__ import annotations

import os
import signal
import threading

ENV_AT = "LOCALPV_CRASH_AT"
ENV_TRACE = "LOCALPV_CRASH_TRACE"

_AT = os.environ.get(ENV_AT, "")
_TRACE = os.environ.get(ENV_TRACE, "")
_lock = threading.Lock()
_counts: dict[str, int] = {}


def _target() -> tuple[str, int]:
    name, _, nth = _AT.partition("@")
    return name, int(nth) if nth.isdigit() else 1


def reached(point: str) -> None:
    """A durable step is done: die here if a test asked for it; note it if a test traces."""
    if not _AT and not _TRACE:
        return
    with _lock:
        count = _counts[point] = _counts.get(point, 0) + 1
        if _TRACE:
            with open(_TRACE, "a", encoding="utf-8") as trace:
                trace.write(f"{point}\n")
        name, nth = _target()
        if point == name and count == nth:
            os.kill(os.getpid(), signal.SIGKILL)

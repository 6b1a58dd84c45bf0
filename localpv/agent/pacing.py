"""When the next pass may start: at once, unless passes are really back to back.

Every mount, PV change and config reload triggers a pass. On a busy node (a Job mounting
volumes in a loop, an informer relisting) triggers come faster than passes end, and a pass
right after a pass after a pass is wasted CPU: a burst of triggers should become one pass.
Spacing *every* pass by a fixed interval did that, but also made a mount that arrived soon
after an unrelated pass wait for the interval before its PV was offered. So the spacing
applies only in a storm: after ``storm_passes`` passes that each started within
``interval`` of the previous one's end. The first trigger after a quiet moment is served at
once; a storm is held to one pass per ``interval`` after the pass that ends it (its last
changes are never left behind: the pass after the pause sees them).
"""

from __future__ import annotations


class PassPacing:
    """Decides the pause before a pass from when the previous ones ended (monotonic seconds)."""

    def __init__(self, interval: float = 0.1, storm_passes: int = 3) -> None:
        self.interval = interval
        self.storm_passes = storm_passes
        self._last_end: float | None = None
        #: Passes in a row that started within ``interval`` of the previous one's end.
        self.back_to_back = 0

    def pause_before_pass(self, now: float) -> float:
        """Seconds to wait before the pass about to start (0: start now)."""
        if self._last_end is None or now - self._last_end >= self.interval:
            self.back_to_back = 0
            return 0.0
        self.back_to_back += 1
        if self.back_to_back <= self.storm_passes:
            return 0.0
        return self._last_end + self.interval - now

    def pass_ended(self, now: float) -> None:
        self._last_end = now

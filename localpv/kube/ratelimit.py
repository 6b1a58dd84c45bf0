"""Client-side rate limiting: one token bucket per process, in front of every API request.

client-go's shape (``--kube-api-qps`` / ``--kube-api-burst``): a bucket holds up to
``burst`` tokens and gains ``qps`` per second; each request takes one and waits when there
is none. :class:`~localpv.kube.api.KubeApi` asks for a token before every attempt of a
request (a retry is a request too) and once per watch it opens - the events a watch
brings cost nothing, only establishing it does.

Callers reserve a slot under a lock and then wait outside it, so concurrent workers are
served in the order they asked and none can take a slot twice. Waiting runs on the
injected :class:`~localpv.clock.Clock`, so tests see the delays without sleeping.

Defaults: ``localpv nfs`` and ``localpv node-cleanup`` are one Deployment each, like
kube-controller-manager, and take its 20 QPS / burst 30. ``localpv agent`` runs on every
node, so the API server sees N times its rate; it keeps client-go's default 5 / 10, which
is what upstream local-static-provisioner runs with (it sets no rate), so swapping the
image does not change the load a node puts on the API server. An agent's steady state is
its watches; bursts come from discovery (one create per new volume: a 60-disk node is
offered within ~10 s) and are bounded by the disks of one node.

Events have a budget of their own (``--event-qps`` / ``--event-burst``, as the kubelet's):
a burst of warnings must not hold back the deletion of a PV offered over dirty data. It is
small, so that a process sends at most ``--kube-api-qps`` plus ``--event-qps`` requests a
second: 1 / 5 for the agent, 2 / 10 for the controllers. Events are written in the
background and deduplicated, so a slow event budget delays what is said, never what is done.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

from localpv.clock import Clock, SystemClock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RateLimit:
    qps: float
    burst: int


#: kube-controller-manager's defaults, for the single-replica controllers (nfs, node-cleanup).
CONTROLLER_RATE = RateLimit(20.0, 30)
#: client-go's defaults (upstream local-static-provisioner's rate), for the per-node agent.
AGENT_RATE = RateLimit(5.0, 10)
#: The events' own budgets: a small share on top of the rates above.
CONTROLLER_EVENT_RATE = RateLimit(2.0, 10)
AGENT_EVENT_RATE = RateLimit(1.0, 5)


class RateLimiter(Protocol):
    def acquire(self, stop: threading.Event | None = None) -> float:
        """Block until a request may go; returns the seconds waited."""
        ...


class TokenBucket:
    """Thread-safe token bucket: ``burst`` at once, then ``qps`` per second."""

    def __init__(self, qps: float, burst: int, *, clock: Clock | None = None) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs qps > 0 and burst >= 1, got {qps} / {burst}")
        self.qps = float(qps)
        self.burst = int(burst)
        self.clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._last = self.clock.monotonic()
        #: Requests that had to wait, and the seconds they waited in total.
        self.throttled = 0
        self.waited = 0.0

    def sibling(self) -> TokenBucket:
        """A bucket of its own at the same rate, for a stream of requests that must not
        starve the others (events must never delay the requests that act on volumes)."""
        return TokenBucket(self.qps, self.burst, clock=self.clock)

    def reserve(self) -> float:
        """Take the next slot; returns how long its holder must wait before sending."""
        with self._lock:
            now = self.clock.monotonic()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            delay = -self._tokens / self.qps if self._tokens < 0 else 0.0
            if delay > 0:
                self.throttled += 1
                self.waited += delay
            return delay

    def acquire(self, stop: threading.Event | None = None) -> float:
        """Wait for a slot (a set ``stop`` cuts the wait short: shutdown must be prompt)."""
        delay = self.reserve()
        if delay > 0:
            if delay >= 1.0:
                log.debug("waited %.2fs for client-side throttling (%.0f QPS, burst %d)", delay, self.qps,
                          self.burst)
            self.clock.wait(stop or threading.Event(), delay)
        return delay


def rate_limiter(qps: float, burst: int, *, clock: Clock | None = None) -> TokenBucket | None:
    """The process's limiter from ``--kube-api-qps`` / ``--kube-api-burst``; qps <= 0 means none."""
    return TokenBucket(qps, burst, clock=clock) if qps > 0 else None

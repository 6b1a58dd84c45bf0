"""Is the claim labeller alive? The agent's one look beyond its own claims.

An agent sees a new claim only once the claim labeller has labelled it
(:mod:`localpv.csi.claimlabels`). With the labeller down, claims of this node wait unseen, and
nothing the agent watches changes: so the agent looks, seldom, at the labeller's leader Lease.
A leader renews it every few seconds; a Lease whose record did not change between two looks
minutes apart, that has no holder, or that does not exist, means no labeller runs. That is
said where an operator looks (a Warning event on the Node, ``localpv_claim_labeller_up`` 0 and
the alert on it), once per outage. It is not the agent's health: restarting the agent
would not label a claim.

The verdict follows client-go's rule for leases: a record is stale when it has not changed for
a while as measured on *our* clock, never by comparing its timestamps with our wall clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localpv.clock import Clock, SystemClock
from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, NotFound
from localpv.kube.events import NORMAL, WARNING, EventRecorder
from localpv.kube.objects import Obj
from localpv.kube.resources import LEASES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reading:
    """What one look found: ``spec`` None when there is no Lease."""

    spec: dict[str, Any] | None
    at: float


def verdict(previous: Reading | None, current: Reading) -> str | None:
    """Why no labeller runs (None: one does). ``previous`` is the look before, if any."""
    if current.spec is None:
        return "its leader Lease does not exist: the claim labeller has never run"
    if not current.spec.get("holderIdentity"):
        return "its leader Lease has no holder: the claim labeller stopped"
    if previous is not None and previous.spec == current.spec:
        return f"its leader Lease was not renewed for {current.at - previous.at:.0f}s"
    return None


class LabellerLease:
    """Looks at the labeller's Lease every ``period``; ``up`` is the last verdict."""

    def __init__(self, api: KubeApi, *, namespace: str, name: str, node: Callable[[], Obj], recorder: EventRecorder,
                 period: float = 300.0, clock: Clock | None = None,
                 on_verdict: Callable[[bool], None] = lambda _up: None) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.node = node
        self.recorder = recorder
        self.period = period
        self.clock = clock or SystemClock()
        self.on_verdict = on_verdict
        self.up = True
        self.why = ""
        self._previous: Reading | None = None
        self._stop = threading.Event()

    def look(self) -> bool:
        """One look; returns whether a labeller runs (an unreadable Lease changes nothing)."""
        try:
            lease = self.api.get(LEASES, self.name, self.namespace)
            spec: dict[str, Any] | None = dict(lease.get("spec") or {})
        except NotFound:
            spec = None
        except ApiError as err:
            log.warning("claim labeller lease %s/%s: cannot read it now: %s", self.namespace, self.name, err)
            return self.up
        current = Reading(spec, self.clock.monotonic())
        why = verdict(self._previous, current)
        self._previous = current
        self._say(why)
        return self.up

    def _say(self, why: str | None) -> None:
        was, self.up, self.why = self.up, why is None, why or ""
        self.on_verdict(self.up)
        where = f"{self.namespace}/{self.name}"
        if was and not self.up:
            log.warning("claim labeller: %s (%s)", why, where)
            self.recorder.event(self.node(), WARNING, "ClaimLabellerDown",
                                f"the claim labeller is not running ({why}; Lease {where}): new claims of dynamic "
                                "classes are not labelled with their node, and this node's agent does not see them "
                                "(their pods wait). See the runbook 'Claims not labelled'.")
        elif self.up and not was:
            log.info("claim labeller: running again (Lease %s)", where)
            self.recorder.event(self.node(), NORMAL, "ClaimLabellerBack",
                                f"the claim labeller runs again (Lease {where})")

    def run(self) -> None:
        """Look every ``period`` until stopped (the first look one period after start: the labeller
        starts with the agents)."""
        while not self.clock.wait(self._stop, self.period):
            self.look()

    def stop(self) -> None:
        self._stop.set()

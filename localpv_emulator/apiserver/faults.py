"""Fault injection: failed, slow and conflicting requests, lost responses, dropped watches,
lost history."""

from __future__ import annotations

import random
import threading
from typing import TYPE_CHECKING, Literal, get_args

from localpv_emulator.apiserver.errors import ApiError

if TYPE_CHECKING:
    from localpv_emulator.apiserver.server import ApiServer


FAULT_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
#: How the answer to a committed write is lost: ``reset`` - the connection is reset (RST)
#: where the answer was due, as when the network or a load balancer drops it; ``close`` -
#: it is closed without an answer (FIN), as by a proxy's timeout or a server that dies
#: between commit and reply. Clients see ECONNRESET and "closed without response".
LostResponse = Literal["reset", "close"]


class Faults:
    """Fault injection, so tests can prove that clients survive a misbehaving API server.

    Faults apply to HTTP requests only; direct store access through :class:`ApiServer`
    methods is never faulted, so tests can always seed and inspect.
    """

    def __init__(self, server: ApiServer, seed: int | None = None) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._errors: dict[str, tuple[float, int]] = {}
        self._latency = 0.0
        self._conflicts = 0.0
        self._lost: dict[tuple[str, str | None], tuple[float, LostResponse]] = {}

    def seed(self, seed: int) -> None:
        """Make the random choices of error_rate/conflict_storm/lose_responses reproducible."""
        with self._lock:
            self._rng.seed(seed)

    def drop_watches(self, abrupt: bool = False) -> None:
        """End every open watch stream now: cleanly (end of body), or by cutting the connection."""
        self._server.end_watches(abrupt)

    @staticmethod
    def _check_rate(rate: float) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1, not {rate}")

    def error_rate(self, verb: str, rate: float, code: int = 500) -> None:
        """Fail this fraction of requests of a verb with ``code`` (429 comes with Retry-After)."""
        if verb not in FAULT_VERBS:
            raise ValueError(f"verb must be one of {', '.join(FAULT_VERBS)}, not {verb!r}")
        self._check_rate(rate)
        with self._lock:
            if rate:
                self._errors[verb] = (rate, code)
            else:
                self._errors.pop(verb, None)

    def lose_responses(self, verb: str, rate: float, *, resource: str | None = None,
                       how: LostResponse = "reset") -> None:
        """Commit this fraction of successful writes of a verb, then lose their answers.

        The write is applied to the store (watchers see it), but instead of its 2xx answer the
        client gets a reset or closed connection (see :data:`LostResponse`): it cannot tell
        whether the write happened, and its retry meets the consequence - AlreadyExists after
        a create, NotFound after a delete, Conflict after an update under a resourceVersion.
        ``resource`` (a plural such as ``persistentvolumes``) limits the fault to one resource;
        a fault for one resource takes precedence over one for all. Writes that fail and dry
        runs are answered as usual; rate 0 removes the fault.
        """
        if verb not in WRITE_VERBS:
            raise ValueError(f"verb must be one of {', '.join(WRITE_VERBS)}, not {verb!r}")
        if how not in get_args(LostResponse):
            raise ValueError(f"how must be one of {', '.join(get_args(LostResponse))}, not {how!r}")
        self._check_rate(rate)
        with self._lock:
            if rate:
                self._lost[(verb, resource)] = (rate, how)
            else:
                self._lost.pop((verb, resource), None)

    def latency(self, seconds: float) -> None:
        """Add this delay to every request."""
        with self._lock:
            self._latency = max(0.0, seconds)

    def forget_history(self) -> None:
        """Compact the history: any resume (watch or continue) from an older version gets 410."""
        self._server.store.forget_history()

    def conflict_storm(self, rate: float) -> None:
        """Fail this fraction of updates and patches with 409 Conflict."""
        self._check_rate(rate)
        with self._lock:
            self._conflicts = rate

    def reset(self) -> None:
        """Remove every fault."""
        with self._lock:
            self._errors.clear()
            self._latency = 0.0
            self._conflicts = 0.0
            self._lost.clear()

    # -- used by the dispatcher

    def delay(self) -> float:
        with self._lock:
            return self._latency

    def injected_error(self, verb: str) -> ApiError | None:
        with self._lock:
            rate, code = self._errors.get(verb, (0.0, 500))
            return ApiError.injected(code) if rate and self._rng.random() < rate else None

    def injected_conflict(self) -> bool:
        with self._lock:
            return bool(self._conflicts) and self._rng.random() < self._conflicts

    def lost_response(self, verb: str, resource: str) -> LostResponse | None:
        """How to lose the answer to a successful write of ``verb`` on ``resource``, or None to send it."""
        with self._lock:
            fault = self._lost.get((verb, resource)) or self._lost.get((verb, None))
            if fault is None or self._rng.random() >= fault[0]:
                return None
            return fault[1]

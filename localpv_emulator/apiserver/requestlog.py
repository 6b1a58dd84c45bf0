"""The log of served requests, so tests and benchmarks can count API calls."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """One served HTTP request."""

    method: str
    path: str
    query: str
    status: int
    verb: str
    resource: str = ""
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    #: a committed write whose answer was not sent (:meth:`Faults.lose_responses`)
    lost: bool = False


class RequestLog:
    """Every request served, so tests and benchmarks can count API calls per verb/resource."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._sent: Counter[tuple[str, str]] = Counter()

    def sent(self, verb: str, resource: str, size: int) -> None:
        """Count ``size`` bytes of response body sent (a watch: each event's line, as it goes)."""
        with self._lock:
            self._sent[(verb, resource)] += size

    def bytes_sent(self, verb: str | None = None, resource: str | None = None) -> int:
        """Response body bytes sent for requests matching every given criterion (benchmarks: what a
        client's list and watch cost it). Kept through :meth:`clear`."""
        with self._lock:
            return sum(n for (v, r), n in self._sent.items()
                       if (verb is None or v == verb) and (resource is None or r == resource))

    def record(self, record: RequestRecord) -> None:
        """Append one served request."""
        with self._lock:
            self._records.append(record)

    def records(self) -> list[RequestRecord]:
        """A snapshot of the log, oldest first."""
        with self._lock:
            return list(self._records)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.records())

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def count(
        self,
        verb: str | None = None,
        resource: str | None = None,
        *,
        method: str | None = None,
        status: int | None = None,
    ) -> int:
        """How many requests match every given criterion."""
        return sum(
            1 for r in self.records()
            if (verb is None or r.verb == verb) and (resource is None or r.resource == resource)
            and (method is None or r.method == method) and (status is None or r.status == status)
        )

    def counts(self) -> Counter[tuple[str, str]]:
        """Requests per (verb, resource)."""
        return Counter((r.verb, r.resource) for r in self.records())

    def clear(self) -> None:
        """Forget what was served so far (to count the calls of one phase of a test)."""
        with self._lock:
            self._records.clear()


@dataclass
class RequestInfo:
    """What the request log records about a request, filled in as it is understood."""

    verb: str = "discovery"
    resource: str = ""
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

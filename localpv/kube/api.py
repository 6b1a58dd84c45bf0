"""The narrow seam between localpv and the API server: plain-dict REST calls.

It sends and receives JSON dicts through a :class:`~localpv.kube.transport.Transport`
(one urllib3 pool and the credentials; :mod:`localpv.kube.client` builds it, from
credentials localpv reads itself or through the ``kubernetes`` package for auth plugins):
whichever built it, every request takes the same path and the same policy below.

**One failure policy, in one place.**

* *A closed boundary.* Every exception that leaves :mod:`localpv.kube` is an
  :class:`~localpv.kube.errors.ApiError` subclass: HTTP statuses by
  :func:`~localpv.kube.errors.classify_status`; refused or reset connections, timeouts,
  urllib3 and TLS errors as ``Retryable``; an answer that is not JSON of the shape the API
  sends (a proxy's HTML, a truncated body, an array where an object belongs, a watch line
  that is not an event) as ``BadResponse``; anything else the client library raises as
  ``Permanent``. Every attempt is reported to the observer with its error, so a garbage
  body is counted as a failure, never as "ok".
* *Requests are retried here and nowhere else.* A get, list page, create, replace, patch
  or delete that fails ``Retryable`` is sent again after ``backoff`` (exponential, with
  jitter, at most ``backoff.attempts`` tries), or after the server's ``Retry-After`` when
  it gives one (capped at ``backoff.maximum``); ``stop`` cuts the wait short. Every other
  class is raised at once. Nothing above this module retries a request: a caller that
  gets an ``ApiError`` gives up that action, and its own schedule - the agent's next pass,
  a work queue's per-item backoff, the leader elector's retry period - decides again
  later from fresh state. Transports never retry (urllib3's own retries of resets and
  timeouts are off on both paths).
* *Sent again at once, once*, and only when it cannot have been acted on: a request on a
  pooled keep-alive connection the server had closed meanwhile (nothing came back), and
  a request refused with 401 when the credentials, read again, have changed (a rotated
  service-account token).
* *Conflicts* are not retried blindly: :meth:`KubeApi.update` reads, changes and writes
  again, so the change is re-decided on the new state.
* *Watches* are not retried here: :class:`~localpv.kube.informer.Informer` owns re-watch
  and relist, with its own backoff, and lists through :meth:`KubeApi.with_policy`
  without request retries, so the two loops never stack.

**A good API citizen.** Every attempt of every request first takes a token from the
process's rate limiter (:mod:`localpv.kube.ratelimit`); a watch takes one when it is
opened, none for the events it brings.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote

from localpv.clock import Clock, SystemClock
from localpv.crashpoints import reached
from localpv.kube.errors import (
    ApiError,
    Backoff,
    Conflict,
    Permanent,
    Retryable,
    bad_response,
    error_from_response,
    transport_error,
)
from localpv.kube.objects import Obj
from localpv.kube.ratelimit import RateLimiter, TokenBucket
from localpv.kube.resources import Resource
from localpv.kube.transport import Response, Transport

log = logging.getLogger(__name__)

#: The verbs that change the cluster: each is a crash point once it is answered.
_WRITES = frozenset({"create", "update", "patch", "delete"})
#: Writes that are no step of a protocol: events (said, not kept), leases (a leader's heartbeat,
#: written on a period: leader election has tests of its own) and CSIStorageCapacity objects (a
#: figure recomputed and written again from scratch at every pass: nothing to recover).
_NOT_STEPS = frozenset({"events", "leases", "csistoragecapacities"})

#: One page of a list: its items and the list's resourceVersion.
Page = tuple[list[Obj], str]

#: Called after every request: (verb, resource plural, seconds, error or None).
RequestObserver = Callable[[str, str, float, ApiError | None], None]

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}

WATCH_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""

    type: str
    object: Obj


def _transport_exceptions() -> tuple[type[BaseException], ...]:
    import http.client

    import urllib3

    return (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


def _unsent(exc: BaseException) -> bool:
    """The connection was closed before the request went out or any answer came back."""
    import http.client

    causes = (exc, *getattr(exc, "args", ()), exc.__cause__, exc.__context__)
    return any(isinstance(c, (http.client.RemoteDisconnected, BrokenPipeError)) for c in causes)


def _json_object(raw: bytes) -> Obj:
    """The decoded body, which must be a JSON object (an empty body is an empty object)."""
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise bad_response("a body that is not JSON", raw) from err
    if not isinstance(doc, dict):
        raise bad_response(f"a JSON {type(doc).__name__} where an object belongs", raw)
    return doc


def _check_list(page: Obj) -> None:
    items, meta = page.get("items"), page.get("metadata")
    if items is not None and not (isinstance(items, list) and all(isinstance(i, dict) for i in items)):
        raise bad_response("a list whose items are not objects", json.dumps(items)[:120])
    if meta is not None and not isinstance(meta, dict):
        raise bad_response("a list whose metadata is not an object", json.dumps(meta)[:120])


class KubeApi:
    """Typed-by-convention access to any :class:`Resource`, returning dicts."""

    def __init__(
        self,
        transport: Transport,
        *,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        observer: RequestObserver | None = None,
        timeout: float = 30.0,
        stop: threading.Event | None = None,
        user_agent: str = "localpv",
        limiter: RateLimiter | None = None,
        event_limiter: RateLimiter | None = None,
    ) -> None:
        self.transport = transport
        self.user_agent = user_agent
        self.backoff = backoff or Backoff()
        self.clock = clock or SystemClock()
        self.observer = observer
        self.timeout = timeout
        self.stop = stop or threading.Event()
        #: The process's rate limiter (None: unlimited, as in tests and benchmarks that say so).
        self.limiter = limiter
        #: The events' own budget (``--event-qps``); None: a sibling of ``limiter`` at its rate.
        self.event_limiter = event_limiter
        self._transport_errors = _transport_exceptions()

    def with_policy(self, *, backoff: Backoff | None = None, timeout: float | None = None) -> KubeApi:
        """The same connection, rate limiter, observer, clock and stop event, with another
        retry policy or timeout (leader election must fail fast; the informer retries itself)."""
        other = copy.copy(self)
        if backoff is not None:
            other.backoff = backoff
        if timeout is not None:
            other.timeout = timeout
        return other

    def for_events(self) -> KubeApi:
        """The same connection on the events' own budget (``event_limiter``): a burst of
        warnings must not hold back the deletion of a PV offered over dirty data."""
        other = copy.copy(self)
        if self.event_limiter is not None:
            other.limiter = self.event_limiter
        elif isinstance(self.limiter, TokenBucket):
            other.limiter = self.limiter.sibling()
        return other

    # ------------------------------------------------------------------ plumbing

    def _request(
        self,
        verb: str,
        res: Resource,
        method: str,
        path: str,
        *,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        stream: bool = False,
        timeout: float | tuple[float, float] | None = None,
        check: Callable[[Obj], None] | None = None,
    ) -> Any:
        """One attempt: a token, one HTTP request, the decoded JSON object (the open
        :class:`Response` if ``stream``), checked by ``check``. Raises only :class:`ApiError`."""
        if self.limiter is not None:
            self.limiter.acquire(self.stop)
        started = time.monotonic()
        error: ApiError | None = None
        try:
            resp = self._send(method, path, query, body, content_type,
                              timeout if timeout is not None else self.timeout)
            if not 200 <= resp.status < 300:
                raise error_from_response(resp.status, self._read(resp), resp.headers)
            if stream:
                return resp
            doc = _json_object(self._read(resp))
            if check is not None:
                check(doc)
            return doc
        except ApiError as err:
            error = err
            raise
        finally:
            if self.observer is not None:
                self.observer(verb, res.plural, time.monotonic() - started, error)

    def _send(self, method: str, path: str, query: list[tuple[str, Any]] | None, body: Any, content_type: str,
              timeout: float | tuple[float, float]) -> Response:
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        data: bytes | None = None
        if body is not None:
            headers["Content-Type"] = content_type
            try:
                data = json.dumps(body).encode()
            except (TypeError, ValueError) as exc:
                raise Permanent(0, "ClientError", f"{type(exc).__name__}: {exc}") from exc
        unsent_once = reauthenticated = False
        while True:
            try:
                resp = self.transport.request(method, path, query=query, headers=headers, body=data,
                                              timeout=timeout)
            except self._transport_errors as exc:
                if _unsent(exc) and not unsent_once:
                    # A pooled keep-alive connection the server had already closed: the request
                    # never reached it. Sent again at once, once (Go's net/http does the same).
                    unsent_once = True
                    continue
                raise transport_error(exc) from exc
            except Exception as exc:  # credentials that cannot be had (an exec plugin failing), a bug
                raise Permanent(0, "ClientError", f"{type(exc).__name__}: {exc}") from exc
            if resp.status == 401 and not reauthenticated and self._reauthenticate():
                # The token was rotated since it was read (a service account's, about hourly):
                # the new one gets its chance now rather than a failed action.
                reauthenticated = True
                resp.close()
                continue
            return resp

    def _reauthenticate(self) -> bool:
        try:
            return self.transport.reauthenticate()
        except Exception as exc:  # credentials that cannot be read again: the 401 stands
            log.warning("cannot read the credentials again after a 401: %s", exc)
            return False

    def _read(self, resp: Response) -> bytes:
        try:
            return resp.read()
        except Exception as exc:  # a body cut short surfaces as urllib3, socket or http.client errors
            raise transport_error(exc) from exc

    def _retrying(self, verb: str, res: Resource, fn: Callable[[], Obj]) -> Obj:
        """Run one request, again after ``Retryable`` failures, per the backoff or Retry-After."""
        attempt = 1
        while True:
            try:
                done = fn()
                if verb in _WRITES and res.plural not in _NOT_STEPS:
                    reached(f"api:{verb}:{res.plural}")  # a durable step of the cluster's state
                return done
            except Retryable as err:
                if attempt >= self.backoff.attempts or self.stop.is_set():
                    raise
                delay = err.retry_after if err.retry_after is not None else self.backoff.delay(attempt)
                delay = min(delay, self.backoff.maximum)
                log.debug("%s %s: %s; retry %d/%d in %.2fs", verb, res.plural, err, attempt,
                          self.backoff.attempts - 1, delay)
                if self.clock.wait(self.stop, delay):
                    raise
                attempt += 1

    # ------------------------------------------------------------------ verbs

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        path = res.path(namespace, _q(name))
        return self._retrying("get", res, lambda: self._request("get", res, "GET", path))

    def discover(self, group: str, version: str = "") -> Obj:
        """A discovery document: the group's (``/apis/<group>``, an APIGroup listing its
        versions) or, with ``version``, that group version's APIResourceList. Raises
        :class:`~localpv.kube.errors.NotFound` when the server does not serve it. Counted in
        the request metrics as resource ``discovery``."""
        res = Resource(group, version, "discovery", "Discovery", False)
        root = f"/apis/{group}" if group else "/api"
        path = f"{root}/{version}" if version else root
        return self._retrying("get", res, lambda: self._request("get", res, "GET", path))

    def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[list[Obj], str]:
        """All matching objects (paged) and the list's resourceVersion for a following watch."""
        items: list[Obj] = []
        rv = ""
        for page, page_rv in self.list_pages(res, namespace, label_selector=label_selector,
                                             field_selector=field_selector, page_size=page_size):
            items.extend(page)
            rv = page_rv
        return items, rv

    def list_pages(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[Page]:
        """Yield (items, resourceVersion) page by page, following every ``continue`` token,
        so a scan of a large collection holds one page in memory at a time."""
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [("limit", page_size)]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if token:
                query.append(("continue", token))
            page = self._retrying("list", res, partial(self._request, "list", res, "GET", res.path(namespace),
                                                       query=query, check=_check_list))
            items: list[Obj] = page.get("items") or []
            for item in items:
                # Lists omit kind/apiVersion on items; restore them so objects are uniform.
                item.setdefault("kind", res.kind)
                item.setdefault("apiVersion", res.api_version)
            meta = page.get("metadata") or {}
            yield items, str(meta.get("resourceVersion") or "")
            token = str(meta.get("continue") or "")
            if not token:
                return

    def create(self, res: Resource, obj: Obj, namespace: str | None = None) -> Obj:
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        path = res.path(ns)
        return self._retrying("create", res, lambda: self._request("create", res, "POST", path, body=obj))

    def replace(self, res: Resource, obj: Obj, *, subresource: str | None = None) -> Obj:
        """PUT; the object's resourceVersion makes it an optimistic-concurrency update."""
        meta = obj["metadata"]
        path = res.path(meta.get("namespace"), _q(meta["name"]), subresource)
        return self._retrying("update", res, lambda: self._request("update", res, "PUT", path, body=obj))

    def update(self, res: Resource, name: str, change: Callable[[Obj], Obj | None], namespace: str | None = None,
               *, attempts: int = 5) -> Obj | None:
        """Read, change, write back under the read resourceVersion; on Conflict (someone
        wrote in between) read and change again, at most ``attempts`` times, then raise it.

        ``change`` gets the object as read and returns the object to write, or None when
        nothing needs changing (then nothing is written and None is returned).
        """
        attempt = 1
        while True:
            wanted = change(self.get(res, name, namespace))
            if wanted is None:
                return None
            try:
                return self.replace(res, wanted)
            except Conflict:
                if attempt >= attempts:
                    raise
                attempt += 1

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> Obj:
        path = res.path(namespace, _q(name), subresource)
        content_type = PATCH_TYPES[patch_type]
        return self._retrying("patch", res, lambda: self._request("patch", res, "PATCH", path, body=patch,
                                                                  content_type=content_type))

    def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = None,
        grace_period: int | None = None,
    ) -> Obj:
        """DELETE with optional preconditions; a precondition mismatch raises Conflict.
        ``grace_period`` 0 deletes a pod at once (no kubelet confirms it: a lost node's pod)."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            body["preconditions"] = preconditions
        if propagation:
            body["propagationPolicy"] = propagation
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        path = res.path(namespace, _q(name))
        return self._retrying("delete", res, lambda: self._request("delete", res, "DELETE", path, body=body))

    def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> WatchStream:
        """Open a watch from ``resource_version``; iterate the result for events.

        Not retried here: the informer owns reconnect and relist decisions. Opening it
        takes one token from the rate limiter; its events take none.
        """
        query: list[tuple[str, Any]] = [
            ("watch", "true"), ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version), ("timeoutSeconds", timeout_seconds),
        ]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        resp = self._request(
            "watch", res, "GET", res.path(namespace), query=query, stream=True,
            timeout=(10.0, timeout_seconds + 30.0),
        )
        return WatchStream(resp)


class WatchStream:
    """Iterator over a chunked watch response; ``close()`` ends it from another thread."""

    def __init__(self, resp: Response) -> None:
        self._resp = resp
        self._closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        buffer = b""
        try:
            for chunk in self._resp.stream():
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield _decode_event(line)
            if buffer.strip():
                yield _decode_event(buffer)
        except ApiError:
            raise
        except Exception as exc:  # urllib3, socket and http.client errors: the stream broke
            if not self._closed:
                raise transport_error(exc) from exc
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # closing a dead socket: nothing left to do
            self._resp.close()


def _decode_event(line: bytes) -> WatchEvent:
    """One watch line: a JSON object with a known ``type`` and an object (whose metadata,
    if any, is an object); anything else is a :class:`BadResponse`."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError) as err:
        raise bad_response("a watch line that is not JSON", line) from err
    obj = doc.get("object") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("type") not in WATCH_EVENT_TYPES or not isinstance(obj, dict) \
            or not isinstance(obj.get("metadata", {}), dict):
        raise bad_response("a watch line that is not a watch event", line)
    return WatchEvent(str(doc["type"]), obj)


def _q(name: str) -> str:
    return quote(name, safe="")

"""The narrow seam between localpv and the API server: plain-dict REST calls.

It uses the real ``kubernetes`` client for what it is good at (kubeconfig, auth, TLS,
connection pooling) and sends/receives JSON dicts through ``ApiClient.call_api``. All
errors are classified by :mod:`localpv.kube.errors`; transient ones are retried here with
backoff and jitter; every request is reported to an observer (request metrics).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote

from localpv.clock import Clock, SystemClock
from localpv.kube.errors import (
    ApiError,
    Backoff,
    Retryable,
    call_with_retries,
    error_from_response,
    transport_error,
)
from localpv.kube.resources import Resource

Obj = dict[str, Any]
#: One page of a list: its items and the list's resourceVersion.
Page = tuple[list[Obj], str]

#: Called after every request: (verb, resource plural, seconds, error or None).
RequestObserver = Callable[[str, str, float, ApiError | None], None]

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""

    type: str
    object: Obj


def _transport_exceptions() -> tuple[type[BaseException], ...]:
    import urllib3

    return (urllib3.exceptions.HTTPError, OSError, ConnectionError, TimeoutError)


class KubeApi:
    """Typed-by-convention access to any :class:`Resource`, returning dicts."""

    def __init__(
        self,
        api_client: Any,
        *,
        backoff: Backoff | None = None,
        clock: Clock | None = None,
        observer: RequestObserver | None = None,
        timeout: float = 30.0,
        stop: threading.Event | None = None,
        user_agent: str = "localpv",
    ) -> None:
        self.api_client = api_client
        self.backoff = backoff or Backoff()
        self.clock = clock or SystemClock()
        self.observer = observer
        self.timeout = timeout
        self.stop = stop or threading.Event()
        api_client.user_agent = user_agent
        self._transport_errors = _transport_exceptions()

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
    ) -> Any:
        """One HTTP request; returns the decoded JSON (or the raw response if ``stream``)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, _, _ = self.api_client.param_serialize(
            method=method, resource_path=path, query_params=query or [], header_params=headers,
            auth_settings=["BearerToken"],
        )
        started = time.monotonic()
        error: ApiError | None = None
        try:
            try:
                resp = self.api_client.call_api(
                    method, url, header_params=headers, body=body,
                    _request_timeout=timeout if timeout is not None else self.timeout,
                )
            except self._transport_errors as exc:
                raise transport_error(exc) from exc
            except Exception as exc:  # the client wraps SSL and other transport issues
                if getattr(exc, "status", None) == 0:
                    raise transport_error(exc) from exc
                raise
            if not 200 <= resp.status < 300:
                data = resp.read()
                raise error_from_response(resp.status, data, resp.headers)
            if stream:
                return resp
            try:
                raw = resp.read()
            except self._transport_errors as exc:
                raise transport_error(exc) from exc
            return json.loads(raw) if raw else {}
        except ApiError as err:
            error = err
            raise
        finally:
            if self.observer is not None:
                self.observer(verb, res.plural, time.monotonic() - started, error)

    def _retrying(self, fn: Callable[[], Any]) -> Any:
        return call_with_retries(fn, self.backoff, clock=self.clock, stop=self.stop)

    # ------------------------------------------------------------------ verbs

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        path = res.path(namespace, _q(name))
        return dict(self._retrying(lambda: self._request("get", res, "GET", path)))

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
        """Yield (items, resourceVersion) page by page, so a scan of a large collection
        holds one page in memory at a time."""
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [("limit", page_size)]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if token:
                query.append(("continue", token))
            page = self._retrying(partial(self._request, "list", res, "GET", res.path(namespace), query=query))
            items = page.get("items") or []
            for item in items:
                # Lists omit kind/apiVersion on items; restore them so objects are uniform.
                item.setdefault("kind", res.kind)
                item.setdefault("apiVersion", res.api_version)
            meta = page.get("metadata") or {}
            yield items, str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                return

    def create(self, res: Resource, obj: Obj, namespace: str | None = None) -> Obj:
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        path = res.path(ns)
        return dict(self._retrying(lambda: self._request("create", res, "POST", path, body=obj)))

    def replace(self, res: Resource, obj: Obj, *, subresource: str | None = None) -> Obj:
        """PUT; the object's resourceVersion makes it an optimistic-concurrency update."""
        meta = obj["metadata"]
        path = res.path(meta.get("namespace"), _q(meta["name"]), subresource)
        return dict(self._retrying(lambda: self._request("update", res, "PUT", path, body=obj)))

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
        return dict(self._retrying(
            lambda: self._request("patch", res, "PATCH", path, body=patch, content_type=content_type)
        ))

    def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = None,
    ) -> Obj:
        """DELETE with optional preconditions; a precondition mismatch raises Conflict."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            body["preconditions"] = preconditions
        if propagation:
            body["propagationPolicy"] = propagation
        path = res.path(namespace, _q(name))
        return dict(self._retrying(lambda: self._request("delete", res, "DELETE", path, body=body)))

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

        Not retried here: the informer owns reconnect and relist decisions.
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
        return WatchStream(resp, self._transport_errors)


class WatchStream:
    """Iterator over a chunked watch response; ``close()`` ends it from another thread."""

    def __init__(self, resp: Any, transport_errors: tuple[type[BaseException], ...]) -> None:
        self._resp = resp
        self._transport_errors = transport_errors
        self._closed = False

    def __iter__(self) -> Iterator[WatchEvent]:
        buffer = b""
        try:
            for chunk in self._resp.response.stream(None, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield _decode_event(line)
            if buffer.strip():
                yield _decode_event(buffer)
        except self._transport_errors as exc:
            if not self._closed:
                raise transport_error(exc) from exc
        finally:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._resp.response.shutdown() if hasattr(self._resp.response, "shutdown") else None
            self._resp.response.release_conn()
        except Exception:  # closing a dead socket: nothing left to do
            pass


def _decode_event(line: bytes) -> WatchEvent:
    try:
        doc = json.loads(line)
    except ValueError as err:
        raise Retryable(0, "BadWatchEvent", f"undecodable watch line: {line[:120]!r}") from err
    return WatchEvent(str(doc.get("type", "")), doc.get("object") or {})


def _q(name: str) -> str:
    return quote(name, safe="")

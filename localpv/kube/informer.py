"""A list+watch cache of one resource, filtered on the server.

The agent's PV informer selects on its own node label, so its traffic and memory grow
with this node's volumes, not with the cluster (upstream watches every PV). The loop is
the classic one: list (paged) → watch from the list's resourceVersion → on a clean end
re-watch from the last seen version; on ``410 Gone`` relist and diff; on transient
errors back off (with jitter) and re-watch. Bookmarks keep the version fresh so a
re-watch after a quiet period does not need a relist.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localpv.clock import Clock, SystemClock
from localpv.kube.api import KubeApi, Obj, WatchStream
from localpv.kube.errors import ApiError, Backoff, Gone, Retryable, classify_status
from localpv.kube.resources import Resource

log = logging.getLogger(__name__)

#: (event type ADDED/MODIFIED/DELETED, old object or None, new object or None)
ChangeHandler = Callable[[str, Obj | None, Obj | None], None]


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    relists_after_gone: int = 0
    errors: int = 0


class Informer:
    """Keeps ``self.store`` equal to the server's view of the selected objects."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_change: ChangeHandler | None = None,
        clock: Clock | None = None,
        backoff: Backoff | None = None,
        watch_timeout: int = 300,
        name: str | None = None,
    ) -> None:
        self.api = api
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.handlers: list[ChangeHandler] = [on_change] if on_change else []
        self.clock = clock or SystemClock()
        self.backoff = backoff or Backoff(initial=0.5, maximum=30.0, attempts=1_000_000)
        self.watch_timeout = watch_timeout
        self.name = name or f"informer-{resource.plural}"
        self.stats = InformerStats()
        self._store: dict[str, Obj] = {}
        self._lock = threading.RLock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self.resource_version = ""

    # ------------------------------------------------------------------ reading

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        with self._lock:
            return self._store.get(f"{namespace}/{name}" if namespace else name)

    def list(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)

    def alive(self) -> bool:
        """Its thread runs (False before start and after stop)."""
        return self._thread is not None and self._thread.is_alive()

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        failures = 0
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                rv = self._watch(rv)
                failures = 0
            except Gone:
                self.stats.relists_after_gone += 1
                log.info("%s: resourceVersion expired, relisting", self.name)
                rv = None
            except ApiError as err:
                if self._stop.is_set():
                    break
                failures += 1
                self.stats.errors += 1
                delay = self.backoff.delay(failures)
                log.warning("%s: %s; retrying in %.1fs", self.name, err, delay)
                if not isinstance(err, Retryable):
                    rv = None  # a permanent error may mean our view is wrong: start over
                elif rv is not None:
                    # Resume after the last event applied, not where the broken watch began:
                    # replaying applied events briefly brings back deleted incarnations (a
                    # Released copy of a PV that is Bound again), which the agent acts on.
                    rv = self.resource_version or rv
                self.clock.wait(self._stop, delay)

    def _relist(self) -> str:
        items, rv = self.api.list(
            self.resource, self.namespace,
            label_selector=self.label_selector, field_selector=self.field_selector,
        )
        self.stats.lists += 1
        fresh = {object_key(o): o for o in items}
        with self._lock:
            old = self._store
            self._store = fresh
            self.resource_version = rv
        for key, obj in old.items():
            if key not in fresh:
                self._notify("DELETED", obj, None)
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._notify("ADDED", None, obj)
            elif _rv(before) != _rv(obj):
                self._notify("MODIFIED", before, obj)
        self._synced.set()
        return rv

    def _watch(self, rv: str) -> str:
        stream = self.api.watch(
            self.resource, self.namespace, resource_version=rv,
            label_selector=self.label_selector, field_selector=self.field_selector,
            timeout_seconds=self.watch_timeout,
        )
        self._stream = stream
        self.stats.watches += 1
        try:
            if self._stop.is_set():
                return rv
            for event in stream:
                if event.type == "ERROR":
                    raise _status_error(event.object)
                new_rv = _rv(event.object)
                if event.type != "BOOKMARK":
                    self.stats.events += 1
                    self._apply(event.type, event.object)
                if new_rv:
                    rv = new_rv
                    self.resource_version = rv
                if self._stop.is_set():
                    break
        finally:
            self._stream = None
            stream.close()
        return rv

    def _apply(self, kind: str, obj: Obj) -> None:
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        key = object_key(obj)
        with self._lock:
            old = self._store.get(key)
            if kind == "DELETED":
                self._store.pop(key, None)
            else:
                self._store[key] = obj
        if kind == "DELETED":
            self._notify("DELETED", old or obj, None)
        else:
            self._notify("MODIFIED" if old is not None else "ADDED", old, obj)

    def _notify(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        for handler in self.handlers:
            try:
                handler(kind, old, new)
            except Exception:  # a handler bug must not kill the cache
                log.exception("%s: change handler failed", self.name)


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _status_error(status: Any) -> ApiError:
    code = int(status.get("code") or 500) if isinstance(status, dict) else 500
    reason = str(status.get("reason") or "") if isinstance(status, dict) else ""
    message = str(status.get("message") or "watch error") if isinstance(status, dict) else "watch error"
    return classify_status(code, reason, message)

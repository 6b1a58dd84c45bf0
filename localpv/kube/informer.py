"""A list+watch cache of one resource, filtered on the server.

The agent's PV informer selects on its own node label, so its traffic and memory grow
with this node's volumes, not with the cluster (upstream watches every PV). The loop is
the classic one: list (paged) → watch from the list's resourceVersion → on a clean end
re-watch from the last seen version; on ``410 Gone`` relist and diff. Bookmarks keep the
version fresh so a re-watch after a quiet period does not need a relist.

This loop is the one place that retries list and watch: it lists through an API handle
without request retries, and after any failure it backs off (with jitter, at least the
server's Retry-After) and then

* re-watches from the last applied event after a transient error (connection, 5xx, 429);
* relists from scratch after anything else - a permanent error (our view may be wrong),
  a garbage list body or watch line (events may have been lost), or an exception nobody
  foresaw (logged with its traceback). The thread never dies of a failure.

With a ``resync_period`` (upstream's ``minResyncPeriod``) it also relists once each
period has passed, a period drawn anew each time (:func:`jittered_period`), so that
caches refresh from the server and the nodes of a cluster do not relist in lock-step. A
relist tells the handlers what changed, as after a 410.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localpv.clock import Clock, SystemClock
from localpv.kube.api import KubeApi, WatchStream
from localpv.kube.errors import NO_RETRY, ApiError, Backoff, BadResponse, Gone, Retryable, classify_status
from localpv.kube.objects import Obj
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
    #: Periodic relists (``resync_period``).
    resyncs: int = 0
    #: Failures of any kind (each is followed by a backoff).
    errors: int = 0


def jittered_period(minimum: float, rng: random.Random | None = None) -> Callable[[], float] | None:
    """Upstream's resync period: each call draws anew in [minimum, 2·minimum); None when
    ``minimum`` is not positive (no periodic relist)."""
    if minimum <= 0:
        return None
    draw = rng or random.Random()
    return lambda: minimum * (1.0 + draw.random())


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
        resync_period: Callable[[], float] | None = None,
    ) -> None:
        self.api = api
        # This loop retries list and watch itself; request retries inside would stack on it.
        self._lister = api.with_policy(backoff=NO_RETRY)
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.handlers: list[ChangeHandler] = [on_change] if on_change else []
        self.clock = clock or SystemClock()
        self.backoff = backoff or Backoff(initial=0.5, maximum=30.0, attempts=1_000_000)
        self.watch_timeout = watch_timeout
        self.name = name or f"informer-{resource.plural}"
        #: Seconds until the next periodic relist, drawn after each list (None: never).
        self.resync_period = resync_period
        self._relist_at: float | None = None
        self._watch_opened = False  # the current attempt got as far as an open watch
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
            listed = False
            self._watch_opened = False
            try:
                if rv is not None and self._resync_due():
                    self.stats.resyncs += 1
                    rv = None
                if rv is None:
                    rv = self._relist()
                    listed = True
                    failures = 0  # a list that worked is a success: backoff starts afresh
                rv = self._watch(rv)
                failures = 0
            except Gone:
                self.stats.relists_after_gone += 1
                rv = None
                if listed:  # even a fresh list's version is too old: do not spin on it
                    failures += 1
                    self.stats.errors += 1
                    self._back_off(failures, "resourceVersion of a fresh list already expired; relisting")
                else:
                    log.info("%s: resourceVersion expired, relisting", self.name)
            except Exception as err:  # the cache must outlive any failure, foreseen or not
                if self._stop.is_set():
                    break
                if self._watch_opened:
                    # The watch was up and then broke (a cut connection, a restart): that is
                    # not a run of failures, and growing the delay would leave the cache
                    # stale for ever longer while the API server is fine.
                    failures = 0
                failures += 1
                self.stats.errors += 1
                if isinstance(err, Retryable) and not isinstance(err, BadResponse):
                    if rv is not None:
                        # Resume after the last event applied, not where the broken watch began:
                        # replaying applied events briefly brings back deleted incarnations (a
                        # Released copy of a PV that is Bound again), which the agent acts on.
                        rv = self.resource_version or rv
                    self._back_off(failures, f"{err}; watching again", err.retry_after)
                    continue
                # A permanent error may mean our view is wrong, garbage may have hidden events,
                # and after a bug nothing is known: start over from a list.
                rv = None
                if isinstance(err, ApiError):
                    self._back_off(failures, f"{err}; relisting", err.retry_after)
                else:
                    log.error("%s: unexpected failure", self.name, exc_info=err)
                    self._back_off(failures, f"unexpected {type(err).__name__}; relisting")

    def _back_off(self, failures: int, what: str, retry_after: float | None = None) -> None:
        delay = max(self.backoff.delay(failures), retry_after or 0.0)
        log.warning("%s: %s in %.1fs", self.name, what, delay)
        self.clock.wait(self._stop, delay)

    def _resync_due(self) -> bool:
        return self._relist_at is not None and self.clock.monotonic() >= self._relist_at

    def _relist(self) -> str:
        items, rv = self._lister.list(
            self.resource, self.namespace,
            label_selector=self.label_selector, field_selector=self.field_selector,
        )
        self.stats.lists += 1
        period = self.resync_period() if self.resync_period is not None else None
        self._relist_at = self.clock.monotonic() + period if period is not None else None
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
        timeout = self.watch_timeout
        if self._relist_at is not None:  # end the watch when the periodic relist is due
            timeout = max(1, min(timeout, math.ceil(self._relist_at - self.clock.monotonic())))
        stream = self.api.watch(
            self.resource, self.namespace, resource_version=rv,
            label_selector=self.label_selector, field_selector=self.field_selector,
            timeout_seconds=timeout,
        )
        self._stream = stream
        self.stats.watches += 1
        self._watch_opened = True
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
    try:
        code = int(status.get("code") or 500) if isinstance(status, dict) else 500
    except (TypeError, ValueError):
        code = 500
    reason = str(status.get("reason") or "") if isinstance(status, dict) else ""
    message = str(status.get("message") or "watch error") if isinstance(status, dict) else "watch error"
    return classify_status(code, reason, message)

"""Watch streams: the initial state or a history replay, then live changes and bookmarks."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from localpv_emulator.apiserver.resources import Obj
from localpv_emulator.apiserver.routing import Route
from localpv_emulator.apiserver.selection import Selection
from localpv_emulator.apiserver.store import Change, encode_event
from localpv_emulator.apiserver.tables import Renderer

if TYPE_CHECKING:
    from localpv_emulator.apiserver.server import ApiServer


class WatchStream:
    """One watch: initial state or history replay, then live changes, bookmarks, timeout.

    Selector transitions follow the real watch cache: an object that stops matching is sent
    as DELETED (its previous content with the change's resourceVersion), one that starts
    matching as ADDED.
    """

    def __init__(
        self,
        server: ApiServer,
        route: Route,
        selection: Selection,
        start: int | None,
        bookmarks: bool,
        timeout: float | None,
        initial_end: bool,
        render: Renderer | None = None,
    ) -> None:
        self.server = server
        self.render = render
        self.store = server.store
        self.route = route
        self.selection = selection
        self.start = start
        self.bookmarks = bookmarks
        self.deadline = time.monotonic() + timeout if timeout else None
        self.initial_end = initial_end
        self.epoch = server.watch_epoch
        self.next_bookmark = time.monotonic() + server.bookmark_interval

    def stopped(self) -> bool:
        return self.server.watch_epoch != self.epoch

    def abrupt(self) -> bool:
        """Whether the stream was cut (no clean end of the chunked body)."""
        return self.stopped() and self.server.abrupt_cut

    def _visible(self, obj: Obj) -> bool:
        namespace = self.route.namespace
        return (namespace is None or obj["metadata"].get("namespace") == namespace) and self.selection.matches(obj)

    def _bookmark(self, rv: int, initial_end: bool = False) -> bytes:
        meta: Obj = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return encode_event("BOOKMARK", {"kind": self.route.rt.kind, "apiVersion": self.route.rt.api_version,
                                         "metadata": meta})

    def _translate(self, change: Change) -> bytes | None:
        if change.rt is not self.route.rt:
            return None
        now = change.type != "DELETED" and self._visible(change.obj)
        before = change.prev is not None and self._visible(change.prev)
        if now:
            kind, obj = ("MODIFIED" if before else "ADDED"), change.obj
        elif before and change.type == "DELETED":
            kind, obj = "DELETED", change.obj
        elif before and change.prev is not None:
            kind, obj = "DELETED", copy.deepcopy(change.prev)
            obj["metadata"]["resourceVersion"] = str(change.rv)
        else:
            return None
        if self.render is None and kind == change.type:
            return change.line()
        return self._event(kind, obj)

    def _event(self, kind: str, obj: Obj) -> bytes:
        if self.render is not None:
            obj = self.render([obj], {"resourceVersion": obj["metadata"]["resourceVersion"]})
        return encode_event(kind, obj)

    def lines(self, alive: Callable[[], bool]) -> Iterator[bytes]:
        """The stream's JSON lines; ends on timeout, disconnection, a dropped watch or expiry."""
        with self.store.lock:
            if self.start is None:
                cursor = self.store.rv
                first = [self._event("ADDED", o) for o in self.store.items(self.route.rt) if self._visible(o)]
            else:
                cursor, first = self.start, []
                if self.store.history_after(cursor) is None:
                    first, cursor = [encode_event("ERROR", self.store.too_old(cursor).status())], -1
        yield from first
        if cursor < 0:
            return
        if self.initial_end:
            yield self._bookmark(cursor, initial_end=True)
        while True:
            batch, cursor, done = self._next_batch(cursor, alive)
            yield from batch
            if done:
                return

    def _next_batch(self, cursor: int, alive: Callable[[], bool]) -> tuple[list[bytes], int, bool]:
        store = self.store
        with store.changed:
            while True:
                if self.stopped():
                    return [], cursor, True
                changes = store.history_after(cursor)
                if changes is None:
                    return [encode_event("ERROR", store.too_old(cursor).status())], cursor, True
                batch = [line for line in map(self._translate, changes) if line is not None]
                cursor = store.rv
                if batch:
                    return batch, cursor, False
                now = time.monotonic()
                if self.bookmarks and now >= self.next_bookmark:
                    self.next_bookmark = now + self.server.bookmark_interval
                    return [self._bookmark(cursor)], cursor, False
                if (self.deadline is not None and now >= self.deadline) or not alive():
                    return [], cursor, True
                store.changed.wait(timeout=self._wait_time(now))

    def _wait_time(self, now: float) -> float:
        limits = [1.0]
        if self.bookmarks:
            limits.append(self.next_bookmark - now)
        if self.deadline is not None:
            limits.append(self.deadline - now)
        return max(0.001, min(limits))

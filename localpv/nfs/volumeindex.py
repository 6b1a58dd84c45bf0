"""The PVs of this provisioner's server, by directory: who is at, above and below a path.

Every claim asks which PV uses a directory on, above or below the one it would get, and every
release which PVs use a directory or one inside it. Scanning the whole PV cache for that, and
parsing each PV's path again, made provisioning cost O(claims x PVs): 1,000 claims spent most
of their CPU there. The index is kept up to date from the PV cache's change handler instead,
so each question costs the depth of the path.

Two views of each PV's path are kept, because the two questions differ on purpose: the
directory a PV's path parses to (a :class:`~localpv.nfs.pathpattern.SubPath` of the export;
a path that does not parse names none of our directories) for ownership, and the path as
written, normalised, for "who would removing this directory hurt" (which errs on the side of
keeping data).
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from localpv.kube.objects import Obj
from localpv.nfs.pathpattern import PathRejected, SubPath

Parts = tuple[str, ...]


@dataclass(frozen=True)
class _Entry:
    pv: Obj
    sub: SubPath | None
    raw: Parts


class _Tree:
    """Names by path: those at a path exactly, and those at or below every prefix."""

    def __init__(self) -> None:
        self.at: dict[Parts, set[str]] = {}
        self.below: dict[Parts, set[str]] = {}

    def add(self, parts: Parts, name: str) -> None:
        self.at.setdefault(parts, set()).add(name)
        for depth in range(len(parts) + 1):
            self.below.setdefault(parts[:depth], set()).add(name)

    def remove(self, parts: Parts, name: str) -> None:
        for table, keys in ((self.at, [parts]), (self.below, [parts[:d] for d in range(len(parts) + 1)])):
            for key in keys:
                names = table.get(key)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del table[key]

    def related(self, parts: Parts) -> set[str]:
        """Names at ``parts``, at one of its parents, or below it."""
        found = set(self.below.get(parts, ()))
        for depth in range(len(parts)):
            found |= self.at.get(parts[:depth], set())
        return found


class VolumeIndex:
    """This server's PVs by directory; fed with :meth:`changed` (a PV cache change handler)."""

    def __init__(self, server: str, subpath_of: Callable[[str], SubPath]) -> None:
        self.server = server
        self._subpath_of = subpath_of
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._parsed = _Tree()
        self._raw = _Tree()

    def load(self, volumes: Iterable[Obj]) -> None:
        """Add ``volumes`` not known yet: a change already followed is newer than a snapshot."""
        for pv in volumes:
            name = str((pv.get("metadata") or {}).get("name") or "")
            with self._lock:
                if name not in self._entries:
                    self._add(name, pv)

    def changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Follow one change of the PV cache (the informer's handler signature)."""
        pv = new if new is not None else old
        if pv is None:
            return
        name = str((pv.get("metadata") or {}).get("name") or "")
        with self._lock:
            self._remove(name)
            if kind != "DELETED" and new is not None:
                self._add(name, new)

    def _remove(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        if entry.sub is not None:
            self._parsed.remove(entry.sub.parts, name)
        self._raw.remove(entry.raw, name)

    def _add(self, name: str, pv: Obj) -> None:
        nfs = (pv.get("spec") or {}).get("nfs") or {}
        path = str(nfs.get("path") or "")
        if nfs.get("server") != self.server or not path:
            return
        try:
            sub: SubPath | None = self._subpath_of(path)
        except PathRejected:
            sub = None
        raw = tuple(part for part in posixpath.normpath(path).split("/") if part)
        self._entries[name] = _Entry(pv, sub, raw)
        if sub is not None:
            self._parsed.add(sub.parts, name)
        self._raw.add(raw, name)

    def around(self, parts: Parts) -> list[tuple[str, SubPath, Obj]]:
        """PVs whose directory is ``parts``, a parent of it, or inside it (name order)."""
        with self._lock:
            names = self._parsed.related(parts)
            found = [(name, self._entries[name]) for name in sorted(names)]
        return [(name, entry.sub, entry.pv) for name, entry in found if entry.sub is not None]

    def at(self, parts: Parts) -> list[tuple[str, SubPath, Obj]]:
        """PVs whose directory is exactly ``parts`` (name order)."""
        with self._lock:
            found = [(name, self._entries[name]) for name in sorted(self._parsed.at.get(parts, ()))]
        return [(name, entry.sub, entry.pv) for name, entry in found if entry.sub is not None]

    def users(self, server_path: str) -> list[str]:
        """PVs whose path, as written, is ``server_path`` or lies inside it (name order)."""
        raw = tuple(part for part in posixpath.normpath(server_path).split("/") if part)
        with self._lock:
            return sorted(self._raw.below.get(raw, ()))

"""A durable, node-local record of which volumes may hold tenant data.

The PV object alone cannot guarantee that a used volume is cleaned before it is offered
again: someone may delete the PV mid-clean, the agent may be killed at any instant, a
cleaner may fail. So the agent keeps its own record, keyed by the volume's host path,
on the node (a hostPath state dir survives pod restarts):

``offered``  a PV exists or is being created; nobody is known to have used it yet.
``used``     the PV was seen bound to a claim: the volume may hold data.
``cleaning`` a cleanup is required (or running) before the volume is offered again.
``clean``    a cleanup succeeded; the PV may be deleted and the volume re-offered.

A path may be (re)discovered only when it has no entry or is ``clean``. Any entry whose
PV vanished without the agent cleaning it is moved to ``cleaning``: we cannot know what
happened while we were not looking, so the safe answer is to clean.

Writes are atomic (temp file, fsync, rename, fsync of the directory): after a crash the
file is the old or the new version, never a torn one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

OFFERED = "offered"
USED = "used"
CLEANING = "cleaning"
CLEAN = "clean"
STATES = (OFFERED, USED, CLEANING, CLEAN)
FORMAT_VERSION = 1


@dataclass(frozen=True)
class JournalEntry:
    """What the agent knows about one volume path."""

    pv: str
    cls: str
    state: str
    since: float
    #: UID of the claim the volume was last seen bound to ("" if none): a clean volume whose
    #: PV later names another claim was used again, even if no pass saw it Bound.
    claim: str = ""

    def with_state(self, state: str, now: float) -> JournalEntry:
        return replace(self, state=state, since=now)


class JournalError(Exception):
    """The journal file exists but cannot be read: refuse to guess."""


class Journal:
    """The record on disk plus an in-memory copy; thread-safe."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        """``path`` None keeps the journal in memory only (dry runs)."""
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._entries: dict[str, JournalEntry] = {}
        self.writes = 0
        if self.path is not None and self.path.exists():
            self._entries = self._read(self.path)

    @staticmethod
    def _read(path: Path) -> dict[str, JournalEntry]:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("version") != FORMAT_VERSION:
                raise JournalError(f"{path}: unsupported journal version {doc.get('version')!r}")
            entries = {}
            for host_path, raw in doc["volumes"].items():
                entry = JournalEntry(pv=str(raw["pv"]), cls=str(raw["cls"]), state=str(raw["state"]),
                                     since=float(raw["since"]), claim=str(raw.get("claim", "")))
                if entry.state not in STATES:
                    raise JournalError(f"{path}: {host_path}: unknown state {entry.state!r}")
                entries[host_path] = entry
            return entries
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            # A corrupt journal must stop the agent: guessing could expose dirty data.
            raise JournalError(f"{path}: unreadable cleanup journal ({err}); inspect or remove it") from err

    def get(self, host_path: str) -> JournalEntry | None:
        with self._lock:
            return self._entries.get(host_path)

    def snapshot(self) -> dict[str, JournalEntry]:
        with self._lock:
            return dict(self._entries)

    def __iter__(self) -> Iterator[tuple[str, JournalEntry]]:
        return iter(self.snapshot().items())

    def apply(self, changes: Mapping[str, JournalEntry | None]) -> None:
        """Set (or, with None, remove) several entries in one durable write."""
        if not changes:
            return
        with self._lock:
            updated = dict(self._entries)
            for host_path, entry in changes.items():
                if entry is None:
                    updated.pop(host_path, None)
                else:
                    updated[host_path] = entry
            if updated == self._entries:
                return
            self._write(updated)
            self._entries = updated

    def _write(self, entries: Mapping[str, JournalEntry]) -> None:
        self.writes += 1
        if self.path is None:
            return
        doc = {"version": FORMAT_VERSION, "volumes": {p: asdict(e) for p, e in sorted(entries.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(doc, indent=1).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

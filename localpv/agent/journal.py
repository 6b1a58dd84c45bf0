"""A durable, node-local record of which volumes may hold tenant data.

The PV object alone cannot guarantee that a used volume is cleaned before it is offered
again: someone may delete the PV mid-clean (or delete it and apply it again), the agent
may be killed at any instant, a cleaner may fail. So the agent keeps its own record on
the node (a hostPath state dir survives pod restarts), one entry per volume:

``offered``  a PV exists or is being created; nobody is known to have used it yet.
``used``     the PV was seen bound to a claim: the volume may hold data.
``cleaning`` a cleanup is required (or running) before the volume is offered again.
``clean``    a cleanup succeeded; the PV may be deleted and the volume re-offered.

Entries are keyed by host path, and each also records what the volume *is* (``identity``:
filesystem UUID, WWN...; ``ident``: device and inode of a mount root, major:minor of a block
device, with the ``boot`` they were seen in) and which PV object it was offered as (``pv_uid``).
A path string or a PV name can be spelled again by anyone (an operator changing ``hostDir``,
a GitOps tool re-applying a PV); an identity and a uid cannot, so the planner trusts those.

A volume may be (re)discovered only when no entry names it (by path or by identity) or
its entry is ``clean``. Any entry whose PV vanished without the agent cleaning it is
moved to ``cleaning``: we cannot know what happened while we were not looking, so the
safe answer is to clean.

A journal that did not exist when the agent started is *recovering*: the agent cannot
tell a first start from a lost state dir (a re-imaged node, a moved hostPath), so until
one pass has seen every discovery directory, a volume without any record is cleaned
before it is first offered. The flag is stored in the file, so a restart mid-recovery
keeps it.

Writes are atomic (temp file, fsync, rename, fsync of the directory): after a crash the
file is the old or the new version, never a torn one.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from localpv.host.durable import replace_durably

log = logging.getLogger(__name__)

class JournalState(enum.StrEnum):
    """A volume's state in the journal (its JSON spelling is the value)."""

    OFFERED = "offered"
    USED = "used"
    CLEANING = "cleaning"
    CLEAN = "clean"


OFFERED = JournalState.OFFERED
USED = JournalState.USED
CLEANING = JournalState.CLEANING
CLEAN = JournalState.CLEAN
STATES = tuple(JournalState)
FORMAT_VERSION = 2
#: Version 1 had no ``ident``/``pv_uid`` and no recovery flag; it is read and upgraded.
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True)
class JournalEntry:
    """What the agent knows about one volume path."""

    pv: str
    cls: str
    state: JournalState
    since: float
    #: UID of the claim the volume was last seen bound to ("" if none): a clean volume whose
    #: PV later names another claim was used again, even if no pass saw it Bound.
    claim: str = ""
    #: UID of the PV object the volume was offered as ("" until known). A PV with another
    #: uid for the same path was made by someone else, and is not trusted as clean.
    pv_uid: str = ""
    #: What the volume is on the host (see ``localpv.host.scan.Entry.ident``), "" if unknown.
    ident: str = ""
    #: ``namespace/name`` of the claim ``claim`` names ("" if unknown): what the agent puts
    #: back into a PV whose claimRef was removed while the volume holds that claim's data.
    #: (Added after format version 2 was fixed: older agents read the file and ignore it.)
    claim_name: str = ""
    #: What the volume is across reboots (see :mod:`localpv.host.identity`): filesystem UUID,
    #: WWN, serial... ("" while unknown: a volatile volume, or a record from before identities).
    #: Additive like ``claim_name``: an older agent ignores it (and drops it when it rewrites
    #: the file; the record then learns it again, see docs/operations.md).
    identity: str = ""
    #: The boot (``/proc/sys/kernel/random/boot_id``) in which ``ident`` was seen ("" in a record
    #: written before boot ids). Device and inode numbers are dealt out again at every boot: a
    #: record knows its volume by them only within the boot they were seen in (see
    #: :mod:`localpv.agent.planner.volatile`). Additive like ``identity``.
    boot: str = ""

    def with_state(self, state: JournalState, now: float) -> JournalEntry:
        return replace(self, state=state, since=now)

    def numbers_in(self, boot: str) -> str:
        """``ident`` if it was seen in boot ``boot``, "" if it is another boot's (or there is none).

        A record written before boot ids (``boot`` "") is taken to be of this boot, as the agent
        that wrote it took it: an upgrade does not reboot the node (docs/operations.md says what
        is left to chance when it does).
        """
        return self.ident if self.ident and self.boot in ("", boot) else ""


#: What a person should do about an unreadable journal. Moving it aside is safe because a
#: missing journal makes the agent clean every volume without a PV before offering it. Putting
#: back an older copy is not: it may say ``clean`` for a volume that was used since, and that
#: volume would be offered with its tenant's data.
_ADVICE = ("; move it aside (always safe): the agent then starts a new journal in recovering mode and cleans "
           "every volume that has no PV before offering it. Do not put back an older copy of it: it may call "
           "clean a volume that was used since, and that volume would be offered with a tenant's data")


#: Journal keys of records *detached* from any path: a volume that may hold data was replaced at
#: its path by another one (a new disk under the old device name). The record is kept under its
#: identity, so the old disk is cleaned before it is offered if it ever comes back, at any path,
#: while the path itself goes to the new disk. (An older agent reads such a key as a path that
#: names nothing: it says once that it cannot clean it, and never acts on it.)
DETACHED_PREFIX = "detached:"


def detached_key(identity: str) -> str:
    return DETACHED_PREFIX + identity


def is_detached(key: str) -> bool:
    return key.startswith(DETACHED_PREFIX)


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
        #: True while the journal may be missing records (it did not exist at start).
        self.recovering = self.path is not None
        if self.path is not None and self.path.exists():
            self._entries, self.recovering = self._read(self.path)

    @classmethod
    def initialise(cls, path: str | os.PathLike[str]) -> Journal:
        """Write an empty, not-recovering journal: for callers that *know* every volume is
        new (the demo's fresh tmpfs mounts, tests). Never done by the agent itself."""
        journal = cls(None)
        journal.path = Path(path)
        journal.recovering = False
        journal._write({})
        return journal

    def end_recovery(self) -> None:
        """Every volume has been seen and recorded: records are complete from now on."""
        with self._lock:
            if self.recovering:
                self.recovering = False
                self._write(self._entries)

    @staticmethod
    def _read(path: Path) -> tuple[dict[str, JournalEntry], bool]:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("version") not in READABLE_VERSIONS:
                raise JournalError(f"{path}: unsupported journal version {doc.get('version')!r}{_ADVICE}")
            entries = {}
            for host_path, raw in doc["volumes"].items():
                if raw["state"] not in STATES:
                    raise JournalError(f"{path}: {host_path}: unknown state {raw['state']!r}{_ADVICE}")
                entry = JournalEntry(pv=str(raw["pv"]), cls=str(raw["cls"]), state=JournalState(raw["state"]),
                                     since=float(raw["since"]), claim=str(raw.get("claim", "")),
                                     pv_uid=str(raw.get("pv_uid", "")), ident=str(raw.get("ident", "")),
                                     claim_name=str(raw.get("claim_name", "")),
                                     identity=str(raw.get("identity", "")), boot=str(raw.get("boot", "")))
                entries[host_path] = entry
            return entries, bool(doc.get("recovering", False))
        except JournalError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            # A corrupt journal must stop the agent: guessing could expose dirty data.
            raise JournalError(f"{path}: unreadable cleanup journal ({err}){_ADVICE}") from err

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
        doc = {"version": FORMAT_VERSION, "recovering": self.recovering,
               "volumes": {p: _as_dict(e) for p, e in sorted(entries.items())}}
        replace_durably(self.path, json.dumps(doc, indent=1).encode("utf-8"), point="agent-journal")


def _as_dict(entry: JournalEntry) -> dict[str, object]:
    """The entry's fields, as ``dataclasses.asdict`` gives them for these flat records, without
    its deep copy of every value (most of a write's CPU in a journal of a thousand volumes)."""
    return {name: getattr(entry, name) for name in _FIELD_NAMES}


_FIELD_NAMES = tuple(f.name for f in fields(JournalEntry))

"""The image journal: a durable, node-local record of every disk image the agent made.

A PV object alone cannot keep images safe: an agent killed between making an image and
creating its PV would leave an image no object names; someone may delete a PV by hand; a
claim may be deleted while its image is being made. So every image is recorded *before*
anything is written to the pool, and the record follows it until the image is gone:

``creating``  being made for claim ``claim_uid``; no PV yet, so nothing in it is data. An
              interrupted attempt is made again for the same claim, or removed once that
              claim is gone: never an orphan, never handed to another claim.
``ready``     made and formatted (``fs_uuid``), or for a ``volumeMode: Block`` volume made
              and marked (``image_uuid``, no filesystem); its PV exists or is being created. From
              here on it may hold a tenant's data: it is removed only on a release with
              reclaim policy Delete, and only once no loop device is bound to it.
``deleting``  its PV was released with Delete: the image is removed as soon as it is not
              staged, then the PV object, its finalizer (:mod:`localpv.csi.deletion`), then
              the record.
``orphaned``  its PV vanished without a release the agent saw (deleted by hand, its
              finalizer removed by hand or never added): the image is kept, never offered to
              anyone, and said so (metrics, ``localpv status``); an operator removes it.

Images are keyed by volume (PV) name, ``pvc-<claim uid>``: a claim only ever gets the image
made for its own uid. The file is written atomically (temp file, fsync, rename, fsync of
the directory), as the cleanup journal is; a file that cannot be read stops the dynamic
part of the agent rather than letting it guess. It has one writer: only ``localpv agent``
opens it, and only while it holds its state dir's lock (``localpv/agent/statedir.py``), so
a second agent on the same state dir exits before it reads this file.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import Enum
from pathlib import Path

from localpv.host.durable import replace_durably

FORMAT_VERSION = 1
FILESYSTEM = "Filesystem"
BLOCK = "Block"
#: Fields written only when they differ from their default: a journal with no Block image is
#: one an agent from before Block volumes reads.
_OMITTED_WHEN_DEFAULT = {"volume_mode": FILESYSTEM, "image_uuid": ""}


class ImageState(Enum):
    CREATING = "creating"
    READY = "ready"
    DELETING = "deleting"
    ORPHANED = "orphaned"


@dataclass(frozen=True)
class ImageRecord:
    """What the agent knows about one image."""

    volume: str
    pool: str
    size: int
    fs_type: str
    provisioning: str
    claim_uid: str
    #: ``namespace/name`` of that claim, for people reading the journal.
    claim: str
    state: ImageState
    since: float
    fs_uuid: str = ""
    #: The uid of the PV object made for it ("" until the create was answered).
    pv_uid: str = ""
    storage_class: str = ""
    #: ``Filesystem`` or ``Block`` (the claim's volumeMode): a PV, a stage, must say the same.
    volume_mode: str = FILESYSTEM
    #: A Block image's identity: the UUID its file is marked with (``fs_type``, ``fs_uuid``: "").
    image_uuid: str = ""

    @property
    def block(self) -> bool:
        return self.volume_mode == BLOCK

    def moved(self, state: ImageState, now: float, **changes: object) -> ImageRecord:
        return replace(self, state=state, since=now, **changes)  # type: ignore[arg-type]


class ImageJournalError(Exception):
    """The journal exists but cannot be read: the agent refuses to guess which images hold data."""


_ADVICE = ("; the dynamic volumes of this node are not served until it is readable again. Do not delete it: "
           "it is what keeps images with data from being removed or reused")


class ImageJournal:
    """The records on disk plus an in-memory copy; thread-safe."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._records: dict[str, ImageRecord] = {}
        #: Pool name -> the host directory its images were made in on this node. A pool's
        #: directory may differ per node and change with the ConfigMap or the Node's labels
        #: (``nodes`` overrides); its images do not move with it (:func:`localpv.csi.pools.move_refusal`).
        #: Older agents ignore the key (and drop it when they write: it is learnt again).
        self._pool_dirs: dict[str, str] = {}
        self.writes = 0
        #: Called after each write that changed a record (outside the lock): the capacity
        #: publisher's cue that a pool's account changed.
        self.listeners: list[Callable[[], None]] = []
        if self.path is not None and self.path.exists():
            self._records, self._pool_dirs = self._read(self.path)

    @staticmethod
    def _read(path: Path) -> tuple[dict[str, ImageRecord], dict[str, str]]:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("version") != FORMAT_VERSION:
                raise ImageJournalError(f"{path}: unsupported image journal version {doc.get('version')!r}{_ADVICE}")
            records = {}
            for volume, stored in doc["images"].items():
                raw = dict(stored)
                raw["state"] = ImageState(raw["state"])
                raw["size"] = int(raw["size"])
                raw["since"] = float(raw["since"])
                records[volume] = ImageRecord(**raw)
            return records, {str(k): str(v) for k, v in (doc.get("pools") or {}).items()}
        except ImageJournalError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ImageJournalError(f"{path}: unreadable image journal ({err}){_ADVICE}") from err

    def get(self, volume: str) -> ImageRecord | None:
        with self._lock:
            return self._records.get(volume)

    def snapshot(self) -> dict[str, ImageRecord]:
        with self._lock:
            return dict(self._records)

    def committed(self, pool: str) -> int:
        """Bytes promised to images of ``pool`` (every state: a record holds its room until the
        image is gone)."""
        with self._lock:
            return sum(r.size for r in self._records.values() if r.pool == pool)

    def pool_dir(self, pool: str) -> str | None:
        """The host directory the images of ``pool`` were made in, None if never recorded."""
        with self._lock:
            return self._pool_dirs.get(pool)

    def set_pool_dir(self, pool: str, host_dir: str) -> None:
        """Record where the images of ``pool`` are (durably, when it changes)."""
        with self._lock:
            if self._pool_dirs.get(pool) == host_dir:
                return
            dirs = {**self._pool_dirs, pool: host_dir}
            self._write(self._records, dirs)
            self._pool_dirs = dirs

    def put(self, record: ImageRecord) -> None:
        self.apply({record.volume: record})

    def drop(self, volume: str) -> None:
        self.apply({volume: None})

    def apply(self, changes: Mapping[str, ImageRecord | None]) -> None:
        """Set (or, with None, remove) records in one durable write."""
        with self._lock:
            updated = dict(self._records)
            for volume, record in changes.items():
                if record is None:
                    updated.pop(volume, None)
                else:
                    updated[volume] = record
            if updated == self._records:
                return
            self._write(updated, self._pool_dirs)
            self._records = updated
        for listener in self.listeners:
            listener()

    def _write(self, records: Mapping[str, ImageRecord], pool_dirs: Mapping[str, str]) -> None:
        self.writes += 1
        if self.path is None:
            return
        images = {}
        for volume, record in sorted(records.items()):
            raw = {k: v for k, v in asdict(record).items() if _OMITTED_WHEN_DEFAULT.get(k, object()) != v}
            raw["state"] = record.state.value
            images[volume] = raw
        doc: dict[str, object] = {"version": FORMAT_VERSION, "images": images}
        if pool_dirs:
            doc["pools"] = dict(sorted(pool_dirs.items()))
        replace_durably(self.path, json.dumps(doc, indent=1).encode("utf-8"), point="image-journal")

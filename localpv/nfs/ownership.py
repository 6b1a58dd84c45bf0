"""Whose a directory on the export is: claim identities, ownership records, and the rules.

Why (issue 11 finding 7): with a ``pathPattern`` fed by labels or annotations, a tenant picks
the directory its claim gets. Upstream hands over whatever is there, on purpose (a re-created
claim gets its data back), so a claim in another namespace naming the same directory read that
namespace's data, and its release with ``onDelete: delete`` erased it.

A directory belongs to the claim *identity* it was made for: namespace and name. A re-created
claim has a new uid but the same identity, so upstream's reuse keeps working for it and for
no one else. Each directory's owner is one small record in ``.localpv/owners/`` at the top of
the export, in a tree that mirrors the directory's path one hashed segment per level (so the
records on, above and below a directory are found without reading the others, and any path
fits: a segment may be 255 bytes of anything). That is outside every tenant directory: a
tenant mounts only its own directory, so it can neither forge nor remove a record (a record
inside the tenant's directory could be both). Records are read and replaced through
:class:`~localpv.nfs.export.Export` (fd-relative, no links followed, atomic rename).

Sharing is what a StorageClass opts in to (``allowSharedDirectories``): its claims may use a
directory without a record, or one made under a class that opted in too - never a directory
made under a class that did not.

Why a record names the cluster too (issue 17): two clusters may mount one export, and both
have a claim ``default/postgres``. An identity is namespace and name *in a cluster*, the
cluster being its id (by default its ``kube-system`` namespace's uid, see
:mod:`localpv.nfs.cluster`). A record of another cluster is that cluster's directory: not
handed out here unless a class opts in (``allowOtherClusters``), and never disposed of here.

Format version 2 adds the ``cluster`` field. Version 1 records (written before) are still read,
with no cluster: who may act on them is the provisioner's rule (a PV of this cluster vouches).
The previous release reads only version 1, strictly, so it refuses version 2 records as
corrupt: it neither hands out nor disposes of a directory whose cluster it cannot check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypedDict

from localpv.kube.objects import Obj
from localpv.nfs.export import Export, UnsafeDirectory
from localpv.nfs.pathpattern import RESERVED_DIRECTORY

#: Where the records live, below the export root.
RECORDS_DIRECTORY = (RESERVED_DIRECTORY, "owners")

#: The record's file name in its mirror directory; never a mirror directory's (64 hex digits).
RECORD_FILE = "record"

#: A record holds a path of at most 4096 bytes and a few names; anything bigger was not written by us.
MAX_RECORD_BYTES = 16 * 1024

#: The format written. Version 1 (no ``cluster``) is read too, never written.
FORMAT_VERSION = 2

SHARING_HINT = ('only StorageClasses with allowSharedDirectories: "true" share directories, and only those made '
                'under such a class')
CLUSTER_HINT = ('a directory recorded by another cluster goes only to a StorageClass with allowOtherClusters: '
                '"true", and is never deleted or archived from here; a rebuilt cluster takes its own back by '
                'running with the old --cluster-id')
UNRECORDED = "has no ownership record (made before localpv recorded owners, or by hand)"
#: Why a version 1 record (no cluster) does not count as this cluster's.
UNATTRIBUTED = ("recorded before records named their cluster, and no PersistentVolume of this cluster names "
                "that directory and claim")
UNATTRIBUTED_HINT = 'such a directory goes only to a StorageClass with allowOtherClusters: "true"'

#: What a cluster id may be: a uid, or a name an operator chose (it is written into every record).
CLUSTER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")


def cluster_id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a cluster id (None if it can)."""
    if CLUSTER_ID_RE.fullmatch(value):
        return None
    return ('expected letters, digits, ".", "_", ":" and "-", starting with a letter or digit, at most 253 '
            f"characters (such as the kube-system namespace's uid), got {value!r}")


class RecordError(Exception):
    """The records could not be read or written (I/O error, or something planted in their place)."""


class CorruptRecord(RecordError):
    """A record that does not parse, or names another directory: it proves nobody's ownership."""


@dataclass(frozen=True)
class ClaimIdentity:
    """A claim as ownership sees it: what survives deleting and re-creating it."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of_claim(cls, claim: Obj) -> ClaimIdentity:
        meta = claim.get("metadata") or {}
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""))

    @classmethod
    def of_volume(cls, pv: Obj) -> ClaimIdentity | None:
        """The claim a PV is or was bound to: ``spec.claimRef``, which tenants cannot write."""
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        namespace, name = ref.get("namespace"), ref.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str) or not namespace or not name:
            return None
        return cls(namespace, name)


@dataclass(frozen=True)
class OwnerRecord:
    """Directory ``path`` (relative to the export) was made for ``owner`` of cluster ``cluster``,
    under ``storage_class``. ``cluster`` is None in a record written before records named it."""

    path: str
    owner: ClaimIdentity
    storage_class: str
    shared: bool
    cluster: str | None

    def attributed_to(self, cluster: str) -> OwnerRecord:
        """This record, read as ``cluster``'s (a version 1 record that cluster has proof of)."""
        return dataclasses.replace(self, cluster=cluster)

    def whose(self, cluster: str) -> str:
        """Its owner as an event names it, read by ``cluster``: the claim, and the cluster if not that one."""
        if self.cluster == cluster:
            return f"claim {self.owner}"
        if self.cluster is None:
            return f"claim {self.owner} ({UNATTRIBUTED})"
        return f"claim {self.owner} of another cluster (cluster id {self.cluster})"


class _RecordFileV1(TypedDict):
    """A record on disk (JSON), as written before records named their cluster."""

    version: int
    path: str
    namespace: str
    name: str
    storageClass: str
    shared: bool


class _RecordFile(_RecordFileV1):
    """A record on disk (JSON): version 2 adds the cluster."""

    cluster: str


@dataclass(frozen=True)
class Claimant:
    """A claim of cluster ``cluster`` asking for, or releasing, a directory. ``shares``: its class
    opted in to sharing; ``other_clusters``: to using directories other clusters recorded."""

    identity: ClaimIdentity
    cluster: str
    storage_class: str
    shares: bool
    other_clusters: bool = False

    def may_use(self, record: OwnerRecord) -> bool:
        """Its own directory, or a shared one when its class shares too; either recorded by its
        own cluster, or by any when its class opts in. A record with no cluster (version 1) is
        another cluster's here: the provisioner attributes the ones this cluster can prove."""
        in_reach = record.cluster == self.cluster or self.other_clusters
        return in_reach and (record.owner == self.identity or (record.shared and self.shares))

    def hint(self, record: OwnerRecord) -> str:
        """What would let this claimant use ``record``'s directory (for a refusal's message)."""
        if record.cluster == self.cluster or self.other_clusters:
            return SHARING_HINT
        return UNATTRIBUTED_HINT if record.cluster is None else CLUSTER_HINT

    def named(self, record: OwnerRecord) -> str:
        """This claimant as a refusal over ``record`` names it: the cluster is said when it is what differs."""
        return f"claim {self.identity}" + ("" if record.cluster == self.cluster else " of this cluster")

    def record_for(self, path: str) -> OwnerRecord:
        return OwnerRecord(path, self.identity, self.storage_class, self.shares, self.cluster)


def first_foreign(records: Iterable[OwnerRecord], claimant: Claimant) -> OwnerRecord | None:
    """The first record ``claimant`` may not use: the reason it may not have or dispose of a directory."""
    return next((record for record in records if not claimant.may_use(record)), None)


def placement(path: str, other: str) -> str | None:
    """How directory ``other`` lies relative to ``path`` (both validated relative paths), or None."""
    if other == path:
        return "is"
    if path.startswith(other + "/"):
        return "is inside"
    if other.startswith(path + "/"):
        return "contains"
    return None


def conflict(path: str, other: str, whose: str) -> str:
    """``path``'s relation to someone else's directory ``other``, as a phrase for an event."""
    relation = placement(path, other) or "is unrelated to"
    where = "" if relation == "is" else f"{other!r}, "
    return f"{relation} {where}the directory of {whose}"


def encode(record: OwnerRecord) -> bytes:
    """A version 2 record; every record written names its cluster."""
    if record.cluster is None:
        raise ValueError(f"the record of {record.path!r} names no cluster; every record written must")
    body: _RecordFile = {"version": FORMAT_VERSION, "path": record.path, "namespace": record.owner.namespace,
                         "name": record.owner.name, "storageClass": record.storage_class, "shared": record.shared,
                         "cluster": record.cluster}
    return json.dumps(body, ensure_ascii=False, sort_keys=True).encode() + b"\n"


#: The exact fields of each format version read: an unknown field could be a restriction this
#: reader does not know of, so it makes the record corrupt rather than being ignored.
_FIELDS = {1: frozenset(_RecordFileV1.__annotations__), FORMAT_VERSION: frozenset(_RecordFile.__annotations__)}


def decode(data: bytes, where: str) -> OwnerRecord:
    """Parse a record strictly: anything unexpected is a :class:`CorruptRecord`, never a guess."""
    try:
        body = json.loads(data)
    except ValueError as err:
        raise CorruptRecord(f"ownership record {where} is not JSON: {err}") from err
    version = body.get("version") if isinstance(body, dict) else None
    fields = _FIELDS.get(version) if isinstance(version, int) and not isinstance(version, bool) else None
    if fields is None or set(body) != fields:
        raise CorruptRecord(f"ownership record {where} is not a version 1 or {FORMAT_VERSION} record")
    text_fields = ("path", "namespace", "name", "storageClass", *(("cluster",) if "cluster" in fields else ()))
    if not all(isinstance(body[k], str) and body[k] for k in text_fields) or not isinstance(body["shared"], bool):
        raise CorruptRecord(f"ownership record {where} has fields of the wrong type")
    return OwnerRecord(body["path"], ClaimIdentity(body["namespace"], body["name"]), body["storageClass"],
                       body["shared"], body.get("cluster"))


def record_location(parts: Sequence[str]) -> tuple[str, ...]:
    """The mirror directory holding the record of directory ``parts``, from the export root."""
    return (*RECORDS_DIRECTORY, *(hashlib.sha256(segment.encode()).hexdigest() for segment in parts))


class OwnershipStore:
    """The records on the export. Only the leader writes, and its provisioner serialises the
    check-then-write, so a record is never decided on by two writers at once."""

    def __init__(self, export: Export) -> None:
        self.export = export

    def read(self, parts: Sequence[str]) -> OwnerRecord | None:
        """The record of directory ``parts``; None if it has none."""
        return self._load(record_location(parts))

    def write(self, record: OwnerRecord) -> None:
        with _guard():
            self.export.write_file(record_location(record.path.split("/")), RECORD_FILE, encode(record))

    def forget(self, parts: Sequence[str]) -> None:
        """Remove the record, then the mirror directories it leaves empty."""
        location = record_location(parts)
        with _guard():
            self.export.remove_file(location, RECORD_FILE)
            for depth in range(len(location), len(RECORDS_DIRECTORY), -1):
                if not self.export.remove_empty_directory(location[:depth]):
                    break

    def lineage(self, parts: Sequence[str]) -> list[OwnerRecord]:
        """The records of ``parts`` and of each directory above it, top first."""
        found = (self.read(parts[:depth]) for depth in range(1, len(parts) + 1))
        return [record for record in found if record is not None]

    def around(self, parts: Sequence[str]) -> list[OwnerRecord]:
        """Every record on, above or below ``parts``: whoever the directory's data concerns."""
        return [*self.lineage(parts), *self.below(parts)]

    def below(self, parts: Sequence[str]) -> list[OwnerRecord]:
        """The records of directories strictly inside ``parts`` (only that part of the mirror is read)."""
        location = record_location(parts)
        with _guard():
            found = self.export.find_files(location, RECORD_FILE)
        records = (self._load((*location, *relative)) for relative in found)
        return [record for record in records if record is not None]

    def _load(self, location: tuple[str, ...]) -> OwnerRecord | None:
        """The record at ``location``; it must name the path whose place that is (a record copied
        elsewhere by hand proves nothing about the directory there)."""
        shown = "/".join((*location, RECORD_FILE))
        with _guard():
            data = self.export.read_file(location, RECORD_FILE, MAX_RECORD_BYTES)
        if data is None:
            return None
        record = decode(data, shown)
        if record_location(record.path.split("/")) != location:
            raise CorruptRecord(f"ownership record {shown} names {record.path!r}, which is not its place")
        return record


@contextmanager
def _guard() -> Iterator[None]:
    """File-level failures of the records become :class:`RecordError` (callers cannot blame a claim)."""
    try:
        yield
    except (UnsafeDirectory, OSError) as err:
        raise RecordError(f"{'/'.join(RECORDS_DIRECTORY)}: {err}") from err

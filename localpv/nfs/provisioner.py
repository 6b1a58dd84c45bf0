"""The nfs-subdir provisioner: one directory per claim on a mounted export.

This is the *what* (research A.4-A.7): which directory a claim gets, what the PV's NFS
source says, what happens to the directory when the volume is released. The *when* -
watching claims, retrying, events, deciding a claim is ours - is the controller's
(:mod:`localpv.nfs.controller`), as it is the lib's upstream.

Beyond upstream, every path is validated before any disk access, and a directory is
never removed or archived while another PV still points at it or inside it (a
``pathPattern`` without a unique part makes claims share directories, research A.12 #2).

And a directory is handed to, or disposed of for, only the claim identity that owns it
(:mod:`localpv.nfs.ownership`): a ``pathPattern`` fed by annotations lets a tenant *name* any
directory, so a name proves nothing. What does: the ownership record written when the
directory was made, and the PV objects (cluster-scoped, not tenant-writable) still naming it.

A claim identity is one *in a cluster* (issue 17): two clusters may share the export. Records
name the cluster that wrote them; a directory recorded by another cluster is refused (unless
the class says ``allowOtherClusters``) and never deleted or archived from here. A record
written before records named a cluster counts as this cluster's only where a PV of this
cluster vouches for it: it names that directory and the recorded claim.
"""

from __future__ import annotations

import errno
import logging
import posixpath
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from localpv.kube.events import NORMAL, WARNING
from localpv.kube.objects import Obj
from localpv.nfs import params
from localpv.nfs.export import Export, UnsafeDirectory
from localpv.nfs.ownership import (
    SHARING_HINT,
    UNRECORDED,
    Claimant,
    ClaimIdentity,
    CorruptRecord,
    OwnerRecord,
    OwnershipStore,
    RecordError,
    conflict,
    first_foreign,
    placement,
)
from localpv.nfs.pathpattern import (
    PATTERN_FIELD,
    PathRejected,
    SubPath,
    archive_names,
    claim_subpath,
    parse_subpath,
)
from localpv.nfs.volumeindex import VolumeIndex

log = logging.getLogger(__name__)

NFS_PATH_FIELD = "spec.nfs.path"


class OperationFailed(Exception):
    """``final``: retrying cannot help until the claim or class changes; ``unsafe_path``:
    refused because the path could lead outside the export (counted in metrics)."""

    def __init__(self, message: str, *, final: bool, unsafe_path: bool = False) -> None:
        super().__init__(message)
        self.final = final
        self.unsafe_path = unsafe_path


class ProvisionFailed(OperationFailed):
    """No directory or volume this time."""


class DeleteFailed(OperationFailed):
    """The directory was not dealt with, so the PV stays."""


class NotMine(Exception):
    """This volume belongs to someone else (lib's ``IgnoredError``): no event, no retry."""


class NotOwned(Exception):
    """The directory is not provably the claim's: refused, with the reason as the message."""


@dataclass(frozen=True)
class Note:
    """Something worth an Event on the claim or volume, besides success or failure."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class ProvisionRequest:
    """Lib's ``ProvisionOptions``: the claim, its class and the PV name chosen for it."""

    claim: Obj
    storage_class: Obj
    pv_name: str
    selected_node: str | None = None


@dataclass
class Provisioned:
    """The PV (spec and source; the controller adds claimRef and annotations) and notes."""

    volume: Obj
    notes: list[Note] = field(default_factory=list)


class ClusterReader(Protocol):
    """The read-only cluster state a provisioner may consult (served from informer caches)."""

    def storage_class(self, name: str) -> Obj | None: ...

    def volumes(self) -> Iterable[Obj]: ...

    def on_volume_change(self, handler: Callable[[str, Obj | None, Obj | None], None]) -> None:
        """Call ``handler(kind, old, new)`` for every change of the volumes from now on."""


@dataclass(frozen=True)
class NfsSource:
    """What goes into every PV, and where the export is mounted in this pod."""

    server: str
    path: str
    mount_dir: str = "/persistentvolumes"
    dir_mode: int = 0o777

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"NFS_PATH must be absolute, got {self.path!r}")
        object.__setattr__(self, "path", posixpath.normpath(self.path))

    def server_path(self, sub: SubPath) -> str:
        return posixpath.join(self.path, sub.relative)

    def subpath_of(self, server_path: str) -> SubPath:
        """Invert :meth:`server_path` for a PV read back from the API (it may be tampered with)."""
        prefix = self.path.rstrip("/") + "/"
        if not server_path.startswith(prefix):
            raise PathRejected(NFS_PATH_FIELD, f"{server_path!a} is not below the export {self.path!r}")
        return parse_subpath(server_path[len(prefix):], NFS_PATH_FIELD)


class NfsProvisioner:
    """Provision and delete directories on ``export`` for PVs pointing at ``source``."""

    supports_block = False

    def __init__(self, source: NfsSource, export: Export, view: ClusterReader, *, cluster: str) -> None:
        self.source = source
        self.export = export
        self.view = view
        #: This cluster's id: written into every record, compared with every record read.
        self.cluster = cluster
        self.owners = OwnershipStore(export)
        # Which PVs use a directory, above or below it: asked for every claim and release.
        # Changes first, then what the cache holds now, so none falls between the two.
        self.index = VolumeIndex(source.server, source.subpath_of)
        view.on_volume_change(self.index.changed)
        self.index.load(view.volumes())
        # Deciding who owns a directory and acting on it is one step: the controller's workers
        # run in parallel, and two claims naming one path must not both see it free.
        self._ownership = threading.Lock()

    # ------------------------------------------------------------------ provision

    def provision(self, request: ProvisionRequest) -> Provisioned:
        spec = request.claim.get("spec") or {}
        if spec.get("selector"):
            raise ProvisionFailed("claim Selector is not supported", final=True)
        if spec.get("volumeAttributesClassName"):
            raise ProvisionFailed(f"volumeAttributesClassName {spec['volumeAttributesClassName']!r}: volume attributes "
                                  "classes are not supported (nothing could apply them to a directory)", final=True)
        sub = self._claim_subpath(request)
        claimant = self._claimant(request)
        try:
            with self._ownership:
                taken = self._take_directory(sub, claimant, request.pv_name)
        except NotOwned as err:
            raise ProvisionFailed(f"refusing the directory path: {_fields(sub)}: {err}", final=True,
                                  unsafe_path=True) from err
        except UnsafeDirectory as err:
            field_name = sub.segments[err.index].blame()
            raise ProvisionFailed(f"refusing the directory path: {field_name}: {err}", final=True,
                                  unsafe_path=True) from err
        except CorruptRecord as err:
            raise ProvisionFailed(f"refusing the directory {sub.relative!r}: {err}", final=True) from err
        except RecordError as err:
            raise ProvisionFailed(f"unable to use the ownership records on the export: {err}", final=False) from err
        except OSError as err:
            raise ProvisionFailed(f"unable to create directory {sub.relative!r} on the export: {err}",
                                  final=False) from err
        server_path = self.source.server_path(sub)
        return Provisioned(self._volume(request, server_path), self._notes(sub, server_path, taken, request.pv_name))

    @staticmethod
    def _claim_subpath(request: ProvisionRequest) -> SubPath:
        pattern = params.path_pattern(request.storage_class.get("parameters") or {})
        try:
            return claim_subpath(pattern, request.claim.get("metadata") or {}, request.pv_name)
        except PathRejected as err:
            raise ProvisionFailed(f"refusing the directory path: {err}", final=True, unsafe_path=True) from err

    def _claimant(self, request: ProvisionRequest) -> Claimant:
        sc = request.storage_class
        parameters = sc.get("parameters") or {}
        try:
            shares = params.allow_shared_directories(parameters)
            other_clusters = params.allow_other_clusters(parameters)
        except ValueError as err:
            raise ProvisionFailed(str(err), final=True) from err
        return Claimant(ClaimIdentity.of_claim(request.claim), self.cluster,
                        str((sc.get("metadata") or {}).get("name") or ""), shares, other_clusters)

    def _take_directory(self, sub: SubPath, claimant: Claimant, pv_name: str) -> _Taken:
        """Check the directory may go to ``claimant``, record it as theirs, make it.

        The record is written *before* a new directory is made: a crash in between leaves a
        record of a missing directory (harmless, overwritten by whoever makes it next), never
        a directory nobody can prove is theirs.
        """
        self._check_volumes(sub, claimant, pv_name)
        if self.export.exists(sub.parts):
            record = self._check_reuse(sub, claimant)
            self.export.make_directory(sub.parts, self.source.dir_mode)
            return _Taken(created=False, record=record)
        self._check_parents(sub, claimant)
        record = claimant.record_for(sub.relative)
        self.owners.write(record)
        if self.export.make_directory(sub.parts, self.source.dir_mode):
            return _Taken(created=True, record=record)
        self.owners.forget(sub.parts)
        raise OSError(errno.EEXIST, "the directory appeared while it was being made; it is checked again",
                      sub.relative)

    def _check_volumes(self, sub: SubPath, claimant: Claimant, pv_name: str) -> None:
        """Refuse a directory that is, is inside or contains another claim's PV's directory.

        PVs outlive records' absence: a directory made before records existed, or retained
        with its PV, is still someone's while a PV names it. A sharing class skips this (its
        records say which directories it may share).
        """
        if claimant.shares:
            return
        for name, other, pv in self.index.around(sub.parts):
            owner = ClaimIdentity.of_volume(pv)
            if name == pv_name or owner == claimant.identity or placement(sub.relative, other.relative) is None:
                continue
            whose = f"PV {name} (claim {owner})" if owner else f"PV {name} (bound to no claim)"
            raise NotOwned(f"directory {sub.relative!r} {conflict(sub.relative, other.relative, whose)}; it is "
                           f"not handed to claim {claimant.identity} ({SHARING_HINT})")

    def _check_reuse(self, sub: SubPath, claimant: Claimant) -> OwnerRecord:
        """An existing directory: no record on, above or below it may be someone else's, and
        without a record of its own only a PV naming this claim (or sharing) vouches for it.
        Returns the directory's record, as it is now on the export."""
        found = self.owners.around(sub.parts)
        records = self._attributed(found)
        self._refuse_foreign(records, sub, claimant)
        own = next((record for record in records if record.path == sub.relative), None)
        if own is not None:
            if own not in found:  # a version 1 record this cluster has proof of: from now on it says so
                self.owners.write(own)
            return own
        if not (claimant.shares or self._volume_names(sub, claimant.identity)):
            raise NotOwned(f"directory {sub.relative!r} already exists and {UNRECORDED}: nothing proves it is "
                           f"claim {claimant.identity}'s; move it away, or claim it through a StorageClass with "
                           'allowSharedDirectories: "true" to share it')
        record = claimant.record_for(sub.relative)
        self.owners.write(record)
        return record

    def _check_parents(self, sub: SubPath, claimant: Claimant) -> None:
        """A new directory inside someone else's would be read by them."""
        self._refuse_foreign(self._attributed(self.owners.lineage(sub.parts[:-1])), sub, claimant)

    @staticmethod
    def _refuse_foreign(records: Iterable[OwnerRecord], sub: SubPath, claimant: Claimant) -> None:
        foreign = first_foreign(records, claimant)
        if foreign is not None:
            whose = foreign.whose(claimant.cluster)
            raise NotOwned(f"directory {sub.relative!r} {conflict(sub.relative, foreign.path, whose)}; it is not "
                           f"handed to {claimant.named(foreign)} ({claimant.hint(foreign)})")

    def _attributed(self, records: Iterable[OwnerRecord], evidence: Iterable[Obj] = ()) -> list[OwnerRecord]:
        """``records`` as this cluster reads them.

        A version 1 record names no cluster: it proves the claim, not the cluster. It is this
        cluster's when one of this cluster's PVs (or ``evidence``, a PV just read) names exactly
        that directory and that claim, as the PV of a volume provisioned before the upgrade
        does, being released or retained. Otherwise it stays unattributed, which every rule
        treats as another cluster's: the claim it names may be another cluster's.
        """
        records = list(records)
        if all(record.cluster is not None for record in records):
            return records
        at_records = [v for record in records if record.cluster is None
                      for v in self.index.at(tuple(record.path.split("/")))]
        vouched = {(other.relative, ClaimIdentity.of_volume(pv))
                   for _, other, pv in [*self._our_volumes(evidence), *at_records]}
        return [record.attributed_to(self.cluster) if record.cluster is None and (record.path, record.owner) in vouched
                else record for record in records]

    def _volume_names(self, sub: SubPath, identity: ClaimIdentity) -> bool:
        """A PV of exactly this directory names ``identity`` as its claim (say, a retained one)."""
        return any(ClaimIdentity.of_volume(pv) == identity for _, _, pv in self.index.at(sub.parts))

    def _our_volumes(self, volumes: Iterable[Obj]) -> Iterator[tuple[str, SubPath, Obj]]:
        """Of ``volumes``, those on our server whose path is a directory below the export (others
        name none of ours)."""
        for pv in volumes:
            nfs = (pv.get("spec") or {}).get("nfs") or {}
            if nfs.get("server") != self.source.server:
                continue
            try:
                yield str(pv["metadata"]["name"]), self.source.subpath_of(str(nfs.get("path") or "")), pv
            except PathRejected:
                continue

    def _volume(self, request: ProvisionRequest, server_path: str) -> Obj:
        cspec = request.claim.get("spec") or {}
        sc = request.storage_class
        spec: Obj = {
            "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy") or "Delete",
            "accessModes": list(cspec.get("accessModes") or []),
            "capacity": {"storage": ((cspec.get("resources") or {}).get("requests") or {}).get("storage", "0")},
            "nfs": {"server": self.source.server, "path": server_path, "readOnly": False},
        }
        if sc.get("mountOptions"):
            spec["mountOptions"] = list(sc["mountOptions"])
        return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": request.pv_name}, "spec": spec}

    def _notes(self, sub: SubPath, server_path: str, taken: _Taken, pv_name: str) -> list[Note]:
        notes = []
        if taken.record.cluster != self.cluster:
            notes.append(Note(WARNING, "DirectoryOfOtherCluster",
                              f"directory {sub.relative!r} is the directory of {taken.record.whose(self.cluster)}; "
                              "it is used here too, as the StorageClass allows other clusters' directories, and is "
                              "never deleted or archived from here"))
        users = self._users(server_path, exclude={pv_name})
        if users:
            notes.append(Note(WARNING, "DirectoryShared",
                              f"directory {sub.relative!r} is also used by {_names(users)} (the same directory or "
                              "one inside it): the volumes share data, and it is kept while they exist"))
        elif not taken.created:
            notes.append(Note(NORMAL, "DirectoryReused",
                              f"directory {sub.relative!r} already existed; its contents are kept"))
        return notes

    # ------------------------------------------------------------------ owner

    def owner(self, pv: Obj) -> ClaimIdentity | None:
        """The claim identity the ownership record of ``pv``'s directory names (None: no readable record)."""
        nfs = (pv.get("spec") or {}).get("nfs") or {}
        if nfs.get("server") != self.source.server:
            return None
        try:
            record = self.owners.read(self.source.subpath_of(str(nfs.get("path") or "")).parts)
        except (PathRejected, RecordError) as err:
            log.warning("PV %s: cannot read the ownership record of its directory: %s", pv["metadata"]["name"], err)
            return None
        return record.owner if record is not None else None

    # ------------------------------------------------------------------ delete

    def delete(self, pv: Obj, *, exclude: Iterable[str] = ()) -> list[Note]:
        """Retain, delete or archive the volume's directory; the caller deletes the PV object.

        ``exclude`` names PVs known to be gone although a cache may still show them.
        """
        nfs = (pv.get("spec") or {}).get("nfs") or {}
        name = str(pv["metadata"]["name"])
        if not nfs:
            raise NotMine(f"PV {name} has no NFS source")
        if nfs.get("server") != self.source.server:
            raise NotMine(f"PV {name} is on server {nfs.get('server')!r}, this provisioner serves "
                          f"{self.source.server!r}")
        server_path = str(nfs.get("path") or "")
        try:
            sub = self.source.subpath_of(server_path)
            if not self.export.exists(sub.parts):
                log.warning("PV %s: directory %s is already gone; deleting the PV", name, server_path)
                self._forget(sub)
                return []
        except PathRejected as err:
            raise DeleteFailed(f"refusing to touch the directory: {err}", final=True, unsafe_path=True) from err
        except UnsafeDirectory as err:
            raise DeleteFailed(f"refusing to touch the directory {server_path!a}: {err}", final=True,
                               unsafe_path=True) from err
        except OSError as err:
            raise DeleteFailed(f"unable to inspect {server_path!r}: {err}", final=False) from err
        class_name = str((pv.get("spec") or {}).get("storageClassName") or "")
        sc = self.view.storage_class(class_name)
        if sc is None:
            raise DeleteFailed(f"storage class {class_name!r} not found; cannot tell whether to delete, retain or "
                               "archive the directory", final=False)
        try:
            action = params.on_delete(sc.get("parameters") or {})
            # Never allowOtherClusters here: another cluster's directory is disposed of by that cluster.
            claimant = Claimant(ClaimIdentity.of_volume(pv) or _NO_CLAIM, self.cluster, class_name,
                                params.allow_shared_directories(sc.get("parameters") or {}))
        except ValueError as err:
            raise DeleteFailed(str(err), final=False) from err
        if action is params.OnDelete.RETAIN:
            self._attribute_retained(sub, pv)
            return []  # the record stays too: the same claim, re-created, gets its directory back
        users = self._users(server_path, exclude={name, *exclude})
        if users:
            return [Note(WARNING, "DirectoryRetained",
                         f"directory {sub.relative!r} is not {action.value}d: {_names(users)} still use(s) it")]
        with self._ownership:
            refusal = self._release_refusal(sub, claimant, pv)
        if refusal is not None:
            return [Note(WARNING, "DirectoryRetained", f"directory {sub.relative!r} is not {action.value}d: {refusal}")]
        notes = self._dispose(sub, action, name)
        self._forget(sub)
        return notes

    def _release_refusal(self, sub: SubPath, claimant: Claimant, pv: Obj) -> str | None:
        """Why the releasing volume's claim may not dispose of the directory (None: it may).

        Without a record, only upstream's default name vouches: ``<namespace>-<claim>-<pv>``
        ends with this PV's name, ``pvc-<claim uid>``, which no other claim could know
        beforehand. Anything else is retained (fail safe) unless the class shares. The PV
        itself vouches for a version 1 record of its directory that names its claim.
        """
        pv_name = str(pv["metadata"]["name"])
        try:
            records = self._attributed(self.owners.around(sub.parts), evidence=[pv])
        except CorruptRecord as err:
            return str(err)
        except RecordError as err:
            raise DeleteFailed(f"unable to read the ownership records on the export: {err}", final=False) from err
        foreign = first_foreign(records, claimant)
        if foreign is not None:
            whose = foreign.whose(claimant.cluster)
            return f"it {conflict(sub.relative, foreign.path, whose)}, not of this volume's {claimant.named(foreign)}"
        if any(record.path == sub.relative for record in records) or claimant.shares:
            return None
        if sub.basename.endswith(f"-{pv_name}"):
            return None
        return (f"it {UNRECORDED}, so nothing proves it is claim {claimant.identity}'s; remove it by hand if it is "
                "garbage")

    def _attribute_retained(self, sub: SubPath, pv: Obj) -> None:
        """A retained directory's version 1 record becomes this cluster's while its PV still vouches
        for it: once the PV is gone nothing would, and the re-created claim would be refused."""
        try:
            with self._ownership:
                found = self.owners.read(sub.parts)
                if found is None or found.cluster is not None:
                    return
                [record] = self._attributed([found], evidence=[pv])
                if record.cluster is not None:
                    self.owners.write(record)
        except RecordError as err:
            log.warning("could not record this cluster in the ownership record of %r: %s", sub.relative, err)

    def _forget(self, sub: SubPath) -> None:
        """Drop the record of a directory that is gone; a failure leaves a harmless stale record.

        Disposing runs unlocked (``rm -rf`` may take long), so the path may have been made
        again meanwhile, for a new claim: its record is then not ours to drop.
        """
        try:
            with self._ownership:
                if not self.export.exists(sub.parts):
                    self.owners.forget(sub.parts)
        except (RecordError, UnsafeDirectory, OSError) as err:
            log.warning("could not remove the ownership record of %r: %s", sub.relative, err)

    def _dispose(self, sub: SubPath, action: params.OnDelete, pv_name: str) -> list[Note]:
        try:
            if action is params.OnDelete.DELETE:
                self.export.remove(sub.parts)
            elif action is params.OnDelete.ARCHIVE:
                archived = self.export.archive(sub.parts, archive_names(sub.basename, pv_name))
                if archived is not None:
                    return [Note(NORMAL, "DirectoryArchived", f"directory {sub.relative!r} archived as {archived!r}")]
        except UnsafeDirectory as err:
            raise DeleteFailed(f"refusing to touch the directory {sub.relative!r}: {err}", final=True,
                               unsafe_path=True) from err
        except OSError as err:
            raise DeleteFailed(f"unable to {action.value} directory {sub.relative!r}: {err}", final=False) from err
        return []

    # ------------------------------------------------------------------ sharing

    def _users(self, server_path: str, *, exclude: set[str]) -> list[str]:
        """Other PVs on our server whose directory is this one or lies inside it.

        Those are the volumes that removing or moving this directory would destroy. A PV of
        a *parent* directory (such as a static PV of the whole export) is not one of them.
        """
        return [name for name in self.index.users(server_path) if name not in exclude]


#: The identity of a PV bound to no claim: matches no record.
_NO_CLAIM = ClaimIdentity("", "")


@dataclass(frozen=True)
class _Taken:
    """A directory given to a claim: ``created`` now or reused, and its record on the export."""

    created: bool
    record: OwnerRecord


def _fields(sub: SubPath) -> str:
    """Every field the path was rendered from: what to change to be given another directory."""
    return ", ".join(dict.fromkeys(source for seg in sub.segments for source in seg.sources)) or PATTERN_FIELD


def _names(pvs: list[str], shown: int = 3) -> str:
    more = f" and {len(pvs) - shown} more" if len(pvs) > shown else ""
    return "PV " + ", ".join(pvs[:shown]) + more

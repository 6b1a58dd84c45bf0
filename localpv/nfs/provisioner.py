"""The nfs-subdir provisioner: one directory per claim on a mounted export.

This is the *what* (research A.4-A.7): which directory a claim gets, what the PV's NFS
source says, what happens to the directory when the volume is released. The *when* -
watching claims, retrying, events, deciding a claim is ours - is the controller's
(:mod:`localpv.nfs.controller`), as it is the lib's upstream.

Beyond upstream, every path is validated before any disk access, and a directory is
never removed or archived while another PV still points at it or inside it (a
``pathPattern`` without a unique part makes claims share directories, research A.12 #2).
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from localpv.kube.events import NORMAL, WARNING
from localpv.nfs import params
from localpv.nfs.export import Export, UnsafeDirectory
from localpv.nfs.pathpattern import PathRejected, SubPath, archive_names, claim_subpath, parse_subpath

log = logging.getLogger(__name__)

Obj = dict[str, Any]

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


class ClusterView(Protocol):
    """The read-only cluster state a provisioner may consult (served from informer caches)."""

    def storage_class(self, name: str) -> Obj | None: ...

    def volumes(self) -> Iterable[Obj]: ...


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

    def __init__(self, source: NfsSource, export: Export, view: ClusterView) -> None:
        self.source = source
        self.export = export
        self.view = view

    # ------------------------------------------------------------------ provision

    def provision(self, request: ProvisionRequest) -> Provisioned:
        claim, sc = request.claim, request.storage_class
        if (claim.get("spec") or {}).get("selector"):
            raise ProvisionFailed("claim Selector is not supported", final=True)
        pattern = params.path_pattern(sc.get("parameters") or {})
        try:
            sub = claim_subpath(pattern, claim.get("metadata") or {}, request.pv_name)
        except PathRejected as err:
            raise ProvisionFailed(f"refusing the directory path: {err}", final=True, unsafe_path=True) from err
        try:
            created = self.export.make_directory(sub.parts, self.source.dir_mode)
        except UnsafeDirectory as err:
            field_name = sub.segments[err.index].blame()
            raise ProvisionFailed(f"refusing the directory path: {field_name}: {err}", final=True,
                                  unsafe_path=True) from err
        except OSError as err:
            raise ProvisionFailed(f"unable to create directory {sub.relative!r} on the export: {err}",
                                  final=False) from err
        server_path = self.source.server_path(sub)
        return Provisioned(self._volume(request, server_path), self._sharing_notes(sub, server_path, created,
                                                                                   request.pv_name))

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

    def _sharing_notes(self, sub: SubPath, server_path: str, created: bool, pv_name: str) -> list[Note]:
        users = self._users(server_path, exclude={pv_name})
        if users:
            return [Note(WARNING, "DirectoryShared",
                         f"directory {sub.relative!r} is also used by {_names(users)} (the same directory or one "
                         "inside it): the volumes share data, and it is kept while they exist")]
        if not created:
            return [Note(NORMAL, "DirectoryReused",
                         f"directory {sub.relative!r} already existed; its contents are kept")]
        return []

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
        except ValueError as err:
            raise DeleteFailed(str(err), final=False) from err
        users = self._users(server_path, exclude={name, *exclude})
        if users:
            return [Note(WARNING, "DirectoryRetained",
                         f"directory {sub.relative!r} is not {action.value}d: {_names(users)} still use(s) it")]
        return self._dispose(sub, action, name)

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
        mine = posixpath.normpath(server_path)
        users = []
        for pv in self.view.volumes():
            name = str(pv["metadata"]["name"])
            nfs = (pv.get("spec") or {}).get("nfs") or {}
            if name in exclude or nfs.get("server") != self.source.server or not nfs.get("path"):
                continue
            other = posixpath.normpath(str(nfs["path"]))
            if other == mine or other.startswith(mine + "/"):
                users.append(name)
        return sorted(users)


def _names(pvs: list[str], shown: int = 3) -> str:
    more = f" and {len(pvs) - shown} more" if len(pvs) > shown else ""
    return "PV " + ", ".join(pvs[:shown]) + more

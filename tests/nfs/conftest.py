"""A real directory as the export, with a neighbour outside it that must never change."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localpv.clock import Clock
from localpv.kube.api import KubeApi
from localpv.kube.errors import Backoff
from localpv.kube.events import RecordedEvent
from localpv.kube.objects import Obj
from localpv.kube.transport import connect
from localpv.kube.workqueue import ItemBackoff
from localpv.naming import PROVISIONED_BY_ANNOTATION
from localpv.nfs.app import NfsOptions, NfsReplica
from localpv.nfs.controller import ControllerSettings
from localpv.nfs.metrics import NfsMetrics
from localpv.nfs.provisioner import NfsSource
from localpv_emulator.apiserver import ApiServer
from tests.conftest import wait_for

Snapshot = dict[str, tuple[str, int, int, str]]


def snapshot(root: Path) -> Snapshot:
    """Every entry below ``root`` (not following links): type, mode, mtime_ns and link target."""
    found: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
            target = os.readlink(path) if kind == "link" else ""
            found[os.path.relpath(path, root)] = (kind, stat.S_IMODE(st.st_mode), st.st_mtime_ns, target)
    return found


#: The export's reserved top-level directory (ownership records), never a volume.
RESERVED = ".localpv"


def volume_entries(root: Path) -> list[str]:
    """The export root's entries that are volumes or archives (the reserved directory aside)."""
    return sorted(name for name in os.listdir(root) if name != RESERVED)


def records(root: Path) -> list[str]:
    """The files among the ownership records on the export (one per directory a claim owns)."""
    return sorted(str(p.relative_to(root)) for p in (root / RESERVED).rglob("*") if not p.is_dir())


@dataclass
class Layout:
    """``export`` is the mounted export; ``outside`` is a sibling full of data to protect."""

    base: Path
    export: Path
    outside: Path

    def outside_snapshot(self) -> Snapshot:
        return snapshot(self.outside)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    export = tmp_path / "export"
    outside = tmp_path / "outside"
    export.mkdir()
    (outside / "secrets").mkdir(parents=True)
    (outside / "secrets" / "key").write_text("do not touch")
    (outside / "victim").mkdir()
    (outside / "victim" / "data").write_text("precious")
    os.chmod(outside / "victim", 0o700)
    return Layout(tmp_path, export, outside)


# --------------------------------------------------------------------------- cluster side

PROVISIONER = "example.com/nfs"
SERVER = "nfs.example.com"
NFS_PATH = "/exports"


class Cluster:
    """Seeds and reads the emulator's store directly (never faulted), in test vocabulary."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    def namespace(self, name: str) -> None:
        if self.server.get("v1", "Namespace", name) is None:
            self.server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def storage_class(self, name: str = "nfs", *, reclaim: str = "Delete", binding: str = "Immediate",
                      mount_options: list[str] | None = None, provisioner: str = PROVISIONER,
                      **parameters: str) -> Obj:
        sc: Obj = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
                   "provisioner": provisioner, "parameters": parameters, "reclaimPolicy": reclaim,
                   "volumeBindingMode": binding}
        if mount_options:
            sc["mountOptions"] = mount_options
        return self.server.create(sc)

    def claim(self, name: str, namespace: str = "default", *, storage_class: str = "nfs", size: str = "1Gi",
              labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
              modes: tuple[str, ...] = ("ReadWriteMany",), **spec: Any) -> Obj:
        self.namespace(namespace)
        meta: Obj = {"name": name, "namespace": namespace}
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        return self.server.create({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
            "spec": {"storageClassName": storage_class, "accessModes": list(modes),
                     "resources": {"requests": {"storage": size}}, **spec},
        })

    def pvc(self, name: str, namespace: str = "default") -> Obj | None:
        return self.server.get("v1", "PersistentVolumeClaim", name, namespace)

    def pv(self, name: str) -> Obj | None:
        return self.server.get("v1", "PersistentVolume", name)

    def pvs(self) -> list[Obj]:
        return self.server.list("v1", "PersistentVolume")

    def bound_pv(self, name: str, namespace: str = "default") -> Obj | None:
        """The claim's PV once the claim is Bound (for ``wait_for``)."""
        claim = self.pvc(name, namespace)
        if not claim or (claim.get("status") or {}).get("phase") != "Bound":
            return None
        return self.pv(claim["spec"]["volumeName"])

    def released_pv(self, path: str, server: str = SERVER, name: str = "pvc-released",
                    claim: tuple[str, str] = ("tenant", "long-gone"), reclaim: str = "Delete") -> str:
        """A PV of ours whose claim (namespace, name) is long gone (as after a restart, or
        made before an upgrade, or planted by someone with PV rights), already ``Released``
        before any provisioner sees it."""
        self.server.create({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {PROVISIONED_BY_ANNOTATION: PROVISIONER}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "nfs",
                     "persistentVolumeReclaimPolicy": reclaim, "nfs": {"server": server, "path": path},
                     "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": claim[0],
                                  "name": claim[1], "uid": "00000000-dead-beef-0000-000000000000"}},
        })
        def released_or_gone() -> bool:  # a running provisioner may dispose of it at once
            pv = self.pv(name)
            return pv is None or (pv.get("status") or {}).get("phase") == "Released"

        wait_for(released_or_gone, what="Released")
        return name

    def delete_claim(self, name: str, namespace: str = "default") -> None:
        self.server.delete("v1", "PersistentVolumeClaim", name, namespace)

    def events(self, reason: str | None = None) -> list[Obj]:
        """Events that reached the API server."""
        return [e for ns in self.server.list("v1", "Namespace")
                for e in self.server.list("v1", "Event", ns["metadata"]["name"])
                if reason is None or e.get("reason") == reason]


@pytest.fixture
def cluster(apiserver: ApiServer) -> Cluster:
    return Cluster(apiserver)


class Replicas:
    """Starts provisioner replicas against the emulator; stops whatever is left at teardown."""

    def __init__(self, server: ApiServer, layout: Layout) -> None:
        self.server = server
        self.layout = layout
        self.running: list[NfsReplica] = []

    def start(self, *, leader_election: bool = False, clock: Clock | None = None, identity: str | None = None,
              cluster_id: str | None = None, **settings: Any) -> NfsReplica:
        """A replica; ``cluster_id`` None: its cluster's own (the emulator's kube-system uid)."""
        controller = ControllerSettings(PROVISIONER, **{"backoff": ItemBackoff(0.05, 0.4), **settings})
        options = NfsOptions(
            NfsSource(SERVER, NFS_PATH, str(self.layout.export)), controller, cluster_id=cluster_id,
            leader_election=leader_election, namespace="kube-system",
            lease_duration=1.0, renew_deadline=0.7, retry_period=0.1,
            **({"identity": identity} if identity else {}),
        )
        # The API layer keeps real time: a manual clock is for the controller's own timers.
        api = KubeApi(connect(self.server.url), backoff=Backoff(initial=0.01, maximum=0.1, attempts=8))
        replica = NfsReplica(api, options, metrics=NfsMetrics(), clock=clock)
        api.observer = replica.metrics.api.observe
        replica.start()
        self.running.append(replica)
        return replica

    def stop(self, replica: NfsReplica) -> None:
        """Stop one replica now (as a crash or a rollout would take it away)."""
        replica.stop()
        self.running.remove(replica)

    def stop_all(self) -> None:
        for replica in self.running:
            replica.stop()


@pytest.fixture
def replicas(apiserver: ApiServer, layout: Layout) -> Iterator[Replicas]:
    r = Replicas(apiserver, layout)
    try:
        yield r
    finally:
        r.stop_all()


def metric(replica: NfsReplica, name: str, **labels: str) -> float:
    return replica.metrics.registry.get_sample_value(name, labels) or 0.0


def history(replica: NfsReplica, reason: str) -> list[RecordedEvent]:
    """Events the replica emitted (in memory: also those whose write an injected fault dropped)."""
    return [e for e in list(replica.recorder.history) if e.reason == reason]


# --------------------------------------------------------------------------- outcomes and data


def settled(cluster: Cluster, replica: NfsReplica, name: str, namespace: str) -> tuple[str, Any]:
    """("bound", the PV) or ("refused", the ProvisioningFailed message), whichever comes first."""
    def outcome() -> tuple[str, Any] | None:
        pv = cluster.bound_pv(name, namespace)
        if pv is not None:
            return "bound", pv
        refused = [e.message for e in history(replica, "ProvisioningFailed") if e.object_name == name]
        return ("refused", refused[0]) if refused else None

    return wait_for(outcome, what=f"claim {namespace}/{name} bound or refused")


def directory(pv: Obj, layout: Layout) -> str:
    return os.path.join(str(layout.export), str(pv["spec"]["nfs"]["path"])[len(NFS_PATH) + 1:])


def plant(path: str, text: str, name: str = "file") -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, name), "w") as f:
        f.write(text)


def content(path: str, name: str = "file") -> str | None:
    try:
        with open(os.path.join(path, name)) as f:
            return f.read()
    except FileNotFoundError:
        return None


def release(cluster: Cluster, pv: Obj, name: str, namespace: str) -> None:
    """Delete the claim and wait until its PV object is gone (the class decides the directory's fate)."""
    cluster.delete_claim(name, namespace)
    wait_for(lambda: cluster.pv(pv["metadata"]["name"]) is None, what=f"PV of {namespace}/{name} deleted")


def no_pv_for(cluster: Cluster, namespace: str, name: str) -> bool:
    return not [pv for pv in cluster.pvs() if (pv["spec"].get("claimRef") or {}).get("namespace") == namespace
                and pv["spec"]["claimRef"].get("name") == name]

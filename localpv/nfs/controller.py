"""The claim/volume controller: sig-storage-lib-external-provisioner's semantics in threads.

It decides *when* a provisioner acts (research B.2-B.7): a claim is provisioned when its
``volume.kubernetes.io/storage-provisioner`` (or the beta key) and its class name us and,
under ``WaitForFirstConsumer``, once a node is selected; a PV is deleted once it is
``Released`` with policy ``Delete`` and was provisioned by us. Work goes through two keyed
queues with per-item exponential backoff; an item that keeps failing is given up after a
threshold and re-armed by the periodic resync (the lib's v6 never retried it again).

Exactly-once matters more than speed: the PV name is ``pvc-<claim uid>`` so a repeated
create is a harmless ``AlreadyExists``; a claim is never worked on by two workers at
once (the queue); PVs we just created or deleted are remembered until the cache shows it,
so a stale cache does not provision twice or keep a shared directory alive; and before
touching disk or the API the controller asks ``may_act`` (the leader lease is still ours).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from localpv.clock import Clock, SystemClock
from localpv.kube.api import KubeApi, Obj
from localpv.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from localpv.kube.events import NORMAL, WARNING, EventRecorder
from localpv.kube.informer import Informer, object_key
from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, STORAGE_CLASSES
from localpv.kube.workqueue import ItemBackoff, WorkQueue
from localpv.naming import PROVISIONED_BY_ANNOTATION
from localpv.nfs.metrics import NfsMetrics
from localpv.nfs.provisioner import DeleteFailed, Note, NotMine, Provisioned, ProvisionFailed, ProvisionRequest
from localpv.supervise import Supervisor

log = logging.getLogger(__name__)

ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_STORAGE_PROVISIONER_BETA = "volume.beta.kubernetes.io/storage-provisioner"
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_SELECTED_NODE_ALPHA = "volume.alpha.kubernetes.io/selected-node"
ANN_STORAGE_CLASS_BETA = "volume.beta.kubernetes.io/storage-class"


class Provisioner(Protocol):
    """What the controller drives (lib's ``Provisioner`` + ``BlockProvisioner``)."""

    supports_block: bool

    def provision(self, request: ProvisionRequest) -> Provisioned: ...

    def delete(self, pv: Obj, *, exclude: Iterable[str] = ()) -> list[Note]: ...


@dataclass(frozen=True)
class ControllerSettings:
    """Lib defaults: 4 workers per queue, 15 min resync, 15 s → 1000 s backoff, 15 failures."""

    provisioner_name: str
    workers: int = 4
    resync_period: float = 900.0
    backoff: ItemBackoff = field(default_factory=ItemBackoff)
    failed_provision_threshold: int = 15
    failed_delete_threshold: int = 15
    sync_timeout: float = 120.0


class ClusterCache:
    """Informers for claims, volumes and classes; the provisioner's read-only view."""

    def __init__(self, api: KubeApi, *, clock: Clock | None = None) -> None:
        self.claims = Informer(api, PERSISTENT_VOLUME_CLAIMS, clock=clock, name="informer-pvcs")
        self.pvs = Informer(api, PERSISTENT_VOLUMES, clock=clock, name="informer-pvs")
        self.classes = Informer(api, STORAGE_CLASSES, clock=clock, name="informer-classes")

    def storage_class(self, name: str) -> Obj | None:
        return self.classes.get(name) if name else None

    def volumes(self) -> list[Obj]:
        return self.pvs.list()

    def start(self) -> None:
        for informer in (self.classes, self.pvs, self.claims):
            informer.start()

    def stop(self) -> None:
        for informer in (self.claims, self.pvs, self.classes):
            informer.stop()

    def wait_synced(self, timeout: float) -> bool:
        return all(i.wait_synced(timeout) for i in (self.classes, self.pvs, self.claims))


def claim_class(claim: Obj) -> str:
    """The claim's class: the beta annotation wins over ``spec.storageClassName``, as in the lib."""
    beta = ((claim.get("metadata") or {}).get("annotations") or {}).get(ANN_STORAGE_CLASS_BETA)
    return str(beta if beta is not None else (claim.get("spec") or {}).get("storageClassName") or "")


def volume_name(claim: Obj) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def finish_volume(volume: Obj, claim: Obj, class_name: str, provisioner_name: str) -> Obj:
    """What the lib adds to every provisioned PV: pre-binding, provenance, class."""
    meta = claim["metadata"]
    volume.setdefault("metadata", {}).setdefault("annotations", {})[PROVISIONED_BY_ANNOTATION] = provisioner_name
    spec = volume.setdefault("spec", {})
    spec["claimRef"] = {
        "kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": meta.get("namespace"),
        "name": meta.get("name"), "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
    }
    spec["storageClassName"] = class_name
    return volume


class ProvisionController:
    """Two queues, their workers, and a resync timer, over a :class:`ClusterCache`."""

    def __init__(
        self,
        api: KubeApi,
        cache: ClusterCache,
        provisioner: Provisioner,
        settings: ControllerSettings,
        *,
        recorder: EventRecorder,
        metrics: NfsMetrics,
        clock: Clock | None = None,
        may_act: Callable[[], bool] = lambda: True,
    ) -> None:
        self.api = api
        self.cache = cache
        self.provisioner = provisioner
        self.settings = settings
        self.recorder = recorder
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.may_act = may_act
        self.claim_queue = WorkQueue("claims", backoff=settings.backoff, clock=self.clock)
        self.volume_queue = WorkQueue("volumes", backoff=settings.backoff, clock=self.clock)
        self._given_up: set[tuple[str, str]] = set()
        self._created: set[str] = set()
        self._deleted: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.supervisor = Supervisor(clock=self.clock, stopping=self._stop)
        self.synced = threading.Event()
        cache.claims.handlers.append(self._on_claim)
        cache.pvs.handlers.append(self._on_volume)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start informers, then (once they are synced) the workers; returns at once."""
        self.cache.start()
        self._spawn(self._run, "nfs-controller")

    def stop(self) -> None:
        self._stop.set()
        self.claim_queue.shutdown()
        self.volume_queue.shutdown()
        self.cache.stop()
        self.supervisor.stop()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        self.supervisor.spawn(name, target)

    def problems(self) -> list[str]:
        """Why this controller is not doing its job: a worker or the resync loop dead or
        crash-looping, or a cache whose thread stopped (empty when all is well)."""
        found = self.supervisor.problems()
        found += [f"{i.name} is not running" for i in (self.cache.claims, self.cache.pvs, self.cache.classes)
                  if not i.alive()]
        return found

    def _run(self) -> None:
        while not self.cache.wait_synced(1.0):
            if self._stop.is_set():
                return
        self.synced.set()
        s = self.settings
        for i in range(s.workers):
            self._spawn(lambda: self._work(self.claim_queue, self._sync_claim, s.failed_provision_threshold),
                        f"claim-worker-{i}")
            self._spawn(lambda: self._work(self.volume_queue, self._sync_volume, s.failed_delete_threshold),
                        f"volume-worker-{i}")
        # No resync now: the informers' initial lists already queued every candidate.
        while not self.clock.wait(self._stop, s.resync_period):
            self.resync()

    def idle(self) -> bool:
        """Both queues are empty and no worker is busy (tests, and a quiet ``/ready``)."""
        return self.claim_queue.idle() and self.volume_queue.idle()

    def resync(self) -> None:
        """Re-arm given-up items and offer every candidate again (the lib's informer resync)."""
        with self._lock:
            given_up, self._given_up = self._given_up, set()
        for queue_name, key in given_up:
            (self.claim_queue if queue_name == "claims" else self.volume_queue).forget(key)
        for claim in self.cache.claims.list():
            if self._claim_candidate(claim):
                self.claim_queue.add(object_key(claim))
        for pv in self.cache.pvs.list():
            if self._volume_wanted(pv):
                self.volume_queue.add(object_key(pv))

    # ------------------------------------------------------------------ queue plumbing

    def _work(self, queue: WorkQueue, sync: Callable[[str], bool], threshold: int) -> None:
        while (key := queue.get()) is not None:
            try:
                retry = sync(key)
            except Exception:  # a bug must cost one item a retry, not the worker thread
                log.exception("%s: syncing %s failed", queue.name, key)
                retry = True
            finally:
                queue.done(key)
            if not retry:
                queue.forget(key)
            elif threshold and queue.num_requeues(key) >= threshold:
                log.warning("%s: giving up on %s after %d retries until the next resync", queue.name, key,
                            queue.num_requeues(key))
                self.metrics.gave_up.labels(queue.name).inc()
                with self._lock:
                    self._given_up.add((queue.name, key))
            else:
                delay = queue.add_rate_limited(key)
                log.info("%s: retrying %s in %.0fs", queue.name, key, delay)

    def _on_claim(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is not None and self._claim_candidate(new):
            self.claim_queue.add(object_key(new))

    def _on_volume(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            with self._lock:
                self._deleted.discard(str((old or {}).get("metadata", {}).get("name")))
            return
        with self._lock:
            self._created.discard(str(new["metadata"]["name"]))
        if self._volume_wanted(new):
            self.volume_queue.add(object_key(new))

    # ------------------------------------------------------------------ claims

    def _claim_candidate(self, claim: Obj) -> bool:
        """Cheap filter before queueing: unbound, and the provisioner annotation names us."""
        if (claim.get("spec") or {}).get("volumeName"):
            return False
        annotations = (claim.get("metadata") or {}).get("annotations") or {}
        named = annotations.get(ANN_STORAGE_PROVISIONER) or annotations.get(ANN_STORAGE_PROVISIONER_BETA)
        return bool(named == self.settings.provisioner_name)

    def _sync_claim(self, key: str) -> bool:
        """Provision the claim if it is ours and due; True means "failed, retry later"."""
        namespace, _, name = key.partition("/")
        claim = self.cache.claims.get(name, namespace)
        if claim is None or not self._claim_candidate(claim) or (claim["metadata"].get("deletionTimestamp")):
            return False
        class_name = claim_class(claim)
        sc = self.cache.storage_class(class_name)
        if sc is None:
            log.info("claim %s: storage class %r not found (yet)", key, class_name)
            return True
        if sc.get("provisioner") != self.settings.provisioner_name:
            return False
        annotations = claim["metadata"].get("annotations") or {}
        node = annotations.get(ANN_SELECTED_NODE) or annotations.get(ANN_SELECTED_NODE_ALPHA) or None
        if sc.get("volumeBindingMode") == "WaitForFirstConsumer" and not node:
            return False
        pv_name = volume_name(claim)
        with self._lock:
            if pv_name in self._created or self.cache.pvs.get(pv_name) is not None:
                return False
        if not self.may_act():
            return True  # a late renewal, or leadership ending: retry later (moot if we stop)
        if (claim.get("spec") or {}).get("volumeMode") == "Block" and not self.provisioner.supports_block:
            self._failed(claim, class_name, f"{self.settings.provisioner_name} does not support block volume "
                                            "provisioning")
            return False
        return self._provision(claim, class_name, ProvisionRequest(claim, sc, pv_name, node))

    def _provision(self, claim: Obj, class_name: str, request: ProvisionRequest) -> bool:
        meta = claim["metadata"]
        started = self.clock.monotonic()
        self.recorder.event(claim, NORMAL, "Provisioning", "External provisioner is provisioning volume for claim "
                                                           f"\"{meta.get('namespace')}/{meta.get('name')}\"")
        try:
            result = self.provisioner.provision(request)
        except NotMine:
            return False
        except ProvisionFailed as err:
            if err.unsafe_path:
                self.metrics.path_rejections.labels("provision").inc()
            self._failed(claim, class_name, f"failed to provision volume with StorageClass {class_name!r}: {err}")
            return not err.final
        for note in result.notes:
            self.recorder.event(claim, note.type, note.reason, note.message)
        return self._save(claim, class_name, request.pv_name, result.volume, started)

    def _save(self, claim: Obj, class_name: str, pv_name: str, volume: Obj, started: float) -> bool:
        """Create the PV object (once; a repeat is ``AlreadyExists``). True means retry."""
        if not self.may_act():
            return True  # if the lease is really gone, the next leader adopts the directory instead
        pv = finish_volume(volume, claim, class_name, self.settings.provisioner_name)
        with self._lock:
            self._created.add(pv_name)
        try:
            self.api.create(PERSISTENT_VOLUMES, pv)
        except AlreadyExists:
            pass  # an earlier attempt's create landed although its response was lost
        except ApiError as err:
            with self._lock:
                self._created.discard(pv_name)
            self._failed(claim, class_name, f"failed to save PersistentVolume {pv_name!r} (the directory is kept "
                                            f"and will be reused): {err}")
            return True
        self.recorder.event(claim, NORMAL, "ProvisioningSucceeded", f"Successfully provisioned volume {pv_name}")
        self.metrics.provision.labels(class_name).inc()
        self.metrics.provision_duration.labels(class_name).observe(self.clock.monotonic() - started)
        return False

    def _failed(self, claim: Obj, class_name: str, message: str) -> None:
        self.metrics.provision_failed.labels(class_name).inc()
        self.recorder.event(claim, WARNING, "ProvisioningFailed", message)

    # ------------------------------------------------------------------ volumes

    def _volume_wanted(self, pv: Obj) -> bool:
        """Lib's ``shouldDelete``: Released, policy Delete, provisioned by us, not being deleted."""
        meta = pv.get("metadata") or {}
        return (
            not meta.get("deletionTimestamp")
            and (pv.get("status") or {}).get("phase") == "Released"
            and (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Delete"
            and (meta.get("annotations") or {}).get(PROVISIONED_BY_ANNOTATION) == self.settings.provisioner_name
        )

    def _sync_volume(self, name: str) -> bool:
        """Dispose of a released volume's directory and delete the PV; True means retry."""
        cached = self.cache.pvs.get(name)
        if cached is None or not self._volume_wanted(cached):
            return False
        if not self.may_act():
            return True
        try:
            pv = self.api.get(PERSISTENT_VOLUMES, name)  # a stale cache must not decide to delete data
        except NotFound:
            return False
        except ApiError as err:
            log.warning("volume %s: re-reading before delete: %s", name, err)
            return True
        if not self._volume_wanted(pv):
            return False
        class_name = str((pv.get("spec") or {}).get("storageClassName") or "")
        started = self.clock.monotonic()
        with self._lock:
            gone = set(self._deleted)
        try:
            notes = self.provisioner.delete(pv, exclude=gone)
        except NotMine as err:
            log.info("volume %s: not ours to delete: %s", name, err)
            return False
        except DeleteFailed as err:
            if err.unsafe_path:
                self.metrics.path_rejections.labels("delete").inc()
            self._delete_failed(pv, class_name, str(err) + ("" if not err.final else
                                                            "; not retried until the next resync"))
            return not err.final
        for note in notes:
            self.recorder.event(pv, note.type, note.reason, note.message)
        return self._remove_object(pv, class_name, started)

    def _remove_object(self, pv: Obj, class_name: str, started: float) -> bool:
        name = str(pv["metadata"]["name"])
        with self._lock:
            self._deleted.add(name)
        try:
            self.api.delete(PERSISTENT_VOLUMES, name, uid=pv["metadata"].get("uid"))
        except (NotFound, Conflict):
            pass  # already gone, or replaced by a new object of that name that is not ours to touch
        except ApiError as err:
            with self._lock:
                self._deleted.discard(name)
            self._delete_failed(pv, class_name, f"failed to delete PersistentVolume object: {err}")
            return True
        self.metrics.delete.labels(class_name).inc()
        self.metrics.delete_duration.labels(class_name).observe(self.clock.monotonic() - started)
        return False

    def _delete_failed(self, pv: Obj, class_name: str, message: str) -> None:
        self.metrics.delete_failed.labels(class_name).inc()
        self.recorder.event(pv, WARNING, "VolumeFailedDelete", message)

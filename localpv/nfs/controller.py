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

A PV of ours is never meant to be on offer (one PV per claim, pre-bound): one whose claimRef
was removed by hand - an operator "unsticking" a Released PV whose directory cannot be
deleted, or a Bound one by mistake - would be bound by the PV controller to the next claim of
the class, with the previous tenant's directory. With reclaim policy Delete it is never left
so: while the claim it was made for (uid in its name) exists, the claimRef is put back
(``VolumeClaimRestored``); otherwise the PV is retracted (deleted with uid and resourceVersion
preconditions, ``VolumeRetracted``) and its directory disposed of as the release would have,
retried while this process lives. Other policies leave it to the operator, with one warning.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from localpv.clock import Clock, SystemClock
from localpv.kube.api import KubeApi
from localpv.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from localpv.kube.events import NORMAL, WARNING, EventRecorder
from localpv.kube.informer import Informer, object_key
from localpv.kube.objects import Obj
from localpv.kube.pvprotection import FINALIZER, Step, deletion_landed, plan, protected, release, set_protection
from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, STORAGE_CLASSES
from localpv.kube.workqueue import ItemBackoff, WorkQueue
from localpv.naming import PROVISIONED_BY_ANNOTATION
from localpv.nfs.metrics import NfsMetrics
from localpv.nfs.ownership import ClaimIdentity
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

    def owner(self, pv: Obj) -> ClaimIdentity | None: ...


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

    def on_volume_change(self, handler: Callable[[str, Obj | None, Obj | None], None]) -> None:
        self.pvs.handlers.append(handler)

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
    """What the lib adds to every provisioned PV: pre-binding, provenance, class, and (its
    ``AddFinalizer``, external-provisioner's default) the deletion protection of a PV with
    reclaim policy Delete."""
    meta = claim["metadata"]
    volume.setdefault("metadata", {}).setdefault("annotations", {})[PROVISIONED_BY_ANNOTATION] = provisioner_name
    spec = volume.setdefault("spec", {})
    if spec.get("persistentVolumeReclaimPolicy") == "Delete":
        volume["metadata"]["finalizers"] = [FINALIZER]
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
        self._retracted: dict[str, Obj] = {}  # PVs retracted whose directory is still to dispose of
        self._warned: set[str] = set()  # uids of unclaimed PVs warned about (not Delete: left alone)
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
            retracted = list(self._retracted)
        for queue_name, key in given_up:
            (self.claim_queue if queue_name == "claims" else self.volume_queue).forget(key)
        for claim in self.cache.claims.list():
            if self._claim_candidate(claim):
                self.claim_queue.add(object_key(claim))
        for pv in self.cache.pvs.list():
            if self._volume_wanted(pv):
                self.volume_queue.add(object_key(pv))
        for name in retracted:
            self.volume_queue.add(name)

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
        """A PV of ours whose finalizer needs adding or removing, or that is ``Released`` with
        policy Delete and not deleted without the finalizer (lib's ``shouldDelete``; the rule is
        :func:`localpv.kube.pvprotection.plan`), and any PV of ours whose claimRef is gone
        (never left on offer), or gone while it was being retracted (its directory still to
        dispose of)."""
        meta = pv.get("metadata") or {}
        if not self._ours(pv):
            return False
        if not (pv.get("spec") or {}).get("claimRef"):
            return not meta.get("deletionTimestamp") or protected(pv)
        return plan(pv) is not Step.NOTHING

    def _ours(self, pv: Obj) -> bool:
        return ((pv.get("metadata") or {}).get("annotations") or {}).get(PROVISIONED_BY_ANNOTATION) == \
            self.settings.provisioner_name

    def _sync_volume(self, name: str) -> bool:
        """Dispose of a released volume's directory and delete the PV; True means retry."""
        with self._lock:
            retracted = self._retracted.get(name)
        if retracted is not None:
            return self._dispose_retracted(retracted)
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
        step = plan(pv)
        if step in (Step.PROTECT, Step.UNPROTECT):
            return set_protection(self.api, name, step, self._ours)
        if not (pv.get("spec") or {}).get("claimRef"):
            if pv["metadata"].get("deletionTimestamp"):
                # Retracted, and this process (or the one before it) ended before the directory went.
                return self._dispose_retracted(self._as_released(pv))
            return self._unclaimed(pv)
        class_name = str((pv.get("spec") or {}).get("storageClassName") or "")
        started = self.clock.monotonic()
        retry = self._dispose(pv, class_name)
        return retry if retry is not None else self._remove_object(pv, class_name, started)

    def _dispose(self, pv: Obj, class_name: str) -> bool | None:
        """Retain, delete or archive the directory: None when done, else whether to retry."""
        with self._lock:
            gone = set(self._deleted)
        try:
            notes = self.provisioner.delete(pv, exclude=gone)
        except NotMine as err:
            log.info("volume %s: not ours to delete: %s", pv["metadata"]["name"], err)
            return False
        except DeleteFailed as err:
            if err.unsafe_path:
                self.metrics.path_rejections.labels("delete").inc()
            self._delete_failed(pv, class_name, str(err) + ("" if not err.final else
                                                            "; not retried until the next resync"))
            return not err.final
        for note in notes:
            self.recorder.event(pv, note.type, note.reason, note.message)
        return None

    # ------------------------------------------------------------------ unclaimed volumes

    def _unclaimed(self, pv: Obj) -> bool:
        """Our PV without a claimRef (read from the API just now): never leave it on offer."""
        meta, spec = pv["metadata"], pv.get("spec") or {}
        policy = spec.get("persistentVolumeReclaimPolicy")
        if policy != "Delete":
            with self._lock:
                first = str(meta.get("uid")) not in self._warned
                self._warned.add(str(meta.get("uid")))
            if first:
                self.recorder.event(pv, WARNING, "VolumeRetainedReoffered",
                                    f"the claimRef was removed: this PV (reclaim policy {policy}) is on offer to "
                                    f"any claim of class {spec.get('storageClassName')!r} with its directory "
                                    f"{(spec.get('nfs') or {}).get('path')!r} and the data in it; retained data "
                                    "is the operator's, so it is left as it is")
            return False
        claim = self._claim_of(pv)
        if claim is not None:
            return self._restore_claim(pv, claim)
        return self._retract(pv)

    def _claim_of(self, pv: Obj) -> Obj | None:
        """The claim the PV was made for, while it exists: its name is ``pvc-<claim uid>``."""
        name = str(pv["metadata"]["name"])
        if not name.startswith("pvc-"):
            return None
        uid = name[len("pvc-"):]
        return next((c for c in self.cache.claims.list() if (c.get("metadata") or {}).get("uid") == uid), None)

    def _restore_claim(self, pv: Obj, claim: Obj) -> bool:
        """Put back the claimRef of the claim the PV was made for (it may be Bound and mounted:
        deleting the PV would make it Lost). The uid and resourceVersion in the patch are
        preconditions: a PV bound or changed since it was read is decided on again."""
        if not self.may_act():
            return True
        meta, cmeta = pv["metadata"], claim["metadata"]
        guard = {k: str(meta[k]) for k in ("uid", "resourceVersion") if meta.get(k)}
        ref = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": cmeta.get("namespace"),
               "name": cmeta.get("name"), "uid": cmeta.get("uid")}
        try:
            updated = self.api.patch(PERSISTENT_VOLUMES, str(meta["name"]), {"metadata": guard,
                                                                            "spec": {"claimRef": ref}})
        except NotFound:
            return False
        except Conflict:
            return True  # changed since it was read: read it again
        except ApiError as err:  # also 403: putting a claimRef back needs ``patch`` on PVs
            self.recorder.event(pv, WARNING, "VolumeClaimRestoreFailed",
                                f"the claimRef was removed while claim {cmeta.get('namespace')}/{cmeta.get('name')} "
                                f"exists, and cannot be put back: {err}")
            return True
        reason = (f"the claimRef was removed while claim {cmeta.get('namespace')}/{cmeta.get('name')} exists: it "
                  "is put back, so that claim keeps its directory and no other claim is given it")
        log.warning("PV %s: %s", meta["name"], reason)
        self.recorder.event(updated, WARNING, "VolumeClaimRestored", reason)
        return False

    def _retract(self, pv: Obj) -> bool:
        """Delete the PV of a gone claim (uid and resourceVersion preconditions: a PV bound since
        it was read is not touched), then dispose of its directory as the release would have."""
        if not self.may_act():
            return True
        meta = pv["metadata"]
        name = str(meta["name"])
        released = self._as_released(pv)
        with self._lock:
            self._deleted.add(name)
            self._retracted[name] = released
        try:
            self.api.delete(PERSISTENT_VOLUMES, name, uid=str(meta.get("uid") or "") or None,
                            resource_version=str(meta.get("resourceVersion") or "") or None)
        except (NotFound, Conflict) as err:
            with self._lock:
                self._deleted.discard(name)
                self._retracted.pop(name, None)
            return isinstance(err, Conflict)  # changed since it was read: read it again
        except ApiError as err:
            with self._lock:
                self._deleted.discard(name)
                self._retracted.pop(name, None)
            self._delete_failed(pv, str((pv.get("spec") or {}).get("storageClassName") or ""),
                                f"the claimRef was removed and the PV cannot be deleted: {err}")
            return True
        reason = ("the claimRef was removed while the claim it was made for is gone: the PV is deleted so that "
                  "no other claim is given its directory, which is disposed of as its release says")
        log.warning("PV %s: %s", name, reason)
        self.recorder.event(pv, WARNING, "VolumeRetracted", reason)
        return self._dispose_retracted(released)

    def _as_released(self, pv: Obj) -> Obj:
        """The PV as its release would see it: the claimRef of the claim identity its directory
        was made for (the ownership record), which the release acts for."""
        name = str(pv["metadata"]["name"])
        released = copy.deepcopy(pv)
        owner = self.provisioner.owner(pv)
        if owner is not None:
            released["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                                            "namespace": owner.namespace, "name": owner.name,
                                            "uid": name[len("pvc-"):] if name.startswith("pvc-") else ""}
        return released

    def _dispose_retracted(self, pv: Obj) -> bool:
        """The directory of a retracted PV, as a release, then its finalizer: retried while this
        process lives, and by the next one while the finalizer holds the PV."""
        name = str(pv["metadata"]["name"])
        if not self.may_act():
            return True
        class_name = str((pv.get("spec") or {}).get("storageClassName") or "")
        started = self.clock.monotonic()
        retry = self._dispose(pv, class_name)
        if retry is not None:
            return retry
        if not self._release(pv, class_name):
            return True
        with self._lock:
            self._retracted.pop(name, None)
        self.metrics.delete.labels(class_name).inc()
        self.metrics.delete_duration.labels(class_name).observe(self.clock.monotonic() - started)
        return False

    def _remove_object(self, pv: Obj, class_name: str, started: float) -> bool:
        """Delete the PV object (unless it is being deleted already), then take the finalizer off
        it: its directory is disposed of. A crash in between leaves it Terminating with the
        finalizer, Released: the next sync disposes again (the directory is gone: nothing to
        do) and removes the finalizer."""
        name = str(pv["metadata"]["name"])
        with self._lock:
            self._deleted.add(name)
        if not pv["metadata"].get("deletionTimestamp"):
            try:
                self.api.delete(PERSISTENT_VOLUMES, name, uid=pv["metadata"].get("uid"))
            except (NotFound, Conflict):
                pass  # already gone, or replaced by a new object of that name that is not ours to touch
            except ApiError as err:
                if not deletion_landed(self.api, name, str(pv["metadata"].get("uid") or "")):
                    with self._lock:
                        self._deleted.discard(name)
                    self._delete_failed(pv, class_name, f"failed to delete PersistentVolume object: {err}")
                    return True
        if not self._release(pv, class_name):
            return True
        self.metrics.delete.labels(class_name).inc()
        self.metrics.delete_duration.labels(class_name).observe(self.clock.monotonic() - started)
        return False

    def _release(self, pv: Obj, class_name: str) -> bool:
        """Take the finalizer off the PV of this uid (its directory is disposed of); False (with
        an event) when it cannot be done now."""
        try:
            release(self.api, str(pv["metadata"]["name"]), str(pv["metadata"].get("uid") or ""))
        except ApiError as err:
            self._delete_failed(pv, class_name, f"the directory is disposed of; the finalizer {FINALIZER} could "
                                                f"not be removed: {err}")
            return False
        return True

    def _delete_failed(self, pv: Obj, class_name: str, message: str) -> None:
        self.metrics.delete_failed.labels(class_name).inc()
        self.recorder.event(pv, WARNING, "VolumeFailedDelete", message)

"""Claims to images and PVs on this node: external-provisioner's contract, in the agent.

Each agent watches the claims labelled with its node (the claim labeller copies the scheduler's
``volume.kubernetes.io/selected-node`` into that label, :mod:`localpv.csi.claimlabels`); the
agent of the node both name provisions: it checks the pool has room, records
the image in the journal, makes and formats it, and creates the PV (``pvc-<claim uid>``,
pre-bound). Observable as external-provisioner's: events ``Provisioning``,
``ProvisioningSucceeded`` and ``ProvisioningFailed`` on the claim; when the pool lacks room
(or is not there), the selected-node annotation is removed so the scheduler tries another
node, with an event saying why.

Exactly once, across crashes: the journal records an image *before* it is made; the PV
name is the claim's uid, so a repeated create is ``AlreadyExists``. At start (and every
resync) the journal is compared with the cluster: an image whose claim is gone and that no
PV ever named is removed; one whose claim still waits is finished; one whose PV vanished
unseen is kept as ``orphaned`` (never removed, never given to another claim).

Released PVs with policy Delete lose their image only once no loop device is bound to it
(unpublished and unstaged); then the PV object goes. Retain keeps both. Such PVs carry
external-provisioner's finalizer, so one deleted before its claim waits for the release
instead of leaving its image behind (:mod:`localpv.csi.deletion`).

Work goes through keyed queues with per-item backoff (:mod:`localpv.kube.workqueue`);
expansion is in :mod:`localpv.csi.expansion`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from localpv.clock import Clock, SystemClock
from localpv.config import ProvisionerConfig
from localpv.csi import claimlabels
from localpv.csi import provisioner as rules
from localpv.csi.claimlabels import ANN_SELECTED_NODE
from localpv.csi.deletion import Deleter
from localpv.csi.expansion import Expander
from localpv.csi.images import FsType, ImageError, Provisioning
from localpv.csi.journal import BLOCK, FILESYSTEM, ImageJournal, ImageRecord, ImageState
from localpv.csi.ledger import Ledger
from localpv.csi.metrics import DynamicMetrics
from localpv.csi.pools import Pool, PoolState
from localpv.csi.volume import PROVISIONING
from localpv.kube import pvprotection
from localpv.kube.api import KubeApi
from localpv.kube.errors import AlreadyExists, ApiError, NotFound
from localpv.kube.events import NORMAL, WARNING, EventRecorder
from localpv.kube.informer import Informer, object_key
from localpv.kube.objects import Obj, annotations_of
from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, STORAGE_CLASSES
from localpv.kube.workqueue import ItemBackoff, WorkQueue
from localpv.naming import NODE_LABEL_KEY, node_label_value
from localpv.supervise import Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DynamicSettings:
    node_name: str
    hostname: str
    workers: int = 4
    resync_period: float = 300.0
    backoff: ItemBackoff = field(default_factory=lambda: ItemBackoff(initial=1.0, maximum=300.0))


class DynamicController:
    """Provisions, deletes and expands this node's dynamic volumes."""

    def __init__(self, api: KubeApi, settings: DynamicSettings, *, config: Callable[[], ProvisionerConfig],
                 pools: Callable[[], Mapping[str, Pool]], journal: ImageJournal, recorder: EventRecorder,
                 metrics: DynamicMetrics, clock: Clock | None = None) -> None:
        self.api = api
        self.settings = settings
        self.config = config
        self.pools = pools
        self.journal = journal
        self.recorder = recorder
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.ledger = Ledger(journal, pools)
        # Only this node's claims: the claim labeller copies each claim's selected node into this
        # label (localpv/csi/claimlabels.py), so the cache grows with this node's claims alone.
        self.claims = Informer(api, PERSISTENT_VOLUME_CLAIMS, clock=self.clock, name="csi-claims",
                               on_change=self._on_claim, label_selector=claimlabels.node_selector(settings.node_name))
        self.pvs = Informer(api, PERSISTENT_VOLUMES, clock=self.clock, name="csi-pvs", on_change=self._on_volume,
                            label_selector=f"{NODE_LABEL_KEY}={node_label_value(settings.node_name)}")
        self.classes = Informer(api, STORAGE_CLASSES, clock=self.clock, name="csi-classes")
        self.claim_queue = WorkQueue("csi-claims", backoff=settings.backoff, clock=self.clock)
        self.volume_queue = WorkQueue("csi-volumes", backoff=settings.backoff, clock=self.clock)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._created: set[str] = set()
        self.synced = threading.Event()
        self.supervisor = Supervisor(clock=self.clock, stopping=self._stop)
        self.expander = Expander(self)
        self.deleter = Deleter(self)

    @property
    def driver(self) -> str:
        return self.config().csi_driver_name

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for informer in (self.classes, self.pvs, self.claims):
            informer.start()
        self.supervisor.spawn("csi-controller", self._run)

    def stop(self) -> None:
        self._stop.set()
        self.claim_queue.shutdown()
        self.volume_queue.shutdown()
        for informer in (self.claims, self.pvs, self.classes):
            informer.stop()
        self.supervisor.stop()

    def problems(self) -> list[str]:
        found = self.supervisor.problems()
        return found + [f"{i.name} is not running" for i in (self.claims, self.pvs, self.classes) if not i.alive()]

    def idle(self) -> bool:
        return self.claim_queue.idle() and self.volume_queue.idle()

    def _run(self) -> None:
        while not all(i.wait_synced(1.0) for i in (self.classes, self.pvs, self.claims)):
            if self._stop.is_set():
                return
        self.recover()
        self.synced.set()
        for i in range(self.settings.workers):
            self.supervisor.spawn(f"csi-claim-worker-{i}", lambda: self._work(self.claim_queue, self.sync_claim))
            self.supervisor.spawn(f"csi-volume-worker-{i}", lambda: self._work(self.volume_queue, self.sync_volume))
        while not self.clock.wait(self._stop, self.settings.resync_period):
            self.recover()

    def _work(self, queue: WorkQueue, sync: Callable[[str], bool]) -> None:
        while (key := queue.get()) is not None:
            try:
                retry = sync(key)
            except Exception:  # a bug costs one item a retry, not the worker
                log.exception("%s: syncing %s failed", queue.name, key)
                retry = True
            finally:
                queue.done(key)
            if retry:
                queue.add_rate_limited(key)
            else:
                queue.forget(key)

    def _on_claim(self, _kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.claim_queue.add(object_key(new))
        elif old is not None:  # gone: an image begun for it is finished with (see sync_claim)
            self.claim_queue.add(object_key(old))

    def _on_volume(self, _kind: str, _old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        with self._lock:
            self._created.discard(str(new["metadata"]["name"]))
        self.volume_queue.add(object_key(new))
        ref = (new.get("spec") or {}).get("claimRef") or {}
        if ref.get("name"):
            self.claim_queue.add(f"{ref.get('namespace')}/{ref.get('name')}")

    # ------------------------------------------------------------------ claims

    def claim_of(self, record: ImageRecord) -> Obj | None:
        """The live claim a record was made for (None when it is gone or is another incarnation).

        Read from the API server, not the cache: the cache holds only the claims labelled with
        this node, and a claim rescheduled elsewhere (or relabelled) has left it while it may still
        be bound to this image - a decision that removes an image must not rest on its absence.
        """
        namespace, _, name = record.claim.partition("/")
        if not name:
            return None
        try:
            claim = self.api.get(PERSISTENT_VOLUME_CLAIMS, name, namespace)
        except NotFound:
            return None
        return claim if claim["metadata"].get("uid") == record.claim_uid else None

    def sync_claim(self, key: str) -> bool:
        """Provision (or expand) the claim if it is this node's to do; True means retry later."""
        namespace, _, name = key.partition("/")
        claim = self.claims.get(name, namespace)
        if claim is None:
            return self._claim_gone(key)
        if claim["metadata"].get("deletionTimestamp"):
            return False
        bound_to = (claim.get("spec") or {}).get("volumeName")
        if bound_to:
            pv = self.pvs.get(str(bound_to))
            return self.expander.sync(claim, pv) if pv is not None and rules.is_ours(pv, self.driver) else False
        if not claimlabels.names_driver(claim, self.driver):
            return False
        if not claimlabels.agrees(claim, self.settings.node_name):
            return False  # another node's, or its label lags its annotation: the labeller's next write brings it
        class_name = claimlabels.claim_class_name(claim)
        storage_class = self.classes.get(class_name)
        if storage_class is None:
            return True  # not in the cache yet
        if storage_class.get("provisioner") != self.driver:
            return False
        volume = rules.volume_name(claim)
        with self._lock:
            if volume in self._created or self.pvs.get(volume) is not None:
                return False
        return self._provision(claim, class_name, storage_class, volume)

    def _provision(self, claim: Obj, class_name: str, storage_class: Obj, volume: str) -> bool:
        started = self.clock.monotonic()
        settings = self.config().dynamic_classes.get(class_name)
        try:
            if settings is None:
                raise rules.Refused(f"StorageClass {class_name} names driver {self.driver}, but the agent's ConfigMap "
                                    "has no dynamicClassMap entry for it")
            rules.check_parameters(storage_class, settings)
            rules.check_claim(claim)
            rules.check_mount_options(storage_class, settings)
            mode = rules.volume_mode(claim)
            size = rules.image_size(rules.requested_bytes(claim), None if mode == BLOCK else FsType(settings.fs_type))
        except rules.Refused as err:
            self._failed(claim, class_name, str(err))
            return False
        request = rules.Request(volume, str(claim["metadata"]["uid"]), rules.claim_key(claim), class_name, settings,
                                size, mode)
        pool = self.pools().get(settings.pool)
        why = self._pool_problem(pool, settings.pool)
        if why is not None:
            return self._reschedule(claim, class_name, why)
        assert pool is not None
        record = self.journal.get(volume)
        if record is not None and record.state in (ImageState.ORPHANED, ImageState.DELETING):
            # Its image may hold a tenant's data (orphaned) or is going: never made again over it.
            self._failed(claim, class_name, f"volume {volume} has an image recorded as {record.state.value} on node "
                                            f"{self.settings.node_name}; it is not made again over it (runbook: "
                                            "orphaned images)")
            return False
        reuse = self._made(pool, record, request)
        if reuse is None:
            try:
                why = self._promise(pool, request, record)
            except OSError as err:
                why = f"pool {pool.name} cannot be read: {err.strerror}"
            if why is not None:
                return self._reschedule(claim, class_name, why)
        self.recorder.event(claim, NORMAL, "Provisioning",
                            f'External provisioner is provisioning volume for claim "{rules.claim_key(claim)}"')
        try:
            identity = reuse or self._make_image(pool, request)
        except ImageError as err:
            return self._allocation_failed(claim, pool, request, err)
        return self._save(claim, storage_class, request, identity, started)

    def _pool_problem(self, pool: Pool | None, name: str) -> str | None:
        """Why no image can be made in the pool now (None when one can)."""
        if pool is None:
            return f"pool {name} is not configured on node {self.settings.node_name}"
        state, why = pool.state()
        return why if state is not PoolState.READY else None

    def _made(self, pool: Pool, record: ImageRecord | None, request: rules.Request) -> str | None:
        """The identity (filesystem UUID, or a Block image's UUID) of a ready image an earlier
        attempt made for this request's mode (the PV create then failed or its answer was
        lost): it is used as it is. None when there is none."""
        if record is None or record.state is not ImageState.READY or record.volume_mode != request.volume_mode:
            return None
        identity = record.image_uuid if record.block else record.fs_uuid
        if not identity:
            return None
        try:
            if not pool.images.exists(record.volume):
                return None
            found = pool.images.block_uuid(record.volume) if record.block else pool.images.fs_uuid(record.volume)
        except ImageError:
            return None
        return identity if found == identity else None

    def _promise(self, pool: Pool, request: rules.Request, record: ImageRecord | None) -> str | None:
        """Check the pool's account and record the image, in one step; why not, when it does not
        fit. A record left by an interrupted attempt is checked again, its own promise aside."""
        thick = request.provisioning is Provisioning.THICK
        with self.ledger.step(pool) as account:
            holds = self.ledger.promise(record, pool) if record is not None and record.pool == pool.name else None
            why = account.refusal(request.size, thick=thick, pool=pool.name, holds=holds)
            if why is None:
                self.journal.put(ImageRecord(
                    volume=request.volume, pool=pool.name, size=request.size,
                    fs_type="" if request.block else request.settings.fs_type,
                    provisioning=request.settings.provisioning, claim_uid=request.claim_uid, claim=request.claim,
                    state=ImageState.CREATING, since=self.clock.now(), storage_class=request.storage_class,
                    volume_mode=request.volume_mode))
            return why

    def _make_image(self, pool: Pool, request: rules.Request) -> str:
        """Make the recorded image (its room is held by its record) and mark it ready; returns
        its identity (a Block image: no mkfs, its mark's UUID)."""
        created = self.journal.get(request.volume)
        assert created is not None
        if request.block:
            image_uuid = pool.images.create_block(request.volume, request.size, provisioning=request.provisioning)
            self.journal.put(created.moved(ImageState.READY, self.clock.now(), image_uuid=image_uuid))
            return image_uuid
        fs_uuid = pool.images.create(request.volume, request.size, fs=request.fs, provisioning=request.provisioning,
                                     mkfs_options=request.settings.mkfs_options)
        self.journal.put(created.moved(ImageState.READY, self.clock.now(), fs_uuid=fs_uuid))
        return fs_uuid

    def _allocation_failed(self, claim: Obj, pool: Pool, request: rules.Request, err: ImageError) -> bool:
        """An image that could not be made (ENOSPC, EFBIG, EIO, a bad mkfs) holds nothing: its
        remains and its record go. A size no file of this pool can have is refused for good
        (until the claim changes); anything else is rescheduled: another node may do."""
        try:
            pool.images.remove(request.volume)
        except ImageError as removal:
            log.warning("image of volume %s: not removed after a failed allocation: %s", request.volume, removal)
            self._failed(claim, request.storage_class, f"failed to provision volume with StorageClass "
                                                       f"{request.storage_class!r}: {err}")
            return True  # its record keeps the room until the remains are gone
        self.journal.drop(request.volume)
        if err.too_large:
            self._failed(claim, request.storage_class, f"failed to provision volume with StorageClass "
                                                       f"{request.storage_class!r}: {err}")
            return False
        return self._reschedule(claim, request.storage_class, str(err))

    def _save(self, claim: Obj, storage_class: Obj, request: rules.Request, identity: str, started: float) -> bool:
        pv = rules.build_volume(request, claim, storage_class, driver=self.driver, node_name=self.settings.node_name,
                                hostname=self.settings.hostname, identity=identity)
        with self._lock:
            self._created.add(request.volume)
        try:
            made = self.api.create(PERSISTENT_VOLUMES, pv)
        except AlreadyExists:
            # Made by an earlier attempt whose answer was lost: its uid goes into the journal
            # too, which is what later tells a PV deleted by hand from one never made.
            try:
                made = self.api.get(PERSISTENT_VOLUMES, request.volume)
            except ApiError:
                made = {}
        except ApiError as err:
            with self._lock:
                self._created.discard(request.volume)
            self._failed(claim, request.storage_class, f"failed to save PersistentVolume {request.volume!r} (the "
                                                       f"image is kept and will be used): {err}")
            return True
        record = self.journal.get(request.volume)
        uid = str((made.get("metadata") or {}).get("uid") or "")
        if record is not None and uid:
            self.journal.put(record.moved(record.state, record.since, pv_uid=uid))
        self.recorder.event(claim, NORMAL, "ProvisioningSucceeded", f"Successfully provisioned volume {request.volume}")
        self.metrics.operations.labels("provision", "ok").inc()
        self.metrics.duration.labels("provision").observe(self.clock.monotonic() - started)
        return False

    def _failed(self, claim: Obj, class_name: str, message: str) -> None:
        self.metrics.operations.labels("provision", "failed").inc()
        self.recorder.event(claim, WARNING, "ProvisioningFailed", message)

    def _reschedule(self, claim: Obj, class_name: str, why: str) -> bool:
        """external-provisioner's answer to "no room here": drop the selected node, so the
        scheduler picks again (maybe another node)."""
        node = self.settings.node_name

        def unselect(current: Obj) -> Obj | None:
            ann = annotations_of(current)
            if ann.get(ANN_SELECTED_NODE) != node or current["metadata"].get("uid") != claim["metadata"]["uid"]:
                return None
            del current["metadata"]["annotations"][ANN_SELECTED_NODE]
            return current

        try:
            self.api.update(PERSISTENT_VOLUME_CLAIMS, claim["metadata"]["name"], unselect,
                            claim["metadata"]["namespace"])
        except NotFound:
            return False
        except ApiError as err:
            log.warning("claim %s: cannot remove %s: %s", rules.claim_key(claim), ANN_SELECTED_NODE, err)
            return True
        self.metrics.operations.labels("reschedule", "ok").inc()
        self._failed(claim, class_name, f"failed to provision volume with StorageClass {class_name!r} on node {node}: "
                                        f"{why}; rescheduling (annotation {ANN_SELECTED_NODE} removed)")
        return False

    # ------------------------------------------------------------------ release

    def sync_volume(self, name: str) -> bool:
        """The release path of one of this node's PVs (:mod:`localpv.csi.deletion`); True: retry later."""
        return self.deleter.sync(name)

    # ------------------------------------------------------------------ the journal against the cluster

    def recover(self) -> None:
        """Finish or undo what a crash interrupted; called once the caches are synced."""
        self.adopt()
        for name, record in self.journal.snapshot().items():
            try:
                self._recover(name, record)
            except ApiError as err:
                log.warning("image %s: cannot check against the cluster now: %s", name, err)

    def _claim_gone(self, key: str) -> bool:
        """An image begun for a claim that is gone - being made, or made with no PV answered yet -
        holds room for nobody: undo it now, not at the next resync (:meth:`_recover` keeps it if
        a PV or the claim says it was handed out). True while one is left (its pool not there
        now, say): the claim's key is retried with backoff until it is gone."""
        left = False
        for volume, record in self.journal.snapshot().items():
            begun = record.state is ImageState.CREATING or (record.state is ImageState.READY and not record.pv_uid)
            if record.claim == key and begun:
                try:
                    self._recover(volume, record, requeue=False)
                except ApiError as err:
                    log.warning("image %s: cannot check against the cluster now: %s", volume, err)
                left = left or self.journal.get(volume) is not None
        return left

    def adopt(self) -> None:
        """Record the images of ready pools that no record names.

        The image journal can be lost (a state dir wiped, a node re-imaged with its pool disks
        kept) or reset; the images on disk are still there, and some hold tenants' data. Left
        out of the journal they would be out of the pools' accounts (the bound and expansions
        would start from zero: promises made twice) and out of every rule that keeps them. So
        each is recorded: as ``ready`` when a PV of this driver names it (with its claim and PV
        uid: released with Delete, it is removed as any other), else as ``orphaned`` - kept,
        never offered, said on the Node.
        """
        known = self.journal.snapshot()
        for pool in self.pools().values():
            if pool.state()[0] is not PoolState.READY:
                continue
            for name in pool.images.names():
                if name not in known:
                    try:
                        self._adopt(pool, name)
                    except ApiError as err:
                        log.warning("image %s: cannot check against the cluster now: %s", name, err)

    def _adopt(self, pool: Pool, name: str) -> None:
        try:
            usage = pool.images.usage(name)
            image_uuid = pool.images.block_uuid(name) or ""
            # A Block image's content is the tenant's: what filesystem it may hold says nothing.
            fs_uuid = "" if image_uuid else pool.images.fs_uuid(name) or ""
            fs_type = "" if image_uuid else pool.images.fs_type(name) or "ext4"
        except ImageError:
            return  # a directory without an image (an interrupted removal): nothing to hold
        try:
            pv: Obj | None = self.api.get(PERSISTENT_VOLUMES, name)
        except NotFound:
            pv = None
        # A PV being deleted is still this image's while the finalizer holds it for the release.
        mine = pv is not None and rules.is_ours(pv, self.driver) and (
            not pv["metadata"].get("deletionTimestamp") or pvprotection.protected(pv))
        spec = (pv or {}).get("spec") or {}
        attributes = (spec.get("csi") or {}).get("volumeAttributes") or {}
        ref = spec.get("claimRef") or {}
        thick = attributes.get(PROVISIONING) == "thick" if mine else usage.allocated >= usage.size
        state = ImageState.READY if mine else ImageState.ORPHANED
        record = ImageRecord(
            volume=name, pool=pool.name, size=usage.size, fs_type=fs_type, provisioning="thick" if thick else "thin",
            claim_uid=str(ref.get("uid") or ""), claim=f"{ref.get('namespace')}/{ref.get('name')}" if ref else "",
            state=state, since=self.clock.now(), fs_uuid=fs_uuid,
            pv_uid=str((pv or {}).get("metadata", {}).get("uid") or "") if mine else "",
            storage_class=str(spec.get("storageClassName") or ""), volume_mode=BLOCK if image_uuid else FILESYSTEM,
            image_uuid=image_uuid)
        self.journal.put(record)
        node: Obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.settings.node_name}}
        said = (f"the PV of that name is {name}'s: it is watched and released as any other" if mine else
                "no PV of this driver names it: kept, never offered to anyone; remove it by hand if its data "
                "is not wanted (see the runbook 'Orphaned images')")
        self.recorder.event(node, WARNING, "ImageAdopted", f"image {name} in pool {pool.name} ({usage.size} bytes) "
                                                           f"had no record (the image journal was lost or reset): "
                                                           f"recorded as {state.value}; {said}")

    def _recover(self, name: str, record: ImageRecord, *, requeue: bool = True) -> None:
        """``requeue``: a claim still waiting for this image is offered to the workers again (not
        from a worker handling that claim: its own retry, with backoff, does that)."""
        if record.state is ImageState.ORPHANED:
            return
        try:
            pv: Obj | None = self.api.get(PERSISTENT_VOLUMES, name)
        except NotFound:
            pv = None
        if pv is not None:
            if record.state is ImageState.DELETING:
                self.volume_queue.add(name)
            elif not record.pv_uid and record.state is ImageState.READY:
                self.journal.put(record.moved(record.state, record.since, pv_uid=str(pv["metadata"].get("uid") or "")))
            return
        if record.pv_uid and record.state is not ImageState.DELETING:
            # A PV was made and is gone, and no release was seen: whatever is in the image is kept.
            log.warning("image %s (claim %s): its PV was deleted without a release; kept as orphaned", name,
                        record.claim)
            self.journal.put(record.moved(ImageState.ORPHANED, self.clock.now()))
            return
        claim = self.claim_of(record)
        if claim is not None and (claim.get("spec") or {}).get("volumeName") == name \
                and record.state is not ImageState.DELETING:
            # Its claim was bound to it, so it was handed out, even though the PV's uid never
            # reached the journal (the create's answer lost, or a stop right after it).
            log.warning("image %s (claim %s): its PV is gone but its claim is bound to it; kept as orphaned", name,
                        record.claim)
            self.journal.put(record.moved(ImageState.ORPHANED, self.clock.now()))
            return
        waiting = claim is not None and not (claim.get("spec") or {}).get("volumeName") \
            and not claim["metadata"].get("deletionTimestamp") and record.state is not ImageState.DELETING
        if waiting:
            assert claim is not None
            if requeue:
                self.claim_queue.add(rules.claim_key(claim))  # it finishes what was begun
            return
        # Never handed to anyone (no PV, claim gone or done), or released: nothing in it is kept.
        if self.deleter.remove_image(record.pool, name, None):
            self.journal.drop(name)

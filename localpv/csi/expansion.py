"""Growing a dynamic volume: external-resizer's contract, in the agent of the volume's node.

A bound claim of a class with ``allowVolumeExpansion: true`` asks for more: the agent of the
volume's node checks the pool has room for the difference, grows the image (and the loop
device, if staged), sets the PV's capacity, and marks the claim ``FileSystemResizePending``
(events ``Resizing``, then ``FileSystemResizeRequired``). The kubelet then calls
NodeExpandVolume, which grows the filesystem online; the node service tells this module,
which sets the claim's ``status.capacity`` and drops the condition
(``FileSystemResizeSuccessful``). The kubelet of 1.20 does the same last step itself; doing
it here too makes the claim end with its new capacity whoever gets there first.

Where the resize is, the claim's status says as external-resizer writes it (KEP-1790, recovery
from failed expansion: beta and on by default 1.32, GA 1.34): ``allocatedResources`` the size
asked for, ``allocatedResourceStatuses`` ``ControllerResizeInProgress`` while the image grows
(and while it cannot yet: no room is not final), ``ControllerResizeInfeasible`` when it never
can, ``NodeResizePending`` once only the filesystem is left (a current kubelet calls
NodeExpandVolume for that; without it only its legacy path did), none once done. An API server
before those fields drops them.

A Block volume has no filesystem to grow: once its image (and its loop devices, if staged)
has grown, the claim is finished at once (``VolumeResizeSuccessful``, as external-resizer says
when no node expansion is required); a NodeExpandVolume the kubelet may still send only finds
the device at its size.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from localpv.csi import loop
from localpv.csi import provisioner as rules
from localpv.csi.images import FsType, ImageError, Provisioning
from localpv.csi.journal import ImageState
from localpv.csi.pools import PoolState
from localpv.csi.volume import POOL
from localpv.kube.errors import ApiError, NotFound
from localpv.kube.events import NORMAL, WARNING
from localpv.kube.objects import Obj
from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from localpv.naming import format_binary_quantity

if TYPE_CHECKING:
    from localpv.csi.controller import DynamicController

log = logging.getLogger(__name__)

RESIZE_PENDING = "FileSystemResizePending"
#: ``status.allocatedResourceStatuses`` of a claim being resized (KEP-1790).
CONTROLLER_RESIZE_IN_PROGRESS = "ControllerResizeInProgress"
CONTROLLER_RESIZE_INFEASIBLE = "ControllerResizeInfeasible"
NODE_RESIZE_PENDING = "NodeResizePending"
#: external-resizer's event when no node expansion is required (a Block volume).
_BLOCK_FINISHED = {"reason": "VolumeResizeSuccessful", "message": "Resize volume succeeded"}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Expander:
    def __init__(self, controller: DynamicController) -> None:
        self.c = controller
        #: Volumes whose filesystem the node service grew: volume name -> bytes.
        self._grown: dict[str, int] = {}
        self._lock = threading.Lock()

    def filesystem_grown(self, volume: str, size: int) -> None:
        """The node service's hook (a gRPC thread): note it and let a worker finish the claim."""
        with self._lock:
            self._grown[volume] = size
        pv = self.c.pvs.get(volume)
        ref = ((pv or {}).get("spec") or {}).get("claimRef") or {}
        if ref.get("name"):
            self.c.claim_queue.add(f"{ref.get('namespace')}/{ref.get('name')}")

    def sync(self, claim: Obj, pv: Obj) -> bool:
        """Grow what the claim asks for, or finish a grown one; True means retry later."""
        try:
            wanted = rules.requested_bytes(claim)
        except rules.Refused:
            return False
        have = rules.capacity_of(pv)
        if wanted > have:
            return self._grow(claim, pv, wanted, have)
        with self._lock:
            grown = self._grown.pop(str(pv["metadata"]["name"]), None)
        if grown is not None and grown >= have:
            record = self.c.journal.get(str(pv["metadata"]["name"]))
            if record is not None and record.block:  # a finish of _grow's that failed: said as it would have
                return self._finish(claim, pv, **_BLOCK_FINISHED)
            return self._finish(claim, pv)
        return False

    def _grow(self, claim: Obj, pv: Obj, wanted: int, have: int) -> bool:
        c = self.c
        name = str(pv["metadata"]["name"])
        started = c.clock.monotonic()
        storage_class = c.classes.get(str((pv.get("spec") or {}).get("storageClassName") or ""))
        if storage_class is None or not storage_class.get("allowVolumeExpansion"):
            return self._failed(claim, f"StorageClass of volume {name} does not allow expansion", retry=False)
        record = c.journal.get(name)
        pool = c.pools().get(str((((pv.get("spec") or {}).get("csi") or {}).get("volumeAttributes") or {}).get(POOL)))
        if record is None or pool is None or record.state is not ImageState.READY:
            return self._failed(claim, f"volume {name} has no ready image recorded on node {c.settings.node_name}",
                                retry=False)
        try:
            self._resize_status(claim, CONTROLLER_RESIZE_IN_PROGRESS)
        except NotFound:
            return False
        except ApiError as err:
            log.warning("claim %s: the resize status could not be set: %s", rules.claim_key(claim), err)
            return True
        provisioning = Provisioning(record.provisioning)
        size = rules.image_size(wanted, None if record.block else FsType(record.fs_type))
        state, why = pool.state()
        if state is not PoolState.READY:
            return self._failed(claim, why, retry=True)
        try:
            # The larger promise replaces the old one in the pool's account, checked and recorded
            # in one step; a thick image needs only the bytes it does not hold (its real allocation).
            with c.ledger.step(pool) as account:
                holds = c.ledger.promise(record, pool)
                refusal = account.refusal(size, thick=provisioning is Provisioning.THICK, pool=pool.name,
                                          holds=holds)
                if refusal is None:
                    c.journal.put(record.moved(record.state, record.since, size=size))
        except OSError as err:
            return self._failed(claim, f"pool {pool.name} cannot be read: {err.strerror}", retry=True)
        if refusal is not None:
            return self._failed(claim, f"cannot grow volume {name} to {size} bytes: {refusal}", retry=True)
        c.recorder.event(claim, NORMAL, "Resizing", f"External resizer is resizing volume {name}")
        try:
            pool.images.grow(name, size, provisioning=provisioning)
            for device in pool.images.in_use(name):
                loop.refresh_capacity(device)
        except (ImageError, loop.LoopError) as err:
            if isinstance(err, ImageError):  # the image is back at its old size: so is its promise
                current = c.journal.get(name)
                if current is not None:
                    c.journal.put(current.moved(current.state, current.since, size=record.size))
            return self._failed(claim, str(err), retry=True)
        capacity = format_binary_quantity(size)
        try:
            c.api.patch(PERSISTENT_VOLUMES, name, {"spec": {"capacity": {"storage": capacity}}})
            if record.block:
                c.metrics.operations.labels("expand", "ok").inc()
                log.info("volume %s grown from %d to %d bytes (raw block: nothing to grow on the node)", name, have,
                         size)
                grown_pv = {**pv, "spec": {**(pv.get("spec") or {}), "capacity": {"storage": capacity}}}
                return self._finish(claim, grown_pv, **_BLOCK_FINISHED)
            self._set_pending(claim)
        except NotFound:
            return False
        except ApiError as err:
            return self._failed(claim, f"image grown; the PV's capacity could not be set: {err}", retry=True)
        c.recorder.event(claim, NORMAL, "FileSystemResizeRequired", "Require file system resize of volume on node")
        c.metrics.operations.labels("expand", "ok").inc()
        c.metrics.duration.labels("expand").observe(c.clock.monotonic() - started)
        log.info("volume %s grown from %d to %d bytes; its filesystem grows at NodeExpandVolume", name, have, size)
        return False

    def _set_pending(self, claim: Obj) -> None:
        meta = claim["metadata"]
        status = dict(claim.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != RESIZE_PENDING]
        conditions.append({"type": RESIZE_PENDING, "status": "True", "lastTransitionTime": _now(),
                           "message": "Waiting for user to (re-)start a pod to finish file system resize of volume "
                                      "on node."})
        self.c.api.patch(PERSISTENT_VOLUME_CLAIMS, meta["name"],
                         {"status": {"conditions": conditions,
                                     "allocatedResourceStatuses": {"storage": NODE_RESIZE_PENDING}}},
                         meta["namespace"], subresource="status")

    def _resize_status(self, claim: Obj, state: str) -> None:
        """Say in the claim's status what size is asked for and where its resize is (nothing is
        written when it says so already: a growth retried while the pool has no room)."""
        meta = claim["metadata"]
        requested = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
        status = claim.get("status") or {}
        if (status.get("allocatedResources") or {}).get("storage") == requested and \
                (status.get("allocatedResourceStatuses") or {}).get("storage") == state:
            return
        self.c.api.patch(PERSISTENT_VOLUME_CLAIMS, meta["name"],
                         {"status": {"allocatedResources": {"storage": requested},
                                     "allocatedResourceStatuses": {"storage": state}}},
                         meta["namespace"], subresource="status")

    def _finish(self, claim: Obj, pv: Obj, *, reason: str = "FileSystemResizeSuccessful",
                message: str = "") -> bool:
        meta = claim["metadata"]
        capacity = ((pv.get("spec") or {}).get("capacity") or {}).get("storage")
        conditions = [c for c in (claim.get("status") or {}).get("conditions") or [] if c.get("type") != RESIZE_PENDING]
        try:
            self.c.api.patch(PERSISTENT_VOLUME_CLAIMS, meta["name"],
                             {"status": {"capacity": {"storage": capacity}, "conditions": conditions or None,
                                         "allocatedResourceStatuses": {"storage": None}}},
                             meta["namespace"], subresource="status")
        except NotFound:
            return False
        except ApiError as err:
            log.warning("claim %s: status capacity not set: %s", rules.claim_key(claim), err)
            with self._lock:
                self._grown.setdefault(str(pv["metadata"]["name"]), rules.capacity_of(pv))
            return True
        self.c.recorder.event(claim, NORMAL, reason,
                              message or f"MountVolume.NodeExpandVolume succeeded for volume {pv['metadata']['name']}")
        return False

    def _failed(self, claim: Obj, message: str, *, retry: bool) -> bool:
        """Say it (an event); a failure that retrying cannot mend is also said in the claim's
        resize status (a retried one leaves it in progress)."""
        self.c.metrics.operations.labels("expand", "failed").inc()
        self.c.recorder.event(claim, WARNING, "VolumeResizeFailed", message)
        if not retry:
            try:
                self._resize_status(claim, CONTROLLER_RESIZE_INFEASIBLE)
            except ApiError as err:  # NotFound too: a claim gone has nothing to say
                log.warning("claim %s: the resize status could not be set: %s", rules.claim_key(claim), err)
        return retry

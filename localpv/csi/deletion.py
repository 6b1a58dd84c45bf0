"""Releasing a dynamic volume: external-provisioner's deletion contract, in the agent.

A PV of this node released with reclaim policy ``Delete`` loses its image only once no loop
device is bound to it (unpublished and unstaged: never under a mount); then the PV object
goes, then the image's record. ``Retain`` keeps both. The image journal's ``deleting`` state
is written before the image goes, so a crash anywhere in between is finished at the next
start (:meth:`localpv.csi.controller.DynamicController.recover`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from localpv.csi import provisioner as rules
from localpv.csi.images import ImageError
from localpv.csi.journal import ImageState
from localpv.csi.pools import PoolState
from localpv.csi.volume import POOL
from localpv.kube.errors import ApiError, Conflict, NotFound
from localpv.kube.events import WARNING
from localpv.kube.objects import Obj
from localpv.kube.resources import PERSISTENT_VOLUMES

if TYPE_CHECKING:
    from localpv.csi.controller import DynamicController

log = logging.getLogger(__name__)


class Deleter:
    """The release path of the controller's PVs (its caches, journal, pools and recorder)."""

    def __init__(self, controller: DynamicController) -> None:
        self.c = controller

    def sync(self, name: str) -> bool:
        c = self.c
        pv = c.pvs.get(name)
        if pv is None or not rules.is_ours(pv, c.driver) or pv["metadata"].get("deletionTimestamp"):
            return False
        spec = pv.get("spec") or {}
        if (pv.get("status") or {}).get("phase") != "Released" or spec.get("persistentVolumeReclaimPolicy") != "Delete":
            return False
        try:
            pv = c.api.get(PERSISTENT_VOLUMES, name)  # a stale cache must not decide to delete data
        except NotFound:
            return False
        if (pv.get("status") or {}).get("phase") != "Released":
            return False
        return self.delete(pv)

    def delete(self, pv: Obj) -> bool:
        c = self.c
        name = str(pv["metadata"]["name"])
        started = c.clock.monotonic()
        record = c.journal.get(name)
        if record is not None and record.state is not ImageState.DELETING:
            c.journal.put(record.moved(ImageState.DELETING, c.clock.now()))
        pool_name = str((((pv.get("spec") or {}).get("csi") or {}).get("volumeAttributes") or {}).get(POOL) or "")
        if not self.remove_image(pool_name, name, pv):
            return True
        try:
            c.api.delete(PERSISTENT_VOLUMES, name, uid=pv["metadata"].get("uid"))
        except (NotFound, Conflict):
            pass
        except ApiError as err:
            self.failed(pv, f"the image is removed; the PersistentVolume object could not be deleted: {err}")
            return True
        c.journal.drop(name)
        c.metrics.operations.labels("delete", "ok").inc()
        c.metrics.duration.labels("delete").observe(c.clock.monotonic() - started)
        return False

    def remove_image(self, pool_name: str, name: str, obj: Obj | None) -> bool:
        """Remove an image if it may go now; False (with an event on ``obj``) if not yet."""
        c = self.c
        pool = c.pools().get(pool_name)
        if pool is None:
            self.failed(obj, f"pool {pool_name!r} is not configured on node {c.settings.node_name}; "
                             "the image is kept")
            return False
        state, why = pool.state()
        if state is not PoolState.READY:
            self.failed(obj, f"{why}; the image is removed once the pool is back")
            return False
        try:
            pool.images.remove(name)
        except ImageError as err:
            self.failed(obj, f"{err}; retried once it is unstaged")
            return False
        log.info("image of volume %s removed from pool %s", name, pool_name)
        return True

    def failed(self, obj: Obj | None, message: str) -> None:
        c = self.c
        c.metrics.operations.labels("delete", "failed").inc()
        if obj is not None:
            c.recorder.event(obj, WARNING, "VolumeFailedDelete", message)
        else:
            log.warning("%s", message)

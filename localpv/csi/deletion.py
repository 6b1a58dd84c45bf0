"""Releasing a dynamic volume: external-provisioner's deletion contract, in the agent.

A PV of this node released with reclaim policy ``Delete`` loses its image only once no loop
device is bound to it (unpublished and unstaged: never under a mount); then the PV object
goes, then the image's record. ``Retain`` keeps both.

**Whatever is deleted first** (KEP-2644, ``HonorPVReclaimPolicy``). Every PV with policy
``Delete`` carries external-provisioner's finalizer,
``external-provisioner.volume.kubernetes.io/finalizer`` (:data:`FINALIZER`), from its creation
(:func:`localpv.csi.provisioner.build_volume`); PVs made before it get it here once they are
Bound, as external-provisioner does for PVs it finds without it. So a PV deleted before its
claim (``kubectl delete pv``) does not vanish with its image left behind: it stays, Terminating,
while its claim is Bound - the claim's pods keep their volume, external-provisioner also waits
for the release - and once the claim is gone and the PV Released, its image is removed and the
finalizer goes last, letting the object go. The finalizer is the one external-provisioner
uses, not one of localpv's own: the PV controller and tooling that know KEP-2644 (runbooks,
``kubectl`` plugins that explain a stuck Terminating PV) then read localpv's PVs right. A PV
whose policy becomes ``Retain`` loses it (its image is kept, as Retain says).

**Crash-safe.** The steps are ordered so that a restart at any point finishes the deletion:
the image journal's ``deleting`` state is written before the image goes; then the image (crash
point ``csi-image:removed``), the delete of the PV object (which only marks it while the
finalizer holds it), the finalizer's removal (a merge patch whose uid and ``resourceVersion``
are preconditions: a concurrent writer's change is read again, never overwritten), and last
the record. A PV found Released and Terminating with the finalizer is simply taken through the
remaining steps again; one that is gone with its record ``deleting`` has the rest done by the
controller's recovery. A PV that lost the finalizer some other way (removed by hand, or
deleted before this release added it) is not deleted through: its image is kept as
``orphaned``, as before (the journal's rule for a PV deleted without a release).

The rule is :func:`localpv.kube.pvprotection.plan` (plain data in, a :class:`Step` out), shared with
the NFS provisioner; :class:`Deleter` carries it out for images.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from localpv.crashpoints import reached
from localpv.csi import provisioner as rules
from localpv.csi.images import ImageError
from localpv.csi.journal import ImageState
from localpv.csi.pools import PoolState
from localpv.csi.volume import POOL
from localpv.kube.errors import ApiError, Conflict, NotFound
from localpv.kube.events import WARNING
from localpv.kube.objects import Obj
from localpv.kube.pvprotection import FINALIZER, Step, deletion_landed, plan, release, set_protection
from localpv.kube.resources import PERSISTENT_VOLUMES

if TYPE_CHECKING:
    from localpv.csi.controller import DynamicController

log = logging.getLogger(__name__)

__all__ = ["Deleter"]


class Deleter:
    """The release path of the controller's PVs (its caches, journal, pools and recorder)."""

    def __init__(self, controller: DynamicController) -> None:
        self.c = controller

    def sync(self, name: str) -> bool:
        """Carry out the PV's step; True means retry later (with the queue's backoff)."""
        c = self.c
        pv = c.pvs.get(name)
        if pv is None or not rules.is_ours(pv, c.driver):
            return False
        step = plan(pv)
        if step in (Step.PROTECT, Step.UNPROTECT):
            return set_protection(c.api, name, step, lambda current: rules.is_ours(current, c.driver))
        if step is not Step.DELETE:
            return False
        try:
            pv = c.api.get(PERSISTENT_VOLUMES, name)  # a stale cache must not decide to delete data
        except NotFound:
            return False
        if not rules.is_ours(pv, c.driver) or plan(pv) is not Step.DELETE:
            return False
        return self.delete(pv)

    def delete(self, pv: Obj) -> bool:
        """The image, the PV object, the finalizer, the record - each step done at most once
        more after a crash (see the module's docstring)."""
        c = self.c
        name = str(pv["metadata"]["name"])
        uid = str(pv["metadata"].get("uid") or "")
        started = c.clock.monotonic()
        record = c.journal.get(name)
        if record is not None and record.state is not ImageState.DELETING:
            c.journal.put(record.moved(ImageState.DELETING, c.clock.now()))
        pool_name = str((((pv.get("spec") or {}).get("csi") or {}).get("volumeAttributes") or {}).get(POOL) or "")
        if not self.remove_image(pool_name, name, pv):
            return True
        if not pv["metadata"].get("deletionTimestamp"):
            try:
                c.api.delete(PERSISTENT_VOLUMES, name, uid=uid or None)
            except (NotFound, Conflict):
                pass  # gone already, or another object of that name now: not this one's to delete
            except ApiError as err:
                if not deletion_landed(c.api, name, uid):
                    self.failed(pv, f"the image is removed; the PersistentVolume object could not be deleted: {err}")
                    return True
        if not self._release(name, uid, pv):
            return True
        c.journal.drop(name)
        c.metrics.operations.labels("delete", "ok").inc()
        c.metrics.duration.labels("delete").observe(c.clock.monotonic() - started)
        return False

    def _release(self, name: str, uid: str, pv: Obj) -> bool:
        """Remove the finalizer of the object with this uid (its image is gone); False (with an
        event) when it could not be done now."""
        try:
            release(self.c.api, name, uid)
        except ApiError as err:
            self.failed(pv, f"the image is removed; the finalizer {FINALIZER} could not be removed: {err}")
            return False
        return True

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
            removed = pool.images.remove(name)
        except ImageError as err:
            self.failed(obj, f"{err}; retried once it is unstaged")
            return False
        if removed:
            reached("csi-image:removed")
            log.info("image of volume %s removed from pool %s", name, pool_name)
        return True

    def failed(self, obj: Obj | None, message: str) -> None:
        c = self.c
        c.metrics.operations.labels("delete", "failed").inc()
        if obj is not None:
            c.recorder.event(obj, WARNING, "VolumeFailedDelete", message)
        else:
            log.warning("%s", message)

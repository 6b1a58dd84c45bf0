"""A provisioner's PV deletion protection (KEP-2644, ``HonorPVReclaimPolicy``), as a rule on data.

external-provisioner keeps its finalizer, ``external-provisioner.volume.kubernetes.io/finalizer``,
on every PV it provisioned with reclaim policy ``Delete``, so that whichever of claim and PV is
deleted first, the storage goes before the object does: a PV deleted while its claim is Bound
stays Terminating; once Released, the provisioner removes the storage, then the finalizer. Both
of localpv's provisioners that make PVs (the dynamic controller and the NFS provisioner) follow
it, with this one rule (:func:`plan`: which step one of their PVs needs now) and the two writes
of the finalizer (:func:`set_protection`, :func:`release`). What the storage is, and how it goes,
is theirs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from enum import Enum

from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, NotFound
from localpv.kube.finalizers import EXTERNAL_PROVISIONER_FINALIZER as FINALIZER
from localpv.kube.finalizers import patch_finalizers
from localpv.kube.objects import Obj
from localpv.kube.resources import PERSISTENT_VOLUMES

log = logging.getLogger(__name__)

__all__ = ["FINALIZER", "Step", "deletion_landed", "plan", "protected", "release", "set_protection"]


class Step(Enum):
    """What one of a provisioner's PVs needs from its release path now."""

    NOTHING = "nothing"
    #: Bound with policy Delete and not protected yet (a PV of an earlier release): add the finalizer.
    PROTECT = "protect"
    #: Protected, but its policy is no longer Delete: remove the finalizer (the storage is kept).
    UNPROTECT = "unprotect"
    #: Released with policy Delete: the storage, the PV object, the finalizer (then the records).
    DELETE = "delete"


def protected(pv: Obj) -> bool:
    return FINALIZER in ((pv.get("metadata") or {}).get("finalizers") or [])


def plan(pv: Obj) -> Step:
    """The release path's rule for one PV of a provisioner (the caller checked it is its own)."""
    policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy")
    phase = (pv.get("status") or {}).get("phase")
    deleting = bool((pv.get("metadata") or {}).get("deletionTimestamp"))
    if policy != "Delete":
        return Step.UNPROTECT if protected(pv) else Step.NOTHING
    if phase == "Released":
        # Being deleted without the finalizer: nothing holds the object for a deletion to
        # finish, and whoever removed it did not ask for the storage to go (it is kept).
        return Step.DELETE if protected(pv) or not deleting else Step.NOTHING
    if phase == "Bound" and not deleting and not protected(pv):
        return Step.PROTECT
    # Bound and being deleted: its claim still has it (and maybe a pod); it waits for the release.
    return Step.NOTHING


def set_protection(api: KubeApi, name: str, step: Step, ours: Callable[[Obj], bool]) -> bool:
    """Add (``PROTECT``) or remove (``UNPROTECT``) the finalizer of PV ``name``, decided again
    on the object as read: nothing is written unless ``ours`` still holds and :func:`plan` still
    says ``step``. True means "retry later" (the write failed; said in the log); a PV gone needs
    nothing."""
    def wanted(current: Obj) -> list[str] | None:
        if not ours(current) or plan(current) is not step:
            return None
        kept = [f for f in current["metadata"].get("finalizers") or [] if f != FINALIZER]
        return [*kept, FINALIZER] if step is Step.PROTECT else kept

    try:
        changed = patch_finalizers(api, PERSISTENT_VOLUMES, name, wanted)
    except NotFound:
        return False
    except ApiError as err:
        log.warning("volume %s: cannot %s its finalizer %s now: %s", name,
                    "add" if step is Step.PROTECT else "remove", FINALIZER, err)
        return True
    if changed:
        log.info("volume %s: finalizer %s %s", name, FINALIZER, "added" if step is Step.PROTECT else "removed")
    return False


def release(api: KubeApi, name: str, uid: str) -> None:
    """Remove the finalizer of PV ``name`` once its storage is gone: only from the object with
    this ``uid`` (empty: whichever), and only if it still has it. A PV already gone is done;
    other API errors propagate."""
    def wanted(current: Obj) -> list[str] | None:
        meta = current["metadata"]
        if (uid and meta.get("uid") != uid) or not protected(current):
            return None
        return [f for f in meta.get("finalizers") or [] if f != FINALIZER]

    with contextlib.suppress(NotFound):
        patch_finalizers(api, PERSISTENT_VOLUMES, name, wanted)


def deletion_landed(api: KubeApi, name: str, uid: str) -> bool:
    """After a delete of PV ``name`` that failed without an answer (a connection lost on the
    way back), whether it landed: the object with this ``uid`` is gone or marked for deletion.
    With the finalizer a repeated delete answers 200, never the 404 that would tell a retry the
    first one landed: a read tells. False when the read fails too."""
    try:
        current = api.get(PERSISTENT_VOLUMES, name)
    except NotFound:
        return True
    except ApiError:
        return False
    meta = current.get("metadata") or {}
    return bool((uid and meta.get("uid") != uid) or meta.get("deletionTimestamp"))

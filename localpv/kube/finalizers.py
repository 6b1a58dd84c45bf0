"""An object's finalizers, rewritten without overwriting anyone's change.

A finalizer list is shared by every controller that guards the object, so it is never replaced
from a stale read: the object is read, the caller decides the list it wants from what it read,
and the list is written with a merge patch whose uid and resourceVersion are preconditions. An
object changed in between (409) is read and decided on again. A patch rather than a
read-and-replace (:meth:`KubeApi.update`): the components' roles may patch objects they may not
update (the agent's ClusterRole and PVs).
"""

from __future__ import annotations

from collections.abc import Callable

from localpv.kube.api import KubeApi
from localpv.kube.errors import Conflict
from localpv.kube.objects import Obj
from localpv.kube.resources import Resource

#: external-provisioner's deletion protection of the PVs it provisions with reclaim policy
#: Delete (KEP-2644, HonorPVReclaimPolicy): it goes once the volume is deleted. localpv's
#: dynamic PVs carry the same name, so tools and runbooks that know it read a stuck PV right.
EXTERNAL_PROVISIONER_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"


def patch_finalizers(api: KubeApi, resource: Resource, name: str, wanted: Callable[[Obj], list[str] | None],
                     *, namespace: str | None = None, attempts: int = 5) -> bool:
    """Write the finalizers ``wanted`` decides from the object as read (None: leave it as it
    is). True when a list was written, False when there was nothing to change; NotFound and
    other API errors propagate, a Conflict only after ``attempts`` reads."""
    for attempt in range(1, attempts + 1):
        current = api.get(resource, name, namespace)
        finalizers = wanted(current)
        if finalizers is None:
            return False
        meta = current["metadata"]
        guard = {k: str(meta[k]) for k in ("uid", "resourceVersion") if meta.get(k)}
        try:
            api.patch(resource, name, {"metadata": {**guard, "finalizers": finalizers}}, namespace)
            return True
        except Conflict:
            if attempt == attempts:
                raise
    return False  # not reached: the last attempt returns or raises

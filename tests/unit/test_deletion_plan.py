"""The release path's rule for a provisioner's PV (localpv.kube.pvprotection.plan), on plain data: which PVs
get external-provisioner's finalizer, which lose it, which are deleted through it (KEP-2644)."""

from __future__ import annotations

from typing import Any

import pytest

from localpv.csi.provisioner import PV_FINALIZER
from localpv.kube.pvprotection import FINALIZER, Step, plan


def pv(phase: str, policy: str = "Delete", *, deleting: bool = False, protected: bool = True,
       others: tuple[str, ...] = ("kubernetes.io/pv-protection",)) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "pvc-1", "finalizers": [*others, *([FINALIZER] if protected else [])]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"persistentVolumeReclaimPolicy": policy}, "status": {"phase": phase}}


def test_the_finalizer_is_external_provisioners() -> None:
    assert FINALIZER == PV_FINALIZER == "external-provisioner.volume.kubernetes.io/finalizer"


@pytest.mark.parametrize(("volume", "step"), [
    # Released with Delete: deleted through, whether the claim or the PV went first.
    (pv("Released"), Step.DELETE),
    (pv("Released", deleting=True), Step.DELETE),
    (pv("Released", protected=False), Step.DELETE),  # a PV of the previous release, released
    # Being deleted without the finalizer (removed by hand): nothing is deleted through it.
    (pv("Released", deleting=True, protected=False), Step.NOTHING),
    # Bound: protected once (a PV of the previous release), waits while being deleted.
    (pv("Bound", protected=False), Step.PROTECT),
    (pv("Bound"), Step.NOTHING),
    (pv("Bound", deleting=True), Step.NOTHING),
    (pv("Bound", deleting=True, protected=False), Step.NOTHING),  # no finalizer can be added now
    (pv("Pending", protected=False), Step.NOTHING),
    (pv("Available", protected=False), Step.NOTHING),
    (pv("Failed"), Step.NOTHING),
    # Not Delete: never deleted; a finalizer left from Delete goes, whatever the phase.
    (pv("Released", "Retain"), Step.UNPROTECT),
    (pv("Bound", "Retain", deleting=True), Step.UNPROTECT),
    (pv("Released", "Retain", protected=False), Step.NOTHING),
    (pv("Released", "Recycle", protected=False), Step.NOTHING),
])
def test_plan(volume: dict[str, Any], step: Step) -> None:
    assert plan(volume) is step


def test_other_finalizers_do_not_protect() -> None:
    assert plan(pv("Released", deleting=True, protected=False, others=("kubernetes.io/pv-controller",))) \
        is Step.NOTHING

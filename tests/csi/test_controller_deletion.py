"""PV deletion protection (KEP-2644, HonorPVReclaimPolicy) for dynamic volumes, against the API
emulator with the PV controller's feature gate on and off, real pools and images: every PV with
policy Delete carries external-provisioner's finalizer, so whichever of claim and PV is deleted
first, the image goes and then the PV - never an image left behind as orphaned."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localpv.csi import loop
from localpv.csi.journal import ImageState
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim, storage_class
from tests.conftest import require_tools, wait_for
from tests.csi.test_controller import CLASS, DRIVER, NODE_NAME, Env, env  # noqa: F401 - env is a fixture

pytestmark = pytest.mark.root
FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
Obj = dict[str, Any]


@pytest.fixture(params=[True, False], ids=["gate-on", "gate-off"])
def apiserver(request: pytest.FixtureRequest) -> Iterator[ApiServer]:
    """The emulator as a cluster with HonorPVReclaimPolicy on (1.31+) and off (before)."""
    srv = ApiServer(binder=True, honor_pv_reclaim_policy=request.param)
    srv.deny("update", "persistentvolumes")  # as the chart's ClusterRole: the agent may patch PVs, not update them
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
    assert srv.controller_failures == []


def finalizers(pv: Obj | None) -> list[str]:
    return list(((pv or {}).get("metadata") or {}).get("finalizers") or [])


def provisioned(dyn: Env, name: str = "data") -> str:
    dyn.claim(name)
    pv = wait_for(lambda: dyn.bound_pv(name), what="the claim to be Bound")
    volume = str(pv["metadata"]["name"])
    wait_for(lambda: (r := dyn.journal().get(volume)) is not None and r.pv_uid, what="the PV's uid in the journal")
    return volume


def pv_of(dyn: Env, volume: str) -> Obj | None:
    return dyn.server.get("v1", "PersistentVolume", volume)


def all_gone(dyn: Env, volume: str) -> bool:
    return pv_of(dyn, volume) is None and not dyn.pool_env.pool.images.exists(volume) and \
        dyn.journal().snapshot() == {}


def test_a_new_dynamic_pv_with_delete_carries_the_finalizer_and_retain_does_not(env: Env) -> None:  # noqa: F811
    env.server.create(storage_class("keep", provisioner=DRIVER, reclaim="Retain"))
    env.config = type(env.config)(dynamic_pools=env.config.dynamic_pools,
                                  dynamic_classes={**env.config.dynamic_classes,
                                                   "keep": type(env.config.dynamic_classes[CLASS])("keep", "fast")})
    env.start()
    volume = provisioned(env)
    assert finalizers(pv_of(env, volume)) == [FINALIZER]
    env.server.create(claim("kept", "keep", size="64Mi", selected_node=NODE_NAME))
    kept = wait_for(lambda: env.bound_pv("kept"), what="the Retain claim to be Bound")
    assert finalizers(kept) == [], "Retain: nothing to delete, nothing to protect"


def test_the_claim_deleted_first_removes_image_then_pv_then_finalizer(env: Env) -> None:  # noqa: F811
    env.start()
    volume = provisioned(env)
    env.server.requests.clear()
    env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
    wait_for(lambda: all_gone(env, volume), timeout=30, what="the image, the PV and the record to go")
    writes = [(r.verb, r.status) for r in env.server.requests
              if r.resource == "persistentvolumes" and r.name == volume and r.verb in ("delete", "update", "patch")]
    # The delete only marks the object (the finalizer holds it); removing the finalizer lets it go.
    assert writes == [("delete", 200), ("patch", 200)], writes


def test_a_pv_deleted_before_its_bound_claim_waits_for_the_release_then_goes_with_its_image(
        env: Env) -> None:  # noqa: F811
    controller = env.start()
    volume = provisioned(env)
    images = env.pool_env.pool.images
    env.server.delete("v1", "PersistentVolume", volume)
    env.server.settle()
    pv = pv_of(env, volume)
    assert pv is not None and pv["metadata"].get("deletionTimestamp"), "the finalizer holds the object"
    assert pv["status"]["phase"] == "Bound" and finalizers(pv) == [FINALIZER]
    controller.recover()  # a resync while it waits: still the claim's, never taken for orphaned
    wait_for(controller.idle, what="the controller to be idle")
    record = env.journal().get(volume)
    assert record is not None and record.state is ImageState.READY
    assert images.exists(volume), "the claim (and its pod) still has the volume: as external-provisioner, wait"
    assert env.bound_pv("data") is not None
    env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
    wait_for(lambda: all_gone(env, volume), timeout=30, what="the image, the PV and the record to go")


def test_a_restart_after_the_image_went_but_not_the_finalizer_finishes(env: Env) -> None:  # noqa: F811
    """The agent stops (as in a crash) with the image removed and the PV held by the finalizer:
    the finalizer could not be removed (forbidden here); the next agent finishes."""
    env.start()
    volume = provisioned(env)
    env.server.deny("patch", "persistentvolumes")
    env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
    wait_for(lambda: any(r == "VolumeFailedDelete" and FINALIZER in m for r, m in env.reasons(volume)),
             timeout=30, what="the finalizer's removal to fail")
    env.stop()
    pv = pv_of(env, volume)
    assert pv is not None and pv["metadata"].get("deletionTimestamp") and finalizers(pv) == [FINALIZER]
    assert not env.pool_env.pool.images.exists(volume)
    record = env.journal().get(volume)
    assert record is not None and record.state is ImageState.DELETING
    env.server.allow_all()
    env.server.deny("update", "persistentvolumes")
    env.start()
    wait_for(lambda: all_gone(env, volume), timeout=30, what="the restarted agent to finish the deletion")


def test_a_conflicting_finalizer_removal_is_retried(env: Env) -> None:  # noqa: F811
    env.start()
    volume = provisioned(env)
    env.server.faults.conflict_storm(1.0)  # every update and patch of anything: 409
    env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
    wait_for(lambda: env.server.requests.count(verb="patch", resource="persistentvolumes", status=409) >= 5,
             timeout=30, what="the finalizer's removal to meet conflicts")
    pv = pv_of(env, volume)
    assert pv is not None and finalizers(pv) == [FINALIZER], "not forced: read again and retried"
    env.server.faults.reset()
    wait_for(lambda: all_gone(env, volume), timeout=30, what="the retried removal to let the PV go")


def test_a_pv_of_the_previous_release_gets_the_finalizer_at_start(env: Env) -> None:  # noqa: F811
    env.start()
    volume = provisioned(env)
    env.stop()
    pv = pv_of(env, volume)
    assert pv is not None
    pv["metadata"]["finalizers"] = []  # as the previous release made it
    env.server.update(pv)
    transition = pv["status"]["lastPhaseTransitionTime"]
    env.start()
    protected = wait_for(lambda: (found := pv_of(env, volume)) and finalizers(found) == [FINALIZER] and found,
                         what="the finalizer added to a Bound PV")
    assert protected["status"] == {"phase": "Bound", "lastPhaseTransitionTime": transition}, "its status is kept"
    env.server.delete("v1", "PersistentVolume", volume)  # then deleted before its claim: protected
    env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
    wait_for(lambda: all_gone(env, volume), timeout=30, what="the image, the PV and the record to go")


def test_a_policy_changed_to_retain_drops_the_finalizer_and_keeps_the_image(env: Env) -> None:  # noqa: F811
    env.start()
    volume = provisioned(env)
    pv = pv_of(env, volume)
    assert pv is not None and finalizers(pv) == [FINALIZER]
    pv["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    env.server.update(pv)
    wait_for(lambda: finalizers(pv_of(env, volume)) == [], what="the finalizer to go")
    env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
    wait_for(lambda: ((pv_of(env, volume) or {}).get("status") or {}).get("phase") == "Released",
             what="the PV to be Released")
    assert env.controller is not None
    wait_for(env.controller.idle, what="the controller to be idle")
    assert env.pool_env.pool.images.exists(volume) and pv_of(env, volume) is not None


def test_a_released_pv_being_deleted_keeps_its_image_while_staged(env: Env) -> None:  # noqa: F811
    """Deleted first, then released while the image is still staged: the finalizer keeps the
    object until the image may go."""
    env.start()
    volume = provisioned(env)
    images = env.pool_env.pool.images
    with images.open_image(volume) as fd, loop.attach(fd, images.image_path(volume)):  # the volume is staged
        env.server.delete("v1", "PersistentVolume", volume)
        env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
        wait_for(lambda: any(r == "VolumeFailedDelete" and "not removed while staged" in m
                             for r, m in env.reasons(volume)), what="the refusal while staged")
        assert images.exists(volume) and finalizers(pv_of(env, volume)) == [FINALIZER]
    wait_for(lambda: all_gone(env, volume), timeout=30, what="the image, the PV and the record to go")


def test_the_documented_rollback_command_removes_only_localpvs_finalizer(env: Env, tmp_path: Path) -> None:  # noqa: F811
    """docs/operations.md's command, run as written with the real kubectl: before a rollback to an
    agent that never removes the finalizer, it leaves every other finalizer where it is."""
    require_tools("kubectl")
    env.start()
    volume = provisioned(env)
    env.stop()
    pv = pv_of(env, volume)
    assert pv is not None and finalizers(pv) == [FINALIZER]
    pv["metadata"]["finalizers"] = ["kubernetes.io/pv-protection", FINALIZER]
    env.server.update(pv)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    command = re.search(r"just before rolling back.*?```sh\n(.+?)\n```", doc, re.S)
    assert command is not None, "the command is no longer in docs/operations.md"
    kubeconfig = env.server.write_kubeconfig(tmp_path / "kubeconfig")
    subprocess.run(["bash", "-o", "pipefail", "-c", command.group(1)], check=True, timeout=60,
                   env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True)
    assert finalizers(pv_of(env, volume)) == ["kubernetes.io/pv-protection"]


def test_a_pv_delete_whose_answer_is_lost_is_read_as_done_not_reported_failed(env: Env) -> None:  # noqa: F811
    """Every answer to a PV delete is lost on the way back: with the finalizer a repeated delete
    answers 200 (the object stays, marked), never the 404 that tells a retry the first one landed,
    so the agent reads the PV: marked, it goes on to the finalizer. Before, each such release
    said VolumeFailedDelete although it had worked."""
    controller = env.start()
    volume = provisioned(env)
    env.server.faults.lose_responses("delete", 1.0, resource="persistentvolumes")
    env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
    wait_for(lambda: all_gone(env, volume), timeout=30, what="the image, the PV and the record to go")
    assert [e.message for e in controller.recorder.history if e.reason == "VolumeFailedDelete"] == []

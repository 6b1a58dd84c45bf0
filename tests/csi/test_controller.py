"""The provisioning protocol against the API emulator (its PV binder plays kube-controller-
manager; the tests play the scheduler by setting the selected node), with real pools and
images: provisioning, rescheduling, idempotency across crashes, deletion, Retain, expansion."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localpv.config import ProvisionerConfig
from localpv.config.dynamic import DynamicClass, PoolConfig
from localpv.csi import loop
from localpv.csi.controller import DynamicController, DynamicSettings
from localpv.csi.images import FsType, Provisioning
from localpv.csi.journal import ImageJournal, ImageRecord, ImageState
from localpv.csi.metrics import DynamicMetrics
from localpv.csi.pools import Pool
from localpv.csi.volume import FS_UUID, NODE, POOL
from localpv.kube.api import KubeApi
from localpv.kube.events import EventRecorder
from localpv.kube.objects import Obj
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim, node, storage_class
from tests.conftest import wait_for
from tests.csi.conftest import PoolEnv
from tests.support.hostfs import MiB
from tests.support.labeller import running_labeller

pytestmark = pytest.mark.root
DRIVER = "local.csi.localpv.dev"
NODE_NAME = "node-1"
CLASS = "dyn"


@dataclass
class Env:
    server: ApiServer
    kube: KubeApi
    pool_env: PoolEnv
    journal_path: Path
    config: ProvisionerConfig
    controller: DynamicController | None = None
    recorder: EventRecorder | None = None
    #: The real claim labeller, started with the first controller and kept across its restarts.
    labeller: ExitStack | None = None

    def start(self, *, labeller: bool = True) -> DynamicController:
        if self.labeller is None and labeller:
            self.labeller = ExitStack()
            self.labeller.enter_context(running_labeller(self.kube, DRIVER))
        self.recorder = EventRecorder(self.kube, component=f"{DRIVER}_{NODE_NAME}")
        self.recorder.start()
        pool = self.pool_env.pool
        self.controller = DynamicController(
            self.kube, DynamicSettings(NODE_NAME, NODE_NAME, resync_period=3600), config=lambda: self.config,
            pools=lambda: {pool.name: pool}, journal=ImageJournal(self.journal_path), recorder=self.recorder,
            metrics=DynamicMetrics())
        self.controller.start()
        wait_for(self.controller.synced.is_set, what="the controller's caches")
        return self.controller

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
        if self.recorder is not None:
            self.recorder.stop()

    def close(self) -> None:
        """The controller and the labeller stopped (the end of a test)."""
        self.stop()
        if self.labeller is not None:
            self.labeller.close()
            self.labeller = None

    def claim(self, name: str, size: str = "64Mi", node_name: str | None = NODE_NAME, **kw: Any) -> Obj:
        return self.server.create(claim(name, CLASS, size=size, selected_node=node_name, **kw))

    def pvc(self, name: str) -> Obj:
        found = self.server.get("v1", "PersistentVolumeClaim", name, "default")
        assert found is not None
        return found

    def bound_pv(self, name: str) -> Obj | None:
        pvc = self.pvc(name)
        if (pvc.get("status") or {}).get("phase") != "Bound":
            return None
        return self.server.get("v1", "PersistentVolume", pvc["spec"]["volumeName"])

    def reasons(self, name: str) -> list[tuple[str, str]]:
        return [(e["reason"], e["message"]) for e in self.server.list("v1", "Event", "default")
                if e["involvedObject"].get("name") == name]

    def journal(self) -> ImageJournal:
        return ImageJournal(self.journal_path)


@pytest.fixture
def env(apiserver: ApiServer, kube: KubeApi, pool_env: PoolEnv, tmp_path: Path) -> Iterator[Env]:
    apiserver.create(node(NODE_NAME))
    sc = storage_class(CLASS, provisioner=DRIVER, parameters={"pool": "fast"})
    sc["allowVolumeExpansion"] = True
    apiserver.create(sc)
    config = ProvisionerConfig(dynamic_pools={"fast": pool_env.pool.config},
                               dynamic_classes={CLASS: DynamicClass(CLASS, "fast")})
    environment = Env(apiserver, kube, pool_env, tmp_path / "state" / "csi-images.json", config)
    yield environment
    environment.close()


def test_a_claim_on_this_node_gets_an_image_and_a_pv(env: Env) -> None:
    env.start()
    made = env.claim("data", size="100Mi")
    pv = wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    volume = f"pvc-{made['metadata']['uid']}"
    assert pv["metadata"]["name"] == volume
    assert pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == DRIVER
    assert pv["metadata"]["labels"]["localpv.dev/node"] == NODE_NAME
    csi = pv["spec"]["csi"]
    images = env.pool_env.pool.images
    assert (csi["driver"], csi["volumeHandle"], csi["fsType"]) == (DRIVER, volume, "ext4")
    assert csi["volumeAttributes"] == {POOL: "fast", FS_UUID: images.fs_uuid(volume), NODE: NODE_NAME,
                                       "localpv.dev/provisioning": "thin"}
    assert pv["spec"]["capacity"]["storage"] == "100Mi"
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}]
    assert images.usage(volume).size == 100 * MiB
    record = wait_for(lambda: (r := env.journal().get(volume)) is not None and r.pv_uid and r,
                      what="the record to learn the PV's uid")
    assert record.state is ImageState.READY and record.pv_uid == pv["metadata"]["uid"]
    reasons = wait_for(lambda: (found := [r for r, _ in env.reasons("data")]) and "ProvisioningSucceeded" in found
                       and found)
    assert "Provisioning" in reasons


def test_claims_for_other_nodes_or_not_yet_scheduled_are_left_alone(env: Env) -> None:
    env.start()
    env.claim("elsewhere", node_name="node-2")
    env.claim("unscheduled", node_name=None)
    env.claim("mine")
    wait_for(lambda: env.bound_pv("mine"), what="a claim of this node to be Bound (the others had their turn)")
    assert env.bound_pv("elsewhere") is None and env.bound_pv("unscheduled") is None
    assert len(env.pool_env.pool.images.names()) == 1


def test_no_room_reschedules_the_claim(env: Env) -> None:
    env.start()
    env.claim("huge", size="2Gi")  # the pool holds 512 MiB, overcommit 1
    wait_for(lambda: "volume.kubernetes.io/selected-node" not in
             (env.pvc("huge")["metadata"].get("annotations") or {}), what="the selected node to be removed")
    message = wait_for(lambda: next((m for r, m in env.reasons("huge") if r == "ProvisioningFailed"), None))
    assert "pool fast has" in message and "does not fit" in message and "rescheduling" in message
    assert env.pool_env.pool.images.names() == [] and env.journal().snapshot() == {}


def test_a_class_parameter_that_disagrees_with_the_configmap_is_one_clear_event(env: Env) -> None:
    env.server.create(storage_class("dyn-bad", provisioner=DRIVER, parameters={"provisioning": "thick"}))
    env.config = ProvisionerConfig(dynamic_pools=env.config.dynamic_pools,
                                   dynamic_classes={CLASS: DynamicClass(CLASS, "fast"),
                                                    "dyn-bad": DynamicClass("dyn-bad", "fast")})
    env.start()
    env.server.create(claim("bad", "dyn-bad", size="64Mi", selected_node=NODE_NAME))
    message = wait_for(lambda: next((m for r, m in env.reasons("bad") if r == "ProvisioningFailed"), None))
    assert message == ("StorageClass dyn-bad: parameter provisioning: expected 'thin' (dynamicClassMap of the agent's "
                       "ConfigMap), found 'thick'; make them agree")
    assert env.pool_env.pool.images.names() == []


def test_a_crash_after_the_image_before_the_pv_makes_no_second_image(env: Env) -> None:
    """The image was made and recorded, then the agent died before its PV was created."""
    made = env.claim("data")
    volume = f"pvc-{made['metadata']['uid']}"
    images = env.pool_env.pool.images
    fs_uuid = images.create(volume, 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    ImageJournal(env.journal_path).put(ImageRecord(
        volume=volume, pool="fast", size=64 * MiB, fs_type="ext4", provisioning="thin",
        claim_uid=made["metadata"]["uid"], claim="default/data", state=ImageState.READY, since=1.0, fs_uuid=fs_uuid,
        storage_class=CLASS))
    env.start()
    pv = wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    assert pv["spec"]["csi"]["volumeAttributes"][FS_UUID] == fs_uuid, "the image made before the crash is used"
    assert images.names() == [volume]
    assert len(env.server.list("v1", "PersistentVolume")) == 1


def test_an_interrupted_image_whose_claim_is_gone_is_removed(env: Env) -> None:
    images = env.pool_env.pool.images
    images.create("pvc-gone", 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    ImageJournal(env.journal_path).put(ImageRecord(
        volume="pvc-gone", pool="fast", size=64 * MiB, fs_type="ext4", provisioning="thin", claim_uid="no-such-uid",
        claim="default/gone", state=ImageState.CREATING, since=1.0))
    env.start()
    assert images.names() == []
    assert env.journal().snapshot() == {}


def test_a_pv_deleted_by_hand_without_its_finalizer_keeps_its_image_as_orphaned(env: Env) -> None:
    """Its finalizer removed by hand (``kubectl patch``), then the PV deleted: nothing held the
    object for a release, and no one asked for the data to go - it is kept."""
    controller = env.start()
    made = env.claim("data")
    pv = wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    volume = pv["metadata"]["name"]
    wait_for(lambda: (r := env.journal().get(volume)) is not None and r.pv_uid, what="the PV's uid in the journal")
    env.stop()  # no agent adds the finalizer back meanwhile
    pv = env.server.get("v1", "PersistentVolume", volume)
    assert pv is not None
    pv["metadata"]["finalizers"] = []
    env.server.update(pv)
    env.server.delete("v1", "PersistentVolume", volume)
    controller = env.start()
    controller.recover()
    assert env.journal().get(volume).state is ImageState.ORPHANED  # type: ignore[union-attr]
    assert env.pool_env.pool.images.exists(volume)
    assert made["metadata"]["uid"] in volume


def test_release_with_delete_removes_the_image_once_unstaged(env: Env) -> None:
    env.start()
    env.claim("data")
    pv = wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    volume = pv["metadata"]["name"]
    images = env.pool_env.pool.images
    with images.open_image(volume) as fd, loop.attach(fd, images.image_path(volume)):  # the volume is staged
        env.server.delete("v1", "PersistentVolumeClaim", "data", "default")
        wait_for(lambda: any(r == "VolumeFailedDelete" and "not removed while staged" in m
                             for r, m in env.reasons(volume)), what="the refusal while staged")
        assert images.exists(volume)
        assert env.server.get("v1", "PersistentVolume", volume) is not None
    # Unstaged (the loop device gone): the image, then the PV object, then the record go.
    wait_for(lambda: env.server.get("v1", "PersistentVolume", volume) is None, timeout=30, what="the PV to go")
    assert not images.exists(volume) and images.names() == []
    wait_for(lambda: env.journal().snapshot() == {}, what="the record to go (after the PV object)")


def test_retain_keeps_the_image(env: Env) -> None:
    env.server.create(storage_class("keep", provisioner=DRIVER, reclaim="Retain"))
    env.config = ProvisionerConfig(dynamic_pools=env.config.dynamic_pools,
                                   dynamic_classes={"keep": DynamicClass("keep", "fast")})
    env.start()
    env.server.create(claim("kept", "keep", size="64Mi", selected_node=NODE_NAME))
    pv = wait_for(lambda: env.bound_pv("kept"), what="the claim to be Bound")
    env.server.delete("v1", "PersistentVolumeClaim", "kept", "default")
    wait_for(lambda: (env.server.get("v1", "PersistentVolume", pv["metadata"]["name"]) or {}).get("status", {})
             .get("phase") == "Released", what="the PV to be Released")
    assert env.controller is not None
    wait_for(env.controller.idle, what="the controller to be idle")
    assert env.pool_env.pool.images.exists(pv["metadata"]["name"])
    assert env.server.get("v1", "PersistentVolume", pv["metadata"]["name"]) is not None


def test_expansion_grows_image_pv_and_finally_the_claim(env: Env) -> None:
    controller = env.start()
    env.claim("data", size="64Mi")
    pv = wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    volume = pv["metadata"]["name"]
    claim_now = env.pvc("data")
    claim_now["spec"]["resources"]["requests"]["storage"] = "128Mi"
    env.server.update(claim_now)
    wait_for(lambda: (env.server.get("v1", "PersistentVolume", volume) or {})["spec"]["capacity"]["storage"] ==
             "128Mi", what="the PV's capacity to grow")
    assert env.pool_env.pool.images.usage(volume).size == 128 * MiB
    assert env.journal().get(volume).size == 128 * MiB  # type: ignore[union-attr]
    conditions = wait_for(lambda: env.pvc("data").get("status", {}).get("conditions"))
    assert [c["type"] for c in conditions] == ["FileSystemResizePending"]
    wait_for(lambda: ("FileSystemResizeRequired", "Require file system resize of volume on node") in
             env.reasons("data"), what="the resize event")
    # The kubelet's NodeExpandVolume grew the filesystem: the claim ends with its new capacity.
    controller.expander.filesystem_grown(volume, 128 * MiB)
    # (The emulator's binder copies a bound PV's capacity into the claim at every pass, which
    # the real PV controller does only when binding: the condition is what proves the finish.)
    wait_for(lambda: not env.pvc("data")["status"].get("conditions"), what="the resize condition to go")
    assert env.pvc("data")["status"]["capacity"]["storage"] == "128Mi"
    wait_for(lambda: any(r == "FileSystemResizeSuccessful" for r, _ in env.reasons("data")), what="the event")


def test_expansion_past_the_pool_is_refused_with_an_event(env: Env) -> None:
    env.start()
    env.claim("data", size="64Mi")
    pv = wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    claim_now = env.pvc("data")
    claim_now["spec"]["resources"]["requests"]["storage"] = "4Gi"
    env.server.update(claim_now)
    message = wait_for(lambda: next((m for r, m in env.reasons("data") if r == "VolumeResizeFailed"), None))
    assert "does not fit" in message
    assert env.pool_env.pool.images.usage(pv["metadata"]["name"]).size == 64 * MiB


def test_expansion_records_what_it_allocated_in_the_claims_status_as_external_resizer_does(env: Env) -> None:
    """KEP-1790 (recovery from failed expansion; beta and on 1.32, GA 1.34): the resizer records
    the size it is growing to in ``status.allocatedResources`` and where it is in
    ``status.allocatedResourceStatuses``: ControllerResizeInProgress, then NodeResizePending,
    which a current kubelet needs to call NodeExpandVolume (without it, only its legacy path
    does), and none once done. Before, neither was ever set."""
    controller = env.start()
    env.claim("data", size="64Mi")
    pv = wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    volume = pv["metadata"]["name"]
    claim_now = env.pvc("data")
    claim_now["spec"]["resources"]["requests"]["storage"] = "100M"  # not whole MiB: the image is 96Mi
    env.server.update(claim_now)

    def resize_status() -> str | None:
        return ((env.pvc("data").get("status") or {}).get("allocatedResourceStatuses") or {}).get("storage")

    wait_for(lambda: resize_status() == "NodeResizePending", what="NodeResizePending")
    assert env.pvc("data")["status"]["allocatedResources"] == {"storage": "100M"}, "what was asked, as the resizer"
    assert (env.server.get("v1", "PersistentVolume", volume) or {})["spec"]["capacity"]["storage"] == "96Mi"
    controller.expander.filesystem_grown(volume, 96 * MiB)
    wait_for(lambda: not env.pvc("data")["status"].get("conditions"), what="the resize condition to go")
    assert resize_status() is None
    assert env.pvc("data")["status"]["allocatedResources"] == {"storage": "100M"}


def test_an_expansion_that_does_not_fit_yet_stays_in_progress_at_what_was_asked(env: Env) -> None:
    """No room in the pool is not final (room may come; with KEP-1790 the user may also ask for
    less, and each attempt grows to what the claim asks then): the claim says
    ControllerResizeInProgress, as external-resizer leaves it on a retryable error, never
    NodeResizePending. (Lowering a request is not tried here: the emulator answers as 1.31,
    whose API server refuses it.)"""
    env.start()
    env.claim("data", size="64Mi")
    wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    claim_now = env.pvc("data")
    claim_now["spec"]["resources"]["requests"]["storage"] = "4Gi"
    env.server.update(claim_now)
    wait_for(lambda: any(r == "VolumeResizeFailed" for r, _ in env.reasons("data")), what="the refusal")
    status = env.pvc("data")["status"]
    assert status.get("allocatedResources") == {"storage": "4Gi"}
    assert status.get("allocatedResourceStatuses") == {"storage": "ControllerResizeInProgress"}


def test_an_expansion_that_never_can_be_done_is_infeasible(env: Env) -> None:
    """The class stopped allowing expansion after the claim asked (a current API server refuses
    the request before that): retrying cannot mend it, and the claim says
    ControllerResizeInfeasible, as external-resizer says of a final error."""
    env.start()
    env.claim("data", size="64Mi")
    wait_for(lambda: env.bound_pv("data"), what="the claim to be Bound")
    sc = env.server.get("storage.k8s.io/v1", "StorageClass", CLASS)
    assert sc is not None
    sc["allowVolumeExpansion"] = False
    env.server.update(sc)
    wait_for(lambda: env.controller is not None and
             not (env.controller.classes.get(CLASS) or {}).get("allowVolumeExpansion"), what="the class seen")
    claim_now = env.pvc("data")
    claim_now["spec"]["resources"]["requests"]["storage"] = "128Mi"
    env.server.update(claim_now)
    wait_for(lambda: ((env.pvc("data").get("status") or {}).get("allocatedResourceStatuses") or {}).get("storage")
             == "ControllerResizeInfeasible", what="ControllerResizeInfeasible")
    assert env.pvc("data")["status"]["allocatedResources"] == {"storage": "128Mi"}
    wait_for(lambda: any(r == "VolumeResizeFailed" and "does not allow expansion" in m for r, m in env.reasons("data")),
             what="the event")


def test_pool_config_default_is_a_mount_requirement(tmp_path: Path) -> None:
    assert Pool(PoolConfig("p", str(tmp_path), str(tmp_path))).config.require_mount is True


def test_an_image_whose_pv_uid_was_never_recorded_is_kept_when_its_bound_pv_is_deleted(env: Env) -> None:
    """The PV was made and bound, but its uid never reached the journal (the create's answer
    was lost, or the agent stopped right after it). The PV is then deleted by hand: the claim
    still names the volume, so the image was handed out and what is in it is kept."""
    images = env.pool_env.pool.images
    made = env.claim("data", node_name=NODE_NAME)
    volume = f"pvc-{made['metadata']['uid']}"
    made["spec"]["volumeName"] = volume
    env.server.update(made)
    fs_uuid = images.create(volume, 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    ImageJournal(env.journal_path).put(ImageRecord(
        volume=volume, pool="fast", size=64 * MiB, fs_type="ext4", provisioning="thin",
        claim_uid=made["metadata"]["uid"], claim="default/data", state=ImageState.READY, since=1.0,
        fs_uuid=fs_uuid))
    env.start()
    record = env.journal().get(volume)
    assert record is not None and record.state is ImageState.ORPHANED
    assert images.exists(volume)

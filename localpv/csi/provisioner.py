"""What a dynamic volume is made of: pure functions from a claim and its class to a request,
and from a made image to its PV object.

The controller (:mod:`localpv.csi.controller`) decides *when*; this module decides *what*,
with no I/O, so every rule is a plain function a test can call: which class settings apply
(the ConfigMap's ``dynamicClassMap``, checked against the StorageClass object's
parameters), how large the image is, and the PV external-provisioner would have made:
``spec.csi`` (driver, volumeHandle, fsType, volumeAttributes), node affinity, capacity,
reclaim policy and mount options from the class, pre-bound to the claim.

A ``volumeMode: Block`` claim gets a Block image (no filesystem) and a PV that says
``volumeMode: Block``. As external-provisioner does, the class's filesystem settings do not
apply to it: no ``fsType`` in its PV, no ``mkfsOptions``, no ``mountOptions`` (nothing is
mounted); the class's parameters must still agree with the ConfigMap, which is a property of
the class, not of the claim.
"""

from __future__ import annotations

from dataclasses import dataclass

from localpv.config.dynamic import DynamicClass
from localpv.csi.images import MIN_BLOCK_SIZE, MIN_SIZE, FsType, Provisioning
from localpv.csi.journal import BLOCK, FILESYSTEM
from localpv.csi.volume import FS_UUID, IMAGE_UUID, NODE, POOL, PROVISIONING
from localpv.kube.finalizers import EXTERNAL_PROVISIONER_FINALIZER
from localpv.kube.objects import Obj
from localpv.naming import (
    HOSTNAME_LABEL_KEY,
    NODE_LABEL_KEY,
    PROVISIONED_BY_ANNOTATION,
    node_label_value,
    parse_quantity,
)

ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_STORAGE_PROVISIONER_BETA = "volume.beta.kubernetes.io/storage-provisioner"
#: external-provisioner's PV deletion protection finalizer (KEP-2644): on every PV with reclaim
#: policy Delete until its volume is deleted (see :mod:`localpv.csi.deletion`).
PV_FINALIZER = EXTERNAL_PROVISIONER_FINALIZER
#: The StorageClass parameter the kubelet's CSI code and external-provisioner read the fsType from.
FSTYPE_PARAMETER = "csi.storage.k8s.io/fstype"
#: StorageClass parameters and the dynamicClassMap field each must agree with.
PARAMETERS = {"pool": "pool", FSTYPE_PARAMETER: "fs_type", "provisioning": "provisioning",
              "mkfsOptions": "mkfs_options"}
MiB = 1 << 20
#: Access modes a node-local volume can serve: one node writes (the node service stages them
#: as SINGLE_NODE_*).
STAGEABLE_MODES = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})


class Refused(Exception):
    """The claim cannot be provisioned as it is (an event says why; retried only on change)."""


@dataclass(frozen=True)
class Request:
    """One image to make: for which claim, how, where, how large."""

    volume: str
    claim_uid: str
    claim: str
    storage_class: str
    settings: DynamicClass
    size: int
    volume_mode: str = FILESYSTEM

    @property
    def block(self) -> bool:
        return self.volume_mode == BLOCK

    @property
    def fs(self) -> FsType:
        return FsType(self.settings.fs_type)

    @property
    def provisioning(self) -> Provisioning:
        return Provisioning(self.settings.provisioning)


def volume_name(claim: Obj) -> str:
    """``pvc-<claim uid>``: one name per claim, so a repeated create is ``AlreadyExists``."""
    return f"pvc-{claim['metadata']['uid']}"


def claim_key(claim: Obj) -> str:
    meta = claim["metadata"]
    return f"{meta.get('namespace')}/{meta.get('name')}"


def annotations_of(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def claim_class_name(claim: Obj) -> str:
    beta = annotations_of(claim).get("volume.beta.kubernetes.io/storage-class")
    return str(beta if beta is not None else (claim.get("spec") or {}).get("storageClassName") or "")


def names_driver(claim: Obj, driver: str) -> bool:
    ann = annotations_of(claim)
    return driver in (ann.get(ANN_STORAGE_PROVISIONER), ann.get(ANN_STORAGE_PROVISIONER_BETA))


def requested_bytes(claim: Obj) -> int:
    text = str((((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage") or "0")
    try:
        return parse_quantity(text)
    except ValueError as err:
        raise Refused(f"spec.resources.requests.storage: expected a quantity, got {text!r}") from err


def image_size(requested: int, fs: FsType | None) -> int:
    """The image for a request: whole MiB, at least what the filesystem needs (``fs`` None: a
    Block image, at least 1 MiB)."""
    return max(-(-requested // MiB) * MiB, MIN_SIZE[fs] if fs is not None else MIN_BLOCK_SIZE)


def volume_mode(claim: Obj) -> str:
    """The claim's ``volumeMode`` (Filesystem when unset, as the API server defaults it)."""
    mode = (claim.get("spec") or {}).get("volumeMode") or FILESYSTEM
    if mode not in (FILESYSTEM, BLOCK):
        raise Refused(f"volumeMode: expected Filesystem or Block, got {mode!r}")
    return str(mode)


def check_parameters(storage_class: Obj, settings: DynamicClass) -> None:
    """The StorageClass object must not say something else than the ConfigMap does."""
    params = storage_class.get("parameters") or {}
    for key, value in params.items():
        if key not in PARAMETERS:
            raise Refused(f"StorageClass {settings.name}: parameter {key!r} is not one of "
                          f"{', '.join(sorted(PARAMETERS))}")
        wanted = str(getattr(settings, PARAMETERS[key]))
        if str(value) != wanted:
            raise Refused(f"StorageClass {settings.name}: parameter {key}: expected {wanted!r} (dynamicClassMap of the "
                          f"agent's ConfigMap), found {value!r}; make them agree")


def check_claim(claim: Obj) -> None:
    spec = claim.get("spec") or {}
    volume_mode(claim)
    modes = set(spec.get("accessModes") or [])
    if not modes or not modes <= STAGEABLE_MODES:
        # ReadOnlyMany too: the kubelet stages it as MULTI_NODE_READER_ONLY, which a node-local
        # volume cannot be, and the pod would wait forever on a volume made for it.
        raise Refused(f"access modes {sorted(modes)}: a node-local volume is reachable from one node only "
                      "(ReadWriteOnce or ReadWriteOncePod)")
    if spec.get("volumeAttributesClassName"):
        raise Refused(f"volumeAttributesClassName {spec['volumeAttributesClassName']!r}: volume attributes classes "
                      "are not supported (nothing could apply them to an image)")
    if spec.get("selector"):
        raise Refused("claim Selector is not supported")
    if spec.get("dataSource") or spec.get("dataSourceRef"):
        raise Refused("volume content sources (clones, snapshots) are not supported")


def check_mount_options(storage_class: Obj, settings: DynamicClass) -> None:
    """A thick class must not mount with ``discard``: every delete would give the image's
    allocated blocks back to the pool, and thick would silently become thin."""
    options = [str(o) for o in storage_class.get("mountOptions") or []]
    if settings.provisioning == "thick" and any(o.split("=")[0] == "discard" for o in options):
        raise Refused(f"StorageClass {settings.name}: mountOptions: expected no 'discard' in a thick class (its "
                      f"discards would give the image's allocated blocks back to the pool), got {options}")


def build_volume(request: Request, claim: Obj, storage_class: Obj, *, driver: str, node_name: str,
                 hostname: str, identity: str) -> Obj:
    """The PV of a made image, pre-bound to its claim (the PV controller finishes the bind).
    ``identity``: the image's filesystem UUID, or a Block image's UUID. With reclaim policy
    Delete it carries :data:`PV_FINALIZER` from the start, as external-provisioner's PVs do."""
    claim_meta, cspec = claim["metadata"], claim.get("spec") or {}
    spec: Obj = {
        "capacity": {"storage": _quantity(request.size)},
        "accessModes": list(cspec.get("accessModes") or ["ReadWriteOnce"]),
        "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
        "storageClassName": request.storage_class,
        "volumeMode": request.volume_mode,
        "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": claim_meta.get("namespace"),
                     "name": claim_meta.get("name"), "uid": claim_meta.get("uid"),
                     "resourceVersion": claim_meta.get("resourceVersion")},
        "csi": {"driver": driver, "volumeHandle": request.volume,
                "volumeAttributes": {POOL: request.settings.pool, IMAGE_UUID if request.block else FS_UUID: identity,
                                     NODE: node_name, PROVISIONING: request.settings.provisioning}},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": HOSTNAME_LABEL_KEY, "operator": "In", "values": [hostname]}]}]}},
    }
    if not request.block:
        spec["csi"]["fsType"] = request.settings.fs_type
        if storage_class.get("mountOptions"):
            spec["mountOptions"] = list(storage_class["mountOptions"])
    meta: Obj = {"name": request.volume, "labels": {NODE_LABEL_KEY: node_label_value(node_name)},
                 "annotations": {PROVISIONED_BY_ANNOTATION: driver}}
    if spec["persistentVolumeReclaimPolicy"] == "Delete":
        meta["finalizers"] = [PV_FINALIZER]
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": meta, "spec": spec}


def is_ours(pv: Obj, driver: str) -> bool:
    spec = pv.get("spec") or {}
    named = annotations_of(pv).get(PROVISIONED_BY_ANNOTATION) == driver
    return named and (spec.get("csi") or {}).get("driver") == driver


def capacity_of(pv: Obj) -> int:
    try:
        return parse_quantity(str(((pv.get("spec") or {}).get("capacity") or {}).get("storage") or "0"))
    except ValueError:
        return 0


def _quantity(size: int) -> str:
    from localpv.naming import format_binary_quantity

    return format_binary_quantity(size)

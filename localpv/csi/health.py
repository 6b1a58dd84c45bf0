"""The health of dynamic volumes: what the node shows of each image handed out, as conditions.

A dynamic volume is a tenant's data like a static one, and is watched the same way
(:mod:`localpv.kube.volumehealth`: ``VolumeConditionAbnormal`` on the claim and the PV, the
``localpv_volume_condition`` gauge). What can go wrong is its own, though: the image file
removed or replaced, its loop device or staging mount gone while the kubelet thinks it is
staged, the filesystem read-only or logging errors after I/O errors, the pool's disk gone -
and, for thin images, the pool itself: thin promises are sizes, not blocks, so a pool whose
free space is less than what its thin volumes may still write makes some tenant's writes fail
with ENOSPC below its size (and, since the loop device turns that into an I/O error, leaves
its filesystem needing repair). That is said *before* it happens, on the claims that may
fail and on the Node.

This module is pure: :func:`assess` turns what the watch (:mod:`localpv.csi.watch`) looked
at - plain data - into conditions. Nothing here acts on an image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from localpv.csi.volume import FS_UUID, IMAGE_UUID, POOL, PROVISIONING
from localpv.kube.objects import Obj
from localpv.kube.volumehealth import Assessment, Condition, VolumeHealth

#: The phases in which a dynamic PV's image is someone's (Bound) or about to be (Available).
WATCHED_PHASES = ("Bound", "Available")


@dataclass(frozen=True)
class MountLook:
    """One mount of an image's filesystem (a staging path or a pod's bind of it), or for a
    Block volume one bind of its device's node (its staging file, a pod's target file)."""

    mount_point: str
    #: The filesystem itself is read-only (its superblock's options), not only this mount.
    read_only: bool


@dataclass(frozen=True)
class ImageLook:
    """What the node shows of one volume's image now."""

    #: Why the image's pool cannot be looked at now (its disk is not mounted...); None: it can.
    pool_problem: str | None = None
    present: bool = True
    #: The filesystem UUID in the image's superblock (None: none there, or a Block image).
    fs_uuid: str | None = None
    #: A Block image's mark (None: not a Block image).
    block_uuid: str | None = None
    size: int = 0
    allocated: int = 0
    #: Loop devices bound to the image (known by the kernel's device and inode of the file).
    loops: tuple[int, ...] = ()
    #: Loop devices bound to a file of this image's name that was deleted (it is gone while in use).
    deleted_loops: tuple[int, ...] = ()
    mounts: tuple[MountLook, ...] = ()
    #: Where the node service staged it (the kubelet's staging path); None: not staged as far as it knows.
    staged_at: str | None = None
    #: ext4's error count of the mounted filesystem (None: not mounted, or not ext4).
    fs_errors: int | None = None
    #: A thick image's holes could not be allocated again (the pool is full): why.
    allocation_problem: str | None = None


@dataclass(frozen=True)
class PoolRisk:
    """A pool whose free space is less than what its thin volumes may still write."""

    pool: str
    free: int
    #: What thin volumes may still write (their sizes less what they have written), in bytes.
    unwritten: int
    #: The part of ``unwritten`` the pool's free space (less ``reserved``) cannot hold.
    unbacked: int

    def sentence(self) -> str:
        return (f"pool {self.pool} has {_mib(self.free)} free for {_mib(self.unwritten)} its thin volumes may still "
                f"write: {_mib(self.unbacked)} of their promised sizes cannot be written (writes fail with ENOSPC "
                "below a volume's size, and the volume's filesystem may need repair); free space in the pool, "
                "move volumes away or lower its overcommit")


@dataclass(frozen=True)
class Looks:
    """Everything :func:`assess` needs, by PV name (images) and pool name (risks)."""

    images: Mapping[str, ImageLook] = field(default_factory=dict)
    risks: Mapping[str, PoolRisk] = field(default_factory=dict)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def assess(pvs: Sequence[Obj], looks: Looks, baselines: Mapping[str, int]) -> Assessment:
    """The health of every Bound or Available dynamic PV from this look.

    ``pvs`` are this node's dynamic PVs; ``baselines`` holds, by PV uid, the ext4 error count
    first seen for its filesystem: a count that grew since is abnormal, one that went down
    (``e2fsck`` reset it) is the new baseline.
    """
    volumes: dict[str, VolumeHealth] = {}
    kept: dict[str, int] = {}
    for pv in pvs:
        meta = pv.get("metadata") or {}
        name = str(meta.get("name") or "")
        phase = str((pv.get("status") or {}).get("phase") or "")
        look = looks.images.get(name)
        if phase not in WATCHED_PHASES or look is None or meta.get("deletionTimestamp"):
            continue
        attributes = (((pv.get("spec") or {}).get("csi") or {}).get("volumeAttributes") or {})
        conditions = _image_conditions(look, str(attributes.get(FS_UUID) or ""), str(attributes.get(IMAGE_UUID) or ""))
        risk = looks.risks.get(str(attributes.get(POOL) or ""))
        thin = attributes.get(PROVISIONING, "thin") != "thick"
        if risk is not None and thin and look.present and look.size > look.allocated:
            conditions[Condition.POOL_OVERCOMMITTED] = risk.sentence()
        uid = str(meta.get("uid") or "")
        if look.fs_errors is not None and uid:
            base = min(baselines.get(uid, look.fs_errors), look.fs_errors)
            kept[uid] = base
            if look.fs_errors > base:
                conditions[Condition.FILESYSTEM_ERRORS] = (
                    f"the filesystem recorded {look.fs_errors - base} new error(s) ({look.fs_errors} in all): check "
                    "the kernel log and the pool's disk; run e2fsck on the image once no pod uses it")
        volumes[name] = VolumeHealth(pv, conditions)
    return Assessment(volumes, kept)


def _image_conditions(look: ImageLook, recorded_uuid: str, recorded_block: str = "") -> dict[Condition, str]:
    if look.pool_problem is not None:
        return {Condition.POOL_UNAVAILABLE: look.pool_problem}
    found: dict[Condition, str] = {}
    if look.deleted_loops:
        found[Condition.MISSING] = (f"the image was deleted while in use (/dev/loop{look.deleted_loops[0]} still "
                                    "reads it): its data goes when the volume is unstaged")
    elif not look.present:
        found[Condition.MISSING] = "the volume's image is gone from its pool"
    elif recorded_block and look.block_uuid != recorded_block:
        found[Condition.IDENTITY_CHANGED] = (f"the image is marked as Block image {look.block_uuid or '(none)'}, the "
                                             f"volume was made with {recorded_block}: it was replaced; it is not "
                                             "staged again")
    elif recorded_uuid and look.fs_uuid != recorded_uuid:
        found[Condition.IDENTITY_CHANGED] = (f"the image holds filesystem {look.fs_uuid or '(none)'}, the volume was "
                                             f"made with {recorded_uuid}: it was replaced; it is not staged again")
    if look.staged_at is not None and look.present:
        if not look.loops:
            found[Condition.DEVICE_MISSING] = (f"the volume was staged at {look.staged_at} and no loop device holds "
                                               "its image now")
        elif not any(m.mount_point == look.staged_at for m in look.mounts):
            what = "its loop device is not bound at its staging file" if look.block_uuid else \
                "nothing is mounted at its staging path"
            found[Condition.NOT_MOUNTED] = (f"{what} {look.staged_at}: the pod's writes may not reach the volume")
    if any(m.read_only for m in look.mounts):
        found[Condition.READ_ONLY] = ("the filesystem is read-only (the kernel remounts it so after I/O errors, such "
                                      "as a full thin pool): writes fail; check the pool and run e2fsck on the image "
                                      "once no pod uses it")
    if look.allocation_problem is not None:
        found[Condition.ALLOCATION_LOST] = look.allocation_problem
    return found

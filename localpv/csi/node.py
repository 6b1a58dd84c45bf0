"""The CSI Node service: what the kubelet calls to put a dynamic volume under a pod.

* **NodeStageVolume** - find the image (its pool must be *there*: a pool whose disk is not
  mounted is an error, never a directory on the root filesystem), check it is the image
  made for this PV (filesystem UUID), bind it to a loop device, check the filesystem,
  mount it at the staging path.
* **NodePublishVolume** - bind-mount the staging path at the pod's target path, read-only
  when asked.
* **NodeUnpublishVolume / NodeUnstageVolume** - unmount; the loop device goes with the last
  mount (autoclear) and is detached explicitly if it lingers. Both succeed when there is
  nothing left to undo, as the spec wants: the kubelet retries them after crashes.
* **NodeGetVolumeStats** - bytes and inodes of the mounted filesystem, and an abnormal
  condition when the image is gone, replaced, the filesystem went read-only or logged errors.
* **NodeExpandVolume** - make the loop device see the grown image, grow the filesystem
  online, tell the controller (which finishes the claim's resize).

A ``volumeMode: Block`` volume (a ``block`` access type) is staged, published and unstaged by
:mod:`localpv.csi.blockvolume`: its loop device, bound to a file, with no filesystem. Its
expansion only makes the device see the image's size; its stats are the device's size. An
image is only ever served in the mode it was made for: its Block mark (and, in the agent, its
journal record's ``volume_mode``) must agree with the access type the kubelet asks for.

**Never stuck behind one volume.** A call for a volume that already has one in progress is
answered at once with ``ABORTED`` (the kubelet retries it with backoff), instead of holding a
server thread until the first one ends: an ``e2fsck`` of a large image may take minutes, and
the kubelet repeats a stage it got no answer for. The slow calls (stage, unstage, expansion)
of all volumes together take at most :data:`SLOW_CALLS` of the server's threads; past that
they are refused with ``ABORTED`` too, so that Probe, NodeGetInfo, NodeGetCapabilities,
NodeGetVolumeStats (which takes no lock) and publish/unpublish always find a thread.

**An image is known by what the kernel holds** (:mod:`localpv.csi.loop`): the loop devices of
an image are those whose backing file has the image's device and inode, whatever path a
restarted agent's predecessor attached it by. A staging path is "this volume, staged" only
when the filesystem mounted there is one of those devices; an image mounted anywhere is
never staged a second time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

from localpv.csi import blockvolume, loop, mounting
from localpv.csi.images import IMAGE_FILE, ImageError, check_name, ext4_size, read_block_uuid, reallocate
from localpv.csi.journal import BLOCK, FILESYSTEM
from localpv.csi.pools import Pool, PoolState
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.rpc import CallObserver, Method, RpcError, service
from localpv.csi.volume import FS_UUID, IMAGE_UUID, NODE, POOL, PROVISIONING, TOPOLOGY_KEY
from localpv.host.mounts import MountInfo
from localpv.naming import node_label_value

log = logging.getLogger(__name__)

SERVICE = "csi.v1.Node"
_Cap = csi.NodeServiceCapability.RPC
_SINGLE_NODE = {csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER,
                csi.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY,
                csi.VolumeCapability.AccessMode.SINGLE_NODE_SINGLE_WRITER,
                csi.VolumeCapability.AccessMode.SINGLE_NODE_MULTI_WRITER}

#: A filesystem this close to its device's size is taken as spanning it (resize2fs may leave a
#: partial block group unused; checking again at every stage would force a full e2fsck each time).
GROWTH_SLACK = 1 << 20

#: Called after a filesystem was grown: (volume id, new size in bytes).
ExpandedHook = Callable[[str, int], None]
#: The volumeMode a volume was made for, as its image journal record says (None: no record).
RecordedMode = Callable[[str], str | None]

#: Stage, unstage and expansion calls in progress at once, all volumes together (each may run
#: e2fsck, resize2fs or xfs_growfs for minutes). The server has more threads than this
#: (:data:`SERVER_THREADS`), so the quick calls always find one.
SLOW_CALLS = 8
#: The CSI server's threads: the slow calls, plus room for Probe, NodeGetInfo, stats,
#: publish and unpublish, and for the ABORTED answers to calls that cannot start.
SERVER_THREADS = SLOW_CALLS + 8


def _invalid(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _precondition(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.FAILED_PRECONDITION, message)


def _required(value: str, name: str) -> str:
    if not value:
        raise _invalid(f"{name} is required")
    if not os.path.isabs(value):
        raise _invalid(f"{name} must be an absolute path, got {value!r}")
    return value


@dataclass(frozen=True)
class _Image:
    key: loop.FileKey
    block: bool
    size: int


class NodeService:
    """``pools`` returns the pools configured now (a reloaded ConfigMap applies at once)."""

    def __init__(self, node_name: str, pools: Callable[[], Mapping[str, Pool]], *,
                 on_expanded: ExpandedHook | None = None, on_change: Callable[[], None] | None = None,
                 recorded_mode: RecordedMode | None = None) -> None:
        self.node_name = node_name
        self.pools = pools
        self.on_expanded = on_expanded
        self.recorded_mode = recorded_mode
        #: Called after a volume was staged or unstaged (the health watch looks again).
        self.on_change = on_change
        #: Where each volume was staged by this process (volume -> staging path, or a Block
        #: volume's staging file), for the health watch: a staging mount that disappears under
        #: the kubelet is said on the volume.
        self._staged: dict[str, str] = {}
        self._busy: set[str] = set()
        self._busy_guard = threading.Lock()
        self._slow = threading.BoundedSemaphore(SLOW_CALLS)

    @contextmanager
    def _exclusive(self, volume_id: str, *, slow: bool = False) -> Iterator[None]:
        """Run one call of ``volume_id`` at a time; a second one is answered ABORTED at once."""
        if slow and not self._slow.acquire(blocking=False):
            raise RpcError(grpc.StatusCode.ABORTED, f"volume {volume_id}: {SLOW_CALLS} volumes are being staged, "
                                                    "unstaged or grown on this node now; retried")
        try:
            with self._busy_guard:
                if volume_id in self._busy:
                    raise RpcError(grpc.StatusCode.ABORTED, f"an operation on volume {volume_id} is in progress; "
                                                            "retried once it ends")
                self._busy.add(volume_id)
            try:
                yield
            finally:
                with self._busy_guard:
                    self._busy.discard(volume_id)
        finally:
            if slow:
                self._slow.release()

    # ------------------------------------------------------------------ lookups

    def _volume_id(self, volume_id: str) -> str:
        try:
            return check_name(volume_id)
        except ImageError as err:
            raise _invalid(str(err)) from err

    def _pool(self, context: Mapping[str, str], volume_id: str) -> Pool:
        name = context.get(POOL, "")
        node = context.get(NODE, "")
        if node and node != self.node_name:
            raise _precondition(f"volume {volume_id} was made on node {node}, this is node {self.node_name}")
        pool = self.pools().get(name)
        if pool is None:
            raise _precondition(f"volume {volume_id}: pool {name!r} is not configured on node {self.node_name} "
                                "(dynamicPools of the agent's ConfigMap)")
        state, why = pool.state()
        if state is PoolState.VOLATILE:
            # New images are not made there (the controller refuses), but what is there is served.
            log.warning("volume %s: %s", volume_id, why)
        elif state is not PoolState.READY:
            raise _precondition(f"volume {volume_id}: {why}")
        return pool

    # ------------------------------------------------------------------ stage

    def stage(self, request: csi.NodeStageVolumeRequest) -> csi.NodeStageVolumeResponse:
        volume_id = self._volume_id(request.volume_id)
        staging = _required(request.staging_target_path, "staging_target_path")
        capability = request.volume_capability
        access = capability.WhichOneof("access_type")
        if access not in ("mount", "block"):
            raise _invalid(f"volume {volume_id}: its capability has no access type (mount or block)")
        if capability.access_mode.mode not in _SINGLE_NODE:
            raise _invalid(f"volume {volume_id}: access mode "
                           f"{csi.VolumeCapability.AccessMode.Mode.Name(capability.access_mode.mode)} is not "
                           "single-node; a node-local volume is reachable from one node only")
        context = dict(request.volume_context)
        thick = context.get(PROVISIONING) == "thick"
        if access == "block":
            with self._exclusive(volume_id, slow=True):
                pool = self._pool(context, volume_id)
                self._check_mode(volume_id, block=True)
                file = blockvolume.stage(pool, volume_id, staging, context.get(IMAGE_UUID), thick=thick)
                with self._busy_guard:
                    self._staged[volume_id] = os.path.realpath(file)
            self._changed()
            return csi.NodeStageVolumeResponse()
        flags = list(capability.mount.mount_flags)
        # A PV's mountOptions entry may hold several options ("noatime,discard").
        if thick and "discard" in {o.strip() for flag in flags for o in flag.split(",")}:
            raise _invalid(f"volume {volume_id}: mount option 'discard' on a thick volume would give its allocated "
                           "blocks back to the pool; remove it from the StorageClass's mountOptions")
        with self._exclusive(volume_id, slow=True):
            pool = self._pool(context, volume_id)
            self._check_mode(volume_id, block=False)
            fs_type = capability.mount.fs_type or "ext4"
            self._stage(pool, volume_id, staging, fs_type, flags, context.get(FS_UUID), thick=thick)
            with self._busy_guard:
                self._staged[volume_id] = os.path.realpath(staging)
        self._changed()
        return csi.NodeStageVolumeResponse()

    def _check_mode(self, volume_id: str, *, block: bool) -> None:
        """Refuse to serve a volume in another mode than its image journal record's."""
        recorded = self.recorded_mode(volume_id) if self.recorded_mode is not None else None
        asked = BLOCK if block else FILESYSTEM
        if recorded is not None and recorded != asked:
            raise _precondition(f"volume {volume_id} was made for volumeMode {recorded} (its image journal record); "
                                f"it is not served as volumeMode {asked} (its PV was changed or re-created?)")

    def staged(self) -> dict[str, str]:
        """Where this process staged each volume that is still staged (volume -> staging path)."""
        with self._busy_guard:
            return dict(self._staged)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _stage(self, pool: Pool, volume_id: str, staging: str, fs_type: str, flags: list[str],
               expected_uuid: str | None, *, thick: bool) -> None:
        try:
            with pool.images.open_image(volume_id) as fd:
                if read_block_uuid(fd) is not None:
                    raise _precondition(f"volume {volume_id}: the image in pool {pool.name} was made for volumeMode "
                                        "Block: its content is the tenant's, never mounted as a filesystem")
                devices = loop.loops_of(fd, named=f"/{volume_id}/{IMAGE_FILE}")
                mounts = [m for device in devices for m in mounting.mounts_of_device(*device.rdev)]
                here = mounting.mount_at(staging)
                if here is not None:
                    if any(m.major_minor == here.major_minor for m in mounts):
                        return  # staged here already (the kubelet repeats the call after a restart)
                    raise _precondition(f"volume {volume_id}: staging path {staging} has another filesystem "
                                        f"mounted ({here.source}, {here.major_minor})")
                if mounts:
                    raise _precondition(f"volume {volume_id}: its image is already mounted at "
                                        f"{mounts[0].mount_point}; a node-local volume is staged once")
                if devices:
                    # Bound, mounted nowhere: an earlier stage's e2fsck or resize2fs still at work
                    # (its agent was killed; the tool was not), or a device being let go. A second
                    # device would have two tools write one filesystem at once: wait for it.
                    raise RpcError(grpc.StatusCode.ABORTED, f"volume {volume_id}: its image is bound to "
                                   f"{', '.join(d.path for d in devices)}, mounted nowhere (an earlier stage's "
                                   "filesystem check still running?); retried once it is free - if nothing uses "
                                   "it, losetup -d it")
                found = self._check_identity(pool, volume_id, fd, expected_uuid)
                if thick:
                    reallocate(fd, volume_id)
                try:
                    attached = loop.attach(fd, pool.images.image_path(volume_id))
                except loop.LoopError as err:
                    raise RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"volume {volume_id}: {err}") from err
                with attached:
                    device = attached.loop.path
                    try:
                        mounting.fsck(device, fs_type)
                        spans = ext4_size(fd) if fs_type == "ext4" else None
                        if spans is not None and attached.loop.size() - spans >= GROWTH_SLACK:
                            # Grown while unstaged (or online growth was not allowed): grow it now.
                            mounting.grow_unmounted(device)
                            log.info("volume %s: filesystem grown to its image's %d bytes before mounting",
                                     volume_id, attached.loop.size())
                        mounting.mount(device, staging, fs_type, flags)
                    except mounting.MountError as err:
                        raise _precondition(f"volume {volume_id} (filesystem {found}): {err}") from err
        except ImageError as err:
            raise blockvolume.image_unusable(pool, volume_id, err) from err
        log.info("volume %s staged at %s", volume_id, staging)

    @staticmethod
    def _check_identity(pool: Pool, volume_id: str, fd: int, expected: str | None) -> str:
        from localpv.csi.images import read_fs_uuid

        found = read_fs_uuid(fd)
        if found is None:
            raise _precondition(f"volume {volume_id}: the image in pool {pool.name} has no ext4 or XFS filesystem; "
                                "it is not the image that was made for this volume")
        if expected and found != expected:
            raise _precondition(f"volume {volume_id}: the image in pool {pool.name} has filesystem {found}, the PV "
                                f"was made with {expected}; refusing to mount another volume's data")
        return found

    def unstage(self, request: csi.NodeUnstageVolumeRequest) -> csi.NodeUnstageVolumeResponse:
        volume_id = self._volume_id(request.volume_id)
        staging = _required(request.staging_target_path, "staging_target_path")
        with self._exclusive(volume_id, slow=True):
            info = mounting.mount_at(staging)
            if info is not None:
                self._check_not_another(volume_id, info)
                self._unmount_staged(volume_id, staging, mounting.device_of(info))
            image = self._image(volume_id)
            blockvolume.unstage(volume_id, staging, image.key if image else None)
            if image is not None and image.block:
                devices = loop.kernel_loops(named=f"/{volume_id}/{IMAGE_FILE}").get(image.key, [])
                blockvolume.let_go(volume_id, devices, image.key)
            with self._busy_guard:
                self._staged.pop(volume_id, None)
        self._changed()
        log.info("volume %s unstaged from %s", volume_id, staging)
        return csi.NodeUnstageVolumeResponse()

    @staticmethod
    def _unmount_staged(volume_id: str, staging: str, device: tuple[int, int]) -> None:
        """Unmount the staging path, and let its loop device go with it.

        The loop device is held open from before the unmount until after it: it cannot be
        freed and given to another image in between, so what is detached is the very device
        that was mounted here - never a number someone else may have taken meanwhile.
        """
        held = loop.hold(loop.Loop(device[1])) if device[0] == loop.LOOP_MAJOR else None
        try:
            try:
                mounting.umount(staging)
            except mounting.MountError as err:
                raise _precondition(f"volume {volume_id}: {err}") from err
            if held is not None and not mounting.mounts_of_device(*device):
                try:
                    loop.detach_held(held)  # autoclear usually does it when the last user goes
                except loop.LoopError as err:
                    log.warning("volume %s: %s (it goes when its last user closes it)", volume_id, err)
        finally:
            if held is not None:
                os.close(held)

    # ------------------------------------------------------------------ publish

    def publish(self, request: csi.NodePublishVolumeRequest) -> csi.NodePublishVolumeResponse:
        volume_id = self._volume_id(request.volume_id)
        staging = _required(request.staging_target_path, "staging_target_path")
        target = _required(request.target_path, "target_path")
        if request.volume_capability.WhichOneof("access_type") == "block":
            with self._exclusive(volume_id):
                image = self._image(volume_id)
                blockvolume.publish(volume_id, staging, target, image.key if image else None,
                                    readonly=request.readonly)
            return csi.NodePublishVolumeResponse()
        with self._exclusive(volume_id):
            staged = mounting.mount_at(staging)
            if staged is None:
                raise _precondition(f"volume {volume_id} is not staged at {staging}")
            self._check_holds(volume_id, staged)
            current = mounting.mount_at(target)
            if current is not None:
                if current.major_minor == staged.major_minor:
                    return csi.NodePublishVolumeResponse()
                raise _precondition(f"volume {volume_id}: target path {target} has another filesystem mounted")
            try:
                mounting.bind(staging, target, readonly=request.readonly)
            except mounting.MountError as err:
                raise _precondition(f"volume {volume_id}: {err}") from err
        return csi.NodePublishVolumeResponse()

    def unpublish(self, request: csi.NodeUnpublishVolumeRequest) -> csi.NodeUnpublishVolumeResponse:
        volume_id = self._volume_id(request.volume_id)
        target = _required(request.target_path, "target_path")
        with self._exclusive(volume_id):
            try:
                while mounting.umount(target):
                    pass
            except mounting.MountError as err:
                raise _precondition(f"volume {volume_id}: {err}") from err
            if os.path.isdir(target) and not os.path.islink(target):
                try:
                    os.rmdir(target)
                except OSError as err:
                    log.warning("volume %s: %s not removed: %s", volume_id, target, err.strerror)
            else:
                blockvolume.remove_file(target, volume_id)  # a Block volume's target file
        return csi.NodeUnpublishVolumeResponse()

    # ------------------------------------------------------------------ stats and expansion

    def _mounted(self, volume_id: str, path: str) -> tuple[MountInfo, loop.Loop | None]:
        info = mounting.mount_at(_required(path, "volume_path"))
        if info is None:
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"volume {volume_id}: nothing is mounted at {path}")
        major, minor = mounting.device_of(info)
        return info, loop.Loop(minor) if major == loop.LOOP_MAJOR else None

    def stats(self, request: csi.NodeGetVolumeStatsRequest) -> csi.NodeGetVolumeStatsResponse:
        volume_id = self._volume_id(request.volume_id)
        block_file = self._block_file(volume_id, _required(request.volume_path, "volume_path"))
        if block_file is not None:
            return self._block_stats(volume_id, block_file)
        info, device = self._mounted(volume_id, request.volume_path)
        try:
            st = os.statvfs(request.volume_path)
        except OSError as err:
            return csi.NodeGetVolumeStatsResponse(volume_condition=csi.VolumeCondition(
                abnormal=True, message=f"the filesystem does not answer statfs: {err.strerror}"))
        usage = [
            csi.VolumeUsage(unit=csi.VolumeUsage.BYTES, total=st.f_blocks * st.f_frsize,
                            available=st.f_bavail * st.f_frsize, used=(st.f_blocks - st.f_bfree) * st.f_frsize),
            csi.VolumeUsage(unit=csi.VolumeUsage.INODES, total=st.f_files, available=st.f_favail,
                            used=st.f_files - st.f_ffree),
        ]
        problem = self._condition(volume_id, info, device)
        return csi.NodeGetVolumeStatsResponse(usage=usage, volume_condition=csi.VolumeCondition(
            abnormal=problem is not None, message=problem or "the image and its filesystem are healthy"))

    @staticmethod
    def _block_file(volume_id: str, path: str) -> str | None:
        """The file a Block volume's device is bound at, for a ``volume_path`` that is one (a
        target file) or a staging directory holding one; None: not a Block volume's path."""
        for candidate in (path, blockvolume.staging_file(path, volume_id)):
            if mounting.device_at(candidate) is not None and mounting.mount_at(candidate) is not None:
                return candidate
        return None

    def _block_stats(self, volume_id: str, path: str) -> csi.NodeGetVolumeStatsResponse:
        """A raw device's usage is its size in bytes (the CSI spec's ``total``): with no
        filesystem, nothing on the node knows what of it is used, and there are no inodes."""
        device = blockvolume.loop_at(path)
        problem = (self._device_condition(volume_id, device) if device is not None else
                   f"{path} is not a loop device: not this volume's image")
        size = device.size() if device is not None and problem is None else 0
        return csi.NodeGetVolumeStatsResponse(
            usage=[csi.VolumeUsage(unit=csi.VolumeUsage.BYTES, total=size)] if size else [],
            volume_condition=csi.VolumeCondition(abnormal=problem is not None,
                                                 message=problem or "the image and its loop device are healthy"))

    def _check_holds(self, volume_id: str, mount: MountInfo) -> None:
        """Refuse a mount whose filesystem is not this volume's image (its loop device reads
        another file): publishing it would hand another volume's data to this volume's pod,
        growing it would grow someone else's filesystem."""
        major, minor = mounting.device_of(mount)
        held = loop.backing_key(loop.Loop(minor)) if major == loop.LOOP_MAJOR else None
        if held is None or held != self._image_key(volume_id):
            raise _precondition(f"volume {volume_id}: {mount.mount_point} holds another filesystem than this "
                                f"volume's image ({mount.source}); refused")

    def _check_not_another(self, volume_id: str, mount: MountInfo) -> None:
        """Refuse to unstage a mount that provably holds another volume's image: unmounting it
        would take that volume away from under its pods. What cannot be told (this volume's
        image gone, a device that is no loop's) is unmounted: the kubelet must be able to let a
        broken volume go."""
        major, minor = mounting.device_of(mount)
        held = loop.backing_key(loop.Loop(minor)) if major == loop.LOOP_MAJOR else None
        mine = self._image_key(volume_id)
        if held is not None and mine is not None and held != mine:
            raise _precondition(f"volume {volume_id}: {mount.mount_point} holds another volume's filesystem "
                                f"({mount.source}); not unmounted")

    def _image_key(self, volume_id: str) -> loop.FileKey | None:
        """The device and inode of the volume's image, in whichever configured pool holds it
        (None when none does, as far as the pools that can be looked at now show)."""
        image = self._image(volume_id)
        return image.key if image is not None else None

    def _image(self, volume_id: str) -> _Image | None:
        """The volume's image in whichever configured pool holds it: its device and inode, and
        whether it is a Block image."""
        for pool in self.pools().values():
            try:
                with pool.images.open_image(volume_id, writable=False) as fd:
                    st = os.fstat(fd)
                    return _Image(loop.file_key(st), read_block_uuid(fd) is not None, st.st_size)
            except (ImageError, OSError):
                continue
        return None

    def _condition(self, volume_id: str, info: MountInfo, device: loop.Loop | None) -> str | None:
        """What is wrong with a mounted volume (None when nothing is): reporting only."""
        if device is None:
            return f"{info.mount_point} is not on a loop device ({info.source}): not this volume's image"
        problem = self._device_condition(volume_id, device)
        if problem is not None:
            return problem
        if "ro" in info.super_options.split(","):
            return "the filesystem was made read-only by the kernel (I/O or filesystem errors)"
        try:
            errors = int(open(f"/sys/fs/ext4/{device.path[5:]}/errors_count").read())  # noqa: SIM115
        except (OSError, ValueError):
            errors = 0
        if errors:
            return f"the filesystem logged {errors} errors (run e2fsck on the image while it is unused)"
        return None

    def _device_condition(self, volume_id: str, device: loop.Loop) -> str | None:
        """What is wrong with a volume's loop device (None when nothing is): reporting only."""
        held = loop.backing_key(device)
        if held is None:
            return f"{device.path} is no longer bound to the image"
        if (loop.backing_file(device) or "").endswith(" (deleted)"):
            return f"volume {volume_id}'s image was deleted while mounted: its data goes when it is unstaged"
        image = self._image_key(volume_id)
        if image is None:
            return f"volume {volume_id} has no image in the pools it could be in now"
        if held != image:
            return f"{device.path} reads another file than volume {volume_id}'s image"
        return None

    def expand(self, request: csi.NodeExpandVolumeRequest) -> csi.NodeExpandVolumeResponse:
        volume_id = self._volume_id(request.volume_id)
        path = request.volume_path or request.staging_target_path
        access = request.volume_capability.WhichOneof("access_type") if request.HasField("volume_capability") else None
        with self._exclusive(volume_id, slow=True):
            image = self._image(volume_id)
            if access == "block" or (access is None and image is not None and image.block):
                return self._expand_block(volume_id, image, request.capacity_range.required_bytes)
            info, device = self._mounted(volume_id, path)
            if device is None:
                raise _precondition(f"volume {volume_id}: {path} is not on a loop device")
            self._check_holds(volume_id, info)
            try:
                size = loop.refresh_capacity(device)
            except loop.LoopError as err:
                raise _precondition(f"volume {volume_id}: {err}") from err
            wanted = request.capacity_range.required_bytes
            if wanted and size < wanted:
                raise RpcError(grpc.StatusCode.OUT_OF_RANGE,
                               f"volume {volume_id}: its image has {size} bytes, {wanted} asked: the image is grown "
                               "by the agent's controller first (retried)")
            if not self._covers(device, info.fs_type, size):
                grow_at = self._writable_mount(volume_id, device, request.staging_target_path)
                try:
                    mounting.grow_filesystem(device.path, grow_at, info.fs_type)
                except mounting.MountError as err:
                    raise _precondition(f"volume {volume_id}: {err}") from err
        log.info("volume %s: filesystem grown to %d bytes", volume_id, size)
        if self.on_expanded is not None:
            self.on_expanded(volume_id, size)
        return csi.NodeExpandVolumeResponse(capacity_bytes=size)

    def _expand_block(self, volume_id: str, image: _Image | None, wanted: int) -> csi.NodeExpandVolumeResponse:
        """A Block volume grows with its image: each of its loop devices is made to see the
        image's size (the controller did, if it was staged then); there is no filesystem."""
        if image is None:
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"volume {volume_id}: no image in the pools configured on "
                                                      f"node {self.node_name}")
        if not image.block:
            raise _precondition(f"volume {volume_id}: its image was made for volumeMode Filesystem, not grown as a "
                                "raw device")
        size = image.size
        try:
            for device in loop.kernel_loops(named=f"/{volume_id}/{IMAGE_FILE}").get(image.key, []):
                size = min(size, loop.refresh_capacity(device))
        except loop.LoopError as err:
            raise _precondition(f"volume {volume_id}: {err}") from err
        if wanted and size < wanted:
            raise RpcError(grpc.StatusCode.OUT_OF_RANGE,
                           f"volume {volume_id}: its image has {size} bytes, {wanted} asked: the image is grown by the "
                           "agent's controller first (retried)")
        log.info("volume %s: its loop device sees %d bytes (raw block: no filesystem to grow)", volume_id, size)
        if self.on_expanded is not None:
            self.on_expanded(volume_id, size)
        return csi.NodeExpandVolumeResponse(capacity_bytes=size)

    @staticmethod
    def _writable_mount(volume_id: str, device: loop.Loop, staging: str) -> str:
        """Where the filesystem can be grown: its staging mount, else any read-write mount of it.
        The pod's target (``volume_path``) may be a read-only bind, and xfs_growfs needs write
        access to the mount it is given."""
        mounts = [m for m in mounting.mounts_of_device(*device.rdev) if "ro" not in m.mount_options.split(",")]
        wanted = os.path.realpath(staging) if staging else ""
        mounts.sort(key=lambda m: m.mount_point != wanted)
        if not mounts:
            raise _precondition(f"volume {volume_id}: its filesystem has no read-write mount to grow it through")
        return mounts[0].mount_point

    @staticmethod
    def _covers(device: loop.Loop, fs_type: str, size: int) -> bool:
        """Whether the filesystem already spans its device (grown at stage): nothing to do."""
        if fs_type != "ext4":
            return False  # xfs_growfs on a full filesystem is a harmless no-op
        fd = os.open(device.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            spans = ext4_size(fd)
        finally:
            os.close(fd)
        return spans is not None and size - spans < GROWTH_SLACK

    # ------------------------------------------------------------------ node facts

    def capabilities(self, _request: csi.NodeGetCapabilitiesRequest) -> csi.NodeGetCapabilitiesResponse:
        types = (_Cap.STAGE_UNSTAGE_VOLUME, _Cap.GET_VOLUME_STATS, _Cap.EXPAND_VOLUME, _Cap.VOLUME_CONDITION)
        return csi.NodeGetCapabilitiesResponse(capabilities=[
            csi.NodeServiceCapability(rpc=_Cap(type=t)) for t in types])

    def info(self, _request: csi.NodeGetInfoRequest) -> csi.NodeGetInfoResponse:
        return csi.NodeGetInfoResponse(node_id=self.node_name, accessible_topology=csi.Topology(
            segments={TOPOLOGY_KEY: node_label_value(self.node_name)}))

    def handler(self, observer: CallObserver | None = None) -> grpc.GenericRpcHandler:
        return service(SERVICE, {
            "NodeStageVolume": Method(csi.NodeStageVolumeRequest, self.stage),
            "NodeUnstageVolume": Method(csi.NodeUnstageVolumeRequest, self.unstage),
            "NodePublishVolume": Method(csi.NodePublishVolumeRequest, self.publish),
            "NodeUnpublishVolume": Method(csi.NodeUnpublishVolumeRequest, self.unpublish),
            "NodeGetVolumeStats": Method(csi.NodeGetVolumeStatsRequest, self.stats),
            "NodeExpandVolume": Method(csi.NodeExpandVolumeRequest, self.expand),
            "NodeGetCapabilities": Method(csi.NodeGetCapabilitiesRequest, self.capabilities),
            "NodeGetInfo": Method(csi.NodeGetInfoRequest, self.info),
        }, observer)

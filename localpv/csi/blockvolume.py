"""Raw block dynamic volumes (``volumeMode: Block``): the node service's part that hands out
an image's loop device as a device file instead of a filesystem.

* **stage** - the image must be a Block image marked with the PV's ``imageUUID``
  (:mod:`localpv.csi.images`); it is bound to a loop device, and nothing else: no mkfs, no
  fsck, no mount. The device's node is bind-mounted onto ``<staging path>/<volume id>``, the
  *staging file*: that bind is the stage's record, in the kernel's mount table - it goes with
  a reboot, and a restarted agent sees it (the kubelet's directory is shared) whatever mount
  namespace it runs in. The device is known by what the kernel holds for it (the image's
  device and inode, :mod:`localpv.csi.loop`), never by a path.
* **publish** - the staging file is bind-mounted onto the pod's target *file* (made if
  missing), read-only when asked.
* **unstage** - the staging file's bind goes, then the loop device - held open across, so the
  device let go is the one that was bound - once no bind of its node is left; with a publish
  left, it is refused (the kubelet unpublishes first, and retries).

**No autoclear.** A bind of a device node names the device by its number and holds nothing
open: with autoclear, the device would be detached when the stage's descriptor closed, and
its number - still named by the binds - could go to another image, whose data a pod would
then read. So a Block volume's loop device is bound without autoclear and detached only by an
unstage that finds no bind and no mount of it left. An agent killed between the attach and
the bind leaves a device bound to the image that nothing refers to: the repeated stage takes
that one (an image is never bound twice), an unstage lets it go, and the image is not removed
while it is there (as for any loop device).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat

import grpc

from localpv.csi import loop, mounting
from localpv.csi.images import IMAGE_FILE, ImageError, read_block_uuid, reallocate
from localpv.csi.pools import Pool
from localpv.csi.rpc import RpcError

log = logging.getLogger(__name__)


def _precondition(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.FAILED_PRECONDITION, message)


def image_unusable(pool: Pool, volume_id: str, err: ImageError) -> RpcError:
    """The answer to a stage (either mode) whose image cannot be used: NOT_FOUND when it is
    missing (nothing is ever created in its place), FAILED_PRECONDITION otherwise."""
    if err.missing:
        return RpcError(grpc.StatusCode.NOT_FOUND, f"volume {volume_id}: no image in pool {pool.name} "
                                                   f"({pool.config.host_dir}); nothing is created in its place")
    return _precondition(str(err))


def staging_file(staging: str, volume_id: str) -> str:
    """Where a Block volume's device is bound when staged: a file in the staging directory."""
    return os.path.join(staging, volume_id)


def loop_at(path: str) -> loop.Loop | None:
    """The loop device whose node is at ``path`` (a bind of it), None if there is none."""
    rdev = mounting.device_at(path)
    return loop.Loop(rdev[1]) if rdev is not None and rdev[0] == loop.LOOP_MAJOR else None


def references(device: loop.Loop) -> list[str]:
    """Where ``device`` is used: binds of its node (staging and target files, the kubelet's own
    binds of them) and mounts of a filesystem on it."""
    return ([m.mount_point for m in mounting.device_binds(*device.rdev)]
            + [m.mount_point for m in mounting.mounts_of_device(*device.rdev)])


def check_identity(pool: Pool, volume_id: str, fd: int, expected: str | None) -> str:
    """The image's Block mark, which must be the PV's ``imageUUID``."""
    found = read_block_uuid(fd)
    if found is None:
        raise _precondition(f"volume {volume_id}: the image in pool {pool.name} is not a Block image (it was made "
                            "for volumeMode Filesystem, or replaced); it is not handed out as a raw device")
    if not expected:
        raise _precondition(f"volume {volume_id}: its PV records no imageUUID; a Block image is handed out only to "
                            "the PV made with it")
    if found != expected:
        raise _precondition(f"volume {volume_id}: the image in pool {pool.name} is Block image {found}, the PV was "
                            f"made with {expected}; refusing to hand out another volume's data")
    return found


def _bind_staged(device: loop.Loop, image: loop.FileKey, file: str, volume_id: str) -> None:
    """Bind the node of ``device`` - bound to ``image``, referred to by nothing - at ``file``.
    It is held open across, so that the number bound is the device that was checked."""
    held = loop.hold(device)
    if held is None:
        raise RpcError(grpc.StatusCode.ABORTED, f"volume {volume_id}: {device.path} went away; retried")
    try:
        if loop.backing_key(device) != image:
            raise RpcError(grpc.StatusCode.ABORTED, f"volume {volume_id}: {device.path} no longer reads its image; "
                                                    "retried")
        if loop.autoclear(device):
            # Not one of ours (a Block volume's device never has autoclear): it goes with whoever
            # holds it, and the binds would then name a freed number.
            raise RpcError(grpc.StatusCode.ABORTED, f"volume {volume_id}: its image is bound to {device.path} by "
                                                    "someone else (autoclear), referred to by no mount; retried once "
                                                    f"it is free - if nothing uses it, losetup -d {device.path}")
        mounting.bind(device.node(), file, readonly=False, file=True)
    finally:
        os.close(held)


def stage(pool: Pool, volume_id: str, staging: str, expected: str | None, *, thick: bool) -> str:
    """Stage a Block volume at ``staging``; returns its staging file. Idempotent: a volume
    staged there already (by this agent or an earlier one) is found by its device."""
    file = staging_file(staging, volume_id)
    try:
        with pool.images.open_image(volume_id) as fd:
            found = check_identity(pool, volume_id, fd, expected)
            image = loop.file_key(os.fstat(fd))
            devices = loop.loops_of(fd, named=f"/{volume_id}/{IMAGE_FILE}")
            here = mounting.mount_at(file)
            if here is not None:
                if loop_at(file) in devices:
                    return file  # staged here already (the kubelet repeats the call after a restart)
                raise _precondition(f"volume {volume_id}: staging file {file} has another device bound "
                                    f"({mounting.device_at(file) or here.source}); not this volume's image")
            used = [(device, where) for device in devices for where in references(device)]
            if used:
                device, where = used[0]
                raise _precondition(f"volume {volume_id}: its image is already staged at {where} ({device.path}); a "
                                    "node-local volume is staged once")
            if thick:
                reallocate(fd, volume_id)
            if devices:
                # Bound, referred to by nothing: a stage whose agent was killed before its bind (or an
                # unstage killed after its unbind). That device is the one: never a second.
                _bind_staged(devices[0], image, file, volume_id)
            else:
                try:
                    attached = loop.attach(fd, pool.images.image_path(volume_id), autoclear=False)
                except loop.LoopError as err:
                    raise RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"volume {volume_id}: {err}") from err
                with attached:
                    try:
                        mounting.bind(attached.loop.node(), file, readonly=False, file=True)
                    except mounting.MountError:
                        attached.detach()
                        raise
    except mounting.MountError as err:
        raise _precondition(f"volume {volume_id} (Block image {found}): {err}") from err
    except ImageError as err:
        raise image_unusable(pool, volume_id, err) from err
    log.info("volume %s staged at %s (raw block)", volume_id, file)
    return file


def check_staged(volume_id: str, staging: str, image: loop.FileKey | None) -> str:
    """The staging file of a Block volume staged at ``staging``, checked to hold a loop device
    of this volume's image (``image``: its device and inode)."""
    file = staging_file(staging, volume_id)
    if mounting.mount_at(file) is None:
        raise _precondition(f"volume {volume_id} is not staged at {staging}")
    device = loop_at(file)
    held = loop.backing_key(device) if device is not None else None
    if held is None or held != image:
        raise _precondition(f"volume {volume_id}: staging file {file} holds another device than this volume's "
                            "image; refused")
    return file


def publish(volume_id: str, staging: str, target: str, image: loop.FileKey | None, *, readonly: bool) -> None:
    """Bind the staged device at the pod's target file; nothing to do when it is there."""
    file = check_staged(volume_id, staging, image)
    if mounting.mount_at(target) is not None:
        if mounting.device_at(target) == mounting.device_at(file):
            return
        raise _precondition(f"volume {volume_id}: target path {target} has another device or filesystem mounted")
    try:
        mounting.bind(file, target, readonly=readonly, file=True)
    except mounting.MountError as err:
        raise _precondition(f"volume {volume_id}: {err}") from err


def unstage(volume_id: str, staging: str, image: loop.FileKey | None) -> None:
    """Undo :func:`stage`: nothing to do when nothing is staged. ``image``: the device and inode
    of this volume's image (None when it cannot be found now)."""
    file = staging_file(staging, volume_id)
    if mounting.mount_at(file) is not None:
        device = loop_at(file)
        held = loop.hold(device) if device is not None else None
        try:
            key = loop.backing_key(device) if device is not None else None
            if key is not None and image is not None and key != image:
                raise _precondition(f"volume {volume_id}: staging file {file} holds another volume's device "
                                    f"({device.path if device else ''}); not unbound")
            if device is not None:
                own = os.path.realpath(file)
                published = [m.mount_point for m in mounting.device_binds(*device.rdev) if m.mount_point != own]
                if published:
                    raise _precondition(f"volume {volume_id} is still published at {published[0]}; it is unstaged "
                                        "once it is unpublished")
            try:
                while mounting.umount(file):
                    pass
            except mounting.MountError as err:
                raise _precondition(f"volume {volume_id}: {err}") from err
            if held is not None and key is not None and device is not None and not references(device):
                _detach(held, volume_id)
        finally:
            if held is not None:
                os.close(held)
    remove_file(file, volume_id)


def let_go(volume_id: str, devices: list[loop.Loop], image: loop.FileKey) -> None:
    """Detach this image's loop devices that nothing refers to (a stage interrupted between its
    attach and its bind): each is held, checked to still read the image, then let go."""
    for device in devices:
        held = loop.hold(device)
        if held is None:
            continue
        try:
            if loop.backing_key(device) == image and not references(device):
                _detach(held, volume_id)
                log.info("volume %s: %s, bound to its image and used by nothing, let go", volume_id, device.path)
        finally:
            os.close(held)


def _detach(held: int, volume_id: str) -> None:
    try:
        loop.detach_held(held)
    except loop.LoopError as err:
        log.warning("volume %s: %s", volume_id, err)


def remove_file(path: str, volume_id: str) -> None:
    """Remove what a bind onto a file left (an empty regular file): never anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as err:
        log.warning("volume %s: %s not removed: %s", volume_id, path, err.strerror)
        return
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

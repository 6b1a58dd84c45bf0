"""Loop devices over disk images, through the kernel's ioctls (no ``losetup`` process).

Why ioctls: a volume's image is opened once, safely (no symlink followed, see
:mod:`localpv.csi.images`), and that very open file is what the loop device is bound to
(``LOOP_CONFIGURE`` takes a file descriptor), so no path is looked up twice. And an attach
costs no fork.

Loop devices are shared with everything else on the node: a free one is asked of
``/dev/loop-control`` and may be taken by someone else before it is configured (``EBUSY``:
ask again). Devices are attached with ``LO_FLAGS_AUTOCLEAR``: the kernel detaches one when
its last user goes (the mount at the staging path), so an agent killed between attach and
mount leaks no device, and an unmounted volume holds none.

**A loop device is known by what the kernel holds for it**: the device and inode of its
backing file (``LOOP_GET_STATUS64``), compared with the image's own ``fstat``. Never by the
path sysfs shows (``loop/backing_file``): the kernel renders it in the mount namespace of
whoever reads it, through the mounts of whoever attached the device - after the agent's
container restarts, the path its predecessor's mount gave resolves nowhere (it reads
``/<volume>/disk.img``), and matching by it would find no device for a staged image. The
path is kept for messages only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LOOP_SET_FD = 0x4C00
LOOP_CLR_FD = 0x4C01
LOOP_SET_STATUS64 = 0x4C04
LOOP_GET_STATUS64 = 0x4C05
LOOP_SET_CAPACITY = 0x4C07
LOOP_CONFIGURE = 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82

LO_FLAGS_AUTOCLEAR = 4
LO_FLAGS_DIRECT_IO = 16

LOOP_MAJOR = 7
#: struct loop_info64: device, inode, rdevice, offset, sizelimit (u64); number, encrypt_type,
#: encrypt_key_size, flags (u32); file_name[64], crypt_name[64], encrypt_key[32]; init[2] (u64).
_INFO64 = "QQQQQIIII64s64s32sQQ"
#: struct loop_config: fd, block_size (u32); loop_info64; reserved[8] (u64).
_CONFIG = "=II" + _INFO64 + "8Q"

SYS_BLOCK = Path("/sys/block")


class LoopError(Exception):
    """A loop device could not be attached, resized or detached (the message says why)."""


@dataclass(frozen=True)
class Loop:
    """A loop device: ``/dev/loopN`` and its number."""

    number: int

    @property
    def path(self) -> str:
        return f"/dev/loop{self.number}"

    @property
    def rdev(self) -> tuple[int, int]:
        return LOOP_MAJOR, self.number

    def node(self) -> str:
        """``/dev/loopN``, made if this process's /dev lacks it (a device made after the
        agent's container started, as every device bound by an earlier container may be)."""
        return _device_node(self.number)

    def size(self) -> int:
        """Its size in bytes as the kernel sees it now."""
        return int((SYS_BLOCK / f"loop{self.number}" / "size").read_text()) * 512


def _info(file_name: str, flags: int) -> tuple[object, ...]:
    name = os.fsencode(file_name)[:63]
    return (0, 0, 0, 0, 0, 0, 0, 0, flags, name, b"", b"", 0, 0)


def _device_node(number: int) -> str:
    """``/dev/loopN``, made if the container's /dev lacks it (a device made after it started)."""
    path = f"/dev/loop{number}"
    if not os.path.exists(path):
        with contextlib.suppress(FileExistsError):
            os.mknod(path, stat.S_IFBLK | 0o660, os.makedev(LOOP_MAJOR, number))
    return path


class Attached:
    """A loop device just bound to an image, held open until :meth:`release`.

    The holder must mount (or otherwise open) the device before releasing it: with autoclear,
    the last close detaches it.
    """

    def __init__(self, loop: Loop, fd: int) -> None:
        self.loop = loop
        self._fd: int | None = fd

    def detach(self) -> None:
        """Let the device go (at :meth:`release`: this is the device's last user)."""
        if self._fd is not None:
            detach_held(self._fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> Attached:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def attach(image_fd: int, name: str, *, autoclear: bool = True, attempts: int = 20) -> Attached:
    """Bind the open image ``image_fd`` to a free loop device (autoclear, direct I/O asked).

    ``name`` is recorded as the device's file name (what ``losetup -l`` shows). Retries when
    another process takes the free device first. Without ``autoclear`` the device stays bound
    when its last user goes, until :func:`detach_held` (a Block volume: what refers to it is a
    bind mount of its device node, which holds no open device).
    """
    try:
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    except OSError as err:
        raise LoopError(f"cannot open /dev/loop-control ({err.strerror}): the agent needs the node's /dev "
                        "and the loop module") from err
    try:
        for _ in range(attempts):
            try:
                number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
            except OSError as err:
                raise LoopError(f"no free loop device ({err.strerror})") from err
            fd = os.open(_device_node(number), os.O_RDWR | os.O_CLOEXEC)
            try:
                _configure(fd, image_fd, name, autoclear=autoclear)
            except OSError as err:
                os.close(fd)
                if err.errno == errno.EBUSY:
                    continue  # taken by someone else between GET_FREE and now
                raise LoopError(f"cannot bind /dev/loop{number} to {name} ({err.strerror})") from err
            return Attached(Loop(number), fd)
        raise LoopError(f"no free loop device after {attempts} attempts (others took each one first)")
    finally:
        os.close(control)


def _configure(fd: int, image_fd: int, name: str, *, autoclear: bool) -> None:
    flags = (LO_FLAGS_AUTOCLEAR if autoclear else 0) | LO_FLAGS_DIRECT_IO
    config = struct.pack(_CONFIG, image_fd, 0, *_info(name, flags), *([0] * 8))
    try:
        fcntl.ioctl(fd, LOOP_CONFIGURE, config)
        return
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTTY):
            raise
    # Kernels before 5.8 have no LOOP_CONFIGURE: bind, then set the flags.
    fcntl.ioctl(fd, LOOP_SET_FD, image_fd)
    try:
        fcntl.ioctl(fd, LOOP_SET_STATUS64, struct.pack("=" + _INFO64, *_info(name, flags & LO_FLAGS_AUTOCLEAR)))
    except OSError:
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
        raise


#: The file behind a loop device as the kernel holds it: (st_dev, st_ino) of the backing file.
FileKey = tuple[int, int]


def file_key(st: os.stat_result) -> FileKey:
    return st.st_dev, st.st_ino


def _status(loop: Loop) -> tuple[int, ...] | None:
    """``struct loop_info64`` of a bound device (None when it is not bound), read with
    ``LOOP_GET_STATUS64`` on the device itself. Opening a bound autoclear device and closing it
    does not detach it: whoever bound it (a mount) still holds it."""
    try:
        fd = os.open(_device_node(loop.number), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        buf = bytearray(struct.calcsize("=" + _INFO64))
        fcntl.ioctl(fd, LOOP_GET_STATUS64, buf, True)
    except OSError:
        return None  # ENXIO: not bound (any more)
    finally:
        os.close(fd)
    return struct.unpack_from("=QQQQQIIII", buf)


def backing_key(loop: Loop) -> FileKey | None:
    """The device and inode of the file bound to ``loop`` (None when it is not bound)."""
    status = _status(loop)
    return (status[0], status[1]) if status is not None else None


def autoclear(loop: Loop) -> bool | None:
    """Whether the device goes when its last user does (None when it is not bound)."""
    status = _status(loop)
    return bool(status[8] & LO_FLAGS_AUTOCLEAR) if status is not None else None


def bound(named: str = "") -> list[Loop]:
    """Loop devices bound now (sysfs shows a ``loop/`` directory only for those) whose backing
    path, as sysfs renders it, ends with ``named``.

    The rendered path is never taken for the file's identity (see above), but its last
    components are the file's own whatever namespace renders it, so it narrows which devices
    are asked: the node's other loop devices (other storage, volumes being cleaned) are never
    opened, and a ``losetup -d`` of theirs is never deferred by our look.
    """
    found = []
    for directory in SYS_BLOCK.glob("loop*/loop"):
        try:
            path = (directory / "backing_file").read_text().rstrip("\n")
        except OSError:
            continue  # detached meanwhile
        if path.endswith(named):
            found.append(Loop(int(directory.parent.name[len("loop"):])))
    return sorted(found, key=lambda loop: loop.number)


def kernel_loops(named: str = "") -> dict[FileKey, list[Loop]]:
    """Loop devices bound to files named ``...named``, by the file the kernel holds for each."""
    found: dict[FileKey, list[Loop]] = {}
    for device in bound(named):
        key = backing_key(device)
        if key is not None:
            found.setdefault(key, []).append(device)
    return found


def loops_of(image: str | os.PathLike[str] | int, named: str) -> list[Loop]:
    """The loop devices bound to this very file - a path (as this process sees it) or an open
    descriptor - matched by device and inode with what the kernel holds; ``named``: the end of
    its path (``/<volume>/disk.img``), which narrows the devices asked."""
    try:
        st = os.fstat(image) if isinstance(image, int) else os.stat(image)
    except FileNotFoundError:
        return []
    return kernel_loops(named).get(file_key(st), [])


def backing_file(loop: Loop) -> str | None:
    """The path sysfs gives for the file a loop device reads (``... (deleted)`` when it was
    removed), None if unbound: for messages only - it is rendered through the mounts of
    whoever attached the device, which may be of another mount namespace (see above)."""
    try:
        return (SYS_BLOCK / f"loop{loop.number}" / "loop" / "backing_file").read_text().rstrip("\n")
    except OSError:
        return None


def refresh_capacity(loop: Loop) -> int:
    """Make the device as large as its grown file; returns the new size in bytes."""
    try:
        fd = os.open(loop.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise LoopError(f"cannot open {loop.path} ({err.strerror})") from err
    try:
        fcntl.ioctl(fd, LOOP_SET_CAPACITY, 0)
    except OSError as err:
        raise LoopError(f"cannot resize {loop.path} ({err.strerror})") from err
    finally:
        os.close(fd)
    return loop.size()


def hold(loop: Loop) -> int | None:
    """Open ``loop`` so that it cannot be freed (and given to another file) while the
    descriptor is open; None when it cannot be opened (it is gone)."""
    try:
        return os.open(_device_node(loop.number), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None


def detach_held(fd: int) -> None:
    """Detach the loop device open as ``fd`` once its last user goes (the caller's close, when
    nothing else holds it): the device is the one that was opened, whatever its number became
    meanwhile. Nothing to do when it is no longer bound."""
    try:
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
    except OSError as err:
        if err.errno not in (errno.ENXIO, errno.EINVAL):
            raise LoopError(f"cannot detach the loop device ({err.strerror})") from err


def detach(loop: Loop) -> bool:
    """Unbind a loop device; True if it was bound. Refuses (EBUSY) one still mounted."""
    try:
        fd = os.open(loop.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
    except OSError as err:
        if err.errno == errno.ENXIO:
            return False
        raise LoopError(f"cannot detach {loop.path} ({err.strerror})") from err
    finally:
        os.close(fd)
    return True

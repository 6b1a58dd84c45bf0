"""Block devices: size, type test, and kernel hot-plug events.

Block volumes are offered with the device's exact size (``BLKGETSIZE64``, as upstream
does), and the agent wants to rescan as soon as a disk appears or changes, rather than on
its next periodic pass. Hot-plug events come from the kernel's uevent netlink socket:
no ``udevd`` runs inside the agent's container (nor on many minimal nodes), so we listen
to the *kernel* source, which carries the raw uevents without udev's processing (no
``/dev/disk/by-id`` symlinks yet when the event arrives; callers rescan, they do not act
on the event's details).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
from types import TracebackType
from typing import Any

__all__ = [
    "OVERFLOW",
    "BlockDeviceMonitor",
    "BlockMonitorUnavailable",
    "block_device_size",
    "is_block_device",
]

# _IOR(0x12, 114, size_t) in the asm-generic ioctl layout (x86, arm, arm64, riscv, s390):
# direction "read" (2) in bits 30-31, argument size in bits 16-29, type, number. The
# kernel always writes a u64 whatever sizeof(size_t) says in the number.
_IOC_READ = 2
BLKGETSIZE64 = (_IOC_READ << 30) | (struct.calcsize("N") << 16) | (0x12 << 8) | 114
_U64 = struct.Struct("=Q")

# Action reported by BlockDeviceMonitor.drain when the kernel dropped events because
# the socket buffer was full: the caller should rescan everything.
OVERFLOW = "overflow"


def block_device_size(path: str) -> int:
    """Size in bytes of the block device at ``path`` (symlinks followed).

    Raises ``OSError`` carrying ``path`` when it cannot be opened or is not a block
    device (the ioctl then fails with ``ENOTTY``).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        buf = bytearray(_U64.size)
        fcntl.ioctl(fd, BLKGETSIZE64, buf, True)
    except OSError as e:
        raise OSError(e.errno, f"BLKGETSIZE64 failed: {e.strerror}", path) from e
    finally:
        os.close(fd)
    size: int = _U64.unpack(buf)[0]
    return size


def is_block_device(path: str) -> bool:
    """True if ``path`` is a block device or a symlink to one; False for broken links."""
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


class BlockMonitorUnavailable(RuntimeError):
    """The kernel uevent socket cannot be opened; fall back to periodic scans."""


class BlockDeviceMonitor:
    """Non-blocking listener for kernel uevents of the ``block`` subsystem.

    Poll :meth:`fileno` for readability, then call :meth:`drain`. Attaching or detaching
    a loop device, for instance, arrives as ``change`` events on the (pre-existing)
    ``loopN`` node; a new disk as ``add``. Construction raises
    :class:`BlockMonitorUnavailable` when netlink cannot be used (pyudev/libudev
    missing, no permission).

    Kernel uevents reach every network namespace owned by the initial user namespace, so
    an agent in its own network namespace still hears them; inside a user namespace it
    hears nothing, and periodic scans remain the safety net.
    """

    def __init__(self) -> None:
        try:
            import pyudev

            self._monitor: Any = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
            self._monitor.filter_by("block")
            self._monitor.start()
        except (ImportError, OSError) as e:
            raise BlockMonitorUnavailable(f"cannot listen to kernel block device events: {e}") from e
        self._closed = False

    def fileno(self) -> int:
        """The netlink socket; readable when events are queued."""
        if self._closed:
            raise ValueError("BlockDeviceMonitor is closed")
        fd: int = self._monitor.fileno()
        return fd

    def drain(self) -> list[tuple[str, str]]:
        """Return every queued event as ``(action, device node or sysfs path)`` without blocking.

        If the kernel dropped events (``ENOBUFS``: the socket buffer overflowed during a
        burst), an ``(OVERFLOW, "")`` entry is appended: what was lost is unknown, so the
        caller must rescan everything.
        """
        self.fileno()  # raises when closed
        events: list[tuple[str, str]] = []
        while True:
            try:
                device = self._monitor.poll(timeout=0)
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                events.append((OVERFLOW, ""))
                continue
            if device is None:
                return events
            events.append((str(device.action), str(device.device_node or device.sys_path)))

    def close(self) -> None:
        """Stop listening and close the socket; safe to call twice."""
        if not self._closed:
            self._closed = True
            # pyudev has no explicit close; dropping the monitor frees the libudev
            # monitor and with it the socket.
            del self._monitor

    def __enter__(self) -> BlockDeviceMonitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

"""Host events that should wake the reconcile loop at once.

One thread polls two kernel sources - the mount table (``POLLPRI`` on
``/proc/self/mountinfo``) and block-device uevents (netlink) - plus a pipe used to stop
it. A new mount thus becomes a PV within milliseconds instead of at the next periodic
pass (upstream: up to 10 s). Either source may be unavailable (e.g. no netlink in a user
namespace); the periodic pass remains the safety net.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable

from localpv.host.block import BlockDeviceMonitor, BlockMonitorUnavailable
from localpv.host.mounts import MountTableWatcher

log = logging.getLogger(__name__)


class HostEventWatcher:
    """Calls ``on_event("mount")`` or ``on_event("block")`` when the host changes."""

    def __init__(self, on_event: Callable[[str], None], *, mounts: bool = True, block_devices: bool = True) -> None:
        self.on_event = on_event
        self._mounts = MountTableWatcher() if mounts else None
        self._block: BlockDeviceMonitor | None = None
        if block_devices:
            try:
                self._block = BlockDeviceMonitor()
            except BlockMonitorUnavailable as err:
                log.warning("%s; block devices are found by periodic scans only", err)
        self._stop_r, self._stop_w = os.pipe()
        self._thread: threading.Thread | None = None

    @property
    def sources(self) -> list[str]:
        return [name for name, src in (("mount", self._mounts), ("block", self._block)) if src is not None]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="host-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(5)
        for src in (self._mounts, self._block):
            if src is not None:
                src.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._stop_r, select.POLLIN)
        mount_fd = self._mounts.fileno() if self._mounts else -1
        block_fd = self._block.fileno() if self._block else -1
        if mount_fd >= 0:
            poller.register(mount_fd, select.POLLPRI | select.POLLERR)
        if block_fd >= 0:
            poller.register(block_fd, select.POLLIN)
        while True:
            for fd, mask in poller.poll():
                if fd == self._stop_r:
                    return
                if fd == mount_fd and mask & (select.POLLPRI | select.POLLERR):
                    self.on_event("mount")
                elif fd == block_fd and self._block is not None and self._block.drain():
                    self.on_event("block")

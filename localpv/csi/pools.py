"""Pools: named directories on a node where images are made, and how much room they have.

A pool is configured once for every node (``dynamicPools`` in the ConfigMap); each node
has its own directory of that name. Before anything is made in or read from a pool, the
agent asks whether the pool is *there*: its directory exists and, unless the pool says
``requireMount: false``, it is the root of a mounted filesystem. A pool whose disk did not
come back after a reboot is then a clear error (the stage fails, nothing is provisioned),
never a directory on the root filesystem silently filling up - the failure a plain
``local`` PV has when its mount is missing at boot.

Room is not decided here: every image on a pool's filesystem is one account
(:mod:`localpv.csi.account`, read and held by :mod:`localpv.csi.ledger`). A claim that does
not fit is rescheduled by the controller, so the scheduler can try another node.
"""

from __future__ import annotations

import os
from enum import Enum

from localpv.config.dynamic import PoolConfig
from localpv.csi.images import ImageStore
from localpv.host.mounts import FilesystemTypes, opened_at_filesystem_root


class PoolState(Enum):
    READY = "ready"
    MISSING = "missing"
    NOT_MOUNTED = "not-mounted"
    #: on a filesystem in memory: its images would not outlive a reboot
    VOLATILE = "volatile"


#: Filesystems that keep their files in memory only: a pool on one loses every image, and
#: the tenants' data in them, at the next reboot (or remount).
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def mounted_root(path: str) -> bool:
    """Whether the topmost mount at ``path`` is the root of a filesystem.

    Inside the agent's container a pool's hostPath is always a mount (a bind); what tells
    a mounted disk from a bare directory of the node's root filesystem is the mount's root:
    ``/`` when the host path is a filesystem's root, the directory's path otherwise.
    """
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return opened_at_filesystem_root(fd, path)
    finally:
        os.close(fd)


def _filesystem_type(path: str) -> str | None:
    """The type of the filesystem the directory ``path`` is on (the mount it was opened on,
    looked up in this namespace's mount table), None when it cannot be told."""
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return FilesystemTypes().of_fd(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


class Pool:
    """One configured pool on this node."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.images = ImageStore(config.mount_dir, require_mount=config.require_mount)

    @property
    def name(self) -> str:
        return self.config.name

    def state(self) -> tuple[PoolState, str]:
        """Whether images can be made and read here, and if not, a sentence saying why."""
        path = self.config.mount_dir
        if not os.path.isdir(path):
            return PoolState.MISSING, (f"pool {self.name}: directory {self.config.host_dir} does not exist on this "
                                       "node (is its disk attached and mounted?)")
        if self.config.require_mount and not mounted_root(path):
            return PoolState.NOT_MOUNTED, (
                f"pool {self.name}: nothing is mounted at {self.config.host_dir} (its disk is missing or not mounted "
                "yet); images are neither made nor staged from the root filesystem (set requireMount: false for a "
                "pool that is a plain directory)")
        if (fs_type := _filesystem_type(path)) in MEMORY_FILESYSTEMS:
            return PoolState.VOLATILE, (
                f"pool {self.name}: {self.config.host_dir} is on {fs_type}, which is memory: its images and their "
                "data would vanish at the next reboot; give the pool a directory on a disk's filesystem")
        return PoolState.READY, ""

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
from collections.abc import Collection, Sequence
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
    #: configured at another directory than the one its images were made in
    MOVED = "moved"


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


def move_refusal(name: str, recorded_dir: str | None, host_dir: str, volumes: Sequence[str],
                 present: Collection[str]) -> str:
    """Why pool ``name`` may not be used at ``host_dir`` now, or "" when it may. Pure.

    ``recorded_dir``: where its images were made on this node (the image journal); ``volumes``:
    the images recorded there that hold or may hold data (every state but ``creating``);
    ``present``: those of them found at ``host_dir``. A pool's directory changes when the
    ConfigMap or the Node's labels give the node another one (``nodes`` overrides). Its images
    stay where they are: used at the new directory, each would be "missing" (stages fail; a
    release would remove nothing and drop the record, leaving the image and its data behind
    unrecorded) and the account would count none of them (promises made twice). So the pool is
    refused, loudly, until it is back at its directory or its images are all at the new one
    (the disk was mounted elsewhere: the images moved with it, and the record follows them).
    """
    if recorded_dir is None or recorded_dir == host_dir or not volumes:
        return ""
    missing = [v for v in volumes if v not in present]
    if not missing:
        return ""
    sample = ", ".join(sorted(missing)[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    return (f"pool {name}: this node's configuration puts it at {host_dir}, but {len(volumes)} image(s) recorded in it "
            f"were made at {recorded_dir} and {len(missing)} are not at {host_dir} ({sample}); nothing is made, staged "
            f"or removed in the pool until it is at {recorded_dir} again (check the pool's nodes overrides and the "
            f"Node's labels) or its images are at {host_dir}")


class Pool:
    """One configured pool on this node."""

    def __init__(self, config: PoolConfig, refusal: str = "") -> None:
        self.config = config
        #: Why the pool is not used at its configured directory (:func:`move_refusal`), or "".
        self.refusal = refusal
        self.images = ImageStore(config.mount_dir, require_mount=config.require_mount)

    @property
    def name(self) -> str:
        return self.config.name

    def state(self) -> tuple[PoolState, str]:
        """Whether images can be made and read here, and if not, a sentence saying why."""
        if self.refusal:
            return PoolState.MOVED, self.refusal
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

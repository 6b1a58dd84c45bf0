"""The watch over dynamic volumes handed out: look at each image, say what is wrong, where
people look (``VolumeConditionAbnormal`` on the claim and the PV, a Warning on the Node for a
pool at risk, the ``localpv_volume_condition`` gauge, ``localpv status``).

Every ``period`` (and when asked: a call of :meth:`HealthWatch.poke`), the watch reads the
node - which loop devices the kernel binds to which file, the mount table, each image's
superblock and allocation, ext4's error counters - into plain data (:class:`Looks`), and
:func:`localpv.csi.health.assess` decides. Reporting never changes a tenant's data. The one
thing the watch does besides reporting restores a promise without touching data: a thick
image whose blocks a discard gave back (``fstrim`` in a pod) gets them allocated again at
once, not only at its next stage.

``/healthz`` holds the watch to its period: a look that has not completed for three periods
(a pool's disk hung under statfs, a bug that kills the loop) fails the agent's health.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence

from localpv.clock import Clock, SystemClock
from localpv.csi import loop, mounting
from localpv.csi.health import ImageLook, Looks, MountLook, PoolRisk, assess
from localpv.csi.images import IMAGE_FILE, ImageError, read_block_uuid, read_fs_uuid
from localpv.csi.pools import Pool, PoolState
from localpv.csi.volume import POOL, PROVISIONING
from localpv.host.mounts import MountInfo, read_mountinfo
from localpv.kube.events import NORMAL, WARNING, EventRecorder
from localpv.kube.objects import Obj
from localpv.kube.volumehealth import HealthReporter

log = logging.getLogger(__name__)

#: Pool states in which its images can be looked at.
_READABLE = (PoolState.READY, PoolState.VOLATILE)


class HealthWatch:
    """Looks at this node's dynamic volumes every ``period`` seconds, and reports."""

    def __init__(self, *, node: Callable[[], Obj | None], pvs: Callable[[], Sequence[Obj]],
                 pools: Callable[[], Mapping[str, Pool]], staged: Callable[[], Mapping[str, str]],
                 risks: Callable[[], Mapping[str, PoolRisk]], recorder: EventRecorder, period: float = 60.0,
                 clock: Clock | None = None) -> None:
        self.node = node
        self.pvs = pvs
        self.pools = pools
        self.staged = staged
        self.risks = risks
        self.recorder = recorder
        self.period = period
        self.clock = clock or SystemClock()
        self.reporter = HealthReporter()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_look: float | None = None
        self._started = self.clock.monotonic()
        self._pool_risks: dict[str, str] = {}
        self.looks = 0

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """The supervised loop: a look now, then one per period or when poked."""
        while not self._stop.is_set():
            self.look_once()
            self._wake.wait(self.period)
            self._wake.clear()

    def poke(self) -> None:
        """Look again soon (a volume was staged or unstaged, a pool changed)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def problems(self) -> list[str]:
        """Why the watch is not doing its job (for ``/healthz``): no look for three periods."""
        since = self._last_look if self._last_look is not None else self._started
        late = self.clock.monotonic() - since
        if late > 3 * self.period:
            return [f"the dynamic volumes' health watch has not completed a look for {late:.0f}s (a pool's disk "
                    "may hang)"]
        return []

    def look_once(self) -> None:
        pvs = list(self.pvs())
        looks = Looks(images=self.look(pvs), risks=dict(self.risks()))
        assessment = assess(pvs, looks, self.reporter.baselines)
        for obj, type_, reason, message in self.reporter.update(assessment):
            self.recorder.event(obj, type_, reason, message)
        self._report_pools(looks.risks)
        self._last_look = self.clock.monotonic()
        self.looks += 1

    def _report_pools(self, risks: Mapping[str, PoolRisk]) -> None:
        """A Warning on the Node when a pool comes at risk (or its figures change much), a
        Normal event when it no longer is."""
        node = self.node()
        now = {name: risk.sentence() for name, risk in risks.items()}
        for name, sentence in now.items():
            if self._pool_risks.get(name) != sentence and node is not None:
                self.recorder.event(node, WARNING, "PoolOvercommitted", sentence)
        for name in set(self._pool_risks) - set(now):
            if node is not None:
                self.recorder.event(node, NORMAL, "PoolNormal", f"pool {name} can hold what its thin volumes may "
                                                                 "still write again")
        self._pool_risks = now

    # ------------------------------------------------------------------ looking

    def look(self, pvs: Sequence[Obj]) -> dict[str, ImageLook]:
        """What the node shows of each PV's image."""
        kernel = loop.kernel_loops(named=f"/{IMAGE_FILE}")
        mounts: dict[str, list[MountInfo]] = {}
        table = read_mountinfo()
        for info in table:
            mounts.setdefault(info.major_minor, []).append(info)
        binds = mounting.all_device_binds(table)  # Block volumes' device files
        deleted = {device.number: path for device in loop.bound(named=f"/{IMAGE_FILE} (deleted)")
                   if (path := loop.backing_file(device) or "")}
        staged = self.staged()
        pools = self.pools()
        looks = {}
        for pv in pvs:
            name = str((pv.get("metadata") or {}).get("name") or "")
            attributes = (((pv.get("spec") or {}).get("csi") or {}).get("volumeAttributes") or {})
            pool = pools.get(str(attributes.get(POOL) or ""))
            thick = attributes.get(PROVISIONING) == "thick"
            looks[name] = self._look_one(name, pool, thick, kernel, mounts, binds, deleted, staged.get(name))
        return looks

    def _look_one(self, name: str, pool: Pool | None, thick: bool, kernel: Mapping[loop.FileKey, list[loop.Loop]],
                  mounts: Mapping[str, list[MountInfo]], binds: Mapping[tuple[int, int], list[MountInfo]],
                  deleted: Mapping[int, str],
                  staged_at: str | None) -> ImageLook:
        gone = tuple(n for n, path in deleted.items() if f"/{name}/" in path)
        if pool is None:
            return ImageLook(pool_problem="its pool is not configured on this node", deleted_loops=gone)
        state, why = pool.state()
        if state not in _READABLE:
            return ImageLook(pool_problem=why, deleted_loops=gone)
        try:
            with pool.images.open_image(name, writable=thick) as fd:
                st = os.fstat(fd)
                block_uuid = read_block_uuid(fd)
                # A Block image's content is the tenant's: whatever superblock it holds says nothing.
                fs_uuid = read_fs_uuid(fd) if block_uuid is None else None
                allocation = _heal_thick(fd, name) if thick and st.st_blocks * 512 < st.st_size else None
                if allocation is None and thick:
                    st = os.fstat(fd)
        except ImageError as err:
            if err.missing:
                return ImageLook(present=False, deleted_loops=gone, staged_at=staged_at)
            return ImageLook(pool_problem=str(err), deleted_loops=gone)
        except OSError as err:
            return ImageLook(pool_problem=f"the image cannot be read ({err.strerror})", deleted_loops=gone)
        devices = kernel.get(loop.file_key(st), [])
        if block_uuid is not None:  # its device's node bound at the staging file, the targets
            files = [m for device in devices for m in binds.get(device.rdev, [])]
            if staged_at is None:  # after a restart: the staging file is named after the volume
                staged_at = next((m.mount_point for m in files if os.path.basename(m.mount_point) == name), None)
            return ImageLook(
                present=True, block_uuid=block_uuid, size=st.st_size, allocated=st.st_blocks * 512,
                loops=tuple(d.number for d in devices), deleted_loops=gone,
                mounts=tuple(MountLook(m.mount_point, False) for m in files), staged_at=staged_at,
                allocation_problem=allocation)
        seen = [m for device in devices for m in mounts.get(f"{loop.LOOP_MAJOR}:{device.number}", [])]
        if staged_at is None:  # after a restart: the image's filesystem mount that is no pod's bind
            staged_at = next((m.mount_point for m in seen if "/pods/" not in m.mount_point), None)
        return ImageLook(
            present=True, fs_uuid=fs_uuid, size=st.st_size, allocated=st.st_blocks * 512,
            loops=tuple(d.number for d in devices), deleted_loops=gone,
            mounts=tuple(MountLook(m.mount_point, "ro" in m.super_options.split(",")) for m in seen),
            staged_at=staged_at, fs_errors=_ext4_errors(devices[0]) if devices and seen else None,
            allocation_problem=allocation)


def _heal_thick(fd: int, name: str) -> str | None:
    """Allocate the holes of a thick image (data untouched); None when done, else why not."""
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            return ("blocks of this thick volume were given back to the pool (a discard, such as fstrim) and the pool "
                    "has no room to allocate them again: writes may fail with ENOSPC below its size; free space in "
                    "the pool")
        return f"its thick image cannot be allocated again ({err.strerror})"
    log.info("volume %s: blocks a discard gave back were allocated again (a thick volume keeps its room)", name)
    return None


def _ext4_errors(device: loop.Loop) -> int | None:
    try:
        with open(f"/sys/fs/ext4/loop{device.number}/errors_count", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None

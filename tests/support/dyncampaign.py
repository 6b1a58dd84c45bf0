"""Fault campaign for dynamic volumes: a real agent as the CSI node plugin, a campaign that
plays the scheduler and the kubelet, tenants that write data, and ``kill -9`` at random.

The agent runs as it does in a pod: each incarnation in a mount namespace of its own (``unshare
-m``) that sees the pools through a slave bind mount (a hostPath with HostToContainer
propagation) and mounts into the kubelet's directory, which is shared with the campaign's
namespace (Bidirectional), and in a PID namespace of its own, so that killing it kills every
process it started, as a container's death does. When an incarnation is killed, its namespace dies with it: the
loop devices it attached report their backing file by a path that resolves nowhere - what a
restarted agent container meets.

One pool (an ext4 filesystem on a loop device) holds the images of two classes, one thin and
one thick, with an over-commit bound and reserved bytes. Tenants claim volumes of random
sizes and classes (the campaign sets the selected node, as the scheduler does), and once the
claim is Bound they go through what the kubelet does for a pod: NodeStageVolume,
NodePublishVolume, a file of random data written and fsynced, sometimes an expansion (the
claim's request raised, then NodeExpandVolume; offline when the kernel refuses an online
ext4 growth), ``fstrim`` on thick volumes, a pod restart (unpublish, unstage, stage and
publish again, the data read back), and in the end unpublish, unstage and the claim deleted.
The kubelet's calls are repeated (a retry after a success) and interrupted (a deadline that
ends before the answer; the call goes on in the agent and is asked again). A tenant whose
claim is rescheduled (no room: the agent removed the selected-node annotation) deletes it.

Cycle kinds, drawn from a generator seeded by the seed alone:

* ``faults``      - API faults (as the agent campaign's) and a SIGKILL at a random instant;
* ``restart``     - the agent is SIGKILLed while volumes are staged and started again in a new
  namespace; every staged tenant's kubelet then repeats NodeStageVolume (it does after its
  own restart) and tries a second stage at another staging path, which must be refused;
* ``pool-remount`` - the operator unmounts the pool disk (once every pod has left it), claims
  made meanwhile must be refused and rescheduled, the disk is mounted again.

Invariants, checked on every tick:

* ``mounted-twice``   - no image is bound to two loop devices, and no loop device's filesystem
  is mounted at two staging paths (one filesystem mounted read-write twice is corrupted);
* ``removed-attached`` - no image is removed (unlinked) while a loop device is bound to it;
* ``over-promised``   - the images recorded in the agent's journal never promise more than
  ``overcommit x size - reserved`` of the pool;
* ``thinned``         - a thick image is whole whenever it is staged (``fstrim`` in a pod gives
  blocks back; they are allocated again before the pod has the volume again);
* ``data``            - every tenant reads back what it wrote, after every stage;
* ``second-stage``    - a second stage of a staged image at another path is refused;
* ``eventually``      - once the faults stop, every claim is served or refused, every deleted
  claim's image is gone, no loop device is left on the pool, and the journal is empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.rpc import unary_call
from localpv.naming import parse_quantity
from localpv_emulator.apiserver import ApiError
from localpv_emulator.objects import claim, node, storage_class
from tests.support.campaign import Violation, _Campaign
from tests.support.hostfs import LoopDevices, MiB, Mounter, sh

NODE = "dyn-node"
DRIVER = "local.csi.localpv.dev"
POOL = "pool"
CLASSES = {"dyn-thin": "thin", "dyn-thick": "thick"}
CYCLE_KINDS = {"faults": 6, "restart": 4, "pool-remount": 2}
SELECTED_NODE = "volume.kubernetes.io/selected-node"
_LOOP_GET_STATUS64 = 0x4C05
_INFO64 = struct.Struct("=QQQQQIIII64s64s32sQQ")
_SINGLE_WRITER = csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER


def kernel_loops(suffix: str = "/disk.img") -> dict[tuple[int, int], list[int]]:
    """Every loop device bound to an image (its backing path ends with ``suffix``) by the
    (device, inode) of its backing file, as the kernel holds it."""
    found: dict[tuple[int, int], list[int]] = {}
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        number = int(backing.parent.parent.name[4:])
        try:
            if not backing.read_text().rstrip("\n").endswith(suffix):
                continue  # not an image: never opened (it would defer someone's losetup -d)
            fd = os.open(f"/dev/loop{number}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            buf = bytearray(_INFO64.size)
            fcntl.ioctl(fd, _LOOP_GET_STATUS64, buf)
        except OSError:
            continue  # detached meanwhile
        finally:
            os.close(fd)
        device, inode = _INFO64.unpack(buf)[:2]
        found.setdefault((device, inode), []).append(number)
    return found


def _mountinfo() -> list[tuple[str, str, str]]:
    """(major:minor, root, mount point) of every mount of this namespace."""
    rows = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            rows.append((parts[2], parts[3], parts[4].replace("\\040", " ")))
    return rows


@dataclass
class _Tenant:
    index: int
    state: str = "idle"
    claim: str = ""
    pv: str = ""
    storage_class: str = ""
    size: int = 0
    pod: int = 0
    digest: str = ""
    expand_to: int = 0
    restarting: bool = False
    #: A stage was asked (maybe interrupted): as the kubelet, it may be staged until unstaged.
    maybe_staged: bool = False
    #: Likewise for a publish: the kubelet unpublishes before it unstages.
    maybe_published: bool = False
    since: float = 0.0

    def staging(self, kubelet: Path) -> Path:
        return kubelet / "plugins" / "kubernetes.io" / "csi" / "pv" / self.pv / "globalmount"

    def target(self, kubelet: Path) -> Path:
        return kubelet / "pods" / f"pod-{self.index}-{self.pod}" / "volumes" / "kubernetes.io~csi" / self.pv / "mount"


@dataclass
class DynamicReport:
    cycles: int = 0
    kills: int = 0
    tenants: int = 0
    checks: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)
    rescheduled: int = 0
    expanded: int = 0
    trimmed: int = 0
    second_stages_refused: int = 0
    interrupted: int = 0
    repeated: int = 0
    remounts: int = 0
    max_promised: int = 0
    bound: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        kinds = ", ".join(f"{k} x{v}" for k, v in sorted(self.kinds.items()))
        faults = ", ".join(f"{k} x{v}" for k, v in sorted(self.faults.items())) or "none"
        return (f"{self.cycles} cycles ({kinds}), {self.kills} SIGKILLs, {self.tenants} tenants wrote and read back, "
                f"{self.checks} invariant checks; {self.rescheduled} claims rescheduled (no room), "
                f"{self.expanded} expansions, {self.trimmed} fstrims of thick volumes, {self.repeated} repeated and "
                f"{self.interrupted} interrupted kubelet calls, {self.second_stages_refused} second stages refused, "
                f"{self.remounts} pool remounts; at most {self.max_promised >> 20} MiB of {self.bound >> 20} MiB "
                f"promised; faults: {faults}; {self.seconds:.0f} s")


class DynamicCampaign(_Campaign):
    """The dynamic-volume campaign; :meth:`run` returns a report or raises :class:`Violation`."""

    def __init__(self, workdir: Path, *, tenants: int = 6, cycles: int = 5, cycle_seconds: float = 4.0,
                 seed: int = 1, settle_timeout: float = 90.0, forced: tuple[str, ...] = (),
                 pool_size: int = 256 * MiB, overcommit: float = 2.0, reserved: int = 16 * MiB) -> None:
        super().__init__(workdir, cycles=cycles, cycle_seconds=cycle_seconds, seed=seed,
                         settle_timeout=settle_timeout)
        self.report: DynamicReport = DynamicReport()  # type: ignore[assignment]
        import random

        kinds_rng = random.Random(f"dyn-kinds-{seed}")
        self.schedule = [*forced, *kinds_rng.choices(list(CYCLE_KINDS), list(CYCLE_KINDS.values()),
                                                     k=max(0, cycles - len(forced)))]
        self.tenants = [_Tenant(i) for i in range(tenants)]
        self.pool_size, self.overcommit, self.reserved = pool_size, overcommit, reserved
        # Socket paths must fit in sun_path (108 bytes): the kubelet dir is short.
        self.short = Path(tempfile.mkdtemp(prefix="lpvc-", dir="/tmp"))
        self.kubelet = self.short / "k"
        self.pools = workdir / "pools"  # the host's view; the agent sees it at ``view``
        self.view = workdir / "agent-view"
        self.state_dir = workdir / "state"
        self.mounter = Mounter()
        self.loops = LoopDevices(workdir)
        self._pool_device = ""
        self._channel: grpc.Channel | None = None
        self._claims = 0
        self._paused = False
        self._pool_mounted = True
        self._faults: list[str] = []
        self._last_note = ""

    # ------------------------------------------------------------------ setup

    def _setup(self) -> dict[str, list[str]]:
        self.kubelet.mkdir(parents=True)
        self.mounter.bind(self.kubelet, self.kubelet)
        sh("mount", "--make-rshared", self.kubelet)
        self.pools.mkdir()
        self.mounter.bind(self.pools, self.pools)
        sh("mount", "--make-rshared", self.pools)
        disk = self.loops.attach(self.pool_size, ext4=True)
        self._pool_device = disk.path
        self.mounter.device(disk.path, self.pools / POOL)
        self.view.mkdir()
        self.server.create(node(NODE))
        for name, provisioning in CLASSES.items():
            sc = storage_class(name, provisioner=DRIVER)
            sc["allowVolumeExpansion"] = True
            sc["parameters"] = {"pool": POOL, "provisioning": provisioning}
            self.server.create(sc)
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump({
            "dynamicPools": {POOL: {"hostDir": str(self.pools / POOL), "mountDir": str(self.view / POOL),
                                    "overcommit": self.overcommit, "reserved": str(self.reserved)}},
            "dynamicClassMap": {name: {"pool": POOL, "provisioning": p} for name, p in CLASSES.items()}}))
        kubeconfig = self.workdir / "kubeconfig"
        self.server.write_kubeconfig(str(kubeconfig))
        agent = [sys.executable, "-m", "localpv", "agent", "--config", str(config), "--node", NODE,
                 "--kubeconfig", str(kubeconfig), "--listen-address", "127.0.0.1:0", "--state-dir",
                 str(self.state_dir), "--kubelet-dir", str(self.kubelet), "--discovery-period", "1s"]
        # Each incarnation as a container: a mount namespace of its own that sees the pools through a
        # slave bind (HostToContainer), and a PID namespace, so that killing it kills what it ran
        # (a container's processes die with it: no mount or e2fsck of a dead agent goes on).
        script = (f"mount --rbind {self.pools} {self.view} && mount --make-rslave {self.view} && "
                  f"exec {' '.join(agent)}")
        # The claim labeller, as the chart runs it beside the agents: the agent sees a claim only
        # once it is labelled with its node. It is killed and started again like the agent.
        labeller = [sys.executable, "-m", "localpv", "claim-labeller", "--kubeconfig", str(kubeconfig),
                    "--listen-address", "", "--no-leader-election", "--driver-name", DRIVER]
        return {"agent": ["unshare", "-m", "-p", "-f", "--kill-child", "--propagation", "unchanged", "--",
                          "sh", "-c", script], "labeller": labeller}

    def _teardown(self) -> None:
        if self._channel is not None:
            self._channel.close()
        for tenant in self.tenants:  # what the agent no longer undoes
            if tenant.pv:
                for path in (tenant.target(self.kubelet), tenant.staging(self.kubelet)):
                    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        if not self._pool_mounted:
            self.mounter.device(self._pool_device, self.pools / POOL)
        self.mounter.umount_all()
        self.loops.detach_all()
        shutil.rmtree(self.short, ignore_errors=True)

    def _sigkill(self, name: str) -> None:
        """Kill an incarnation and wait until every process of its PID namespace is gone (its
        mounts with them): killing ``unshare`` has the kernel kill the namespace's first process,
        a moment later."""
        proc = self._procs.get(name)
        children: list[str] = []
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        super()._sigkill(name)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in children):
            if time.monotonic() > deadline:
                raise Violation("campaign", f"the agent's processes {children} outlived it by 30 s")
            threading.Event().wait(0.01)

    def _note(self, text: str) -> None:
        """A line in ``campaign.log`` next to ``agent.log``: what the campaign did, and when
        (a line repeating the one before is left out: a retried call says the same each tick)."""
        if text == self._last_note:
            return
        self._last_note = text
        with open(self.workdir / "campaign.log", "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {text}\n")

    # ------------------------------------------------------------------ the kubelet's calls

    def _node(self, method: str, request: Any, answer: type[Any], *, interrupt: bool = True) -> bool:
        """One CSI call as the kubelet makes it: True when it succeeded; False when it must be
        asked again later (agent down, busy, interrupted by its deadline)."""
        short = interrupt and self.rng.random() < 0.08
        self.report.calls[method] += 1
        try:
            unary_call(self._channel_(), f"/csi.v1.Node/{method}", request, answer, timeout=0.002 if short else 30.0)
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and short:
                self.report.interrupted += 1
                return False
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.DEADLINE_EXCEEDED):
                return False
            self._note(f"{method}: {code.name}: {err.details()}")  # type: ignore[attr-defined]
            return False
        return True

    def _channel_(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.kubelet}/plugins/{DRIVER}/csi.sock")
        return self._channel

    def _context(self, tenant: _Tenant) -> dict[str, str]:
        pv = self.server.get("v1", "PersistentVolume", tenant.pv) or {}
        return dict(((pv.get("spec") or {}).get("csi") or {}).get("volumeAttributes") or {})

    def _capability(self) -> csi.VolumeCapability:
        return csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume(fs_type="ext4"),
                                    access_mode=csi.VolumeCapability.AccessMode(mode=_SINGLE_WRITER))

    def _stage(self, tenant: _Tenant, staging: Path | None = None) -> bool:
        if staging is None:
            tenant.maybe_staged = True
        request = csi.NodeStageVolumeRequest(volume_id=tenant.pv, staging_target_path=str(
            staging or tenant.staging(self.kubelet)), volume_capability=self._capability(),
            volume_context=self._context(tenant))
        return self._node("NodeStageVolume", request, csi.NodeStageVolumeResponse, interrupt=staging is None)

    def _publish(self, tenant: _Tenant) -> bool:
        tenant.maybe_published = True
        return self._node("NodePublishVolume", csi.NodePublishVolumeRequest(
            volume_id=tenant.pv, staging_target_path=str(tenant.staging(self.kubelet)),
            target_path=str(tenant.target(self.kubelet)), volume_capability=self._capability(),
            volume_context=self._context(tenant)), csi.NodePublishVolumeResponse)

    def _unpublish(self, tenant: _Tenant) -> bool:
        return self._node("NodeUnpublishVolume", csi.NodeUnpublishVolumeRequest(
            volume_id=tenant.pv, target_path=str(tenant.target(self.kubelet))), csi.NodeUnpublishVolumeResponse)

    def _unstage(self, tenant: _Tenant) -> bool:
        return self._node("NodeUnstageVolume", csi.NodeUnstageVolumeRequest(
            volume_id=tenant.pv, staging_target_path=str(tenant.staging(self.kubelet))),
            csi.NodeUnstageVolumeResponse)

    def _expand(self, tenant: _Tenant) -> bool:
        return self._node("NodeExpandVolume", csi.NodeExpandVolumeRequest(
            volume_id=tenant.pv, volume_path=str(tenant.target(self.kubelet)),
            staging_target_path=str(tenant.staging(self.kubelet)),
            capacity_range=csi.CapacityRange(required_bytes=tenant.expand_to)), csi.NodeExpandVolumeResponse)

    # ------------------------------------------------------------------ tenants

    def _tick(self) -> None:
        self._check()
        for tenant in self.tenants:
            self._advance(tenant)

    def _advance(self, t: _Tenant) -> None:
        now = time.monotonic()
        if t.state == "idle":
            if self._paused or self.rng.random() > 0.3:
                return
            self._claims += 1
            t.claim, t.storage_class = f"c{self._claims}", self.rng.choice(sorted(CLASSES))
            t.size = self.rng.choice((8, 16, 24, 32, 48, 64, 96)) * MiB
            self.server.create(claim(t.claim, t.storage_class, size=f"{t.size >> 20}Mi", selected_node=NODE))
            t.state, t.since, t.pv, t.expand_to, t.restarting = "claimed", now, "", 0, False
        elif t.state == "claimed":
            pvc = self.server.get("v1", "PersistentVolumeClaim", t.claim, "default") or {}
            if (pvc.get("status") or {}).get("phase") == "Bound":
                t.pv, t.state = str(pvc["spec"]["volumeName"]), "bound"
            elif SELECTED_NODE not in ((pvc.get("metadata") or {}).get("annotations") or {}):
                self.report.rescheduled += 1  # no room here, and there is no other node
                self._note(f"claim {t.claim} ({t.storage_class}, {t.size >> 20} MiB) rescheduled")
                self._delete_claim(t)
        elif t.state == "bound":
            if self._paused:
                # A stage the kubelet asked for and got no answer to may have happened: the
                # kubelet unstages such a volume before it lets it go (its "uncertain" state).
                t.state = "unstaging" if t.maybe_staged else "parked"
            elif self._stage(t):
                self._whole_if_thick(t)
                self._second_stage(t)
                if self.rng.random() < 0.3:  # the kubelet repeats a stage it has no answer for
                    self.report.repeated += 1
                    if not self._stage(t):
                        return
                t.pod += 1
                t.state = "staged"
        elif t.state == "staged":
            if self._paused:
                t.state = "unpublishing" if t.maybe_published else "unstaging"
            elif self._publish(t):
                t.state, t.since = "published", now
                self._verify_or_write(t)
        elif t.state == "published":
            self._live(t, now)
        elif t.state == "unpublishing":
            if self._unpublish(t):
                t.state, t.maybe_published = "unstaging", False
        elif t.state == "unstaging":
            if self._unstage(t):
                t.maybe_staged = False
                if self._paused:
                    t.state = "parked"
                elif t.restarting:
                    t.state, t.restarting = "bound", False  # the pod comes back: staged again, data read back
                else:
                    self._delete_claim(t)
        elif t.state == "parked" and not self._paused:
            t.state = "bound"

    def _live(self, t: _Tenant, now: float) -> None:
        """A running pod: sometimes it asks for more room, trims, restarts, or ends."""
        if self._paused:
            t.state, t.restarting = "unpublishing", True
            return
        if t.expand_to:
            self._expanding(t, now)
            return
        roll = self.rng.random()
        if roll < 0.05 and t.size < 96 * MiB:
            t.expand_to, t.since = t.size + self.rng.choice((8, 16)) * MiB, now
            pvc = self.server.get("v1", "PersistentVolumeClaim", t.claim, "default")
            if pvc is not None:
                pvc["spec"]["resources"]["requests"]["storage"] = f"{t.expand_to >> 20}Mi"
                with contextlib.suppress(ApiError):
                    self.server.update(pvc)
        elif roll < 0.1 and CLASSES[t.storage_class] == "thick":
            subprocess.run(["fstrim", str(t.target(self.kubelet))], capture_output=True, check=False)
            self.report.trimmed += 1
        elif now - t.since > self.rng.uniform(1.0, 3.0):
            t.state, t.restarting = "unpublishing", self.rng.random() < 0.5

    def _expanding(self, t: _Tenant, now: float) -> None:
        """The kubelet's NodeExpandVolume once the controller grew the image and the PV."""
        pv = self.server.get("v1", "PersistentVolume", t.pv) or {}
        if capacity_of(pv) < t.expand_to:
            if now - t.since > 15:  # no room to grow: the claim keeps asking, the pod goes on
                t.expand_to = 0
            return
        request = csi.NodeExpandVolumeRequest(volume_id=t.pv, volume_path=str(t.target(self.kubelet)),
                                              staging_target_path=str(t.staging(self.kubelet)),
                                              capacity_range=csi.CapacityRange(required_bytes=t.expand_to))
        try:
            unary_call(self._channel_(), "/csi.v1.Node/NodeExpandVolume", request, csi.NodeExpandVolumeResponse,
                       timeout=30.0)
        except grpc.RpcError as err:
            if "CAP_SYS_RESOURCE" in (err.details() or ""):  # type: ignore[attr-defined]
                # Grown offline at the next stage: the pod restarts.
                t.size, t.expand_to, t.state, t.restarting = t.expand_to, 0, "unpublishing", True
                self.report.expanded += 1
            return
        t.size, t.expand_to = t.expand_to, 0
        self.report.expanded += 1

    def _verify_or_write(self, t: _Tenant) -> None:
        """Read back what the tenant wrote (after every stage), or write it the first time."""
        path = t.target(self.kubelet) / "data"
        if t.digest:
            try:
                found = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as err:
                raise Violation("data", f"{t.claim} ({t.pv}): cannot read its data back: {err}") from err
            if found != t.digest:
                raise Violation("data", f"{t.claim} ({t.pv}): its data changed")
            return
        data = os.urandom(self.rng.randint(64 << 10, 2 * MiB))
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        t.digest = hashlib.sha256(data).hexdigest()
        self.report.tenants += 1

    def _second_stage(self, t: _Tenant, *, always: bool = False) -> None:
        """The same image staged at another path: must be refused while it is staged."""
        if not always and self.rng.random() > 0.3:
            return
        other = self.kubelet / "plugins" / "kubernetes.io" / "csi" / "pv" / t.pv / "other"
        request = csi.NodeStageVolumeRequest(volume_id=t.pv, staging_target_path=str(other),
                                             volume_capability=self._capability(), volume_context=self._context(t))
        try:
            unary_call(self._channel_(), "/csi.v1.Node/NodeStageVolume", request, csi.NodeStageVolumeResponse,
                       timeout=30.0)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:  # type: ignore[attr-defined]
                self.report.second_stages_refused += 1
            return
        finally:
            with contextlib.suppress(OSError):
                other.rmdir()
        subprocess.run(["umount", str(other)], capture_output=True, check=False)
        raise Violation("second-stage", f"{t.pv} staged at {t.staging(self.kubelet)} was staged again at {other}")

    def _whole_if_thick(self, t: _Tenant) -> None:
        """A thick volume is whole whenever it is staged: what a discard gave back (``fstrim`` in
        the pod) is allocated again before the pod gets it back."""
        if CLASSES[t.storage_class] != "thick":
            return
        st = (self.pools / POOL / t.pv / "disk.img").stat()
        if st.st_blocks * 512 < st.st_size:
            raise Violation("thinned", f"thick image {t.pv} staged with {st.st_blocks * 512} of {st.st_size} bytes "
                                       "allocated")

    def _delete_claim(self, t: _Tenant) -> None:
        assert not t.maybe_staged and not t.maybe_published, \
            f"{t.pv}: the campaign let a claim go with its volume maybe staged or published"
        with contextlib.suppress(ApiError):
            self.server.delete("v1", "PersistentVolumeClaim", t.claim, "default")
        t.state, t.claim, t.pv, t.digest, t.expand_to = "idle", "", "", "", 0

    # ------------------------------------------------------------------ invariants

    def _journal(self) -> dict[str, dict[str, Any]]:
        try:
            doc = json.loads((self.state_dir / "csi-images.json").read_text())
        except (OSError, ValueError):
            return {}
        images = doc.get("images") if isinstance(doc, dict) else None
        return images if isinstance(images, dict) else {}

    def _check(self) -> None:
        self.report.checks += 1
        pool = self.pools / POOL
        loops = kernel_loops()
        images: dict[tuple[int, int], Path] = {}
        if self._pool_mounted:
            for image in pool.glob("*/disk.img"):
                with contextlib.suppress(OSError):
                    st = image.stat()
                    images[(st.st_dev, st.st_ino)] = image
        for key, image in images.items():
            numbers = loops.get(key, [])
            if len(numbers) > 1:
                raise Violation("mounted-twice", f"{image} is bound to {len(numbers)} loop devices: {numbers}")
        staging_root = str(self.kubelet / "plugins" / "kubernetes.io")
        staged: Counter[str] = Counter(dev for dev, root, point in _mountinfo()
                                       if point.startswith(staging_root + "/") and dev.startswith("7:"))
        twice = [dev for dev, count in staged.items() if count > 1]
        if twice:
            raise Violation("mounted-twice", f"loop device(s) {twice} mounted at two staging paths")
        if self._pool_mounted:
            device = os.stat(pool).st_dev
            deleted = [n for (dev, _ino), ns in kernel_loops("/disk.img (deleted)").items() if dev == device
                       for n in ns]
            if deleted:
                raise Violation("removed-attached", f"loop device(s) {deleted} read an image of the pool that was "
                                                    "deleted while attached")
        journal = self._journal()
        if self._pool_mounted:
            st = os.statvfs(pool)
            bound = int(st.f_blocks * st.f_frsize * self.overcommit) - self.reserved
            promised = sum(int(r.get("size") or 0) for r in journal.values() if r.get("pool") == POOL)
            self.report.bound = bound
            self.report.max_promised = max(self.report.max_promised, promised)
            if promised > bound:
                raise Violation("over-promised", f"{promised} bytes promised in pool {POOL}, bound {bound} "
                                                 f"(overcommit {self.overcommit} x size - {self.reserved} reserved)")

    # ------------------------------------------------------------------ cycles

    def _cycle(self) -> None:
        kind = self.schedule[self.report.cycles] if self.report.cycles < len(self.schedule) else "faults"
        self.report.kinds[kind] += 1
        self._note(f"cycle {self.report.cycles}: {kind}")
        if kind == "faults":
            super()._cycle()
            return
        end = time.monotonic() + self.cycle_seconds
        if kind == "restart":
            self._restart_cycle(end)
        else:
            self._remount_cycle(end)
        self._run_until(end)

    def _run_until(self, end: float, done: Any = None) -> bool:
        while time.monotonic() < end:
            self._tick()
            if done is not None and done():
                return True
            threading.Event().wait(self.tick_interval)
        return False

    def _restart_cycle(self, end: float) -> None:
        """Kill the agent while volumes are staged; the kubelet then repeats NodeStageVolume of
        each staged volume (and a second stage elsewhere must be refused)."""
        self._run_until(end + 30, lambda: any(t.state in ("staged", "published") for t in self.tenants))
        self._sigkill("agent")
        self.report.kills += 1
        self._note("agent SIGKILLed with volumes staged; started again in a new namespace")
        self._start("agent")
        for t in self.tenants:
            if t.state in ("staged", "published"):
                deadline = time.monotonic() + 30
                while not self._node("NodeStageVolume", csi.NodeStageVolumeRequest(
                        volume_id=t.pv, staging_target_path=str(t.staging(self.kubelet)),
                        volume_capability=self._capability(), volume_context=self._context(t)),
                        csi.NodeStageVolumeResponse, interrupt=False):
                    if time.monotonic() > deadline:
                        raise Violation("restart", f"{t.pv}: a repeated NodeStageVolume of a staged volume "
                                                   "failed for 30 s after an agent restart")
                    threading.Event().wait(0.05)
                self._second_stage(t, always=True)

    def _remount_cycle(self, end: float) -> None:
        """The operator unmounts the pool disk once no pod uses it, and mounts it again."""
        self._paused = True
        if not self._run_until(end + 60, lambda: all(t.state in ("idle", "claimed", "parked") for t in self.tenants)
                               and not kernel_loops_on(self.pools / POOL)):
            raise Violation("eventually", "pods did not leave the pool within 60 s for its remount")
        self.mounter.umount(self.pools / POOL)
        self._pool_mounted = False
        self._note("pool unmounted")
        self._paused = False
        self._run_until(time.monotonic() + self.cycle_seconds / 2)
        self._paused = True
        self._run_until(time.monotonic() + 30, lambda: all(t.state in ("idle", "claimed", "parked")
                                                           for t in self.tenants))
        self.mounter.device(self._pool_device, self.pools / POOL)
        self._pool_mounted = True
        self.report.remounts += 1
        self._note("pool mounted again")
        self._paused = False

    # ------------------------------------------------------------------ the end

    def _settle(self) -> None:
        """Faults off: every tenant finishes; then every claim goes and nothing is left."""
        deadline = time.monotonic() + self.settle_timeout
        self._paused = True
        while not all(t.state in ("idle", "parked", "claimed") for t in self.tenants):
            if time.monotonic() > deadline:
                states = {t.claim: t.state for t in self.tenants if t.state != "idle"}
                raise Violation("eventually", f"tenants did not finish within {self.settle_timeout:.0f} s: {states}")
            self._tick()
            threading.Event().wait(self.tick_interval)
        for t in self.tenants:
            if t.claim:
                self._delete_claim(t)

        def empty() -> bool:
            self._check()
            pvs = [pv for pv in self.server.list("v1", "PersistentVolume")
                   if (pv.get("spec") or {}).get("storageClassName") in CLASSES]
            return not pvs and not self._journal() and not list((self.pools / POOL).glob("pvc-*")) \
                and not kernel_loops_on(self.pools / POOL)
        while not empty():
            if time.monotonic() > deadline:
                left = sorted(p.name for p in (self.pools / POOL).glob("pvc-*"))
                raise Violation("eventually", f"after every claim was deleted, left: journal "
                                              f"{sorted(self._journal())}, images {left}; loop devices held: "
                                              f"{holders(self.pools / POOL)}")
            threading.Event().wait(0.1)


def capacity_of(pv: dict[str, Any]) -> int:
    text = str(((pv.get("spec") or {}).get("capacity") or {}).get("storage") or "0")
    return parse_quantity(text)


def holders(pool: Path) -> dict[str, list[str]]:
    """Who holds each loop device bound to a file of ``pool``'s filesystem: processes with it
    open, and mounts of it in any process's mount namespace (for a violation's message)."""
    try:
        device = os.stat(pool).st_dev
    except OSError:
        return {}
    numbers = {n for key, ns in kernel_loops().items() if key[0] == device for n in ns}
    found: dict[str, list[str]] = {f"loop{n}": [] for n in numbers}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            comm = (proc / "comm").read_text().strip()
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                for n in numbers:
                    if target == f"/dev/loop{n}":
                        found[f"loop{n}"].append(f"pid {proc.name} ({comm}) fd")
            for line in (proc / "mountinfo").read_text().splitlines():
                fields = line.split()
                for n in numbers:
                    if fields[2] == f"7:{n}":
                        found[f"loop{n}"].append(f"pid {proc.name} ({comm}) mount {fields[4]}")
    return {k: sorted(set(v))[:6] for k, v in found.items()}


def kernel_loops_on(pool: Path) -> bool:
    """Whether any loop device is bound to a file of the filesystem mounted at ``pool``."""
    try:
        device = os.stat(pool).st_dev
    except OSError:
        return False
    return any(dev == device for dev, _ino in kernel_loops())

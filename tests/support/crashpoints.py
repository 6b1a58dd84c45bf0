"""Crash points, enumerated (issue 24): every durable step of a scenario, killed there once.

A scenario is a protocol driven to its end against a real daemon process (``localpv agent`` or
``localpv nfs``), the API emulator and real mounts. It is run once with
``LOCALPV_CRASH_TRACE`` to learn the durable steps it passes through - each half of a journal
or record write, each API write (:mod:`localpv.crashpoints`) - and then once per step: the
process SIGKILLs itself exactly there (``LOCALPV_CRASH_AT=<point>@<n>``), is started again
without it, and the scenario is driven on to its end. The invariants are checked all along and
at the end: no dirty offer, no data removed while in use, no lost record, no duplicate PV, no
image removed while attached, and the scenario completes (progress resumes).

Scenarios:

* ``image`` - a dynamic claim provisioned (image journal: creating, ready, PV uid; the PV
  create), staged by the kubelet with a tenant's data, grown (journal size; PV capacity; claim
  status), unstaged and its claim deleted (deleting, the image removed, the PV deleted, the
  record dropped);
* ``image-pv-first`` - a dynamic claim provisioned and Bound, then its PV deleted before it
  (``kubectl delete pv``: the finalizer holds the object, the image is kept while the claim is
  Bound), then the claim deleted (deleting, the image removed, the finalizer removed, the
  record dropped);
* ``volume`` - a static volume offered, claimed, written, released, cleaned and offered again
  (the agent journal's release, clean and re-offer; the PV create and delete);
* ``moved`` - a static disk with an identity bound and written; with the agent stopped, its
  claim deleted, another disk put at its path and it at another: its record follows it (the
  journal's follow), it is cleaned and offered there, the other disk offered at the old path;
* ``nfs`` - an NFS claim provisioned (the ownership record, the PV), released with
  ``onDelete: archive`` (the record archived, the PV deleted);
* ``nfs-delete`` - the same with ``onDelete: delete`` (the directory removed, the PV deleted);
* ``nfs-pv-first`` - an NFS claim provisioned and written, its PV deleted before it (the
  finalizer holds the object, the directory is kept while the claim exists), then the claim
  deleted (the directory removed, the finalizer removed).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from localpv.crashpoints import ENV_AT, ENV_TRACE
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.rpc import unary_call
from localpv.kube.api import KubeApi
from localpv.kube.transport import connect
from localpv_emulator.apiserver import ApiError, ApiServer
from localpv_emulator.objects import claim, node, storage_class
from tests.support.campaign import Violation
from tests.support.hostfs import LoopDevices, MiB, Mounter
from tests.support.labeller import running_labeller

NODE = "crash-node"
DRIVER = "local.csi.localpv.dev"
NFS_PROVISIONER = "cluster.local/nfs-crash"
Obj = dict[str, Any]


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise Violation("progress", f"{what} did not happen within {timeout:.0f} s")
        threading.Event().wait(0.05)


@dataclass
class Run:
    """One run of a scenario: its emulator, its process (one incarnation after another), and
    the crash point it is to die at once (``point@n``, counted over all its incarnations)."""

    workdir: Path
    server: ApiServer
    argv: list[str]
    env: dict[str, str]
    crash_at: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def trace(self) -> Path:
        """Every point each incarnation reached, in order (all of them append to it)."""
        return self.workdir / "trace"

    def start(self) -> None:
        """Start an incarnation. Until the run has died at its point, the incarnation is told
        to die at the pass of it that is the run's n-th (the ones before it passed some)."""
        log = open(self.workdir / "daemon.log", "ab")  # noqa: SIM115 - handed to the child
        env = {k: v for k, v in os.environ.items() if k not in (ENV_AT, ENV_TRACE)}
        env.update({"PYTHONPATH": str(Path(__file__).resolve().parents[2]), **self.env, ENV_TRACE: str(self.trace)})
        if self.crash_at:
            point, _, nth = self.crash_at.partition("@")
            passed = self.trace.read_text().split().count(point) if self.trace.exists() else 0
            env[ENV_AT] = f"{point}@{int(nth) - passed}"
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def dead_by_its_point(self) -> bool:
        return self.proc is not None and self.proc.poll() == -signal.SIGKILL

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop_gently(self) -> None:
        """SIGTERM and wait (an operator's stop; not taken for a death at the crash point)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


class Scenario:
    """What a scenario sets up, drives and checks; subclasses say each."""

    name = ""
    #: A step is retried (the daemon may be down, or not yet caught up) until this long.
    step_timeout = 60.0
    #: The daemon of the run (set by :func:`run_scenario`): a step may stop and start it, as an
    #: operator's maintenance window does.
    daemon: Run

    def setup(self, workdir: Path, server: ApiServer) -> tuple[list[str], dict[str, str]]:
        """Make the world; the daemon's command line and environment."""
        raise NotImplementedError

    def steps(self) -> list[tuple[str, Callable[[], bool]]]:
        """The scenario's steps, in order: (what, do-it) where do-it returns True once done.
        Each is idempotent: it is called again after a restart until it is done."""
        raise NotImplementedError

    def check(self) -> None:
        """The invariants, now (called on every tick)."""

    def final(self) -> None:
        """The invariants once the scenario is complete."""

    def teardown(self) -> None:
        """Undo what ``setup`` made."""


def run_scenario(make: Callable[[], Scenario], crash_at: str | None, base: Path) -> tuple[bool, list[str]]:
    """Run one scenario; with ``crash_at``, the daemon dies there once and is started again.
    Returns whether it died there (the point is reached again: threads may order steps
    differently from the traced run) and, without ``crash_at``, the points it reached in order."""
    workdir = Path(tempfile.mkdtemp(prefix="crash-", dir=base))
    server = ApiServer(binder=True)
    server.start()
    scenario = make()
    trace = workdir / "trace"
    # The claim labeller beside the daemon, as the chart runs it (dynamic claims reach the agent
    # only once labelled); in this process, so that it outlives every crash of the daemon.
    labeller = contextlib.ExitStack()
    labeller.enter_context(running_labeller(KubeApi(connect(server.url))))
    try:
        argv, env = scenario.setup(workdir, server)
        run = Run(workdir, server, argv, env, crash_at)
        scenario.daemon = run
        run.start()
        crashed = crash_at is None
        for what, step in scenario.steps():
            deadline = time.monotonic() + scenario.step_timeout
            while True:
                scenario.check()
                if not crashed and run.dead_by_its_point():
                    crashed = True  # killed at the point: started again, without it
                    run.crash_at = None
                    run.start()
                with contextlib.suppress(OSError, ApiError, grpc.RpcError):
                    if step():
                        break
                if time.monotonic() > deadline:
                    raise Violation("progress", f"{scenario.name}: {what} did not happen within "
                                                f"{scenario.step_timeout:.0f} s (crash at {crash_at})")
                threading.Event().wait(0.05)
        scenario.final()
        crashed = crashed and crash_at is not None
        run.stop()
        points = trace.read_text().split() if trace.exists() else []
        return crashed, points
    finally:
        with contextlib.suppress(Exception):
            run.stop()  # type: ignore[possibly-undefined]
        scenario.teardown()
        labeller.close()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def occurrences(points: list[str]) -> list[str]:
    """``point@n`` for every time each point was reached."""
    seen: Counter[str] = Counter()
    out = []
    for point in points:
        seen[point] += 1
        out.append(f"{point}@{seen[point]}")
    return out


# ---------------------------------------------------------------- image: dynamic volumes


class ImageScenario(Scenario):
    """A dynamic claim through its whole life; the kubelet is played over the CSI socket."""

    name = "image"

    def setup(self, workdir: Path, server: ApiServer) -> tuple[list[str], dict[str, str]]:
        self.server = server
        self.workdir = workdir
        self.mounter = Mounter()
        self.loops = LoopDevices(workdir)
        self.short = Path(tempfile.mkdtemp(prefix="lpvk-", dir="/tmp"))
        disk = self.loops.attach(128 * MiB, ext4=True)
        self.pool = self.mounter.device(disk.path, workdir / "pool")
        self.state = workdir / "state"
        server.create(node(NODE))
        sc = storage_class("dyn", provisioner=DRIVER, parameters={"pool": "p"})
        sc["allowVolumeExpansion"] = True
        server.create(sc)
        config = workdir / "config.yaml"
        config.write_text(yaml.safe_dump({"dynamicPools": {"p": {"hostDir": str(self.pool)}},
                                          "dynamicClassMap": {"dyn": {"pool": "p"}}}))
        kubeconfig = workdir / "kubeconfig"
        server.write_kubeconfig(str(kubeconfig))
        self.staging = self.short / "staging"
        self.target = self.short / "target"
        self.pv = ""
        self.digest = b""
        return ([sys.executable, "-m", "localpv", "agent", "--config", str(config), "--node", NODE,
                 "--kubeconfig", str(kubeconfig), "--listen-address", "127.0.0.1:0", "--state-dir", str(self.state),
                 "--kubelet-dir", str(self.short / "k"), "--discovery-period", "1s"], {})

    def _call(self, method: str, request: Any, answer: type[Any]) -> bool:
        with grpc.insecure_channel(f"unix://{self.short}/k/plugins/{DRIVER}/csi.sock") as channel:
            unary_call(channel, f"/csi.v1.Node/{method}", request, answer, timeout=30)
        return True

    def _context(self) -> dict[str, str]:
        pv = self.server.get("v1", "PersistentVolume", self.pv) or {}
        return dict(((pv.get("spec") or {}).get("csi") or {}).get("volumeAttributes") or {})

    def _capability(self) -> csi.VolumeCapability:
        return csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume(fs_type="ext4"),
                                    access_mode=csi.VolumeCapability.AccessMode(mode=1))

    def steps(self) -> list[tuple[str, Callable[[], bool]]]:
        return [("the claim made", self._claim), ("the claim Bound", self._bound),
                ("the volume staged and published", self._stage), ("the tenant's data written", self._write),
                ("the claim grown", self._grow), ("the PV grown", self._pv_grown),
                ("the volume unpublished and unstaged", self._unstage), ("the claim deleted", self._delete),
                ("the image, its record and its PV gone", self._gone)]

    def _claim(self) -> bool:
        with contextlib.suppress(ApiError):
            self.server.create(claim("data", "dyn", size="32Mi", selected_node=NODE))
        return self.server.get("v1", "PersistentVolumeClaim", "data", "default") is not None

    def _bound(self) -> bool:
        pvc = self.server.get("v1", "PersistentVolumeClaim", "data", "default") or {}
        if (pvc.get("status") or {}).get("phase") != "Bound":
            return False
        self.pv = str(pvc["spec"]["volumeName"])
        return True

    def _stage(self) -> bool:
        self._call("NodeStageVolume", csi.NodeStageVolumeRequest(
            volume_id=self.pv, staging_target_path=str(self.staging), volume_capability=self._capability(),
            volume_context=self._context()), csi.NodeStageVolumeResponse)
        return self._call("NodePublishVolume", csi.NodePublishVolumeRequest(
            volume_id=self.pv, staging_target_path=str(self.staging), target_path=str(self.target),
            volume_capability=self._capability(), volume_context=self._context()), csi.NodePublishVolumeResponse)

    def _write(self) -> bool:
        self.digest = os.urandom(64 << 10)
        data = self.target / "data"
        data.write_bytes(self.digest)
        with open(data, "rb") as f:
            os.fsync(f.fileno())
        return True

    def _grow(self) -> bool:
        pvc = self.server.get("v1", "PersistentVolumeClaim", "data", "default")
        if pvc is None:
            return False
        if pvc["spec"]["resources"]["requests"]["storage"] != "48Mi":
            pvc["spec"]["resources"]["requests"]["storage"] = "48Mi"
            self.server.update(pvc)
        return True

    def _pv_grown(self) -> bool:
        pv = self.server.get("v1", "PersistentVolume", self.pv) or {}
        return ((pv.get("spec") or {}).get("capacity") or {}).get("storage") == "48Mi"

    def _unstage(self) -> bool:
        if (self.target / "data").read_bytes() != self.digest:
            raise Violation("data", f"{self.pv}: the tenant's data changed")
        self._call("NodeUnpublishVolume", csi.NodeUnpublishVolumeRequest(volume_id=self.pv,
                                                                          target_path=str(self.target)),
                   csi.NodeUnpublishVolumeResponse)
        return self._call("NodeUnstageVolume", csi.NodeUnstageVolumeRequest(
            volume_id=self.pv, staging_target_path=str(self.staging)), csi.NodeUnstageVolumeResponse)

    def _delete(self) -> bool:
        with contextlib.suppress(ApiError):
            self.server.delete("v1", "PersistentVolumeClaim", "data", "default")
        return self.server.get("v1", "PersistentVolumeClaim", "data", "default") is None

    def _journal(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.state / "csi-images.json").read_text())["images"])
        except (OSError, ValueError, KeyError):
            return {}

    def _gone(self) -> bool:
        return (not self._journal() and not list(self.pool.glob("pvc-*"))
                and not [pv for pv in self.server.list("v1", "PersistentVolume")])

    def check(self) -> None:
        pvs = [pv for pv in self.server.list("v1", "PersistentVolume")]
        if len(pvs) > 1:
            raise Violation("duplicate", f"{len(pvs)} PVs for one claim: {[p['metadata']['name'] for p in pvs]}")
        if self.pv and self.digest and mounted(self.staging) and not (self.pool / self.pv / "disk.img").exists():
            raise Violation("removed-attached", f"{self.pv}'s image is gone while it is staged")
        journal = self._journal()
        for pv in pvs:
            name = pv["metadata"]["name"]
            if (self.pool / name / "disk.img").exists() and name not in journal and pv.get("status", {}).get(
                    "phase") == "Bound":
                raise Violation("lost-record", f"image {name} of a Bound PV has no record in the image journal")

    def teardown(self) -> None:
        for path in (self.target, self.staging):
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
        self.mounter.umount_all()
        self.loops.detach_all()
        shutil.rmtree(self.short, ignore_errors=True)


class ImagePvFirstScenario(ImageScenario):
    """KEP-2644's order: the PV deleted while its claim is Bound, then the claim."""

    name = "image-pv-first"

    def steps(self) -> list[tuple[str, Callable[[], bool]]]:
        return [("the claim made", self._claim), ("the claim Bound", self._bound),
                ("the PV protected", self._protected), ("the PV deleted first", self._delete_pv),
                ("the claim deleted", self._delete), ("the image, its record and its PV gone", self._gone)]

    def _protected(self) -> bool:
        pv = self.server.get("v1", "PersistentVolume", self.pv) or {}
        return "external-provisioner.volume.kubernetes.io/finalizer" in (pv.get("metadata", {}).get("finalizers") or [])

    def _delete_pv(self) -> bool:
        with contextlib.suppress(ApiError):
            self.server.delete("v1", "PersistentVolume", self.pv)
        pv = self.server.get("v1", "PersistentVolume", self.pv) or {}
        return bool(pv.get("metadata", {}).get("deletionTimestamp"))

    def check(self) -> None:
        super().check()
        pvc = self.server.get("v1", "PersistentVolumeClaim", "data", "default") or {}
        if self.pv and (pvc.get("status") or {}).get("phase") == "Bound" and pvc["spec"].get("volumeName") == self.pv:
            if self.server.get("v1", "PersistentVolume", self.pv) is None:
                raise Violation("unprotected", f"{self.pv} is gone while its claim is Bound")
            if not (self.pool / self.pv / "disk.img").exists():
                raise Violation("removed-bound", f"{self.pv}'s image is gone while its claim is Bound")


def mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


# ---------------------------------------------------------------- volume: the static agent


class VolumeScenario(Scenario):
    """A static volume offered, claimed, written, released, cleaned and offered again."""

    name = "volume"

    def setup(self, workdir: Path, server: ApiServer) -> tuple[list[str], dict[str, str]]:
        self.server = server
        self.mounter = Mounter()
        self.disks = workdir / "disks"
        self.volume = self.mounter.tmpfs(self.disks / "v0", size=4 * MiB)
        self.state = workdir / "state"
        server.create(node(NODE))
        server.create(storage_class("local"))
        config = workdir / "config.yaml"
        config.write_text(yaml.safe_dump({"storageClassMap": {"local": {"hostDir": str(self.disks),
                                                                           "mountDir": str(self.disks)}}}))
        kubeconfig = workdir / "kubeconfig"
        server.write_kubeconfig(str(kubeconfig))
        self.first_uid = ""
        self.wrote = self.released = False
        return ([sys.executable, "-m", "localpv", "agent", "--config", str(config), "--node", NODE,
                 "--kubeconfig", str(kubeconfig), "--listen-address", "127.0.0.1:0", "--state-dir", str(self.state),
                 "--discovery-period", "1s"], {})

    def _pv(self) -> Obj | None:
        pvs = self.server.list("v1", "PersistentVolume")
        return pvs[0] if pvs else None

    def steps(self) -> list[tuple[str, Callable[[], bool]]]:
        return [("the volume offered", self._offered), ("claimed and Bound", self._bound),
                ("the tenant's data written", self._write), ("the claim deleted", self._release),
                ("the volume offered again, clean", self._again)]

    def _offered(self) -> bool:
        pv = self._pv()
        if pv is None or pv.get("status", {}).get("phase") != "Available":
            return False
        self.first_uid = str(pv["metadata"]["uid"])
        return True

    def _bound(self) -> bool:
        if self.server.get("v1", "PersistentVolumeClaim", "data", "default") is None:
            self.server.create(claim("data", "local", size="1Mi", selected_node=NODE))
        pvc = self.server.get("v1", "PersistentVolumeClaim", "data", "default") or {}
        return (pvc.get("status") or {}).get("phase") == "Bound"

    def _write(self) -> bool:
        (self.volume / "data").write_text("tenant data\n")
        self.wrote = True
        return True

    def _release(self) -> bool:
        with contextlib.suppress(ApiError):
            self.server.delete("v1", "PersistentVolumeClaim", "data", "default")
        self.released = True
        return self.server.get("v1", "PersistentVolumeClaim", "data", "default") is None

    def _again(self) -> bool:
        pv = self._pv()
        return bool(pv and pv["metadata"]["uid"] != self.first_uid and pv.get("status", {}).get("phase") == "Available"
                    and not os.listdir(self.volume))

    def check(self) -> None:
        pvs = self.server.list("v1", "PersistentVolume")
        if len(pvs) > 1:
            raise Violation("duplicate", f"{len(pvs)} PVs for one volume")
        left = os.listdir(self.volume)
        for pv in pvs:
            if pv.get("status", {}).get("phase") == "Available" and left and self.released:
                raise Violation("offered-dirty", f"PV {pv['metadata']['name']} on offer over {left}")
        if self.wrote and not self.released and not (self.volume / "data").exists():
            raise Violation("cleaned-while-bound", "the tenant's data vanished while its claim is Bound")

    def teardown(self) -> None:
        self.mounter.umount_all()


def _contents(path: Path) -> list[str]:
    """What a volume holds; ext4's ``lost+found`` is part of the filesystem, not a tenant's."""
    return [name for name in os.listdir(path) if name != "lost+found"] if path.is_dir() else []


class MovedScenario(VolumeScenario):
    """A disk with an identity (ext4 on a loop device) offered, claimed and written; then, with
    the agent stopped, its claim is deleted, a fresh disk takes its path and it comes back at
    another: its record follows it there (the agent journal's follow), the Released PV of the old
    path goes, it is cleaned at the new path and offered there, and the fresh disk is offered
    at the old path."""

    name = "moved"

    def setup(self, workdir: Path, server: ApiServer) -> tuple[list[str], dict[str, str]]:
        argv, env = super().setup(workdir, server)
        self.mounter.umount(self.volume)  # the parent's tmpfs: this scenario's disks have identities
        self.loops = LoopDevices(workdir)
        self.disk_a, self.disk_b = self.loops.attach(16 * MiB, ext4=True), self.loops.attach(16 * MiB, ext4=True)
        self.mounter.device(self.disk_a.path, self.volume)
        self.moved_to = self.disks / "v1"
        self.moved = False
        return argv, env

    def steps(self) -> list[tuple[str, Callable[[], bool]]]:
        return [("the volume offered", self._offered), ("claimed and Bound", self._bound),
                ("the tenant's data written", self._write),
                ("with the agent stopped: the claim deleted, another disk at its path, it at another",
                 self._move),
                ("it cleaned and offered at its new path, the other disk offered at the old", self._settled)]

    def _move(self) -> bool:
        self.daemon.stop_gently()
        self._release()
        if mounted(self.volume) and not self.moved:
            self.mounter.umount(self.volume)
        if not mounted(self.volume):
            self.mounter.device(self.disk_b.path, self.volume)
        if not mounted(self.moved_to):
            self.mounter.device(self.disk_a.path, self.moved_to)
        self.moved = True
        self.daemon.start()
        return True

    def _settled(self) -> bool:
        pvs = self._by_path()
        return all(len(pvs.get(path, [])) == 1 and pvs[path][0].get("status", {}).get("phase") == "Available"
                   and pvs[path][0]["metadata"]["uid"] != self.first_uid and not _contents(Path(path))
                   for path in (str(self.volume), str(self.moved_to)))

    def _by_path(self) -> dict[str, list[Obj]]:
        out: dict[str, list[Obj]] = {}
        for pv in self.server.list("v1", "PersistentVolume"):
            out.setdefault(str(pv["spec"]["local"]["path"]), []).append(pv)
        return out

    def check(self) -> None:
        for path, pvs in self._by_path().items():
            if len(pvs) > 1:
                raise Violation("duplicate", f"{len(pvs)} PVs for {path}")
            where = Path(path)
            left = _contents(where)
            if pvs[0].get("status", {}).get("phase") == "Available" and left and self.released:
                raise Violation("offered-dirty", f"PV {pvs[0]['metadata']['name']} of {path} on offer over {left}")
        tenant = (self.moved_to if self.moved else self.volume) / "data"
        if self.wrote and not self.released and not tenant.exists():
            raise Violation("cleaned-while-bound", "the tenant's data vanished while its claim is Bound")

    def final(self) -> None:
        # The record followed the disk: what the tenant left is gone from it, wherever it is.
        if (self.moved_to / "data").exists():
            raise Violation("lost-record", "the released tenant's data is still on its disk at the end")

    def teardown(self) -> None:
        super().teardown()
        self.loops.detach_all()


# ---------------------------------------------------------------- nfs: the NFS provisioner


class NfsScenario(Scenario):
    """An NFS claim provisioned, then released with ``onDelete: archive``."""

    name = "nfs"
    on_delete = "archive"

    def setup(self, workdir: Path, server: ApiServer) -> tuple[list[str], dict[str, str]]:
        self.server = server
        self.export = workdir / "export"
        self.export.mkdir()
        server.create(storage_class("nfs", binding="Immediate", provisioner=NFS_PROVISIONER,
                                    parameters={"onDelete": self.on_delete}))
        kubeconfig = workdir / "kubeconfig"
        server.write_kubeconfig(str(kubeconfig))
        self.directory: Path | None = None
        return ([sys.executable, "-m", "localpv", "nfs", "--nfs-server", "nfs.example", "--nfs-path", "/srv/nfs",
                 "--provisioner-name", NFS_PROVISIONER, "--kubeconfig", str(kubeconfig), "--namespace", "default",
                 "--mount-dir", str(self.export), "--listen-address", "127.0.0.1:0", "--lease-duration", "2s",
                 "--renew-deadline", "1500ms", "--retry-period", "300ms", "--retry-initial", "200ms",
                 "--retry-max", "2s", "--resync-period", "5s"], {})

    def steps(self) -> list[tuple[str, Callable[[], bool]]]:
        return [("the claim Bound", self._bound), ("the tenant's data written", self._write),
                ("the claim deleted", self._release), ("its directory archived, its PV gone", self._archived)]

    def _bound(self) -> bool:
        if self.server.get("v1", "PersistentVolumeClaim", "data", "default") is None:
            self.server.create(claim("data", "nfs", access_modes=("ReadWriteMany",)))
        pvc = self.server.get("v1", "PersistentVolumeClaim", "data", "default") or {}
        if (pvc.get("status") or {}).get("phase") != "Bound":
            return False
        pv = self.server.get("v1", "PersistentVolume", pvc["spec"]["volumeName"]) or {}
        path = str(((pv.get("spec") or {}).get("nfs") or {}).get("path") or "")
        self.directory = self.export / Path(path).relative_to("/srv/nfs")
        return self.directory.is_dir()

    def _write(self) -> bool:
        assert self.directory is not None
        (self.directory / "data").write_text("tenant data\n")
        return True

    def _release(self) -> bool:
        with contextlib.suppress(ApiError):
            self.server.delete("v1", "PersistentVolumeClaim", "data", "default")
        return self.server.get("v1", "PersistentVolumeClaim", "data", "default") is None

    def _archived(self) -> bool:
        archived = [p for p in self.export.iterdir() if p.name.startswith("archived-")]
        return bool(archived) and not self.server.list("v1", "PersistentVolume") and \
            any((p / "data").exists() for p in archived)

    def check(self) -> None:
        pvs = self.server.list("v1", "PersistentVolume")
        if len(pvs) > 1:
            raise Violation("duplicate", f"{len(pvs)} PVs for one claim")
        if self.directory is not None and not self.directory.exists():
            archived = [p for p in self.export.iterdir() if p.name.startswith("archived-") and (p / "data").exists()]
            if not archived and (self.directory.parent / self.directory.name).exists() is False and \
                    any(p.get("status", {}).get("phase") == "Bound" for p in pvs):
                raise Violation("lost-data", "the tenant's directory is gone while its claim is Bound")


class NfsDeleteScenario(NfsScenario):
    """An NFS claim provisioned, then released with ``onDelete: delete``."""

    name = "nfs-delete"
    on_delete = "delete"

    def _archived(self) -> bool:
        return (self.directory is not None and not self.directory.exists()
                and not self.server.list("v1", "PersistentVolume"))


class NfsPvFirstScenario(NfsDeleteScenario):
    """An NFS claim provisioned and written, its PV deleted first (held by the finalizer, the
    directory kept while the claim is Bound), then the claim deleted with ``onDelete: delete``."""

    name = "nfs-pv-first"

    def steps(self) -> list[tuple[str, Callable[[], bool]]]:
        return [("the claim Bound", self._bound), ("the tenant's data written", self._write),
                ("the PV protected", self._protected), ("the PV deleted first", self._delete_pv),
                ("the claim deleted", self._release), ("its directory deleted, its PV gone", self._archived)]

    def _pv(self) -> Obj:
        pvc = self.server.get("v1", "PersistentVolumeClaim", "data", "default") or {}
        return self.server.get("v1", "PersistentVolume", str((pvc.get("spec") or {}).get("volumeName"))) or {}

    def _protected(self) -> bool:
        return "external-provisioner.volume.kubernetes.io/finalizer" in \
            (self._pv().get("metadata", {}).get("finalizers") or [])

    def _delete_pv(self) -> bool:
        name = str(self._pv().get("metadata", {}).get("name") or "")
        with contextlib.suppress(ApiError):
            self.server.delete("v1", "PersistentVolume", name)
        return bool(self._pv().get("metadata", {}).get("deletionTimestamp"))

    written = False

    def _write(self) -> bool:
        self.written = super()._write()
        return self.written

    def check(self) -> None:
        super().check()
        pvc = self.server.get("v1", "PersistentVolumeClaim", "data", "default")
        if self.written and pvc is not None and not pvc["metadata"].get("deletionTimestamp") and \
                self.directory is not None and not (self.directory / "data").exists():
            raise Violation("lost-data", "the tenant's directory went while its claim exists (its PV deleted first)")


SCENARIOS: dict[str, Callable[[], Scenario]] = {"image": ImageScenario, "image-pv-first": ImagePvFirstScenario,
                                                 "volume": VolumeScenario,
                                                 "moved": MovedScenario, "nfs": NfsScenario,
                                                 "nfs-delete": NfsDeleteScenario, "nfs-pv-first": NfsPvFirstScenario}


#: Crash runs of one scenario at a time: each has its own emulator, daemon, mounts and work dir,
#: and spends most of its time waiting on the daemon's periods, so a few overlap well even on a
#: small machine (docs/reliability.md has the figures).
PARALLEL_RUNS = 3


def enumerate_crashes(name: str, base: Path, *, report: Callable[[str], None] = print,
                      parallel: int = PARALLEL_RUNS) -> tuple[int, list[str]]:
    """Learn the scenario's points, then run it once per point, ``parallel`` runs at a time;
    (runs, the points traced). A run that did not pass its point again (threads ordered the
    steps differently from the traced run, more likely with runs side by side) is run once more,
    alone. Raises the :class:`Violation` of the first run to break an invariant; runs not yet
    started then are not started."""
    make = SCENARIOS[name]
    _, points = run_scenario(make, None, base)
    crash_ats = occurrences(points)
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel, thread_name_prefix=f"crash-{name}") as pool:
        futures = [pool.submit(run_scenario, make, at, base) for at in crash_ats]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
        except BaseException:
            for pending in futures:
                pending.cancel()
            raise
    missed = [at for at, future in zip(crash_ats, futures, strict=True) if not future.result()[0]]
    missed = [at for at in missed if not run_scenario(make, at, base)[0]]
    runs = len(crash_ats)
    report(f"{name}: {len(points)} crash points, {runs - len(missed)} killed there and recovered, "
           f"{len(missed)} not reached again in their run")
    return runs, points


def named_points(root: Path | None = None) -> set[str]:
    """Every crash point the code names, read from its source: ``reached("...")`` calls and the
    four halves of each ``replace_durably(..., point="...")``. (API writes are points too, named
    by verb and resource at run time: each scenario's trace has those it passes.)"""
    import re

    source = root or Path(__file__).resolve().parents[2] / "localpv"
    halves = ("written", "flushed", "renamed", "dir-flushed")
    found: set[str] = set()
    for path in source.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        found.update(re.findall(r'\breached\("([^"{}]+)"\)', text))
        for kind in re.findall(r'replace_durably\([^\n]*?point="([^"]+)"', text):
            found.update(f"{kind}:{half}" for half in halves)
    return found

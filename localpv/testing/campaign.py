"""Fault campaign for the node agent: a real agent process, real tmpfs volumes, tenants
that write data, an API server that misbehaves, and `kill -9` at random instants.

Each cycle turns on a random mix of API faults (dropped watches, 410 on resume, 20 % 5xx
on writes, 409 storms, 300 ms latency, an API-server restart), lets simulated tenants
claim, write to and release volumes, and kills the agent with SIGKILL at a random
instant (then starts it again). Invariants are checked continuously, and any violation
stops the campaign with an exception naming it:

* ``duplicate``      - never two PVs for one volume path;
* ``offered-dirty``  - a PV that becomes Available offers an empty volume (the previous
  tenant's data was wiped first);
* ``cleaned-while-bound`` - a tenant's data is never removed while its claim is bound;
* ``eventually-clean`` - after the faults stop, every volume is offered again, empty.

:class:`NfsCampaign` does the same for ``localpv nfs``: two leader-elected replicas (real
processes, one SIGKILLed at a random instant per cycle), claims in bursts - some with
hostile path annotations - and deletions, under the same API faults. Its invariants:

* ``duplicate``        - never two PVs for one claim;
* ``escape``           - nothing outside the export is created, changed or removed, and a
  hostile claim never gets a PV;
* ``eventually-bound`` / ``eventually-clean`` - after the faults stop every live claim is
  Bound to a PV whose directory exists, and once all claims are deleted no PV and no
  volume directory is left.

Used by ``tests/reliability`` (a few cycles) and ``benchmarks/reliability.py`` (the full
run, whose figures go to docs/reliability.md).
"""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localpv.nfs.pathpattern import RESERVED_DIRECTORY
from localpv.testing.apiserver import ApiServer
from localpv.testing.hostfs import Mounter
from localpv.testing.objects import claim, node, storage_class

NODE = "campaign-node"
CLASS = "local-fs"
HOST_DIR = "/mnt/disks"
FAULTS = ("drop-watches", "gone", "write-5xx", "conflicts", "latency", "restart")


class Violation(AssertionError):
    """An invariant did not hold."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant


@dataclass
class CampaignReport:
    cycles: int = 0
    kills: int = 0
    tenants: int = 0
    checks: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def summary(self) -> str:
        faults = ", ".join(f"{k} x{v}" for k, v in sorted(self.faults.items()))
        return (f"{self.cycles} cycles, {self.kills} SIGKILLs, {self.tenants} tenants served, "
                f"{self.checks} invariant checks, faults: {faults}; {self.seconds:.0f} s")


def inject_faults(server: ApiServer, faults: list[str], report: CampaignReport) -> None:
    """Turn on this cycle's faults (watch drops are paced by the caller's loop)."""
    f = server.faults
    for name in faults:
        report.faults[name] += 1
        if name == "gone":
            f.forget_history()
            f.drop_watches()
        elif name == "write-5xx":
            for verb in ("create", "update", "patch", "delete"):
                f.error_rate(verb, 0.2, code=500)
        elif name == "conflicts":
            f.conflict_storm(0.3)
        elif name == "latency":
            f.latency(0.3)
        elif name == "restart":
            server.restart()


@dataclass
class _Volume:
    index: int
    path: Path
    state: str = "idle"  # idle -> claimed -> bound -> released -> idle
    last_uid: str = ""
    claim_name: str = ""
    marker: Path | None = None
    since: float = 0.0

    @property
    def host_path(self) -> str:
        return f"{HOST_DIR}/v{self.index}"


class _Campaign:
    """What both campaigns share: the emulator, the processes under test, the fault cycle.

    A subclass says how to set up (``_setup`` returns the command line of each process),
    what one tick checks and does (``_tick``), what happens at the start and end of a
    cycle, and how the run settles once the faults stop (``_settle``).
    """

    tick_interval = 0.02

    def __init__(self, workdir: Path, *, cycles: int, cycle_seconds: float, seed: int, settle_timeout: float,
                 kill: bool = True) -> None:
        self.workdir = workdir
        self.cycles = cycles
        self.cycle_seconds = cycle_seconds
        self.kill = kill
        self.rng = random.Random(seed)
        self.settle_timeout = settle_timeout
        self.server = ApiServer(binder=True)
        self.server.faults.seed(seed)
        self.report = CampaignReport()
        self._argv: dict[str, list[str]] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # hooks
    def _setup(self) -> dict[str, list[str]]:
        raise NotImplementedError

    def _tick(self) -> None:
        raise NotImplementedError

    def _settle(self) -> None:
        raise NotImplementedError

    def _cycle_start(self) -> None:
        """Work done as a cycle's faults begin (nothing by default)."""

    def _cycle_end(self) -> None:
        """Work done once a cycle's faults are off (nothing by default)."""

    def _teardown(self) -> None:
        """Release what ``_setup`` made besides the processes and the emulator."""

    # processes
    def _start(self, name: str) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        self._procs[name] = subprocess.Popen(self._argv[name], stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def _sigkill(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    # the run
    def run(self) -> CampaignReport:
        started = time.monotonic()
        self.server.start()
        try:
            self._argv = self._setup()
            for name in self._argv:
                self._start(name)
            for _ in range(self.cycles):
                self._cycle()
                self.report.cycles += 1
            self.server.faults.reset()
            self._settle()
        finally:
            for name in self._procs:
                self._sigkill(name)
            self.server.stop()
            self._teardown()
            self.report.seconds = time.monotonic() - started
        return self.report

    def _cycle(self) -> None:
        faults = self.rng.sample(FAULTS, k=self.rng.randint(1, 3))
        inject_faults(self.server, faults, self.report)
        now = time.monotonic()
        kill_at = now + self.rng.uniform(0.2, self.cycle_seconds) if self.kill else None
        end, next_drop = now + self.cycle_seconds, now + 1.0
        self._cycle_start()
        while time.monotonic() < end:
            self._tick()
            now = time.monotonic()
            if "drop-watches" in faults and now >= next_drop:
                self.server.faults.drop_watches(abrupt=self.rng.random() < 0.5)
                next_drop = now + 1.0
            if kill_at is not None and now >= kill_at:
                victim = self.rng.choice(sorted(self._argv))
                self._sigkill(victim)
                self.report.kills += 1
                self._tick()
                self._start(victim)
                kill_at = None
            threading.Event().wait(self.tick_interval)
        self.server.faults.reset()
        self._cycle_end()


class AgentCampaign(_Campaign):
    """The node agent campaign; :meth:`run` returns a report or raises :class:`Violation`."""

    def __init__(self, workdir: Path, *, volumes: int = 4, cycles: int = 5, cycle_seconds: float = 3.0,
                 kill: bool = True, seed: int = 1, settle_timeout: float = 60.0) -> None:
        super().__init__(workdir, cycles=cycles, cycle_seconds=cycle_seconds, seed=seed,
                         settle_timeout=settle_timeout, kill=kill)
        self.mounter = Mounter()
        self.volumes = [_Volume(i, workdir / "discovery" / f"v{i}") for i in range(volumes)]
        self._claims = 0

    def _setup(self) -> dict[str, list[str]]:
        self.server.create(node(NODE))
        self.server.create(storage_class(CLASS))
        for volume in self.volumes:
            self.mounter.tmpfs(volume.path, size=4 << 20)
        kubeconfig = self.workdir / "kubeconfig"
        self.server.write_kubeconfig(str(kubeconfig))
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump({"storageClassMap": {CLASS: {
            "hostDir": HOST_DIR, "mountDir": str(self.workdir / "discovery")}}}))
        return {"agent": [sys.executable, "-m", "localpv", "agent", "--config", str(config), "--node", NODE,
                          "--kubeconfig", str(kubeconfig), "--listen-address", "127.0.0.1:0",
                          "--state-dir", str(self.workdir / "state"), "--discovery-period", "1s"]}

    def _teardown(self) -> None:
        self.mounter.umount_all()

    # ------------------------------------------------------------------ tenants and invariants

    def _pvs_by_path(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for pv in self.server.list("v1", "PersistentVolume"):
            found.setdefault(pv["spec"]["local"]["path"], []).append(pv)
        return found

    def _tick(self) -> None:
        pvs = self._pvs_by_path()
        self.report.checks += 1
        for path, items in pvs.items():
            if len(items) > 1:
                raise Violation("duplicate", f"{path}: {[p['metadata']['name'] for p in items]}")
        for volume in self.volumes:
            found = pvs.get(volume.host_path)
            self._advance(volume, found[0] if found else None)

    def _advance(self, volume: _Volume, pv: dict[str, Any] | None) -> None:
        phase = (pv or {}).get("status", {}).get("phase")
        uid = (pv or {}).get("metadata", {}).get("uid", "")
        if volume.state == "bound" and volume.marker is not None and not volume.marker.exists():
            raise Violation("cleaned-while-bound", f"{volume.host_path}: data of {volume.claim_name} vanished")
        if volume.state in ("idle", "released") and phase == "Available" and uid != volume.last_uid:
            left = os.listdir(volume.path)
            if left:
                raise Violation("offered-dirty", f"{volume.host_path} offered as {uid} still holds {left}")
            volume.last_uid, volume.state = uid, "idle"
            self._claim(volume)
        elif volume.state == "claimed" and phase == "Bound" and \
                (pv or {}).get("spec", {}).get("claimRef", {}).get("name") == volume.claim_name:
            volume.marker = volume.path / f"data-{volume.claim_name}"
            volume.marker.write_text("tenant data\n")
            volume.state, volume.since = "bound", time.monotonic()
            self.report.tenants += 1
        elif volume.state == "bound" and time.monotonic() - volume.since > self.rng.uniform(0.1, 0.6):
            self.server.delete("v1", "PersistentVolumeClaim", volume.claim_name, "default")
            volume.state, volume.marker = "released", None

    def _claim(self, volume: _Volume) -> None:
        self._claims += 1
        volume.claim_name = f"c{volume.index}-{self._claims}"
        pvc = claim(volume.claim_name, CLASS, selected_node=NODE)
        pvc["spec"]["volumeName"] = str(self._pvs_by_path()[volume.host_path][0]["metadata"]["name"])
        self.server.create(pvc)
        volume.state = "claimed"

    def _settle(self) -> None:
        """With the faults off, every volume must come back empty and Available."""
        deadline = time.monotonic() + self.settle_timeout
        while True:
            pvs = self._pvs_by_path()
            pending = []
            for volume in self.volumes:
                pv = (pvs.get(volume.host_path) or [{}])[0]
                phase = pv.get("status", {}).get("phase")
                if volume.state == "bound" or (volume.state == "claimed" and phase == "Bound"):
                    self.server.delete("v1", "PersistentVolumeClaim", volume.claim_name, "default")
                    volume.state, volume.marker = "released", None
                elif volume.state == "released" and phase == "Available":
                    uid = pv["metadata"]["uid"]
                    if uid != volume.last_uid and os.listdir(volume.path):
                        raise Violation("offered-dirty", f"{volume.host_path} offered as {uid} still dirty")
                    volume.state, volume.last_uid = "idle", uid
                if volume.state != "idle" or phase != "Available" or os.listdir(volume.path):
                    pending.append(f"{volume.host_path}: {volume.state}/{phase}")
            if not pending:
                return
            if time.monotonic() > deadline:
                raise Violation("eventually-clean", f"not Available and empty in time: {pending}")
            threading.Event().wait(0.05)


# =========================================================================== NFS


HOSTILE_PATHS = ("..", "../..", "../outside", "/etc", "a/../../b", ".", "x/./y", "ok/../..", "archived-vol-1")
NFS_PROVISIONER = "campaign.example/nfs"
NFS_PATH = "/exports"


def _tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry below ``root`` without following links: (kind, mtime_ns)."""
    found: dict[str, tuple[str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            st = os.lstat(os.path.join(dirpath, name))
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"
            found[os.path.relpath(os.path.join(dirpath, name), root)] = (kind, st.st_mtime_ns)
    return found


class NfsCampaign(_Campaign):
    """Two `localpv nfs` replicas under faults and SIGKILL; :meth:`run` raises :class:`Violation`."""

    tick_interval = 0.05

    def __init__(self, workdir: Path, *, cycles: int = 5, cycle_seconds: float = 4.0, seed: int = 1,
                 settle_timeout: float = 90.0) -> None:
        super().__init__(workdir, cycles=cycles, cycle_seconds=cycle_seconds, seed=seed,
                         settle_timeout=settle_timeout)
        self.export = workdir / "export"
        self.outside = workdir / "outside"
        self.live: dict[str, bool] = {}  # claim name -> hostile?
        self._made = 0
        self._outside_before: dict[str, tuple[str, int]] = {}

    def _setup(self) -> dict[str, list[str]]:
        self.export.mkdir(parents=True)
        (self.outside / "victim").mkdir(parents=True)
        (self.outside / "victim" / "data").write_text("precious\n")
        self._outside_before = _tree(self.outside)
        kubeconfig = self.workdir / "kubeconfig"
        self.server.write_kubeconfig(str(kubeconfig))
        self.server.create(storage_class("nfs", binding="Immediate", provisioner=NFS_PROVISIONER, parameters={
            "pathPattern": "${.PVC.namespace}/${.PVC.annotations.nfs.io/storage-path}", "onDelete": "delete"}))
        argv = [sys.executable, "-m", "localpv", "nfs", "--nfs-server", "nfs.example", "--nfs-path", NFS_PATH,
                "--provisioner-name", NFS_PROVISIONER, "--kubeconfig", str(kubeconfig),
                "--namespace", "default", "--mount-dir", str(self.export), "--listen-address", "127.0.0.1:0",
                "--lease-duration", "2s", "--renew-deadline", "1500ms", "--retry-period", "300ms",
                "--retry-initial", "200ms", "--retry-max", "2s", "--resync-period", "5s"]
        return {"nfs-0": argv, "nfs-1": argv}

    def run(self) -> CampaignReport:
        report = super().run()
        if _tree(self.outside) != self._outside_before:
            raise Violation("escape", "the tree outside the export changed")
        return report

    def _cycle_start(self) -> None:
        self._claims(normal=4, hostile=1)

    def _cycle_end(self) -> None:
        for name in self.rng.sample(sorted(self.live), k=min(len(self.live), 3)):
            self.server.delete("v1", "PersistentVolumeClaim", name, "default")
            del self.live[name]

    def _tick(self) -> None:
        self._check()

    def _claims(self, *, normal: int, hostile: int) -> None:
        for i in range(normal + hostile):
            self._made += 1
            name = f"c{self._made}"
            bad = i >= normal
            path = self.rng.choice(HOSTILE_PATHS) if bad else f"vol-{self._made}"
            pvc = claim(name, "nfs", access_modes=("ReadWriteMany",))
            pvc["metadata"]["annotations"] = {"nfs.io/storage-path": path}
            self.server.create(pvc)
            self.live[name] = bad
            self.report.tenants += 0 if bad else 1

    def _check(self) -> None:
        self.report.checks += 1
        per_claim: Counter[str] = Counter()
        for pv in self.server.list("v1", "PersistentVolume"):
            ref = pv["spec"].get("claimRef") or {}
            per_claim[str(ref.get("uid"))] += 1
            if self.live.get(str(ref.get("name"))):
                raise Violation("escape", f"hostile claim {ref.get('name')} got PV {pv['metadata']['name']}")
        duplicated = [uid for uid, n in per_claim.items() if n > 1]
        if duplicated:
            raise Violation("duplicate", f"claims with several PVs: {duplicated}")

    def _settle(self) -> None:
        deadline = time.monotonic() + self.settle_timeout
        self._wait(deadline, "eventually-bound", self._all_bound)
        for name in list(self.live):
            self.server.delete("v1", "PersistentVolumeClaim", name, "default")
        self.live.clear()
        self._wait(deadline, "eventually-clean", self._all_clean)

    def _wait(self, deadline: float, invariant: str, done: Any) -> None:
        while True:
            self._check()
            problem = done()
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise Violation(invariant, problem)
            threading.Event().wait(0.1)

    def _all_bound(self) -> str | None:
        for name, bad in self.live.items():
            pvc = self.server.get("v1", "PersistentVolumeClaim", name, "default") or {}
            if bad:
                continue
            if pvc.get("status", {}).get("phase") != "Bound":
                return f"claim {name} not Bound"
            pv = self.server.get("v1", "PersistentVolume", pvc["spec"]["volumeName"]) or {}
            sub = pv.get("spec", {}).get("nfs", {}).get("path", "").removeprefix(NFS_PATH + "/")
            if not sub or not (self.export / sub).is_dir():
                return f"claim {name}: directory {sub!r} missing"
        return None

    def _all_clean(self) -> str | None:
        """No PV, no volume directory and no ownership record left (namespace directories may stay)."""
        if self.server.list("v1", "PersistentVolume"):
            return "PVs left"
        leftovers = [p for p, (kind, _) in _tree(self.export).items()
                     if kind != "dir" or ("/" in p and p.split("/")[0] != RESERVED_DIRECTORY)]
        return f"volume directories or ownership records left: {leftovers[:5]}" if leftovers else None

"""Fault campaign for the node agent: a real agent process, real tmpfs volumes, tenants
that write data, an API server that misbehaves, and `kill -9` at random instants.

Each cycle turns on a random mix of API faults (dropped watches, 410 on resume, 20 % 5xx
on writes, 409 storms, 300 ms latency, an API-server restart) and lets simulated tenants
claim, write to and release volumes. What else happens depends on the cycle's kind, drawn
from a generator seeded by the campaign's seed alone (the same seed, the same kinds):

* ``faults``       - the agent is SIGKILLed at a random instant and started again;
* ``reapply-down`` / ``reapply-up`` - a Bound-then-released or Released PV is deleted and
  applied again as a GitOps tool would (same name, labels, annotations and spec, no
  claimRef, a new uid), with the agent SIGKILLed for the while or running;
* ``hostdir``      - the class's hostDir (and its mountDir, through a symlink) changes to
  another spelling of the same directory; the agent is SIGKILLed the instant a claim is
  made (a config rollout does not wait for a quiet moment), tenants go on without it, it
  is started with the new config, and the PVs naming the old paths are deleted by hand,
  before the start or after it (alternately);
* ``state-loss``   - with the agent SIGKILLed, everything in its state dir (journal.json and
  the rest) is removed; every other such cycle the Released PV of a volume its tenant just
  left is deleted meanwhile too; the agent is started again;
* ``renumber``     - the node reboots and the kernel deals out the disks' device numbers in
  another order: with the agent SIGKILLed (and a bound tenant's claim deleted meanwhile, if
  there is one), every volume's ext4 image is detached and attached again on another
  volume's loop device, and each path is mounted from its device *name* again, as an fstab
  line ``/dev/loopN /mnt/disks/vN`` would; the agent starts on the swapped disks and, a
  while later, the operator mounts each disk at its own path again;
* ``unclaim``      - the operator "unsticks" a Bound or Released PV whose volume holds its
  tenant's data by removing its claimRef (``kubectl patch pv --type json`` with
  ``remove /spec/claimRef``), with the agent SIGKILLed for the while, SIGKILLed at a random
  instant after it, or running. A Bound PV's claim stays live: its tenant holds on, and the
  PV must be Bound to that claim again with the data intact; a Released one's tenant left.

Invariants are checked on every tick (every 20 ms, during the identity changes as much
as between them), and any violation stops the campaign with an exception naming it:

* ``duplicate``      - never two PVs for one volume, under either spelling of its path;
* ``offered-dirty``  - no PV is Available while its volume holds a previous tenant's data.
  One residual window is allowed, because no agent can close it: a PV the campaign
  re-applied itself is on offer from the moment it is applied until the agent acts on it
  (while the agent is down or starting, that is until its first pass). Such a PV counts
  as a violation only once it stayed Available over a dirty volume longer than ``grace``
  (5 s) after the agent was up - its /status counts a completed pass - or after it was
  applied, whichever is later. A PV the campaign unclaimed has the same window, counted
  from the patch, and so has a PV that was on offer when a ``renumber`` cycle put another
  disk at its path (counted from the reboot). The report gives the longest such exposures,
  in all and after the agent was up;
* ``cleaned-while-bound`` - a tenant's data is never removed while its claim is bound,
  wherever its disk is mounted (a ``renumber`` cycle moves it to another path);
* ``claim-kept``     - a live claim whose PV was unclaimed is Bound to it again within
  ``grace`` of the agent being up (or of the patch, whichever is later);
* ``eventually-clean`` - after the faults stop, every volume is offered again, empty.

What the campaign did and when is written to ``campaign.log`` next to the agent's log.

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

import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localpv.nfs.pathpattern import RESERVED_DIRECTORY
from localpv_emulator.apiserver import ApiError, ApiServer
from localpv_emulator.apiserver.patch import JSON_PATCH
from localpv_emulator.apiserver.resources import resource_for
from localpv_emulator.objects import claim, node, storage_class
from tests.support.hostfs import LoopDevices, Mounter

NODE = "campaign-node"
CLASS = "local-fs"
HOST_DIR = "/mnt/disks"
#: Another spelling of the same directory, for the ``hostdir`` cycles.
ALIAS_HOST_DIR = "/mnt/disks-alias"
FAULTS = ("drop-watches", "gone", "write-5xx", "conflicts", "latency", "restart", "lost-answers")
#: The agent campaign's kinds of cycle, with the weight of each in the seeded draw.
CYCLE_KINDS = {"faults": 10, "reapply-down": 3, "reapply-up": 3, "hostdir": 2, "state-loss": 3, "unclaim": 3,
               "renumber": 3}
#: How long a PV the campaign re-applied may stay on offer over a dirty volume once the
#: agent is up (has completed a pass) before that counts as ``offered-dirty``. The agent
#: retracts it in the pass after its PV watch shows it; under the campaign's own faults
#: (300 ms on every request, watches cut, 410s) and the agent's client-side rate limit
#: (5 requests/s, as client-go and upstream) such a pass can take a few seconds.
REAPPLY_GRACE = 5.0
#: Agent events counted in the report (each says one of the identity rules acted).
AGENT_EVENTS = ("VolumeRetracted", "VolumeMoved", "JournalRecovering", "VolumeNotCleaned", "VolumeSuspect",
                "VolumeClaimRestored", "VolumeIdentityMismatch", "VolumeReplaced", "VolumeConditionAbnormal")


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
    #: Agent campaign only: cycles of each kind, and what the identity cycles did.
    kinds: Counter[str] = field(default_factory=Counter)
    reapplied: int = 0
    reapply_raced: int = 0
    host_dir_changes: int = 0
    lost_with_pv_deleted: int = 0
    #: Longest time a re-applied PV was seen on offer over a dirty volume: in all, and
    #: counted from when the agent was up (what the grace bounds).
    reapplied_offer_max: float = 0.0
    reapplied_after_up_max: float = 0.0
    #: PVs whose claimRef the campaign removed, how many of those had a live claim that got
    #: its PV back, and the same exposures as for re-applied PVs.
    unclaimed: int = 0
    claims_kept: int = 0
    unclaimed_offer_max: float = 0.0
    unclaimed_after_up_max: float = 0.0
    #: Reboots that renumbered the disks, how many disks moved, and the longest time a PV
    #: that was on offer stayed so over another (dirty) disk put at its path, after the agent was up.
    renumbered: int = 0
    disks_moved: int = 0
    renumbered_after_up_max: float = 0.0
    agent_events: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        faults = ", ".join(f"{k} x{v}" for k, v in sorted(self.faults.items()))
        text = (f"{self.cycles} cycles, {self.kills} SIGKILLs, {self.tenants} tenants served, "
                f"{self.checks} invariant checks, faults: {faults}; {self.seconds:.0f} s")
        if self.kinds:
            kinds = ", ".join(f"{k} x{v}" for k, v in sorted(self.kinds.items()))
            events = ", ".join(f"{k} x{v}" for k, v in sorted(self.agent_events.items())) or "none"
            text += (f"\ncycle kinds: {kinds}; {self.reapplied} PVs re-applied ({self.reapply_raced} lost the race "
                     f"to the agent's own offer), {self.host_dir_changes} hostDir changes, state dir lost "
                     f"{self.kinds['state-loss']} times ({self.lost_with_pv_deleted} with a Released PV deleted too)"
                     f"\nre-applied PVs on offer over dirty volumes: at most {self.reapplied_offer_max:.2f} s in all, "
                     f"{self.reapplied_after_up_max:.2f} s after the agent was up"
                     f"\n{self.unclaimed} PVs unclaimed ({self.claims_kept} live claims Bound to theirs again), "
                     f"on offer over dirty volumes: at most {self.unclaimed_offer_max:.2f} s in all, "
                     f"{self.unclaimed_after_up_max:.2f} s after the agent was up"
                     f"\n{self.renumbered} reboots renumbering disks ({self.disks_moved} disks moved), PVs on offer "
                     f"over another disk at most {self.renumbered_after_up_max:.2f} s after the agent was up; "
                     f"agent events: {events}")
        return text


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
        elif name == "lost-answers":
            # The write happens, its answer never comes: the retry meets AlreadyExists,
            # NotFound or a Conflict, and must take the first attempt's effect as done.
            for verb in ("create", "update", "patch", "delete"):
                f.lose_responses(verb, 0.2)
        elif name == "conflicts":
            f.conflict_storm(0.3)
        elif name == "latency":
            f.latency(0.3)
        elif name == "restart":
            server.restart()


@dataclass
class _Volume:
    """One volume path (and its PV) and the tenant who claims it. The disk mounted there (an
    ext4 image on a loop device) may change in a ``renumber`` cycle: a tenant's file is on the
    disk that was at the path when it was written (``marker_disk``), wherever that is now."""

    index: int
    path: Path
    state: str = "idle"  # idle -> claimed -> bound -> released -> idle
    last_uid: str = ""
    claim_name: str = ""
    #: The tenant's file on the disk (its name), while a claim holds it.
    marker: str | None = None
    since: float = 0.0
    host_dir: str = HOST_DIR
    #: When the campaign removed the claimRef of this bound tenant's PV (None: it did not, or it is Bound again).
    unclaimed_at: float | None = None
    #: The disk image the tenant's file was written to.
    marker_disk: Path | None = None

    @property
    def host_path(self) -> str:
        return f"{self.host_dir}/v{self.index}"


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
        except Violation as violation:
            # The workdir goes with the test's tmp dir: CI output keeps what each process said.
            violation.add_note(self._log_tails())
            raise
        finally:
            for name in self._procs:
                self._sigkill(name)
            self.server.stop()
            self._teardown()
            self.report.seconds = time.monotonic() - started
        return self.report

    def _log_tails(self, lines: int = 60) -> str:
        """The last lines of each log in the workdir (campaign.log, one per process)."""
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            parts.append(f"--- last {len(tail)} lines of {log.name}\n" + "\n".join(tail))
        return "\n".join(parts)

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
    """The node agent campaign; :meth:`run` returns a report or raises :class:`Violation`.

    ``forced`` names the kinds of the first cycles (the reduced CI run forces one of
    each); later cycles draw theirs from :data:`CYCLE_KINDS` with a generator seeded
    from ``seed`` alone, so a seed always gives the same sequence of kinds.
    """

    def __init__(self, workdir: Path, *, volumes: int = 4, cycles: int = 5, cycle_seconds: float = 3.0,
                 kill: bool = True, seed: int = 1, settle_timeout: float = 60.0, grace: float = REAPPLY_GRACE,
                 forced: Sequence[str] = ()) -> None:
        super().__init__(workdir, cycles=cycles, cycle_seconds=cycle_seconds, seed=seed,
                         settle_timeout=settle_timeout, kill=kill)
        unknown = [k for k in forced if k not in CYCLE_KINDS]
        if unknown:
            raise ValueError(f"unknown cycle kinds {unknown}; expected some of {list(CYCLE_KINDS)}")
        self.mounter = Mounter()
        self.loops = LoopDevices(workdir)
        self.volumes = [_Volume(i, workdir / "discovery" / f"v{i}") for i in range(volumes)]
        self._by_path = {f"{d}/v{v.index}": v for d in (HOST_DIR, ALIAS_HOST_DIR) for v in self.volumes}
        self._claims = 0
        self.grace = grace
        kinds_rng = random.Random(f"cycle-kinds-{seed}")
        weights = [CYCLE_KINDS[k] for k in CYCLE_KINDS]
        self.schedule = [*forced, *kinds_rng.choices(list(CYCLE_KINDS), weights, k=max(0, cycles - len(forced)))]
        self.host_dir = HOST_DIR
        self.state_dir = workdir / "state"
        self._config = workdir / "config.yaml"
        self._port = 0
        self._faults: list[str] = []
        self._next_drop = 0.0
        #: When the running agent completed its first pass (None: down or starting).
        self._agent_up_at: float | None = None
        #: uid -> when the campaign applied that PV itself; and since when each was seen on offer dirty.
        self._reapplied: dict[str, float] = {}
        self._dirty_since: dict[str, float] = {}
        #: uid -> when the campaign removed that PV's claimRef.
        self._unclaimed: dict[str, float] = {}
        #: uid -> when a PV on offer got another disk at its path (a ``renumber`` cycle's reboot).
        self._renumbered: dict[str, float] = {}
        #: Tenants wait while the disks are swapped (between a renumbering reboot and the fix).
        self._swapped = False
        #: The disk image mounted at each volume path now.
        self._image_at: dict[Path, Path] = {}

    # ------------------------------------------------------------------ setup and processes

    def _setup(self) -> dict[str, list[str]]:
        self.server.create(node(NODE))
        self.server.create(storage_class(CLASS))
        for volume in self.volumes:
            # A real disk for each volume (ext4 has a UUID, tmpfs none), mounted by its
            # device name as an fstab line would, so that a reboot can renumber them.
            disk = self.loops.attach(size=16 << 20, ext4=True)
            self.mounter.device(disk.path, volume.path)
            (volume.path / "lost+found").rmdir()  # offered empty, like a fresh tmpfs
            self._image_at[volume.path] = disk.backing
        (self.workdir / "discovery-alias").symlink_to(self.workdir / "discovery")
        kubeconfig = self.workdir / "kubeconfig"
        self.server.write_kubeconfig(str(kubeconfig))
        self._write_config(HOST_DIR)
        with socket.socket() as sock:  # a fixed port, so /healthz can be polled across restarts
            sock.bind(("127.0.0.1", 0))
            self._port = sock.getsockname()[1]
        return {"agent": [sys.executable, "-m", "localpv", "agent", "--config", str(self._config), "--node", NODE,
                          "--kubeconfig", str(kubeconfig), "--listen-address", f"127.0.0.1:{self._port}",
                          "--state-dir", str(self.state_dir), "--discovery-period", "1s"]}

    def _write_config(self, host_dir: str) -> None:
        mount_dir = self.workdir / ("discovery" if host_dir == HOST_DIR else "discovery-alias")
        self._config.write_text(yaml.safe_dump({"storageClassMap": {CLASS: {
            "hostDir": host_dir, "mountDir": str(mount_dir)}}}))

    def _teardown(self) -> None:
        self.mounter.umount_all()
        self.loops.detach_all()

    def _start(self, name: str) -> None:
        super()._start(name)
        self._agent_up_at = None
        self._note("agent started")

    def _sigkill(self, name: str) -> None:
        super()._sigkill(name)
        self._agent_up_at = None
        self._note("agent SIGKILLed")

    def _kill_agent(self) -> None:
        self._sigkill("agent")
        self.report.kills += 1

    def _note(self, text: str) -> None:
        """A line in ``campaign.log`` next to ``agent.log``: what the campaign did, and when."""
        with open(self.workdir / "campaign.log", "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {text}\n")

    def _poll_agent_up(self) -> None:
        """Note when the (re)started agent has completed a pass (``passes`` in its /status)."""
        proc = self._procs.get("agent")
        if self._agent_up_at is not None or proc is None or proc.poll() is not None:
            return
        if int(self._agent_status().get("passes") or 0) > 0:
            self._agent_up_at = time.monotonic()
            self._note("agent up (first pass done)")

    def _agent_status(self) -> dict[str, Any]:
        """The running agent's /status document; empty when it does not answer (yet)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self._port}/status", timeout=0.5) as response:
                doc = json.loads(response.read())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _journal_states(self) -> dict[str, str]:
        """The running agent's journal state of each volume (host path), from its /status."""
        volumes = self._agent_status().get("volumes") or []
        return {str(v.get("path")): str(v.get("journal") or "") for v in volumes if isinstance(v, dict)}

    # ------------------------------------------------------------------ cycles

    def _cycle(self) -> None:
        kind = self.schedule[self.report.cycles] if self.report.cycles < len(self.schedule) else "faults"
        self.report.kinds[kind] += 1
        self._note(f"cycle {self.report.cycles}: {kind}")
        if kind == "faults":
            super()._cycle()
            return
        self._faults = self.rng.sample(FAULTS, k=self.rng.randint(1, 3))
        self._note(f"faults {self._faults}")
        inject_faults(self.server, self._faults, self.report)
        start = time.monotonic()
        end, self._next_drop = start + self.cycle_seconds, start + 1.0
        if kind in ("reapply-down", "reapply-up"):
            self._reapply_cycle(start, end, agent_down=kind == "reapply-down")
        elif kind == "hostdir":
            self._hostdir_cycle(start, end)
        elif kind == "unclaim":
            self._unclaim_cycle(start, end)
        elif kind == "renumber":
            self._renumber_cycle(start, end)
        else:
            self._state_loss_cycle(start, end)
        self._run_until(end)
        self.server.faults.reset()
        self._faults = []

    def _run_until(self, end: float, done: Callable[[], bool] | None = None) -> bool:
        """Tick (checking the invariants) until ``end`` or until ``done()``; pace watch drops."""
        while time.monotonic() < end:
            self._tick()
            if done is not None and done():
                return True
            now = time.monotonic()
            if "drop-watches" in self._faults and now >= self._next_drop:
                self.server.faults.drop_watches(abrupt=self.rng.random() < 0.5)
                self._next_drop = now + 1.0
            threading.Event().wait(self.tick_interval)
        return False

    def _run_for(self, seconds: float) -> None:
        self._run_until(time.monotonic() + seconds)

    def _reapply_cycle(self, start: float, end: float, *, agent_down: bool) -> None:
        """Delete a Bound-then-released or Released PV and apply it again (new uid, no claimRef)."""
        self._run_until(start + self.rng.uniform(0.2, 0.4) * self.cycle_seconds)
        if not agent_down:
            self._run_until(end + 20, lambda: self._agent_up_at is not None)
        target: list[tuple[_Volume, dict[str, Any]]] = []

        def candidate() -> bool:
            pvs = self._pvs_by_path()
            for volume in self.rng.sample(self.volumes, k=len(self.volumes)):
                pv = (pvs.get(volume.host_path) or [{}])[0]
                if volume.state in ("bound", "released") and \
                        pv.get("status", {}).get("phase") in ("Bound", "Released"):
                    target.append((volume, pv))
                    return True
            return False

        if not candidate() and not self._run_until(end + 20, candidate):
            raise Violation("campaign", "no Bound or Released PV to re-apply within 20 s")
        volume, pv = target[-1]
        if agent_down:
            self._kill_agent()
        if volume.state == "bound":
            self._release(volume)
        name = str(pv["metadata"]["name"])
        current = self.server.get("v1", "PersistentVolume", name) or pv
        try:
            self.server.delete("v1", "PersistentVolume", name)
        except ApiError as err:
            if err.code != 404:
                raise
        fresh = {"apiVersion": "v1", "kind": "PersistentVolume",
                 "metadata": {k: v for k, v in current["metadata"].items() if k in ("name", "labels", "annotations")},
                 "spec": {k: v for k, v in current["spec"].items() if k != "claimRef"}}
        try:
            created = self.server.create(fresh)
        except ApiError as err:  # the agent offered the volume again first (it had cleaned it)
            if err.code != 409:
                raise
            self.report.reapply_raced += 1
        else:
            self._reapplied[str(created["metadata"]["uid"])] = time.monotonic()
            self.report.reapplied += 1
            self._note(f"PV {name} of {volume.host_path} ({volume.state}, holds {os.listdir(volume.path)}) deleted "
                       f"(uid {current['metadata']['uid']}) and re-applied as uid {created['metadata']['uid']}")
        if agent_down:
            self._run_for(self.rng.uniform(0.2, 1.0))  # on offer with no agent to retract it
            self._start("agent")

    def _hostdir_cycle(self, start: float, end: float) -> None:
        """The operator points the class at another spelling of the same directory (hostDir
        and, through a symlink, mountDir) and the agent restarts with it; the PVs that name
        the old paths are deleted by hand, before the restart or after it (alternately).

        The agent goes down the instant a claim is made for a fresh PV (a config rollout
        does not wait for a quiet moment), so that tenant binds, writes and leaves while no
        agent watches; the others are released just before. Volumes are therefore dirty,
        some already being cleaned, when the old PVs go.
        """
        self._run_until(start + self.rng.uniform(0.2, 0.4) * self.cycle_seconds)
        claims = self._claims
        self._run_until(end + 20, lambda: self._claims > claims)
        self._kill_agent()
        self._run_for(self.rng.uniform(0.5, 1.0))  # tenants go on without the agent
        for volume in self.volumes:
            if volume.state in ("bound", "claimed"):
                self._release(volume)
        old = self.host_dir
        self.host_dir = ALIAS_HOST_DIR if old == HOST_DIR else HOST_DIR
        self._write_config(self.host_dir)
        delete_first = self.report.host_dir_changes % 2 == 0
        if delete_first:
            self._delete_pvs_under(old)
        for volume in self.volumes:
            volume.host_dir = self.host_dir
        self._start("agent")
        self.report.host_dir_changes += 1
        self._note(f"hostDir {old} -> {self.host_dir}, agent started, old PVs deleted "
                   f"{'before' if delete_first else 'after'} the start; volumes holding data: "
                   f"{[v.index for v in self.volumes if os.listdir(v.path)]}")
        if not delete_first:
            self._run_for(self.rng.uniform(0.3, 1.0))
            self._delete_pvs_under(old)

    def _state_loss_cycle(self, start: float, end: float) -> None:
        """The node's state dir is lost (re-imaged node, moved hostPath) while the agent is
        down. Every other such cycle the operator also deletes, meanwhile, the Released PV of
        a volume its tenant just left: a dirty volume with neither a PV nor a record."""
        self._run_until(start + self.rng.uniform(0.2, 0.6) * self.cycle_seconds)
        self._kill_agent()
        for entry in os.scandir(self.state_dir):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        self._note("state dir emptied")
        if self.report.kinds["state-loss"] % 2 == 1:
            left: list[str] = []

            def released() -> bool:
                pvs = self._pvs_by_path()
                for volume in self.volumes:
                    pv = (pvs.get(volume.host_path) or [{}])[0]
                    if volume.state == "released" and os.listdir(volume.path) and \
                            pv.get("status", {}).get("phase") == "Released":
                        left.append(str(pv["metadata"]["name"]))
                        return True
                return False

            if released() or self._run_until(time.monotonic() + 3.0, released):
                self._delete_pv(left[-1])
                self.report.lost_with_pv_deleted += 1
                self._note(f"Released PV {left[-1]} of a dirty volume deleted too")
        self._start("agent")

    def _unclaim_cycle(self, start: float, end: float) -> None:
        """Remove the claimRef of a Bound or Released PV whose volume holds its tenant's data,
        with the agent down meanwhile, SIGKILLed at a random instant after, or running."""
        self._run_until(start + self.rng.uniform(0.2, 0.4) * self.cycle_seconds)
        # Only a volume whose use the agent has recorded (journal used or cleaning) is
        # unclaimed. A bind, a write, a release and an unclaim all between two of its passes
        # (or while it is down with a lost journal) leave a PV it cannot tell from one never
        # used: a documented residual risk (docs/reliability.md), not what this cycle tests.
        agent = self.rng.choice(("down", "killed", "up"))

        def candidates() -> list[tuple[_Volume, dict[str, Any]]]:
            if self._agent_up_at is None:
                return []
            pvs = self._pvs_by_path()
            recorded = self._journal_states()
            found = []
            for volume in self.rng.sample(self.volumes, k=len(self.volumes)):
                pv = (pvs.get(volume.host_path) or [{}])[0]
                if volume.state in ("bound", "released") and os.listdir(volume.path) and \
                        pv.get("status", {}).get("phase") in ("Bound", "Released") and pv["spec"].get("claimRef") \
                        and recorded.get(volume.host_path) in ("used", "cleaning"):
                    found.append((volume, pv))
            return found

        # Candidates are found with the agent up (tenants only move on while it runs), then
        # the agent is stopped if this cycle wants it down, then one of them is unclaimed.
        if not candidates() and not self._run_until(end + 20, lambda: bool(candidates())):
            raise Violation("campaign", "no Bound or Released PV over a dirty volume to unclaim within 20 s")
        found = candidates()
        if agent == "down":
            self._kill_agent()
        if not any(self._unclaim(volume, pv, agent) for volume, pv in found):
            self._note("every candidate changed before it could be unclaimed; none this cycle")
        if agent == "down":
            self._run_for(self.rng.uniform(0.2, 1.0))  # on offer with no agent to act on it
            self._start("agent")
        elif agent == "killed":
            self._run_for(self.rng.uniform(0.0, 1.5))
            self._kill_agent()
            self._start("agent")

    def _renumber_cycle(self, start: float, end: float) -> None:
        """A reboot that renumbers the disks, a while with each on another path, then the fix."""
        self._run_until(start + self.rng.uniform(0.2, 0.4) * self.cycle_seconds)
        self._run_until(end + 20, lambda: any(v.state == "bound" for v in self.volumes))
        self._kill_agent()  # the node goes down
        bound = [v for v in self.volumes if v.state == "bound" and v.unclaimed_at is None]
        if bound:
            self._release(self.rng.choice(bound))  # a claim deleted while the node is down
        # Requests the killed agent had in flight (a PV create under 300 ms of latency) land
        # meanwhile: the PVs on offer at the reboot are the ones that exist after it.
        self._run_for(1.0)
        paths = [v.path for v in self.volumes]
        images = [self._image_at[p] for p in paths]
        while [self._image_at[p] for p in paths] == images:
            self.rng.shuffle(images)  # at least one disk moves
        moved = sum(1 for p, i in zip(paths, images, strict=True) if self._image_at[p] != i)
        self._attach_disks(dict(zip(paths, images, strict=True)))
        self._swapped = True
        self.report.renumbered += 1
        self.report.disks_moved += moved
        self._note(f"rebooted: {moved} disks moved")
        self._start("agent")
        self._run_until(end + 20, lambda: self._agent_up_at is not None)
        self._run_for(self.rng.uniform(1.0, 2.0))  # the agent on the swapped disks
        self._attach_disks(self._recorded_placement())  # the operator's fix, from `localpv status`
        self._swapped = False
        self._note("each disk mounted at the path its record names again")

    def _recorded_placement(self) -> dict[Path, Path]:
        """Each disk at the path whose record names its identity (what `localpv status` lists,
        as the runbook says); disks no record names take the remaining paths."""
        identity_at = {str(v.get("path")): str(v.get("identity") or "") for v in self._agent_status().get("volumes")
                       or [] if isinstance(v, dict)}
        uuid_of = {image: "fs:uuid=" + subprocess.run(["blkid", "-p", "-o", "value", "-s", "UUID", str(image)],
                                                      capture_output=True, text=True, check=True).stdout.strip()
                   for image in self._image_at.values()}
        placement: dict[Path, Path] = {}
        for volume in self.volumes:
            wanted = identity_at.get(volume.host_path)
            image = next((i for i, u in uuid_of.items() if u == wanted and i not in placement.values()), None)
            if image is not None:
                placement[volume.path] = image
        spare = [i for i in uuid_of if i not in placement.values()]
        for volume in self.volumes:
            if volume.path not in placement:
                placement[volume.path] = spare.pop(0)
        return placement

    def _attach_disks(self, placement: dict[Path, Path]) -> None:
        """Mount disk ``placement[path]`` at each volume path, from a loop device's *name*.

        A PV on offer at that moment may now offer another disk, one that holds data: no
        agent can take it off offer before its next pass (with the agent down, before its
        first), so such a PV gets the same grace as a re-applied one, counted from now."""
        now = time.monotonic()
        for items in self._pvs_by_path().values():
            for pv in items:
                if pv.get("status", {}).get("phase") == "Available":
                    self._renumbered[str(pv["metadata"]["uid"])] = now
        devices = sorted(d.path for d in self.loops.attached)
        for volume in self.volumes:
            self.mounter.umount(volume.path)
        for disk in self.loops.attached:
            self.loops.detach(disk)
        for volume, device in zip(self.volumes, devices, strict=True):
            self.loops.attach_image(placement[volume.path], device)
            self.mounter.device(device, volume.path)
        self._image_at = dict(placement)

    def _unclaim(self, volume: _Volume, pv: dict[str, Any], agent: str) -> bool:
        """``kubectl patch pv --type json`` removing ``/spec/claimRef`` (of that very PV)."""
        name, uid = str(pv["metadata"]["name"]), str(pv["metadata"]["uid"])
        ops = [{"op": "test", "path": "/metadata/uid", "value": uid}, {"op": "remove", "path": "/spec/claimRef"}]
        try:
            self.server.store.patch(resource_for("v1", "PersistentVolume"), None, name, JSON_PATCH,
                                    json.dumps(ops).encode())
        except ApiError as err:  # gone, re-created or its claimRef already off since the list
            self._note(f"unclaiming PV {name} (uid {uid}) of {volume.host_path} failed: {err}")
            return False
        self._unclaimed[uid] = time.monotonic()
        self.report.unclaimed += 1
        if volume.state == "bound":
            volume.unclaimed_at = self._unclaimed[uid]
        self._note(f"PV {name} (uid {uid}) of {volume.host_path} ({volume.state}, claim {volume.claim_name}, "
                   f"holds {os.listdir(volume.path)}) unclaimed, agent {agent}")
        return True

    def _release(self, volume: _Volume) -> None:
        try:
            self.server.delete("v1", "PersistentVolumeClaim", volume.claim_name, "default")
        except ApiError as err:
            if err.code != 404:
                raise
        volume.state, volume.marker, volume.marker_disk, volume.unclaimed_at = "released", None, None, None

    def _delete_pv(self, name: str) -> None:
        try:
            self.server.delete("v1", "PersistentVolume", name)
        except ApiError as err:
            if err.code != 404:
                raise

    def _delete_pvs_under(self, host_dir: str) -> None:
        for path, items in self._pvs_by_path().items():
            if path.startswith(host_dir + "/"):
                for pv in items:
                    self._delete_pv(str(pv["metadata"]["name"]))

    # ------------------------------------------------------------------ tenants and invariants

    def _pvs_by_path(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for pv in self.server.list("v1", "PersistentVolume"):
            found.setdefault(pv["spec"]["local"]["path"], []).append(pv)
        return found

    def _check(self) -> dict[str, list[dict[str, Any]]]:
        """``duplicate`` and ``offered-dirty``, over every PV (old and new spellings alike)."""
        self._poll_agent_up()
        pvs = self._pvs_by_path()
        self.report.checks += 1
        now = time.monotonic()
        per_volume: dict[int, list[str]] = {}
        for path, items in pvs.items():
            volume = self._by_path.get(path)
            if volume is None:
                continue
            per_volume.setdefault(volume.index, []).extend(f"{p['metadata']['name']} ({path})" for p in items)
            for pv in items:
                if pv["spec"].get("claimRef"):  # the agent or the PV controller gave it a claimRef again
                    self._unclaimed.pop(str(pv["metadata"]["uid"]), None)
                if pv.get("status", {}).get("phase") == "Available":
                    self._check_offer(volume, pv, now)
        for names in per_volume.values():
            if len(names) > 1:
                raise Violation("duplicate", f"one volume published as {names}")
        return pvs

    def _check_offer(self, volume: _Volume, pv: dict[str, Any], now: float) -> None:
        """An Available PV must offer an empty volume. The one exception is a PV the campaign
        applied itself (or unclaimed): it is on offer from the moment it is applied until the agent
        acts, so it is a violation only once it stayed on offer dirty ``grace`` seconds after the
        agent was up."""
        uid = str(pv["metadata"]["uid"])
        left = os.listdir(volume.path)
        if not left:
            return
        ref = pv["spec"].get("claimRef") or {}
        if ref and ref.get("name") == volume.claim_name and left == [f"data-{volume.claim_name}"]:
            # Pre-bound to the claim whose data it holds (the agent put back the claimRef that
            # was removed by hand): only that claim can bind it, and the phase says Bound or
            # Released at the PV controller's next sync. It is offered to nobody else.
            return
        unclaimed = uid in self._unclaimed
        applied = self._unclaimed.get(uid) if unclaimed else self._reapplied.get(uid)
        if uid in self._renumbered:
            # On offer when the reboot put another disk at its path: the agent takes it off
            # offer in its first pass (until then, the window no agent can close).
            if self._agent_up_at is None:
                return
            exposure = now - max(self._renumbered[uid], self._agent_up_at)
            self.report.renumbered_after_up_max = max(self.report.renumbered_after_up_max, exposure)
            if exposure > self.grace:
                raise Violation("offered-dirty", f"{pv['spec']['local']['path']}: PV {pv['metadata']['name']} "
                                                 f"(uid {uid}) on offer over another disk holding {left} "
                                                 f"{exposure:.1f} s after the agent was up")
            return
        if applied is None:
            raise Violation("offered-dirty", f"{pv['spec']['local']['path']} offered as {pv['metadata']['name']} "
                                             f"(uid {uid}) still holds {left}")
        r = self.report
        since = self._dirty_since.setdefault(uid, now)
        if unclaimed:
            r.unclaimed_offer_max = max(r.unclaimed_offer_max, now - since)
        else:
            r.reapplied_offer_max = max(r.reapplied_offer_max, now - since)
        if self._agent_up_at is None:
            return  # nobody to retract it yet: the residual window the docstring names
        exposure = now - max(applied, self._agent_up_at)
        if unclaimed:
            r.unclaimed_after_up_max = max(r.unclaimed_after_up_max, exposure)
        else:
            r.reapplied_after_up_max = max(r.reapplied_after_up_max, exposure)
        if exposure > self.grace:
            raise Violation("offered-dirty", f"{pv['spec']['local']['path']}: PV {pv['metadata']['name']} "
                                             f"{'unclaimed' if unclaimed else 're-applied as'} uid {uid} is still on "
                                             f"offer over {left} {exposure:.1f} s after the agent was up")

    def _tick(self) -> None:
        pvs = self._check()
        for volume in self.volumes:
            found = pvs.get(volume.host_path)
            self._advance(volume, found[0] if found else None)

    def _advance(self, volume: _Volume, pv: dict[str, Any] | None) -> None:
        phase = (pv or {}).get("status", {}).get("phase")
        uid = (pv or {}).get("metadata", {}).get("uid", "")
        marker = self._marker_path(volume)
        if volume.state == "bound" and marker is not None and not marker.exists():
            raise Violation("cleaned-while-bound", f"{volume.host_path}: data of {volume.claim_name} vanished "
                                                   f"(its disk is mounted at {marker.parent})")
        if self._swapped:
            return  # the node's pods wait for the operator to mount each disk at its path again
        if volume.state == "bound" and volume.unclaimed_at is not None:
            self._await_claim_kept(volume, pv)
            return
        if volume.state in ("idle", "released") and phase == "Available" and uid != volume.last_uid:
            if os.listdir(volume.path):
                return  # a re-applied or unclaimed PV within its grace (anything else raised in _check)
            volume.last_uid, volume.state = uid, "idle"
            self._claim(volume)
        elif volume.state == "claimed" and phase == "Bound" and \
                (pv or {}).get("spec", {}).get("claimRef", {}).get("name") == volume.claim_name:
            volume.marker, volume.marker_disk = f"data-{volume.claim_name}", self._image_at[volume.path]
            (volume.path / volume.marker).write_text("tenant data\n")
            volume.state, volume.since = "bound", time.monotonic()
            self.report.tenants += 1
        elif volume.state == "bound" and time.monotonic() - volume.since > self.rng.uniform(0.1, 0.6):
            self._release(volume)

    def _marker_path(self, volume: _Volume) -> Path | None:
        """Where the tenant's file is now: on the disk it was written to, wherever that is mounted."""
        if volume.marker is None:
            return None
        mounted = next((path for path, image in self._image_at.items() if image == volume.marker_disk), None)
        return (mounted or volume.path) / volume.marker

    def _await_claim_kept(self, volume: _Volume, pv: dict[str, Any] | None) -> None:
        """A tenant whose PV the campaign unclaimed holds on until its claim is Bound to that
        PV again (its data checked by ``cleaned-while-bound``); ``claim-kept`` otherwise."""
        assert volume.unclaimed_at is not None
        pvc = self.server.get("v1", "PersistentVolumeClaim", volume.claim_name, "default") or {}
        ref = (pv or {}).get("spec", {}).get("claimRef") or {}
        if (pv or {}).get("status", {}).get("phase") == "Bound" and ref.get("name") == volume.claim_name and \
                ref.get("uid") == pvc.get("metadata", {}).get("uid") and \
                pvc.get("status", {}).get("phase") == "Bound" and \
                pvc.get("spec", {}).get("volumeName") == (pv or {}).get("metadata", {}).get("name"):
            volume.unclaimed_at, volume.since = None, time.monotonic()
            self.report.claims_kept += 1
            return
        if self._agent_up_at is None:
            return
        waited = time.monotonic() - max(volume.unclaimed_at, self._agent_up_at)
        if waited > self.grace:
            raise Violation("claim-kept", f"{volume.host_path}: live claim {volume.claim_name} "
                                          f"({pvc.get('status', {}).get('phase')}) not Bound to its PV again "
                                          f"{waited:.1f} s after the agent was up; PV: "
                                          f"{(pv or {}).get('metadata', {}).get('name')} "
                                          f"{(pv or {}).get('status', {}).get('phase')} claimRef {ref or None}")

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
            pvs = self._check()
            pending = []
            for volume in self.volumes:
                pv = (pvs.get(volume.host_path) or [{}])[0]
                phase = pv.get("status", {}).get("phase")
                if volume.unclaimed_at is not None:
                    self._advance(volume, pv or None)  # a live claim whose PV was unclaimed: Bound again first
                elif volume.state == "bound" or (volume.state == "claimed" and phase == "Bound"):
                    self._release(volume)
                elif volume.state == "released" and phase == "Available" and not os.listdir(volume.path):
                    volume.state, volume.last_uid = "idle", pv["metadata"]["uid"]
                if volume.state != "idle" or phase != "Available" or os.listdir(volume.path):
                    pending.append(f"{volume.host_path}: {volume.state}/{phase}")
            if not pending:
                break
            if time.monotonic() > deadline:
                raise Violation("eventually-clean", f"not Available and empty in time: {pending}")
            threading.Event().wait(0.05)
        for event in self.server.list("v1", "Event"):
            if event.get("reason") in AGENT_EVENTS:
                self.report.agent_events[str(event["reason"])] += int(event.get("count") or 1)


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

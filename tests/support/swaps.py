"""Swaps, enumerated (issue 24, item 3): every swap of two mounts and every move of one mount to
an empty path, made while the agent is stopped, on a node with a volume in every state.

The node (the agent in-process, against an emulator of its own: :mod:`tests.support.agentenv`):

* ``b`` - bound: a tenant's claim, its data;
* ``f`` - released, its cleaner failing: the tenant left a file ``chattr +i`` (the cleanup
  removes the rest, fails, and is retried);
* ``c`` - released, its cleanup in flight: the filesystem cleaner is wrapped so that it waits
  for as long as the node lives whenever the volume it is started on is ``c``'s;
* ``a`` - Available: clean, on offer;
* ``h`` - held: tenant ``h``'s volume (``x``, bound, its data) is mounted outside the discovery
  directory and a volume no record names (``y``, somebody's data) is at ``h``: the agent holds
  ``h`` (identity mismatch);
* ``e`` - an empty path (a directory, no mount).

Volume kinds: ext4 on loop devices (a stable identity: the filesystem UUID) and tmpfs (none:
device and inode numbers within one boot). Variants: the same boot with the journal as it is; the
same boot with the journal rewritten as a release before identities wrote it (no ``identity``,
no ``boot``: an upgrade); a reboot (a new boot id) with the journal as it is.

A case, with the agent stopped: the reboot if any, the operation (the control - nothing -, a swap
of two of ``a b c f h``, or a move of one of them to ``e``), the journal rewritten if an upgrade.
The agent is started; its first pass and three more are checked. It is stopped, the operation
undone, and it is started again: it must come back to the node's steady state (``b`` and ``h``
Bound to their tenants, ``a`` on offer, ``f`` and ``c`` cleaning at their paths, nothing held but
``h``) within 20 s; after a reboot of volumes without identity the operator gives the word each
``VolumeIdentityMismatch`` event asks for (``accept-volume.localpv.dev/<PV>=<numbers>@<boot>``),
where it names the volume that belongs at that path. A node serves every case of a variant in
turn; after a case that legitimately leaves it off its steady state (``y`` moved to ``e`` is
offered there as a new volume; put back at ``h``, that PV and record stay) it is built again. At
the end of each node the operator fixes everything (``chattr -i``, the cleaner let go, ``x`` back
at ``h``, ``y`` taken away): every volume ends clean and on offer, or Bound with its data.

Checked on every poll (20 ms) while an agent is up, after its first pass - :meth:`SwapNode.check`:

* ``offered-dirty``: no PV is Available over a volume holding files (or over a path showing no
  volume whose directory holds files), unless it was made for ``y``, which no record names: a
  volume brought along is offered with its files, and never cleaned;
* ``cleaned-while-bound``: no cleanup starts on ``b``, ``x`` or ``y`` (the wrapped cleaner logs
  the device of every volume it is started on), and their files are intact wherever they are;
* ``lost-record``: ``f`` and ``c`` (released, not cleaned) are each named by a record in state
  ``used`` or ``cleaning``, by identity or by numbers they had in the boot the record says - or,
  without identity, the path they are at has a record that is not ``clean`` and is held (after a
  reboot numbers name nothing: a record may have taken an empty volume, and what keeps this one
  is the hold at its path until it is put back or the operator says what it is);
* ``duplicate``: at most one PV per path, and no two live PVs made for one volume (the volume its
  path showed when the harness first saw the PV; for a volume without identity, made in one boot);
* ``progress``: the steady state after each undo, and the end.

Pruned, and why:

* the empty path as a *source* (a swap with ``e`` is a move) and moves onto a path that has a
  mount (those are swaps);
* an upgrade combined with a reboot: a record written before boot ids is taken as of this boot
  (the residual docs/reliability.md states; the procedure is upgrade, one pass, then reboot);
* for ext4 a reboot keeps device numbers here (``mount --move``): disks renumbered at boot are
  the issue-17 suite's and campaign's (tests/agent/test_renumbering_e2e.py), and a stable
  identity makes numbers irrelevant;
* tmpfs across a reboot is modelled as a disk without identity that keeps its data: each volume
  is copied onto a new tmpfs (new numbers, dealt by the kernel: often another volume's old ones).
  A real tmpfs comes back empty: every volume empty and renumbered, so every permutation of the
  mounts is the same node - one run (``reboot-empty``), the last of the tmpfs reboot node, after
  which only the end is checked.

:data:`KNOWN_RESIDUALS` lists the cases that break an invariant on the current code for a reason
not fixed here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import localpv.agent.cleaning
from localpv.agent.journal import CLEAN, CLEANING, USED, Journal, JournalEntry
from localpv.agent.node import NodeAgent
from localpv.agent.pvbuilder import ACCEPT_VOLUME_PREFIX
from tests.support.agentenv import NODE, AgentEnv, bound_claim, events, forget_identities, fresh_agent_env, numbers
from tests.support.campaign import Violation
from tests.support.hostfs import LoopDevice, LoopDevices, MiB, sh, umount

Obj = dict[str, Any]
HOST_DIR = "/mnt/disks"
#: The paths of the discovery directory that hold a mount in the node's steady state.
MOUNTED = ("a", "b", "c", "f", "h")
EMPTY = "e"
VARIANTS = (("same", "current"), ("same", "upgrade"), ("reboot", "current"))
PASSES = 3
#: How long the watch goes on after the passes of a case (a cleanup starts in a process of its own).
SETTLE = 0.3
#: Cases that break an invariant on the current code, for a reason not fixed here (each is said in
#: docs/reliability.md, "Swaps, enumerated"): the case label, and the invariant it breaks. The
#: suite fails if one of them stops breaking it (fixed: take it off the list) or another one does.
KNOWN_RESIDUALS: dict[str, str] = {
    # After a reboot, a volume without identity that holds data, mounted at a path no record names,
    # is a new volume to the agent (its numbers prove nothing, no record knows it): it is offered
    # with its files - the rule for a disk brought along (``y``). When it is a tenant's (bound, or
    # released and not cleaned) whose fstab line moved at the reboot, that tenant's data is on offer.
    **{f"tmpfs reboot current move {name}->{EMPTY}": "offered-dirty" for name in ("b", "c", "f")},
}
PROGRESS_TIMEOUT = 20.0

#: Wraps the filesystem cleaner (``localpv.agent.cleaning._FS_CLEANER``): logs the device of the
#: volume it is started on, waits while that device is listed in ``blocked`` (until ``open``
#: exists), then runs the real cleaner. Its environment has no PATH: it needs none.
_WRAPPER = """\
import os, sys, time
gate, args = sys.argv[1], sys.argv[2:]
try:
    dev = os.stat(args[0]).st_dev
except OSError:
    dev = -1
with open(os.path.join(gate, "log"), "a") as f:
    f.write(f"{dev} {args[0]}\\n")
def blocked():
    with open(os.path.join(gate, "blocked")) as f:
        return str(dev) in f.read().split() and not os.path.exists(os.path.join(gate, "open"))
while blocked():
    time.sleep(0.05)
os.execv(sys.executable, [sys.executable, "-m", "localpv.host.fsclean", *args])
"""


@dataclass(frozen=True)
class Op:
    """Swap the mounts at two paths, or move the one at ``a`` to ``b`` (an empty path); none: the control."""

    kind: str  # "none", "swap" or "move"
    a: str = ""
    b: str = ""

    def __str__(self) -> str:
        return {"none": "none", "swap": f"swap {self.a}<->{self.b}", "move": f"move {self.a}->{self.b}"}[self.kind]


def operations() -> list[Op]:
    """The control, every swap of two mounted paths, every move of one to the empty path."""
    return [Op("none"), *(Op("swap", a, b) for a, b in itertools.combinations(MOUNTED, 2)),
            *(Op("move", a, EMPTY) for a in MOUNTED)]


@dataclass
class Vol:
    """One volume of the node: where it is mounted now, and what it holds."""

    name: str
    mount: Path
    files: dict[str, str] = field(default_factory=dict)
    #: A live tenant's (or a stranger's) data: never cleaned, never lost.
    protected: bool = False
    #: Data released and not cleaned yet: a dirty record must name the volume.
    dirty: bool = False
    #: A volume no record names (``y``): offered as a new volume with its files, never cleaned.
    foreign: bool = False
    device: LoopDevice | None = None
    identity: str = ""
    #: Every set of numbers the volume was known by, with the boot it was seen in.
    names: set[tuple[str, str]] = field(default_factory=set)
    dev: int = 0

    def seen(self, boot: str) -> None:
        self.dev = os.stat(self.mount).st_dev
        self.names.add((numbers(self.mount), boot))

    def named_by(self, record: JournalEntry) -> bool:
        """Whether ``record`` knows this volume: by its identity, or by numbers it had in the boot the
        record says (any boot for a record without one)."""
        if self.identity and record.identity == self.identity:
            return True
        return any(record.ident == found and record.boot in ("", boot) for found, boot in self.names)

    def has_files(self) -> list[str]:
        return sorted(n for n in os.listdir(self.mount) if n != "lost+found")


@dataclass
class SwapReport:
    runs: int = 0
    checks: int = 0
    held: int = 0
    cases: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Nodes built; cases after which the node was built again (see :meth:`SwapNode.steady`).
    nodes: int = 0
    rebuilt: int = 0
    #: Cases of :data:`KNOWN_RESIDUALS` met, and the invariant each broke.
    residuals: dict[str, str] = field(default_factory=dict)


class SwapNode:
    """A node of volumes in every state (see the module docstring), its cases and checks."""

    def __init__(self, env: AgentEnv, kind: str, workdir: Path, monkeypatch: pytest.MonkeyPatch,
                 loops: LoopDevices | None = None, report: SwapReport | None = None) -> None:
        self.env, self.kind, self.workdir, self.loops = env, kind, workdir, loops
        self.boot_n = 1
        self.vols: dict[str, Vol] = {}
        #: PV uid -> the volume it was made for ("" none), and the boot it was made in.
        self.pv_volume: dict[str, tuple[str, str]] = {}
        self.setup_uids: dict[str, str] = {}
        self.report = report or SwapReport()
        self.agent: NodeAgent | None = None
        self.emptied = False  # the tmpfs reboot-empty case took every volume's data
        self._checking = threading.Event()
        self._violation: Violation | None = None
        self._lock = threading.Lock()
        self.gate = workdir / "gate"
        self.gate.mkdir(parents=True, exist_ok=True)
        (self.gate / "blocked").write_text("")
        (self.gate / "log").write_text("")
        wrapper = workdir / "gated_cleaner.py"
        wrapper.write_text(_WRAPPER)
        monkeypatch.setattr(localpv.agent.cleaning, "_FS_CLEANER", (sys.executable, str(wrapper), str(self.gate)))
        self.parked = workdir / "parked"
        self.spare = workdir / "spare"

    # ---------------------------------------------------------------- paths and mounts

    @property
    def boot(self) -> str:
        return f"boot-{self.boot_n}"

    def path(self, name: str) -> Path:
        return self.env.fs_dir / name

    @staticmethod
    def host(name: str) -> str:
        return f"{HOST_DIR}/{name}"

    def at(self, where: Path) -> Vol | None:
        return next((v for v in self.vols.values() if v.mount == where), None)

    def _new_volume(self, name: str, where: Path) -> Vol:
        where.mkdir(parents=True, exist_ok=True)
        vol = Vol(name, where)
        if self.kind == "ext4":
            assert self.loops is not None
            vol.device = self.loops.attach(size=16 * MiB, ext4=True)
            sh("mount", vol.device.path, where)
            uuid = sh("blkid", "-p", "-o", "value", "-s", "UUID", vol.device.path).strip()
            vol.identity = f"fs:uuid={uuid}"
        else:
            sh("mount", "-t", "tmpfs", "-o", "size=4m", f"swap-{name}", where)
        vol.seen(self.boot)
        self.vols[name] = vol
        return vol

    def _write(self, vol: Vol, name: str, text: str) -> None:
        (vol.mount / name).write_text(text)
        vol.files[name] = text

    def move(self, vol: Vol, where: Path) -> None:
        where.mkdir(parents=True, exist_ok=True)
        sh("mount", "--move", vol.mount, where)
        vol.mount = where

    def apply(self, op: Op) -> None:
        if op.kind == "swap":
            first, second = self.at(self.path(op.a)), self.at(self.path(op.b))
            assert first is not None and second is not None
            self.move(first, self.spare)
            self.move(second, self.path(op.a))
            self.move(first, self.path(op.b))
        elif op.kind == "move":
            vol = self.at(self.path(op.a))
            assert vol is not None
            self.move(vol, self.path(op.b))

    def undo(self, op: Op) -> None:
        if op.kind == "swap":
            self.apply(op)
        elif op.kind == "move":
            self.apply(Op("move", op.b, op.a))

    def renumber(self, *, keep_data: bool) -> None:
        """A reboot of tmpfs volumes: each one mounted again on a new tmpfs (new device numbers,
        dealt by the kernel), with its files (a disk without identity) or empty (tmpfs)."""
        self.drain_log()
        for vol in self.vols.values():
            fresh = self.workdir / f"fresh-{vol.name}"
            fresh.mkdir(exist_ok=True)
            sh("mount", "-t", "tmpfs", "-o", "size=4m", f"swap-{vol.name}", fresh)
            if keep_data:
                for name in vol.has_files():
                    shutil.copy2(vol.mount / name, fresh / name)
            self._immutable(vol, False)
            umount(str(vol.mount))
            sh("mount", "--move", fresh, vol.mount)
            if keep_data:
                self._immutable(vol, True)
            else:
                vol.files.clear()
                vol.dirty = False
            vol.seen(self.boot)
        self._block_cleaning(self.vols["c"])

    def _immutable(self, vol: Vol, on: bool) -> None:
        if vol.name == "f" and (vol.mount / "f-stuck").exists():
            subprocess.run(["chattr", "+i" if on else "-i", str(vol.mount / "f-stuck")], check=True)

    def _block_cleaning(self, vol: Vol) -> None:
        (self.gate / "blocked").write_text(f"{vol.dev}\n")

    def teardown(self) -> None:
        self.stop_agent()
        (self.gate / "open").touch()
        for vol in self.vols.values():
            with contextlib.suppress(Exception):
                self._immutable(vol, False)
            _unmount(vol.mount)
            if vol.device is not None and self.loops is not None:
                self.loops.detach(vol.device)

    # ---------------------------------------------------------------- the agent

    def start_agent(self) -> NodeAgent:
        self.agent = self.env.start_agent(boot=self.boot)
        agent = self.agent
        self._wait(lambda: agent.passes >= 1, 15, "progress", "the agent's first pass")
        self._checking.set()
        return agent

    def stop_agent(self) -> None:
        self._checking.clear()
        self.env.stop_agents()
        self.agent = None

    def _wait(self, predicate: Callable[[], Any], timeout: float, invariant: str, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            self._raise_found()
            found = predicate()
            if found:
                return found
            if time.monotonic() > deadline:
                raise Violation(invariant, f"{what} did not happen within {timeout:.0f} s; {self.describe()}")
            time.sleep(0.02)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Check the invariants in the background (every 20 ms) while the agent is up."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.02):
                if self._checking.is_set() and self._violation is None:
                    try:
                        self.check()
                    except Violation as found:
                        self._violation = found
                    except Exception as err:  # a harness error: reported, not hidden
                        if not stop.is_set():
                            self._violation = Violation("harness", repr(err))

        thread = threading.Thread(target=watch, name="swaps-watch", daemon=True)
        thread.start()
        try:
            yield
            self._raise_found()
        finally:
            stop.set()
            thread.join(5)

    def _raise_found(self) -> None:
        if self._violation is not None:
            raise self._violation

    # ---------------------------------------------------------------- the invariants

    def drain_log(self) -> list[tuple[Vol | None, str]]:
        """Cleanups started since the last look: (the volume cleaned, the path)."""
        with self._lock:
            log = self.gate / "log"
            lines = log.read_text().splitlines()
            log.write_text("")
        by_dev = {v.dev: v for v in self.vols.values()}
        started = []
        for line in lines:
            dev, path = line.split(" ", 1)
            started.append((by_dev.get(int(dev)), path))
        return started

    def check(self) -> None:
        with self._lock:
            self._check()
        self.report.checks += 1

    def _check(self) -> None:
        log = self.gate / "log"
        by_dev = {v.dev: v for v in self.vols.values()}
        for line in log.read_text().splitlines():
            vol = by_dev.get(int(line.split(" ", 1)[0]))
            if vol is not None and vol.protected:
                raise Violation("cleaned-while-bound", f"a cleanup started on volume {vol.name} ({line}); "
                                                       f"{self.describe()}")
        if not self.emptied:
            for vol in self.vols.values():
                if vol.protected:
                    for name, text in vol.files.items():
                        try:
                            ok = (vol.mount / name).read_text() == text
                        except OSError:
                            ok = False
                        if not ok:
                            raise Violation("cleaned-while-bound", f"{name} of volume {vol.name} (at {vol.mount}) "
                                                                   f"vanished; {self.describe()}")
        pvs = self.env.pvs()
        by_path: dict[str, list[Obj]] = {}
        live_by_volume: dict[tuple[str, str], list[str]] = {}
        for pv in pvs:
            path = pv["spec"]["local"]["path"]
            by_path.setdefault(path, []).append(pv)
            uid = pv["metadata"]["uid"]
            if uid not in self.pv_volume:
                shown = self.at(self.path(path.rsplit("/", 1)[1]))
                self.pv_volume[uid] = (shown.name if shown else "", self.boot)
            made_for, boot = self.pv_volume[uid]
            if made_for and not pv["metadata"].get("deletionTimestamp"):
                # Without an identity, a volume is known by its numbers within one boot only: PVs made
                # for it in different boots are, for all anyone can tell, for two volumes.
                key = (made_for, "" if self.vols[made_for].identity else boot)
                live_by_volume.setdefault(key, []).append(pv["metadata"]["name"])
            if pv.get("status", {}).get("phase") == "Available":
                self._check_offer(pv, path)
        for path, found in by_path.items():
            if len(found) > 1:
                raise Violation("duplicate", f"{path} has PVs {[p['metadata']['name'] for p in found]}")
        for (name, _), found_names in live_by_volume.items():
            if len(found_names) > 1:
                raise Violation("duplicate", f"volume {name} has PVs {found_names}; {self.describe()}")
        records = Journal(self.env.state_dir / "journal.json").snapshot()
        for vol in self.vols.values():
            if not vol.dirty or any(r.state in (USED, CLEANING) and vol.named_by(r) for r in records.values()):
                continue
            here = records.get(self.host(vol.mount.name)) if vol.mount.parent == self.env.fs_dir else None
            held = self.host(vol.mount.name) in self.held()
            if not vol.identity and here is not None and here.state != CLEAN and held:
                # Numbers of an earlier boot name nothing: a record may have taken another volume (an
                # empty one) and been cleaned. What keeps this one is the record at its path, held
                # until the volume is put back or the operator says what it is.
                continue
            raise Violation("lost-record", f"no dirty record names volume {vol.name} ({sorted(vol.names)}); "
                                           f"{self.describe()}")

    def _check_offer(self, pv: Obj, host_path: str) -> None:
        """A PV on offer shows an empty volume, or the empty directory of a path where nothing is
        mounted (reported as ``NotMounted``, not acted on: a vanished disk's PV stays); or it was
        made for a volume no record names (``y``), which is offered as a new volume with its files."""
        where = self.path(host_path.rsplit("/", 1)[1])
        shown = self.at(where)
        made_for = self.pv_volume[pv["metadata"]["uid"]][0]
        if shown is None:
            files = sorted(os.listdir(where)) if where.is_dir() else []
            what = f"the directory under it, holding {files}"
        elif shown.foreign and made_for == shown.name:
            return
        else:
            files, what = shown.has_files(), f"volume {shown.name}, holding {shown.has_files()}"
        if files:
            raise Violation("offered-dirty", f"PV {pv['metadata']['name']} (made for {made_for or 'nothing'}) is on "
                                             f"offer for {host_path}, which shows {what}; {self.describe()}")

    def describe(self) -> str:
        """Where each volume is, what each PV and record says (for a Violation's message)."""
        places = ", ".join(f"{v.name}@{v.mount.name}" for v in self.vols.values())
        pvs = ", ".join(f"{p['spec']['local']['path'].rsplit('/', 1)[1]}:{p['metadata']['name'][-6:]}:"
                        f"{p.get('status', {}).get('phase')}" for p in self.env.pvs())
        records = ", ".join(f"{k.rsplit('/', 1)[-1]}:{r.state}" for k, r in
                            sorted(Journal(self.env.state_dir / "journal.json").snapshot().items()))
        held = sorted(self.held()) if self.agent else []
        return f"volumes [{places}] PVs [{pvs}] records [{records}] held {held}"

    def held(self) -> set[str]:
        agent = self.agent
        if agent is None or agent.last_plan is None:
            return set()
        return set(agent.last_plan.held)

    # ---------------------------------------------------------------- the node's life

    def setup(self) -> None:
        """Make the node of the module docstring; the agent is stopped at the end."""
        env = self.env
        for name in ("a", "b", "c", "f"):
            self._new_volume(name, self.path(name))
        x = self._new_volume("x", self.path("h"))
        self.path(EMPTY).mkdir()
        agent = self.start_agent()
        with self.watching():
            for name, vol in (("b", self.vols["b"]), ("f", self.vols["f"]), ("c", self.vols["c"]), ("h", x)):
                bound_claim(env, f"tenant-{name}", self.host(name))
                self._write(vol, f"{vol.name}-data", f"tenant {name}")
                vol.protected = True
            self._write(self.vols["f"], "f-stuck", "tenant f, cannot be removed")
            self._immutable(self.vols["f"], True)
            self._block_cleaning(self.vols["c"])
            for name in ("f", "c"):
                self.vols[name].protected, self.vols[name].dirty = False, True
                env.apiserver.delete("v1", "PersistentVolumeClaim", f"tenant-{name}", "default")
            f_pv = env.pv_for(self.host("f"))
            assert f_pv is not None
            self._wait(lambda: any(e["involvedObject"].get("name") == f_pv["metadata"]["name"]
                                   for e in events(env, "VolumeFailedDelete")),
                       15, "progress", "f's cleanup failing")
            self._wait(lambda: (self.gate / "log").read_text().count(f"{self.vols['c'].dev} ") > 0, 15,
                       "progress", "c's cleanup started")
        assert agent.passes
        self.stop_agent()
        self.move(x, self.parked)  # tenant h's volume goes; a stranger's is mounted at h
        y = self._new_volume("y", self.path("h"))
        self._write(y, "y-data", "somebody's")
        y.protected = y.foreign = True
        self.start_agent()
        with self.watching():
            self._wait(lambda: self.host("h") in self.held(), 15, "progress", "h held")
        self.setup_uids = {name: str((self.env.pv_for(self.host(name)) or {}).get("metadata", {}).get("uid"))
                           for name in ("b", "h")}
        self.stop_agent()

    def steady(self, *, strict: bool = True) -> bool:
        """The node's steady state (see the module docstring). Not ``strict``: the empty path may
        also keep what a case left there - a volume no record named (``y``) moved there is offered
        as a new one, and when it goes back to ``h`` that PV and record stay (held, or on offer
        over an empty directory, as a disk gone): the node is then built again for the next case."""
        records = Journal(self.env.state_dir / "journal.json").snapshot()
        for name in ("b", "h"):
            pv = self.env.pv_for(self.host(name))
            if pv is None or pv["metadata"]["uid"] != self.setup_uids[name] or pv["status"].get("phase") != "Bound":
                return False
        if self.env.phase(self.host("a")) != "Available":
            return False
        for name in ("f", "c"):
            record = records.get(self.host(name))
            if record is None or record.state != CLEANING or self.env.phase(self.host(name)) == "Available":
                return False
        if not strict:
            return self.held() <= {self.host("h"), self.host(EMPTY)}
        return (self.held() <= {self.host("h")} and self.host(EMPTY) not in records
                and self.env.pv_for(self.host(EMPTY)) is None)

    def run_case(self, op: Op, boot: str, journal: str) -> bool:
        """One case (the agent stopped before and after): see the module docstring. True when it
        left the node off its steady state (legitimately: :meth:`steady`)."""
        label = f"{self.kind} {boot} {journal} {op}"
        self.report.cases.append(label)
        try:
            if boot == "reboot":
                self.boot_n += 1
                if self.kind == "tmpfs":
                    self.renumber(keep_data=True)
            self.apply(op)
            if journal == "upgrade":
                forget_identities(self.env.state_dir)
            agent = self.start_agent()
            with self.watching():
                for _ in range(PASSES):
                    agent.reconcile_once()
                    self.check()
                time.sleep(SETTLE)  # a cleanup decided in those passes starts in a child of its own
                self.check()
                if self.held():
                    self.report.held += 1
            self.stop_agent()
            self.undo(op)
            agent = self.start_agent()
            with self.watching():
                operator = boot == "reboot" and self.kind == "tmpfs"
                self._wait(lambda: (not operator or self.accept_as_asked() >= 0) and self.steady(strict=False),
                           PROGRESS_TIMEOUT, "progress", f"the steady state after undoing {op}")
                for _ in range(PASSES):
                    agent.reconcile_once()
                    self.check()
                drifted = not self.steady()
            self.stop_agent()
        except Violation as found:
            self.stop_agent()
            raise Violation(found.invariant, f"[{label}] {found}") from None
        self.report.runs += 1
        return drifted

    def accept_as_asked(self) -> int:
        """The operator's word, after a reboot and with each volume back at its path: for every
        annotation a ``VolumeIdentityMismatch`` event asks for that names, at a path of this node,
        the volume the operator knows belongs there (its home volume, by this boot's numbers), the
        annotation is put on the Node. Returns how many."""
        wanted = {}
        for event in events(self.env, "VolumeIdentityMismatch"):
            message = event.get("message", "")
            if ACCEPT_VOLUME_PREFIX not in message:
                continue
            command = message.split(f"kubectl annotate node {NODE} ", 1)[1].split(" ", 1)[0]
            key, value = command.rstrip(".").split("=", 1)
            path = message.split(" ", 1)[0]
            name = path.rsplit("/", 1)[-1]
            vol = self.at(self.path(name)) if path.startswith(HOST_DIR + "/") else None
            if vol is not None and vol.name == name and value == f"{numbers(vol.mount)}@{self.boot}":
                wanted[key] = value
        node = self.env.apiserver.get("v1", "Node", NODE)
        annotations = node["metadata"].setdefault("annotations", {})
        if any(annotations.get(key) != value for key, value in wanted.items()):
            annotations.update(wanted)
            self.env.apiserver.update(node)
        return len(wanted)

    def reboot_empty(self) -> None:
        """tmpfs after a real reboot: every volume back empty, renumbered; then the end."""
        self.report.cases.append(f"{self.kind} reboot-empty")
        self.boot_n += 1
        self.renumber(keep_data=False)
        self.emptied = True
        self.report.runs += 1

    def finish(self) -> None:
        """The operator fixes everything: every volume ends clean and on offer, or Bound with its data."""
        self._immutable(self.vols["f"], False)
        (self.gate / "open").touch()
        x, y = self.vols["x"], self.vols["y"]
        self.move(y, self.workdir / "parked-y")
        self.move(x, self.path("h"))
        y.protected = False  # no longer on the node
        self.start_agent()

        def done() -> bool:
            if any(self.env.phase(self.host(n)) != "Bound" for n in ("b", "h")):
                return False
            for name in ("a", "c", "f"):
                vol = self.at(self.path(name))
                if self.env.phase(self.host(name)) != "Available" or vol is None or vol.has_files():
                    return False
            return not self.held()

        with self.watching():
            for name in ("c", "f"):
                self.vols[name].dirty = False  # cleaned from here on, as they should be
            self._wait(done, PROGRESS_TIMEOUT, "progress", "the end: every volume clean and offered, or Bound")
            self.check()
        self.stop_agent()



def _unmount(where: Path) -> None:
    """Unmount, waiting for a cleaner killed with the agent to let go of it (a lazy unmount
    would keep its loop device busy past the test)."""
    deadline = time.monotonic() + 10
    while True:
        proc = subprocess.run(["umount", str(where)], capture_output=True, text=True, check=False)
        if proc.returncode == 0 or "not mounted" in proc.stderr:
            return
        if time.monotonic() > deadline:
            umount(str(where))
            return
        time.sleep(0.05)


def run_swaps(kind: str, workdir: Path, monkeypatch: pytest.MonkeyPatch, loops: LoopDevices,
              variants: tuple[tuple[str, str], ...] = VARIANTS) -> SwapReport:
    """Every case of every variant: a node per variant (built again after a case that moved it
    off its steady state), each ended by :meth:`SwapNode.finish`."""
    report = SwapReport()
    start = time.monotonic()
    builds = 0

    def build(stack: contextlib.ExitStack) -> SwapNode:
        nonlocal builds
        builds += 1
        env = stack.enter_context(fresh_agent_env(workdir / f"node-{builds}"))
        node = SwapNode(env, kind, workdir / f"node-{builds}" / "swaps", monkeypatch, loops, report)
        stack.callback(node.teardown)
        node.setup()
        return node

    for boot, journal in variants:
        pending = operations()
        while pending:
            with contextlib.ExitStack() as stack:
                node = build(stack)
                finished = True
                while pending:
                    op = pending.pop(0)
                    label = f"{kind} {boot} {journal} {op}"
                    try:
                        if node.run_case(op, boot, journal):
                            report.rebuilt += 1
                            break
                    except Violation as found:
                        if KNOWN_RESIDUALS.get(label) != found.invariant:
                            raise
                        report.residuals[label] = found.invariant
                        finished = False  # that node's state is off: built again, not ended
                        break
                if finished:
                    if not pending and kind == "tmpfs" and boot == "reboot":
                        node.reboot_empty()
                    node.finish()
    report.nodes = builds
    report.seconds = time.monotonic() - start
    return report

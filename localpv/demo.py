"""``localpv demo``: the whole lifecycle of a local volume, with no cluster needed.

It starts the embedded API-server emulator (with its PV binder standing in for
kube-controller-manager), makes a discovery directory with real tmpfs mounts when run as
root (simulated mount points otherwise, and it says so), runs the real node agent
against the emulator over HTTP, and walks one volume through its life:

    PV Available → claim Bound → tenant writes data → claim deleted → volume cleaned
    → PV Available again (new UID, empty volume)

Every step is printed as a table row with the elapsed time. Exit status 0 means every
step happened and the data was really gone.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from localpv.agent.journal import Journal
from localpv.agent.metrics import AgentMetrics
from localpv.agent.node import AgentOptions, NodeAgent
from localpv.config import parse_config
from localpv.host.mounts import mount_points
from localpv.host.scan import scan_directory
from localpv.kube.api import KubeApi
from localpv.kube.errors import Backoff
from localpv.kube.events import EventRecorder
from localpv.kube.transport import connect
from localpv_emulator.objects import claim, node, storage_class

NODE = "demo-node"
CLASS = "local-demo"
HOST_DIR = "/mnt/local-demo"


class DemoFailed(Exception):
    """A lifecycle step did not happen in time."""


class DemoStopped(Exception):
    """SIGTERM or SIGHUP arrived: raised in the main thread so that ``run()``'s cleanup
    unmounts the volumes (the default action would kill the process and leave them)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    # One stop is enough: a second signal must not interrupt the cleanup it starts.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise DemoStopped(signum)


class Demo:
    """One run of the demo; ``run()`` returns normally only when every step succeeded."""

    def __init__(self, out: TextIO, *, volumes: int = 2, timeout: float = 30.0, simulate: bool = False) -> None:
        self.out = out
        self.volumes = volumes
        self.timeout = timeout
        self.real_mounts = os.geteuid() == 0 and not simulate
        self.started = time.monotonic()
        # Resolved: the mount table names mounts by their real path (TMPDIR may be a symlink).
        self.workdir = Path(os.path.realpath(tempfile.mkdtemp(prefix="localpv-demo-")))
        self.discovery = self.workdir / "discovery"
        #: Plain directories the agent is told are mount points (no root, or --simulate-mounts).
        self.simulated: frozenset[str] = frozenset()

    # ------------------------------------------------------------------ output

    def say(self, step: str, detail: str = "") -> None:
        elapsed = time.monotonic() - self.started
        self.out.write(f"{elapsed:7.2f}s  {step:<34} {detail}\n")
        self.out.flush()

    def table(self, server: Any) -> None:
        rows = [("PV", "PATH", "CAPACITY", "PHASE", "CLAIM", "UID")]
        for pv in sorted(server.list("v1", "PersistentVolume"), key=lambda p: p["spec"]["local"]["path"]):
            ref = pv["spec"].get("claimRef") or {}
            rows.append((pv["metadata"]["name"], pv["spec"]["local"]["path"], pv["spec"]["capacity"]["storage"],
                         pv.get("status", {}).get("phase", ""), ref.get("name", "-"), pv["metadata"]["uid"][:8]))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.out.write("           " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + "\n")
        self.out.flush()

    def wait(self, what: str, predicate: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            threading.Event().wait(0.02)
        raise DemoFailed(f"timed out after {self.timeout:.0f}s waiting for: {what}")

    # ------------------------------------------------------------------ host

    def make_volumes(self) -> Callable[[], frozenset[str]]:
        self.discovery.mkdir(parents=True)
        for i in range(1, self.volumes + 1):
            target = self.discovery / f"vol{i}"
            target.mkdir()
            if self.real_mounts:
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={16 * i}m", "localpv-demo", str(target)],
                               check=True)
        if self.real_mounts:
            self.say("host", f"mounted {self.volumes} real tmpfs volumes under {self.discovery}")
            self.say("", f"the agent finds them there (mountDir); PVs name them by hostDir {HOST_DIR},")
            self.say("", "the path on the node, as an agent in a container sees the host's disks")
            return mount_points
        why = "NOT ROOT" if os.geteuid() != 0 else "--simulate-mounts"
        self.say("host", f"{why}: plain directories, SIMULATED as mount points (run as root for real tmpfs)")
        self.say("", f"the agent looks in {self.discovery} (mountDir); PVs name them by hostDir {HOST_DIR}")
        self.simulated = frozenset(str(self.discovery / f"vol{i}") for i in range(1, self.volumes + 1))
        return lambda: mount_points() | self.simulated

    def cleanup(self) -> None:
        """Unmount whatever is mounted under the work dir, deepest first, then remove it.

        The mount table is the truth, not a list kept while mounting: a signal can land
        between a ``mount`` that succeeded and the line that would have recorded it."""
        root = str(self.workdir) + "/"
        for target in sorted((m for m in mount_points() if m.startswith(root)), key=len, reverse=True):
            subprocess.run(["umount", target], check=False)
        if any(m.startswith(root) for m in mount_points()):
            self.out.write(f"warning: could not unmount everything under {self.workdir}; it is left in place\n")
            return
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------ the story

    def run(self) -> None:
        """Walk the story; the volumes are unmounted and the work dir removed however it
        ends: success, a failed step, Ctrl-C, SIGTERM or SIGHUP."""
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> None:
        from localpv_emulator.apiserver import ApiServer

        server = ApiServer(binder=True)
        server.start()
        agent: NodeAgent | None = None
        try:
            self.say("api-server emulator", f"listening on {server.url} (PV binder on)")
            server.create(node(NODE))
            server.create(storage_class(CLASS))
            mount_table = self.make_volumes()
            config = parse_config({"storageClassMap": {CLASS: {"hostDir": HOST_DIR, "mountDir": str(self.discovery)}}})
            api = KubeApi(connect(server.url))
            # Simulated volumes are plain directories: the cleaner must accept them (an
            # agent never does; for it a volume that is not a mount point is unmounted).
            options = AgentOptions(node_name=NODE, discovery_period=2.0, watch_host=self.real_mounts,
                                   require_mount_point=self.real_mounts,
                                   retry_backoff=Backoff(initial=0.5, maximum=2.0, attempts=1_000_000))
            # The demo made these volumes itself a moment ago: they are known to be new and
            # empty, so it starts a journal with nothing to recover (an agent never does).
            journal = Journal.initialise(self.workdir / "state" / "journal.json")
            agent = NodeAgent(api, options, config.config, journal,
                              metrics=AgentMetrics(), mount_table=mount_table,
                              scanner=functools.partial(scan_directory, simulated=self.simulated),
                              recorder=EventRecorder(api, component="localpv-demo"))
            agent.start()
            self.story(server)
        finally:
            if agent is not None:
                agent.stop()
            server.stop()
            self.cleanup()

    def story(self, server: Any) -> None:
        path = f"{HOST_DIR}/vol1"

        def pv() -> dict[str, Any] | None:
            found = [p for p in server.list("v1", "PersistentVolume") if p["spec"]["local"]["path"] == path]
            return found[0] if found else None

        def phase() -> str:
            current = pv()
            return str(current.get("status", {}).get("phase", "")) if current else ""

        self.wait("every volume published", lambda: len(server.list("v1", "PersistentVolume")) == self.volumes)
        first = self.wait("PV Available", lambda: phase() == "Available" and pv())
        self.say("1. discovered", f"{first['metadata']['name']} for {path} is Available")
        self.table(server)

        server.create(claim("demo-claim", CLASS, size="10Mi", selected_node=NODE))
        self.wait("claim Bound", lambda: phase() == "Bound")
        self.say("2. claim bound", "demo-claim (10Mi, WaitForFirstConsumer, scheduled to demo-node)")
        self.table(server)

        data = self.discovery / "vol1" / "tenant-data.txt"
        data.write_text("something private\n")
        self.say("3. tenant writes data", f"{data.name} ({data.stat().st_size} bytes)")

        server.delete("v1", "PersistentVolumeClaim", "demo-claim", "default")
        self.wait("PV Released or cleaned", lambda: phase() in ("Released", "") or pv() is None
                  or pv()["metadata"]["uid"] != first["metadata"]["uid"])  # type: ignore[index]
        self.say("4. claim deleted", "PV Released: the agent cleans the volume before anything else")

        again = self.wait("PV Available again with a new UID", lambda: (
            (current := pv()) is not None and current["metadata"]["uid"] != first["metadata"]["uid"]
            and phase() == "Available" and current))
        left = sorted(os.listdir(self.discovery / "vol1"))
        if left:
            raise DemoFailed(f"volume still holds {left}")
        self.say("5. cleaned and offered again", f"same name {again['metadata']['name']}, new UID, volume empty")
        self.table(server)
        self.say("done", "the volume went round its whole life; nothing of the tenant's data is left")

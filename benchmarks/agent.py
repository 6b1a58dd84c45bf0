"""Node agent figures: mount → PV latency, cost of a discovery pass, RSS vs. cluster size.

Run as root (real tmpfs mounts):

    python -m benchmarks.agent latency --mounts 50
    python -m benchmarks.agent pass --entries 1000
    python -m benchmarks.agent rss --other-pvs 10000
    python -m benchmarks.agent health --volumes 100 [--agent-tree OTHER_CHECKOUT]
    python -m benchmarks.agent idle --volumes 10 [--agent-tree OTHER_CHECKOUT]
    python -m benchmarks.agent client [--agent-tree OTHER_CHECKOUT]
    LOCALPV_BENCH_UPSTREAM_LSP=/path/to/local-volume-provisioner \
        python -m benchmarks.agent compare --volumes 10 --other-pvs 10000 --mounts 30

Each prints its figures; the results with the command and the machine are recorded in
docs/benchmarks.md. This is not a test: nothing here asserts anything.

``compare`` runs `localpv agent` and, when it is built and named in
``LOCALPV_BENCH_UPSTREAM_LSP``, upstream's local-volume-provisioner the same way: each a
process of its own (benchmarks/programs.py), the same ConfigMap directory, a fresh
emulator with the Node, the StorageClass and N PVs of other nodes, and a discovery
directory holding V tmpfs volumes; both with their defaults (10 s periodic pass). Per
program and cluster size: seconds from the start until its V PVs exist (a first start:
empty state), CPU from the start until a 2 s window under 2 % of a CPU ("idle"), RSS and
CPU over the following minute; then, with no other PVs, the mount -> PV latency of M
more mounts made at random gaps of 0-5 s (seed 1).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.programs import (
    UPSTREAM_LSP_ENV,
    Program,
    Running,
    in_own_root,
    localpv_program,
    python_env,
    upstream_binary,
)
from localpv.agent.journal import Journal
from localpv.agent.metrics import AgentMetrics
from localpv.agent.node import AgentOptions, NodeAgent
from localpv.config import parse_config
from localpv.kube.api import KubeApi
from localpv.kube.events import EventRecorder
from localpv.kube.transport import connect
from localpv.naming import NODE_LABEL_KEY
from localpv_emulator.apiserver import ApiServer, resource_for
from localpv_emulator.objects import node, storage_class
from tests.support.hostfs import Mounter

NODE = "bench-node"


def machine() -> str:
    return (f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total // 2**30} GiB, "
            f"Python {platform.python_version()}, Linux {platform.release()}")


def setup(server: ApiServer) -> None:
    server.create(node(NODE))
    server.create(storage_class("local-fs", binding="Immediate"))


def _journal(path: Path) -> Journal:
    """The benchmark's volumes are its own fresh mounts: nothing to recover."""
    return Journal(path) if path.exists() else Journal.initialise(path)


def make_agent(server: ApiServer, discovery: Path, state: Path, *, watch_host: bool) -> tuple[NodeAgent, KubeApi]:
    config = parse_config({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks", "mountDir": str(discovery)}}})
    metrics = AgentMetrics()
    api = KubeApi(connect(server.url), observer=metrics.api.observe)
    agent = NodeAgent(api, AgentOptions(node_name=NODE, discovery_period=3600, watch_host=watch_host),
                      config.config, _journal(state / "journal.json"), metrics=metrics,
                      recorder=EventRecorder(api, component="bench"))
    return agent, api


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_latency(mounts: int) -> None:
    """Time from `mount` returning to the PV being readable from the API server."""
    server = ApiServer(binder=True)
    server.start()
    setup(server)
    work = Path(tempfile.mkdtemp(prefix="bench-lat-"))
    (work / "d").mkdir()
    agent, _ = make_agent(server, work / "d", work, watch_host=True)
    agent.start()
    mounter = Mounter()
    samples = []
    try:
        for i in range(mounts):
            target = work / "d" / f"v{i}"
            t0 = time.perf_counter()
            mounter.tmpfs(target, size=1 << 20)
            while not any(pv["spec"]["local"]["path"] == f"/mnt/disks/v{i}"
                          for pv in server.list("v1", "PersistentVolume")):
                time.sleep(0.002)
            samples.append(time.perf_counter() - t0)
    finally:
        agent.stop()
        mounter.umount_all()
        server.stop()
    ms = [s * 1000 for s in samples]
    print(f"mount -> PV visible via API, {mounts} mounts (event-driven, periodic pass 3600 s):")
    print(f"  p50 {statistics.median(ms):.1f} ms   p99 {percentile(ms, 0.99):.1f} ms   max {max(ms):.1f} ms")
    print("  (upstream polls every 10 s: expected ~5 s median, 10 s worst)")


def bench_pass(entries: int) -> None:
    """CPU time and API calls of one discovery pass creating N PVs, then of an idle pass."""
    server = ApiServer(binder=False)
    server.start()
    setup(server)
    work = Path(tempfile.mkdtemp(prefix="bench-pass-"))
    (work / "d").mkdir()
    mounter = Mounter()
    try:
        for i in range(entries):
            mounter.tmpfs(work / "d" / f"v{i:04d}", size=1 << 20)
        agent, _ = make_agent(server, work / "d", work, watch_host=False)
        agent.start()
        agent.reconcile_once()  # the start-up pass may have raced; make sure every PV exists
        while len(server.list("v1", "PersistentVolume")) < entries:
            time.sleep(0.01)
        # Measure a creating pass from scratch: delete everything the start pass made.
        agent.stop()
        for pv in server.list("v1", "PersistentVolume"):
            server.delete("v1", "PersistentVolume", pv["metadata"]["name"])
        (work / "journal.json").unlink()
        agent, _ = make_agent(server, work / "d", work, watch_host=False)
        agent.start(run_loop=False)  # the measured pass must not race the loop thread
        server.requests.clear()
        t_cpu, t_wall = time.thread_time(), time.perf_counter()
        result = agent.reconcile_once()
        cpu, wall = time.thread_time() - t_cpu, time.perf_counter() - t_wall
        calls = len(server.requests)
        server.requests.clear()
        t_cpu2, t_wall2 = time.thread_time(), time.perf_counter()
        agent.reconcile_once()
        cpu2, wall2 = time.thread_time() - t_cpu2, time.perf_counter() - t_wall2
        calls2 = len(server.requests)
        agent.stop()
    finally:
        mounter.umount_all()
        server.stop()
    print(f"discovery pass over {entries} mounted entries (agent thread CPU; the emulator runs in-process):")
    print(f"  creating pass: {len(result.creates)} PVs, {cpu * 1000:.0f} ms CPU, {wall * 1000:.0f} ms wall, "
          f"{calls} API requests ({calls / max(1, len(result.creates)):.2f} per PV)")
    print(f"  idle pass:     0 PVs, {cpu2 * 1000:.0f} ms CPU, {wall2 * 1000:.0f} ms wall, {calls2} API requests")


UNFILTERED = """
import sys, threading
from localpv.kube.api import KubeApi
from localpv.kube.client import make_api_client
from localpv.kube.informer import Informer
from localpv.kube.resources import PERSISTENT_VOLUMES
informer = Informer(KubeApi(make_api_client(sys.argv[1])), PERSISTENT_VOLUMES)
informer.start()
informer.wait_synced(120)
print(len(informer), flush=True)
threading.Event().wait()
"""


def unfiltered_rss(kubeconfig: Path, log: Path) -> int:
    """RSS of a process caching every PV of the cluster, as upstream's informer does."""
    program = Program("unfiltered PV informer", [sys.executable, "-c", UNFILTERED, str(kubeconfig)], python_env())
    with Running(program, log) as proc:
        proc.wait_for(lambda: bool(log.read_text().strip()), 120, "its informer to sync")
        threading.Event().wait(2)
        return proc.rss()


def add_other_pvs(server: ApiServer, count: int) -> None:
    """PVs of other nodes (500 of them), as upstream or localpv on those nodes made them."""
    for i in range(count):
        server.create({"apiVersion": "v1", "kind": "PersistentVolume",
                       "metadata": {"name": f"other-{i}", "labels": {NODE_LABEL_KEY: f"node-{i % 500}"},
                                    "annotations": {"pv.kubernetes.io/provisioned-by":
                                                    f"local-volume-provisioner-node-{i % 500}-x"}},
                       "spec": {"capacity": {"storage": "100Gi"}, "local": {"path": f"/mnt/disks/v{i}"},
                                "accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In",
                                     "values": [f"node-{i % 500}"]}]}]}}}})


def cluster_with_other_pvs(count: int) -> ApiServer:
    """A started emulator (no binder) with NODE, the StorageClass and ``count`` PVs of other nodes."""
    server = ApiServer(binder=False)
    server.start()
    setup(server)
    add_other_pvs(server, count)
    return server


def agent_rss(other_pvs: int) -> tuple[int, int, int]:
    """RSS of `localpv agent` idle among N PVs of other nodes, its PV lists, an unfiltered informer's RSS."""
    server = cluster_with_other_pvs(other_pvs)
    work = Path(tempfile.mkdtemp(prefix="bench-rss-"))
    (work / "d").mkdir()
    kubeconfig = server.write_kubeconfig(work / "kubeconfig")
    cfg = work / "config.yaml"
    cfg.write_text(yaml.safe_dump({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks",
                                                                     "mountDir": str(work / "d")}}}))
    program = localpv_program("localpv agent", ["agent", "--config", str(cfg), "--node", NODE, "--kubeconfig",
                                                str(kubeconfig), "--listen-address", "127.0.0.1:0",
                                                "--state-dir", str(work / "state")])
    try:
        with Running(program, work / "log") as proc:
            proc.wait_for(lambda: server.requests.count(verb="watch", resource="persistentvolumes") > 0, 60,
                          "its PV watch")
            threading.Event().wait(3)  # idle a moment after the watch is open
            rss = proc.rss()
        lists = server.requests.count(verb="list", resource="persistentvolumes")
        return rss, lists, unfiltered_rss(kubeconfig, work / "unfiltered.log")
    finally:
        server.stop()


def bench_rss(other_pvs: int) -> None:
    """RSS of a real `localpv agent` process with 0 and with N PVs of other nodes in the cluster."""
    rows = [(count, *agent_rss(count)) for count in (0, other_pvs)]
    print("`localpv agent` RSS once idle (label-filtered PV cache):")
    for count, rss, lists, unfiltered in rows:
        print(f"  {count:>6} PVs of other nodes: RSS {rss / 2**20:.1f} MiB ({lists} PV list requests: "
              f"one-time adoption scan + informer); an unfiltered PV informer alone: {unfiltered / 2**20:.1f} MiB")


def token_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig with a bearer token, as a service account or a CI user has (the emulator
    takes any token): the credentials the daemons run with."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": "bench-token"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}))
    return path


def tree_env(tree: str | None) -> dict[str, str]:
    """The environment that runs the localpv of ``tree`` (another checkout), else this one."""
    return {**os.environ, "PYTHONPATH": tree or str(Path(__file__).resolve().parent.parent)}


def bench_idle(volumes: int, tree: str | None) -> None:
    """RSS of a real `localpv agent` process once idle with N tmpfs volumes published (no
    other PVs), token credentials: what a DaemonSet pays on every node. ``tree`` runs the
    agent of another checkout, for the before/after figure."""
    server = ApiServer(binder=False)
    server.start()
    setup(server)
    work = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    (work / "d").mkdir()
    mounter = Mounter()
    proc: subprocess.Popen[bytes] | None = None
    try:
        for i in range(volumes):
            mounter.tmpfs(work / "d" / f"v{i:02d}", size=1 << 20)
        kubeconfig = token_kubeconfig(work / "kubeconfig", server.url)
        cfg = work / "config.yaml"
        cfg.write_text(yaml.safe_dump({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks",
                                                                         "mountDir": str(work / "d")}}}))
        proc = subprocess.Popen([sys.executable, "-m", "localpv", "agent", "--config", str(cfg), "--node", NODE,
                                 "--kubeconfig", str(kubeconfig), "--listen-address", "127.0.0.1:0",
                                 "--state-dir", str(work / "state")],
                                stderr=subprocess.DEVNULL, env=tree_env(tree), cwd=tempfile.gettempdir())
        deadline = time.monotonic() + 60
        while len(server.list("v1", "PersistentVolume")) < volumes and time.monotonic() < deadline:
            time.sleep(0.05)
        threading.Event().wait(10)  # the agent records its volumes, then idles
        rss = psutil.Process(proc.pid).memory_info().rss
        made = len(server.list("v1", "PersistentVolume"))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        mounter.umount_all()
        server.stop()
    print(f"`localpv agent`{' of ' + tree if tree else ''}, idle with {made} tmpfs volumes published, "
          f"token kubeconfig: RSS {rss / 2**20:.1f} MiB")


CLIENT = """
import json, resource, sys, time
started = time.perf_counter()
from localpv.kube.api import KubeApi
from localpv.kube.client import make_api_client
KubeApi(make_api_client(sys.argv[1]))
elapsed = time.perf_counter() - started
rss = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
print(json.dumps({"seconds": elapsed, "rss": rss, "kubernetes": "kubernetes" in sys.modules}))
"""

BARE = """
import json, resource
print(json.dumps({"rss": int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()}))
"""


def bench_client(runs: int, tree: str | None) -> None:
    """Time and RSS of `import localpv.kube.api` + building a client from a token kubeconfig,
    each in a fresh interpreter (median of ``runs``), beside a bare interpreter's RSS."""
    import json

    work = Path(tempfile.mkdtemp(prefix="bench-client-"))
    kubeconfig = token_kubeconfig(work / "kubeconfig", "https://127.0.0.1:6443")
    env, cwd = tree_env(tree), tempfile.gettempdir()

    def one(code: str, *args: str) -> dict[str, float]:
        out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True,
                             text=True, check=True).stdout
        doc: dict[str, float] = json.loads(out)
        return doc

    samples = [one(CLIENT, str(kubeconfig)) for _ in range(runs)]
    bare = statistics.median(one(BARE)["rss"] for _ in range(3))
    seconds = statistics.median(s["seconds"] for s in samples)
    rss = statistics.median(s["rss"] for s in samples)
    print(f"import localpv.kube.api + KubeApi(make_api_client(token kubeconfig)){' of ' + tree if tree else ''}, "
          f"median of {runs} fresh interpreters:")
    print(f"  {seconds * 1000:.0f} ms; RSS {rss / 2**20:.1f} MiB ({(rss - bare) / 2**20:+.1f} MiB over a bare "
          f"interpreter's {bare / 2**20:.1f} MiB); kubernetes imported: {bool(samples[0]['kubernetes'])}")


def bench_health(volumes: int, seconds: float, tree: str | None) -> None:
    """What watching the volumes in use costs: CPU and RSS of a real `localpv agent` process,
    idle with N Bound ext4 volumes on loop devices (each pass reads their identities with
    libblkid and assesses their health), over ``seconds``, at the default cadence (a pass
    every 10 s). ``tree`` runs the agent of another checkout (PYTHONPATH), e.g. the commit
    before identities and health, for the before/after figure."""
    from tests.support.hostfs import LoopDevices

    server = ApiServer(binder=True)
    server.start()
    setup(server)
    work = Path(tempfile.mkdtemp(prefix="bench-health-"))
    (work / "d").mkdir()
    mounter, loops = Mounter(), LoopDevices(work)
    env = {**os.environ, **({"PYTHONPATH": tree} if tree else {})}
    proc: subprocess.Popen[bytes] | None = None
    try:
        for i in range(volumes):
            disk = loops.attach(size=8 << 20, ext4=True)
            mounter.device(disk.path, work / "d" / f"v{i:03d}")
        kubeconfig = work / "kubeconfig"
        server.write_kubeconfig(str(kubeconfig))
        cfg = work / "config.yaml"
        cfg.write_text(yaml.safe_dump({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks",
                                                                         "mountDir": str(work / "d")}}}))
        _journal(work / "state" / "journal.json")  # fresh volumes: nothing to recover
        proc = subprocess.Popen([sys.executable, "-m", "localpv", "agent", "--config", str(cfg), "--node", NODE,
                                 "--kubeconfig", str(kubeconfig), "--listen-address", "127.0.0.1:0",
                                 "--state-dir", str(work / "state"), "--no-host-events"],
                                stderr=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
        while len(server.list("v1", "PersistentVolume")) < volumes:
            time.sleep(0.05)
        for pv in server.list("v1", "PersistentVolume"):
            server.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "metadata": {"name": pv["metadata"]["name"], "namespace": "default"},
                           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-fs",
                                    "volumeName": pv["metadata"]["name"],
                                    "resources": {"requests": {"storage": "1Mi"}}}})
        while sum(1 for pv in server.list("v1", "PersistentVolume") if pv["status"].get("phase") == "Bound") \
                < volumes:
            time.sleep(0.05)
        threading.Event().wait(15)  # the agent records every use, then idles
        agent = psutil.Process(proc.pid)
        before = agent.cpu_times()
        threading.Event().wait(seconds)
        after = agent.cpu_times()
        rss = agent.memory_info().rss
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        mounter.umount_all()
        loops.detach_all()
        server.stop()
    cpu = (after.user - before.user) + (after.system - before.system)
    print(f"`localpv agent`{' of ' + tree if tree else ''}, idle with {volumes} Bound ext4 volumes on loop devices, "
          f"over {seconds:.0f} s:")
    print(f"  CPU {cpu * 1000:.0f} ms ({cpu * 60 / seconds * 1000 * 100 / volumes:.0f} ms per minute per 100 "
          f"volumes); RSS {rss / 2**20:.1f} MiB")


HOST_DIR = "/mnt/disks"
#: Where upstream's image expects its ConfigMap, and where the benchmark puts its program.
UPSTREAM_CONFIG = "/etc/provisioner/config"


def agent_programs() -> list[Callable[[Path, Path, Path], Program]]:
    """Each node agent, given (work dir, ConfigMap directory, kubeconfig); both run on NODE."""
    programs: list[Callable[[Path, Path, Path], Program]] = [
        lambda work, config, kubeconfig: localpv_program(
            "localpv agent", ["agent", "--config", str(config), "--kubeconfig", str(kubeconfig),
                              "--listen-address", "127.0.0.1:0", "--state-dir", str(work / "state")],
            {"MY_NODE_NAME": NODE})]
    binary = upstream_binary(UPSTREAM_LSP_ENV)
    if binary is not None:
        programs.append(lambda work, config, kubeconfig: Program(
            "local-volume-provisioner",
            in_own_root(["/local-volume-provisioner", "--listen-address=127.0.0.1:0"],
                        {"/local-volume-provisioner": Path(binary), UPSTREAM_CONFIG: config,
                         "/kubeconfig": kubeconfig, str(work / "disks"): work / "disks"}, work / "root"),
            {"MY_NODE_NAME": NODE, "MY_NAMESPACE": "default", "KUBECONFIG": "/kubeconfig",
             "PATH": os.environ.get("PATH", "/usr/bin:/bin")}))
    return programs


@dataclass(frozen=True)
class AgentFigures:
    name: str
    other_pvs: int
    ready: float
    cpu_to_idle: float
    rss_idle: int
    idle_cpu_per_minute: float
    latencies_ms: list[float]


def own_paths_seen(server: ApiServer, paths: set[str]) -> set[str]:
    """Which of ``paths`` have a PV on NODE (read from the store: a poll must not load the server).
    PVs of other nodes carry the same paths: the node is told by the PV's node affinity."""
    seen = set()
    for pv in server.store.items(resource_for("v1", "PersistentVolume")):
        path = pv["spec"].get("local", {}).get("path")
        if path in paths and NODE in pv_nodes(pv):
            seen.add(path)
    return seen


def pv_nodes(pv: dict[str, Any]) -> set[str]:
    terms = pv["spec"].get("nodeAffinity", {}).get("required", {}).get("nodeSelectorTerms", [])
    return {value for term in terms for expr in term.get("matchExpressions", []) for value in expr.get("values", [])}


def measure_agent(program_for: Callable[[Path, Path, Path], Program], volumes: int, other_pvs: int,
                  idle_seconds: float, mounts: int) -> AgentFigures:
    """One agent, as a process, on a fresh emulator and a fresh discovery directory."""
    server = cluster_with_other_pvs(other_pvs)
    work = Path(tempfile.mkdtemp(prefix="bench-compare-"))
    (work / "root").mkdir()
    mounter = Mounter()
    try:
        disks = mounter.tmpfs(work / "disks", size=1 << 20)
        subprocess.run(["mount", "--make-shared", str(disks)], check=True)  # later mounts reach upstream's namespace
        for i in range(volumes):
            mounter.tmpfs(disks / f"v{i}", size=1 << 20)
        (work / "config").mkdir()
        (work / "config" / "storageClassMap").write_text(yaml.safe_dump(
            {"local-fs": {"hostDir": HOST_DIR, "mountDir": str(disks)}}))
        program = program_for(work, work / "config", server.write_kubeconfig(work / "kubeconfig"))
        own = {f"{HOST_DIR}/v{i}" for i in range(volumes)}
        latencies: list[float] = []
        with Running(program, work / "log") as proc:
            ready = proc.wait_for(lambda: own_paths_seen(server, own) == own, 300, f"its {volumes} PVs")
            cpu_to_idle = proc.wait_idle()
            cpu0 = proc.cpu()
            threading.Event().wait(idle_seconds)
            idle_cpu, rss = (proc.cpu() - cpu0) * 60 / idle_seconds, proc.rss()
            if mounts:
                latencies = mount_latencies(proc, server, mounter, disks, mounts)
        return AgentFigures(program.name, other_pvs, ready, cpu_to_idle, rss, idle_cpu, latencies)
    finally:
        mounter.umount_all()
        server.stop()


def mount_latencies(proc: Running, server: ApiServer, mounter: Mounter, disks: Path, mounts: int) -> list[float]:
    """Mount M volumes at random gaps of 0-5 s (seed 1) while polling for their PVs; ms each took."""
    rng = random.Random(1)
    mounted: dict[str, float] = {}
    seen: dict[str, float] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            now = time.monotonic()
            for path in own_paths_seen(server, set(mounted) - set(seen)):
                seen[path] = now
            stop.wait(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        for i in range(mounts):
            threading.Event().wait(rng.uniform(0, 5))
            path = f"{HOST_DIR}/m{i}"
            mounter.tmpfs(disks / f"m{i}", size=1 << 20)
            mounted[path] = time.monotonic()
        proc.wait_for(lambda: len(seen) == mounts, 60, "the PVs of the mounts")
    finally:
        stop.set()
        poller.join()
    return [(seen[path] - mounted[path]) * 1000 for path in mounted]


def bench_compare(volumes: int, other_pvs: int, idle_seconds: float, mounts: int) -> None:
    """Each agent with no other PVs (and the mount latencies), then with N PVs of other nodes."""
    rows = [measure_agent(program_for, volumes, count, idle_seconds, mounts if count == 0 else 0)
            for count in (0, other_pvs) for program_for in agent_programs()]
    print(f"{volumes} volumes on the node; each agent a process of its own, with its defaults:")
    for r in rows:
        line = (f"  {r.name}, {r.other_pvs} PVs of other nodes: own PVs after {r.ready:.2f} s, CPU to idle "
                f"{r.cpu_to_idle:.2f} s, idle RSS {r.rss_idle / 2**20:.1f} MiB, idle CPU {r.idle_cpu_per_minute:.3f} s"
                "/min")
        if r.latencies_ms:
            line += (f"; mount -> PV over {len(r.latencies_ms)} mounts: p50 {statistics.median(r.latencies_ms):.0f} "
                     f"ms, p99 {percentile(r.latencies_ms, 0.99):.0f} ms, max {max(r.latencies_ms):.0f} ms")
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("latency").add_argument("--mounts", type=int, default=50)
    sub.add_parser("pass").add_argument("--entries", type=int, default=1000)
    sub.add_parser("rss").add_argument("--other-pvs", type=int, default=10000)
    health = sub.add_parser("health")
    health.add_argument("--volumes", type=int, default=100)
    health.add_argument("--seconds", type=float, default=120.0)
    health.add_argument("--agent-tree", default=None, help="run the agent of this checkout (PYTHONPATH)")
    idle = sub.add_parser("idle")
    idle.add_argument("--volumes", type=int, default=10)
    idle.add_argument("--agent-tree", default=None, help="run the agent of this checkout (PYTHONPATH)")
    client = sub.add_parser("client")
    client.add_argument("--runs", type=int, default=15)
    client.add_argument("--agent-tree", default=None, help="import the localpv of this checkout (PYTHONPATH)")
    compare = sub.add_parser("compare")
    compare.add_argument("--volumes", type=int, default=10)
    compare.add_argument("--other-pvs", type=int, default=10000)
    compare.add_argument("--idle-seconds", type=float, default=60.0)
    compare.add_argument("--mounts", type=int, default=30)
    args = parser.parse_args()
    if os.geteuid() != 0 and args.what not in ("rss", "client"):
        sys.exit("needs root (real tmpfs mounts)")
    print(machine())
    runs = {"latency": lambda: bench_latency(args.mounts), "pass": lambda: bench_pass(args.entries),
            "rss": lambda: bench_rss(args.other_pvs),
            "health": lambda: bench_health(args.volumes, args.seconds, args.agent_tree),
            "idle": lambda: bench_idle(args.volumes, args.agent_tree),
            "client": lambda: bench_client(args.runs, args.agent_tree),
            "compare": lambda: bench_compare(args.volumes, args.other_pvs, args.idle_seconds, args.mounts)}
    runs[args.what]()


if __name__ == "__main__":
    main()


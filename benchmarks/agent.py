"""Node agent figures: mount → PV latency, cost of a discovery pass, RSS vs. cluster size.

Run as root (real tmpfs mounts):

    python -m benchmarks.agent latency --mounts 50
    python -m benchmarks.agent pass --entries 1000
    python -m benchmarks.agent rss --other-pvs 10000
    python -m benchmarks.agent health --volumes 100 [--agent-tree OTHER_CHECKOUT]
    python -m benchmarks.agent idle --volumes 10 [--agent-tree OTHER_CHECKOUT]
    python -m benchmarks.agent client [--agent-tree OTHER_CHECKOUT]

Each prints its figures; the results with the command and the machine are recorded in
docs/benchmarks.md. This is not a test: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

from localpv.agent.journal import Journal
from localpv.agent.metrics import AgentMetrics
from localpv.agent.node import AgentOptions, NodeAgent
from localpv.config import parse_config
from localpv.kube.api import KubeApi
from localpv.kube.events import EventRecorder
from localpv.kube.transport import connect
from localpv.naming import NODE_LABEL_KEY
from localpv_emulator.apiserver import ApiServer
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


def unfiltered_rss(kubeconfig: Path) -> int:
    """RSS of a process caching every PV of the cluster, as upstream's informer does."""
    proc = subprocess.Popen([sys.executable, "-c", UNFILTERED, str(kubeconfig)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        threading.Event().wait(2)
        return int(psutil.Process(proc.pid).memory_info().rss)
    finally:
        proc.terminate()
        proc.wait(10)


def bench_rss(other_pvs: int) -> None:
    """RSS of a real `localpv agent` process with 0 and with N PVs of other nodes in the cluster."""
    rows = []
    for count in (0, other_pvs):
        server = ApiServer(binder=False)
        server.start()
        setup(server)
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
        work = Path(tempfile.mkdtemp(prefix="bench-rss-"))
        (work / "d").mkdir()
        kubeconfig = work / "kubeconfig"
        server.write_kubeconfig(str(kubeconfig))
        cfg = work / "config.yaml"
        cfg.write_text(yaml.safe_dump({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks",
                                                                         "mountDir": str(work / "d")}}}))
        proc = subprocess.Popen([sys.executable, "-m", "localpv", "agent", "--config", str(cfg), "--node", NODE,
                                 "--kubeconfig", str(kubeconfig), "--listen-address", "127.0.0.1:0",
                                 "--state-dir", str(work / "state")], stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and server.requests.count(verb="watch",
                                                                          resource="persistentvolumes") == 0:
                time.sleep(0.05)
            threading.Event().wait(3)  # idle a moment after the watch is open
            rss = psutil.Process(proc.pid).memory_info().rss
            lists = server.requests.count(verb="list", resource="persistentvolumes")
            proc.terminate()
            proc.wait(10)
            unfiltered = unfiltered_rss(kubeconfig)
        finally:
            if proc.poll() is None:
                proc.terminate()
            server.stop()
        rows.append((count, rss, lists, unfiltered))
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
    args = parser.parse_args()
    if os.geteuid() != 0 and args.what not in ("rss", "client"):
        sys.exit("needs root (real tmpfs mounts)")
    print(machine())
    runs = {"latency": lambda: bench_latency(args.mounts), "pass": lambda: bench_pass(args.entries),
            "rss": lambda: bench_rss(args.other_pvs),
            "health": lambda: bench_health(args.volumes, args.seconds, args.agent_tree),
            "idle": lambda: bench_idle(args.volumes, args.agent_tree),
            "client": lambda: bench_client(args.runs, args.agent_tree)}
    runs[args.what]()


if __name__ == "__main__":
    main()


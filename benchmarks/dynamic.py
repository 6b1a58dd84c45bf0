"""Dynamic volumes' figures (docs/benchmarks.md), as root on a machine with loop devices:

    python3 -m benchmarks.dynamic                 # all four
    python3 -m benchmarks.dynamic --claims 100 --only bound

* ``bound``: N claims of one node, created at once against the API emulator (its PV binder
  binds), a real pool (ext4 on a loop device) and the agent's controller with production
  settings (4 workers, the agent's 5 QPS / burst 10 rate limit): seconds from the first
  create to the last claim Bound.
* ``images``: time to make one 1 GiB image, thin and thick, ext4 and XFS (mkfs included).
* ``publish``: NodePublishVolume + NodeUnpublishVolume over the real unix socket with a real
  gRPC client, the volume staged once (no mkfs in the loop): p50/p99 of publish.
* ``rss``: the agent's modules imported and its API client made, then the CSI servers
  started (grpcio imported): the RSS each time, in a fresh interpreter.

Nothing here asserts anything; it prints what it measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20


def _pool(base: Path, size: int) -> tuple[str, Path]:
    image = base / "pool.img"
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    device = subprocess.run(["losetup", "--find", "--show", str(image)], check=True, capture_output=True,
                            text=True).stdout.strip()
    root = base / "pool"
    root.mkdir()
    subprocess.run(["mount", device, str(root)], check=True)
    return device, root


def _unpool(device: str, root: Path) -> None:
    subprocess.run(["umount", str(root)], check=False)
    subprocess.run(["losetup", "-d", device], check=False)


def bound(claims: int, base: Path) -> None:
    from localpv.config import ProvisionerConfig
    from localpv.config.dynamic import DynamicClass, PoolConfig
    from localpv.csi.controller import DynamicController, DynamicSettings
    from localpv.csi.journal import ImageJournal
    from localpv.csi.metrics import DynamicMetrics
    from localpv.csi.pools import Pool
    from localpv.kube.api import KubeApi
    from localpv.kube.events import EventRecorder
    from localpv.kube.ratelimit import AGENT_RATE, rate_limiter
    from localpv.kube.transport import connect
    from localpv_emulator.apiserver import ApiServer
    from localpv_emulator.objects import claim, node, storage_class
    from tests.support.labeller import running_labeller

    device, root = _pool(base, claims * 80 * MiB)
    server = ApiServer(binder=True)
    server.start()
    try:
        server.create(node("node-1"))
        server.create(storage_class("dyn", provisioner="local.csi.localpv.dev"))
        pool = Pool(PoolConfig("fast", str(root), str(root)))
        config = ProvisionerConfig(dynamic_pools={"fast": pool.config}, dynamic_classes={"dyn": DynamicClass("dyn",
                                                                                                          "fast")})
        api = KubeApi(connect(server.url), limiter=rate_limiter(AGENT_RATE.qps, AGENT_RATE.burst))
        recorder = EventRecorder(api.for_events(), component="bench")
        recorder.start()
        controller = DynamicController(api, DynamicSettings("node-1", "node-1"), config=lambda: config,
                                       pools=lambda: {"fast": pool}, journal=ImageJournal(base / "j.json"),
                                       recorder=recorder, metrics=DynamicMetrics())
        controller.start()
        controller.synced.wait(30)
        # The claim labeller, as the chart runs it (the agent sees a claim once it is labelled);
        # its requests go to an API handle of its own, outside the agent's rate limit.
        labeller = running_labeller(KubeApi(connect(server.url)))
        labeller.__enter__()
        started = time.monotonic()
        for i in range(claims):
            server.create(claim(f"c{i}", "dyn", size="64Mi", selected_node="node-1"))
        while True:
            done = sum(1 for c in server.list("v1", "PersistentVolumeClaim", "default")
                       if (c.get("status") or {}).get("phase") == "Bound")
            if done == claims:
                break
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        print(f"bound: {claims} claims of one node, created to Bound: {elapsed:.2f} s "
              f"({claims / elapsed:.1f} claims/s; 4 workers, rate limit {AGENT_RATE.qps:g} QPS burst "
              f"{AGENT_RATE.burst})")
        labeller.__exit__(None, None, None)
        controller.stop()
        recorder.stop()
    finally:
        server.stop()
        _unpool(device, root)


def images(base: Path) -> None:
    from localpv.csi.images import FsType, ImageStore, Provisioning

    device, root = _pool(base, 6 << 30)
    try:
        store = ImageStore(str(root))
        for fs in FsType:
            for provisioning in Provisioning:
                times = []
                for i in range(3):
                    name = f"{fs.value}-{provisioning.value}-{i}"
                    t = time.monotonic()
                    store.create(name, 1 << 30, fs=fs, provisioning=provisioning)
                    times.append(time.monotonic() - t)
                    store.remove(name)
                print(f"images: 1 GiB {fs.value} {provisioning.value}: median {statistics.median(times) * 1000:.0f} ms "
                      f"(mkfs included; {len(times)} runs)")
    finally:
        _unpool(device, root)


def publish(base: Path, rounds: int) -> None:
    import grpc

    from localpv.config.dynamic import PoolConfig
    from localpv.csi.images import FsType, Provisioning
    from localpv.csi.node import NodeService
    from localpv.csi.pools import Pool
    from localpv.csi.proto import csi_pb2 as csi
    from localpv.csi.rpc import UnixServer, unary_call
    from localpv.csi.volume import FS_UUID, POOL

    device, root = _pool(base, 512 * MiB)
    sock_dir = Path(tempfile.mkdtemp(prefix="lpv-", dir="/tmp"))
    pool = Pool(PoolConfig("fast", str(root), str(root)))
    fs_uuid = pool.images.create("pvc-bench", 64 * MiB, fs=FsType.EXT4, provisioning=Provisioning.THIN)
    server = UnixServer(str(sock_dir / "csi.sock"), [NodeService("node-1", lambda: {"fast": pool}).handler()])
    server.start()
    channel = grpc.insecure_channel(f"unix://{sock_dir / 'csi.sock'}")
    cap = csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume(fs_type="ext4"),
                               access_mode=csi.VolumeCapability.AccessMode(mode=1))
    staging, target = base / "staging", base / "target"
    try:
        unary_call(channel, "/csi.v1.Node/NodeStageVolume", csi.NodeStageVolumeRequest(
            volume_id="pvc-bench", staging_target_path=str(staging), volume_capability=cap,
            volume_context={POOL: "fast", FS_UUID: fs_uuid}), csi.NodeStageVolumeResponse)
        times = []
        for _ in range(rounds):
            t = time.monotonic()
            unary_call(channel, "/csi.v1.Node/NodePublishVolume", csi.NodePublishVolumeRequest(
                volume_id="pvc-bench", staging_target_path=str(staging), target_path=str(target),
                volume_capability=cap), csi.NodePublishVolumeResponse)
            times.append(time.monotonic() - t)
            unary_call(channel, "/csi.v1.Node/NodeUnpublishVolume", csi.NodeUnpublishVolumeRequest(
                volume_id="pvc-bench", target_path=str(target)), csi.NodeUnpublishVolumeResponse)
        times.sort()
        p99 = times[max(0, int(len(times) * 0.99) - 1)]
        print(f"publish: NodePublishVolume over the socket, {rounds} rounds: p50 {statistics.median(times) * 1000:.1f} "
              f"ms, p99 {p99 * 1000:.1f} ms")
        unary_call(channel, "/csi.v1.Node/NodeUnstageVolume", csi.NodeUnstageVolumeRequest(
            volume_id="pvc-bench", staging_target_path=str(staging)), csi.NodeUnstageVolumeResponse)
    finally:
        channel.close()
        server.stop()
        time.sleep(0.2)  # the autoclear of the loop device before the pool goes
        _unpool(device, root)


_RSS = """
import gc, os, sys, tempfile, psutil
import localpv.cli, localpv.agent.node, localpv.agent.executor, localpv.kube.informer, localpv.agent.metrics
from localpv_emulator.apiserver import ApiServer
if sys.argv[1] == "csi":
    from localpv.csi.identity import IdentityService
    from localpv.csi.node import NodeService
    from localpv.csi.registration import RegistrationService
    from localpv.csi.rpc import UnixServer
    from localpv.csi import controller, app
    d = tempfile.mkdtemp(prefix="lpv-", dir="/tmp")
    s1 = UnixServer(d + "/csi.sock", [IdentityService("x").handler(), NodeService("n", dict).handler()])
    s2 = UnixServer(d + "/reg.sock", [RegistrationService("x", d + "/csi.sock").handler()])
    s1.start(); s2.start()
import localpv.kube.client, localpv.kube.transport  # the agent's API client: no kubernetes package
gc.collect()
print(psutil.Process().memory_info().rss)
"""


def rss() -> None:
    def measure(kind: str) -> int:
        return int(subprocess.run([sys.executable, "-c", _RSS, kind], check=True, capture_output=True,
                                  text=True).stdout.split()[-1])

    static = statistics.median(measure("static") for _ in range(3))
    dynamic = statistics.median(measure("csi") for _ in range(3))
    print(f"rss: agent modules {static / MiB:.1f} MiB; with the CSI servers running {dynamic / MiB:.1f} MiB "
          f"(+{(dynamic - static) / MiB:.1f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--only", choices=("bound", "images", "publish", "rss"))
    args = parser.parse_args()
    if os.geteuid() != 0 and args.only != "rss":
        sys.exit("run as root (loop devices, mounts)")
    for name in ("bound", "images", "publish", "rss"):
        if args.only in (None, name):
            with tempfile.TemporaryDirectory(prefix="lpv-bench-") as tmp:
                if name == "bound":
                    bound(args.claims, Path(tmp))
                elif name == "images":
                    images(Path(tmp))
                elif name == "publish":
                    publish(Path(tmp), args.rounds)
                else:
                    rss()


if __name__ == "__main__":
    main()

"""NFS mode figures: N pending claims at once → seconds until all are Bound, API requests per claim.

    python -m benchmarks.nfs_provisioning --claims 1000
    python -m benchmarks.nfs_provisioning --claims 1000 --no-binder
    python -m benchmarks.nfs_provisioning --claims 1000 --kube-api-qps 0   # no client-side rate limit
    LOCALPV_BENCH_UPSTREAM_NFS=/path/to/nfs-subdir-external-provisioner \
        python -m benchmarks.nfs_provisioning --claims 1000 --processes

The claims are written straight into the emulator's store and the emulator's PV binder
is left to settle (every claim Pending, annotated for our provisioner); only then does one
provisioner replica start, with production settings (4+4 workers, leader election on a
real Lease), against a temporary directory as the export. So the clock covers leader
election, the initial lists, provisioning and the binder's binding - a burst of N claims
meeting the provisioner at once - and every HTTP request the emulator logs from then on is
the provisioner's own. Then all claims are deleted at once and the same is measured for
deletion (``archiveOnDelete: "false"``: directories removed).

``--no-binder`` takes the emulator's PV binder out of the measurement: the script does the
kube-controller-manager's two small parts itself (it annotates the claims for our
provisioner when creating them, and marks the PVs Released when deleting them), and
"done" means every claim has its pre-bound PV, i.e. the provisioner's work is finished.
The replica's API handle carries the production rate limit, ``localpv nfs``'s defaults
(20 QPS, burst 30; ``--kube-api-qps 0`` takes it away), so the times include waiting for
tokens: one per request, events included.

``--processes`` puts `localpv nfs` and upstream's nfs-subdir-external-provisioner side by
side, each a process of its own started the same way (benchmarks/programs.py) with the
same environment (``NFS_SERVER``, ``NFS_PATH``, ``PROVISIONER_NAME``, ``KUBECONFIG``,
``POD_NAMESPACE``) against a fresh emulator with the same pending claims (binder on); each
with its own defaults (client-side rate limits: localpv 20 QPS, burst 30; upstream
client-go's 5 QPS, burst 10, which nfs-subdir does not change). It prints the RSS once
every claim is Bound, the CPU time for provisioning them, and for deleting them too.
This is not a test: nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.programs import UPSTREAM_NFS_ENV, Program, Running, in_own_root, localpv_program, upstream_binary
from localpv.kube.api import KubeApi
from localpv.kube.ratelimit import CONTROLLER_RATE, rate_limiter
from localpv.kube.transport import connect
from localpv.nfs.app import NfsOptions, NfsReplica
from localpv.nfs.controller import ControllerSettings
from localpv.nfs.metrics import NfsMetrics
from localpv.nfs.pathpattern import RESERVED_DIRECTORY
from localpv.nfs.provisioner import NfsSource
from localpv_emulator.apiserver import ApiServer, resource_for

PROVISIONER = "bench.localpv/nfs"


def machine() -> str:
    return (f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total // 2**30} GiB, "
            f"Python {platform.python_version()}, Linux {platform.release()}")


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {timeout:.0f}s waiting for {what}")
        threading.Event().wait(0.1)


PVS = resource_for("v1", "PersistentVolume")
ASKED = {"volume.kubernetes.io/storage-provisioner": PROVISIONER,
         "volume.beta.kubernetes.io/storage-provisioner": PROVISIONER}


def claim(i: int, annotations: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"claim-{i:05d}", "namespace": "bench", "annotations": annotations},
            "spec": {"storageClassName": "nfs", "accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "1Gi"}}}}


def phases(server: ApiServer) -> Counter[str]:
    """Claim phases, read from the store without copies (a poll must not load the server)."""
    claims = server.store.items(resource_for("v1", "PersistentVolumeClaim"), "bench")
    return Counter(str((c.get("status") or {}).get("phase")) for c in claims)


def volume_dirs(export: str) -> int:
    """Entries of the export but the provisioner's own records directory."""
    return sum(1 for entry in os.listdir(export) if entry != RESERVED_DIRECTORY)


def breakdown(server: ApiServer, claims: int) -> str:
    counts = server.requests.counts()
    rows = sorted(counts.items(), key=lambda kv: -kv[1])
    return "\n".join(f"    {verb:>7} {resource:<24} {n:>6}  ({n / claims:.2f} per claim)"
                     for (verb, resource), n in rows)


def start_server(binder: bool) -> ApiServer:
    """An emulator with the benchmark's namespace and StorageClass (``archiveOnDelete: "false"``)."""
    server = ApiServer(binder=binder).start()
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
    server.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "nfs"},
                   "provisioner": PROVISIONER, "parameters": {"archiveOnDelete": "false"},
                   "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"})
    return server


#: The environment both provisioners read (nfs-subdir's variables; `localpv nfs` reads the same).
NFS_ENV = {"NFS_SERVER": "nfs.bench", "NFS_PATH": "/exports", "PROVISIONER_NAME": PROVISIONER,
           "POD_NAMESPACE": "kube-system"}
#: Where nfs-subdir-external-provisioner expects the export (its image's mount point).
UPSTREAM_MOUNT = "/persistentvolumes"


def nfs_programs(localpv_args: list[str]) -> list[Callable[[Path, Path, Path], Program]]:
    """Each provisioner, given (work dir, export dir, kubeconfig); ``localpv_args`` go to localpv's."""
    programs: list[Callable[[Path, Path, Path], Program]] = [
        lambda work, export, kubeconfig: localpv_program(
            "localpv nfs", ["nfs", "--listen-address", "127.0.0.1:0", "--mount-dir", str(export), *localpv_args],
            {**NFS_ENV, "KUBECONFIG": str(kubeconfig)})]
    binary = upstream_binary(UPSTREAM_NFS_ENV)
    if binary is not None:
        programs.append(lambda work, export, kubeconfig: Program(
            "nfs-subdir-external-provisioner",
            in_own_root(["/nfs-subdir-external-provisioner"],
                        {"/nfs-subdir-external-provisioner": Path(binary), "/kubeconfig": kubeconfig,
                         UPSTREAM_MOUNT: export}, work / "root"),
            {**NFS_ENV, "KUBECONFIG": "/kubeconfig", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}))
    return programs


@dataclass(frozen=True)
class ProcessFigures:
    name: str
    bound: float
    deleted: float
    rss: int
    cpu_provision: float
    cpu_total: float
    dirs: int
    left: int
    provision_requests: int
    delete_requests: int


def measure_process(program_for: Callable[[Path, Path, Path], Program], n: int, timeout: float) -> ProcessFigures:
    """One provisioner, as a process, against a fresh emulator holding N pending claims."""
    server = start_server(binder=True)
    for i in range(n):
        server.create(claim(i, {}))
    server.settle(timeout=timeout)
    work = Path(tempfile.mkdtemp(prefix="nfs-bench-proc-"))
    (work / "root").mkdir()
    export = work / "export"
    export.mkdir()
    program = program_for(work, export, server.write_kubeconfig(work / "kubeconfig"))
    server.requests.clear()
    try:
        with Running(program, work / "log") as proc:
            bound = proc.wait_for(lambda: phases(server)["Bound"] == n, timeout, "all claims Bound", every=0.2)
            rss, cpu_provision, dirs = proc.rss(), proc.cpu(), volume_dirs(export)
            provision_requests = len(server.requests)
            started = time.monotonic()
            for i in range(n):
                server.delete("v1", "PersistentVolumeClaim", f"claim-{i:05d}", "bench")
            proc.wait_for(lambda: not server.store.items(PVS), timeout, "all PVs deleted", every=0.2)
            deleted = time.monotonic() - started
            return ProcessFigures(program.name, bound, deleted, rss, cpu_provision, proc.cpu(), dirs,
                                  volume_dirs(export), provision_requests, len(server.requests) - provision_requests)
    finally:
        server.stop()


def bench_processes(n: int, timeout: float, localpv_args: list[str]) -> None:
    """Each provisioner as a process against the same N pending claims: RSS and CPU."""
    rows = [measure_process(program_for, n, timeout) for program_for in nfs_programs(localpv_args)]
    print(f"machine: {machine()}")
    print(f"{n} pending claims, each provisioner a process of its own (emulator binder on), own defaults"
          f"{' but localpv ' + ' '.join(localpv_args) if localpv_args else ''}:")
    for r in rows:
        print(f"  {r.name}: all Bound after {r.bound:.1f}s, all PVs deleted {r.deleted:.1f}s later; "
              f"RSS after {n} claims {r.rss / 2**20:.1f} MiB; CPU provisioning {r.cpu_provision:.2f}s, "
              f"provisioning and deleting {r.cpu_total:.2f}s; directories created {r.dirs}, left {r.left}; "
              f"API requests {r.provision_requests / n:.2f} per claim provisioning, {r.delete_requests / n:.2f} "
              "deleting")
    if len(rows) == 2:
        ours, theirs = rows
        print(f"  ratio localpv / upstream: RSS {ours.rss / theirs.rss:.2f}, CPU provisioning "
              f"{ours.cpu_provision / theirs.cpu_provision:.2f}, CPU provisioning and deleting "
              f"{ours.cpu_total / theirs.cpu_total:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=None, help="seconds (default 600; 3600 with --processes)")
    parser.add_argument("--binder", action=argparse.BooleanOptionalAction, default=True,
                        help="run the emulator's PV binder (default) or stand in for it")
    parser.add_argument("--kube-api-qps", type=float, default=None,
                        help=f"client-side rate limit (0: none; default {CONTROLLER_RATE.qps:g}, localpv nfs's; "
                             "with --processes it is passed to localpv nfs only when given)")
    parser.add_argument("--kube-api-burst", type=int, default=None)
    parser.add_argument("--processes", action="store_true",
                        help="localpv nfs and upstream's nfs-subdir-external-provisioner as processes, side by side")
    args = parser.parse_args()
    n = args.claims
    if args.processes:
        limits = [*(["--kube-api-qps", f"{args.kube_api_qps:g}"] if args.kube_api_qps is not None else []),
                  *(["--kube-api-burst", str(args.kube_api_burst)] if args.kube_api_burst is not None else [])]
        bench_processes(n, args.timeout or 3600.0, limits)
        return
    args.kube_api_qps = CONTROLLER_RATE.qps if args.kube_api_qps is None else args.kube_api_qps
    args.kube_api_burst = CONTROLLER_RATE.burst if args.kube_api_burst is None else args.kube_api_burst
    args.timeout = args.timeout or 600.0

    server = start_server(args.binder)
    with tempfile.TemporaryDirectory(prefix="nfs-bench-") as export:
        metrics = NfsMetrics()
        limiter = rate_limiter(args.kube_api_qps, args.kube_api_burst)
        api = KubeApi(connect(server.url), observer=metrics.api.observe, limiter=limiter)
        options = NfsOptions(NfsSource("nfs.bench", "/exports", export),
                             ControllerSettings(PROVISIONER, workers=args.workers), namespace="kube-system")
        replica = NfsReplica(api, options, metrics=metrics)
        started = time.monotonic()
        for i in range(n):
            server.create(claim(i, {} if args.binder else ASKED))
        server.settle(timeout=args.timeout)
        created = time.monotonic() - started
        server.requests.clear()
        cpu0 = time.process_time()

        started = time.monotonic()
        replica.start()
        wait(lambda: replica.controller is not None and replica.controller.synced.is_set(), 30, "leadership")
        synced = time.monotonic() - started
        if args.binder:
            wait(lambda: phases(server)["Bound"] == n, args.timeout, "all claims Bound")
        else:
            wait(lambda: len(server.store.items(PVS)) == n, args.timeout, "all PVs created")
        bound = time.monotonic() - started
        replica.recorder.flush(60)
        provision_requests = len(server.requests)
        provision_breakdown = breakdown(server, n)
        dirs = volume_dirs(export)
        cpu_provision = time.process_time() - cpu0

        server.requests.clear()
        started = time.monotonic()
        for i in range(n):
            server.delete("v1", "PersistentVolumeClaim", f"claim-{i:05d}", "bench")
        if not args.binder:
            for pv in server.list("v1", "PersistentVolume"):
                pv["status"] = {"phase": "Released"}
                server.update(pv, subresource="status")
        wait(lambda: not server.store.items(PVS), args.timeout, "all PVs deleted")
        deleted = time.monotonic() - started
        replica.recorder.flush(60)
        delete_requests = len(server.requests)
        delete_breakdown = breakdown(server, n)
        left = volume_dirs(export)
        replica.stop()
    server.stop()

    print(f"machine: {machine()}")
    print(f"claims: {n} pending (created and settled in the emulator in {created:.2f}s), "
          f"workers: {args.workers}+{args.workers}")
    print("client-side rate limit: " + (f"{limiter.qps:g} QPS, burst {limiter.burst}; {limiter.throttled} requests "
                                        f"waited for a token" if limiter else "none"))
    done = "all Bound" if args.binder else "all PVs created (pre-bound; no binder)"
    print(f"leader with synced caches after {synced:.2f}s; {done} after {bound:.2f}s ({n / bound:.0f} claims/s); "
          f"directories created: {dirs}")
    print(f"API requests by the provisioner while provisioning: {provision_requests} "
          f"({provision_requests / n:.2f} per claim)")
    print(provision_breakdown)
    print(f"all PVs deleted after {deleted:.2f}s ({n / deleted:.0f} volumes/s); directories left: {left}")
    print(f"API requests by the provisioner while deleting: {delete_requests} ({delete_requests / n:.2f} per volume)")
    print(delete_breakdown)
    print(f"CPU of this process while provisioning (emulator included): {cpu_provision:.1f}s")


if __name__ == "__main__":
    main()

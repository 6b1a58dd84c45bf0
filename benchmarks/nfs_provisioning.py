"""NFS mode figures: N pending claims at once → seconds until all are Bound, API requests per claim.

    python -m benchmarks.nfs_provisioning --claims 1000
    python -m benchmarks.nfs_provisioning --claims 1000 --no-binder
    python -m benchmarks.nfs_provisioning --claims 1000 --kube-api-qps 0   # no client-side rate limit

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

import psutil

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--binder", action=argparse.BooleanOptionalAction, default=True,
                        help="run the emulator's PV binder (default) or stand in for it")
    parser.add_argument("--kube-api-qps", type=float, default=CONTROLLER_RATE.qps,
                        help="client-side rate limit, as localpv nfs (0: none)")
    parser.add_argument("--kube-api-burst", type=int, default=CONTROLLER_RATE.burst)
    args = parser.parse_args()
    n = args.claims

    server = ApiServer(binder=args.binder).start()
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
    server.create({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "nfs"},
                   "provisioner": PROVISIONER, "parameters": {"archiveOnDelete": "false"},
                   "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"})
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

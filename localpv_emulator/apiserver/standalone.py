"""The standalone server: ``python -m localpv_emulator.apiserver``."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from localpv_emulator.apiserver.resources import CAPACITY_VERSIONS_ENV, KUBE_VERSION
from localpv_emulator.apiserver.server import ApiServer


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM (the standalone mode used by ``localpv demo`` and humans)."""
    parser = argparse.ArgumentParser(prog="python -m localpv_emulator.apiserver",
                                     description="Serve the localpv Kubernetes API emulator.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    parser.add_argument("--kubeconfig-out", type=Path, help="write a kubeconfig for the server here")
    parser.add_argument("--binder", action="store_true", help="run the PV binder")
    parser.add_argument("--job-completer", action="store_true", help="mark every Job as succeeded")
    parser.add_argument("--history-limit", type=int, default=10000, help="watch events kept for resumes")
    parser.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds between watch bookmarks")
    parser.add_argument("--kube-version", default=KUBE_VERSION, help="version reported by /version")
    parser.add_argument("--capacity-versions", default=None, metavar="V[,V...]",
                        help="storage.k8s.io versions of CSIStorageCapacity to serve, of v1, v1beta1, v1alpha1 "
                             f"('none': none; default: env {CAPACITY_VERSIONS_ENV}, else v1)")
    parser.add_argument("--honor-pv-reclaim-policy", choices=("true", "false"), default="true",
                        help="the PV controller's feature gate HonorPVReclaimPolicy (on by default from 1.31)")
    args = parser.parse_args(argv)
    versions = None if args.capacity_versions is None else [
        v.strip() for v in args.capacity_versions.split(",") if v.strip() not in ("", "none")]
    try:
        server = ApiServer(binder=args.binder, job_completer=args.job_completer, history_limit=args.history_limit,
                           bookmark_interval=args.bookmark_interval, kube_version=args.kube_version, port=args.port,
                           capacity_versions=versions, honor_pv_reclaim_policy=args.honor_pv_reclaim_policy == "true")
    except ValueError as err:
        parser.error(f"--capacity-versions: {err}")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    if args.kubeconfig_out:
        server.write_kubeconfig(args.kubeconfig_out)
    print(f"localpv API emulator serving on {server.url}", flush=True)
    while not stop.wait(0.5):
        pass
    server.stop()
    return 0

"""Cleaning figures: filesystem volumes vs. `rm -rf`, and block cleaner throughput.

Run as root:

    python -m benchmarks.cleaning fs --volumes 20 --files 10000
    python -m benchmarks.cleaning block --size-mib 256

`fs` fills N tmpfs volumes with a tree of files, cleans them with the agent's ProcTable
(its default 4 workers, the same code path as a released PV), refills them and removes
the same trees with `rm -rf` (4 at a time, like the pool), and prints both times and the
ratio. `block` runs each shipped cleaner script on a loop device and prints MiB/s.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from localpv.agent.cleaning import block_cleaner, filesystem_cleaner, packaged_scripts_dir
from localpv.agent.model import RUNNING
from localpv.agent.proctable import ProcTable
from tests.support.hostfs import LoopDevices, Mounter

MiB = 1 << 20


def machine() -> str:
    return (f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total // 2**30} GiB, "
            f"Python {platform.python_version()}, Linux {platform.release()}")


def fill(root: Path, files: int) -> None:
    """``files`` small files spread over 100 directories, two levels deep."""
    per_dir = max(1, files // 100)
    for d in range(100):
        sub = root / f"d{d // 10}" / f"e{d % 10}"
        sub.mkdir(parents=True, exist_ok=True)
        for f in range(per_dir):
            (sub / f"f{f}").write_bytes(b"x" * 64)


def bench_fs(volumes: int, files: int, workers: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-clean-"))
    mounter = Mounter()
    try:
        roots = [mounter.tmpfs(work / f"v{i}", size=256 * MiB) for i in range(volumes)]
        for root in roots:
            fill(root, files)
        table = ProcTable(workers)
        t0 = time.perf_counter()
        for i, root in enumerate(roots):
            table.start(f"v{i}", filesystem_cleaner(str(root), str(work)))
        while any(s.state == RUNNING for s in table.statuses().values()):
            threading.Event().wait(0.005)
        ours = time.perf_counter() - t0
        assert all(not os.listdir(r) for r in roots), "not clean"
        table.shutdown()
        for root in roots:
            fill(root, files)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda r: subprocess.run(["sh", "-c", f'rm -rf "{r}"/*'], check=True), roots))
        rm = time.perf_counter() - t0
    finally:
        mounter.umount_all()
    total = volumes * files
    print(f"filesystem cleaning, {volumes} tmpfs volumes x {files} files ({total} files), {workers} workers:")
    print(f"  localpv (no symlink following, mount checks, verified empty): {ours:.2f} s "
          f"({total / ours:,.0f} files/s)")
    print(f"  rm -rf of the same trees:                                    {rm:.2f} s ({total / rm:,.0f} files/s)")
    print(f"  ratio localpv / rm -rf: {ours / rm:.2f}")


def bench_block(size_mib: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-blk-"))
    loops = LoopDevices(work)
    scripts = [("quick_reset.sh", []), ("dd_zero.sh", ["1"]), ("shred.sh", ["1"]), ("blkdiscard.sh", [])]
    print(f"block cleaners on a {size_mib} MiB loop device (sparse file on {work}):")
    try:
        for script, args in scripts:
            dev = loops.attach(size=size_mib * MiB, ext4=True)
            fn = block_cleaner(dev.path, [str(packaged_scripts_dir() / script), *args], timeout=3600)
            t0 = time.perf_counter()
            outcome = fn(threading.Event())
            elapsed = time.perf_counter() - t0
            rate = f"{size_mib / elapsed:8.0f} MiB/s" if script != "quick_reset.sh" else "(metadata only)"
            print(f"  {script + ' ' + ' '.join(args):<20} {elapsed:7.2f} s  {rate}  "
                  f"{'ok' if outcome.ok else 'FAILED: ' + outcome.message}")
            loops.detach_all()
    finally:
        loops.detach_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    fs = sub.add_parser("fs")
    fs.add_argument("--volumes", type=int, default=20)
    fs.add_argument("--files", type=int, default=10000)
    fs.add_argument("--workers", type=int, default=4)
    sub.add_parser("block").add_argument("--size-mib", type=int, default=256)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (tmpfs mounts, loop devices)")
    print(machine())
    if args.what == "fs":
        bench_fs(args.volumes, args.files, args.workers)
    else:
        bench_block(args.size_mib)


if __name__ == "__main__":
    main()

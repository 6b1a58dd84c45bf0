"""Cleaning figures: filesystem volumes vs. `rm -rf`, and block cleaner throughput.

Run as root:

    python -m benchmarks.cleaning cleanup --files 500000 --rounds 2
    python -m benchmarks.cleaning cleanup --files 100000 --dirs 50000 --rounds 2
    python -m benchmarks.cleaning fs --volumes 20 --files 10000
    python -m benchmarks.cleaning block --size-mib 256

`cleanup` fills one tmpfs volume with a tree of files and empties it with the cleanup
Job's command, `localpv cleanup --dir` (a process of its own, as in the Job: start-up,
refusals, the child cleaner, the walk, the final check), fills it again and removes the
same tree with `rm -rf` (the two take turns going first); each round prints both wall
times, their CPU (user + system of the processes, which other load on the machine
disturbs less) and the ratios.
`fs` fills N tmpfs volumes, cleans them with the agent's ProcTable (its default 4
workers, the same code path as a released PV), refills them and removes the same trees
with `rm -rf` (4 at a time, like the pool), and prints both times and the ratio. `block`
runs each shipped cleaner script on a loop device and prints MiB/s.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
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


def fill(root: Path, files: int, dirs: int = 100) -> None:
    """``files`` small files (64 bytes) spread over ``dirs`` directories, two levels deep."""
    per_dir = max(1, files // dirs)
    width = max(1, math.isqrt(dirs))
    data = b"x" * 64
    for d in range(dirs):
        sub = root / f"d{d // width}" / f"e{d % width}"
        sub.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(sub, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for f in range(per_dir):
                fd = os.open(f"f{f}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
                os.write(fd, data)
                os.close(fd)
        finally:
            os.close(dir_fd)


def timed(argv: list[str]) -> tuple[float, float, float]:
    """Run ``argv`` to completion: wall seconds, then user and system CPU seconds of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def bench_cleanup(files: int, dirs: int, rounds: int) -> None:
    """`localpv cleanup --dir` vs `rm -rf` on one volume, the same tree, alternating."""
    work = Path(tempfile.mkdtemp(prefix="bench-cleanup-"))
    mounter = Mounter()
    print(f"one tmpfs volume of {files} files in {dirs} directories; `localpv cleanup --dir` vs `rm -rf`:")
    try:
        root = mounter.tmpfs(work / "disks" / "v", size=max(256 * MiB, files * 8192))
        localpv = [sys.executable, "-m", "localpv", "cleanup", "--dir", str(root), "--discovery-dir",
                   str(work / "disks")]
        for n in range(1, rounds + 1):
            times = {}
            for what in ("localpv", "rm") if n % 2 else ("rm", "localpv"):  # each goes first in turn
                fill(root, files, dirs)
                times[what] = timed(localpv if what == "localpv" else
                                    ["rm", "-rf", "--", *sorted(str(root / name) for name in os.listdir(root))])
                assert not os.listdir(root), f"{what} left something"
            ours, rm = times["localpv"], times["rm"]
            print(f"  round {n}: localpv cleanup {ours[0]:.2f} s (CPU {ours[1]:.2f} user + {ours[2]:.2f} system), "
                  f"rm -rf {rm[0]:.2f} s (CPU {rm[1]:.2f} + {rm[2]:.2f}); ratio {ours[0] / rm[0]:.2f}, "
                  f"in CPU {(ours[1] + ours[2]) / (rm[1] + rm[2]):.2f}")
    finally:
        mounter.umount_all()


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
    cleanup = sub.add_parser("cleanup")
    cleanup.add_argument("--files", type=int, default=500_000)
    cleanup.add_argument("--dirs", type=int, default=100)
    cleanup.add_argument("--rounds", type=int, default=2)
    fs = sub.add_parser("fs")
    fs.add_argument("--volumes", type=int, default=20)
    fs.add_argument("--files", type=int, default=10000)
    fs.add_argument("--workers", type=int, default=4)
    sub.add_parser("block").add_argument("--size-mib", type=int, default=256)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (tmpfs mounts, loop devices)")
    print(machine())
    if args.what == "cleanup":
        bench_cleanup(args.files, args.dirs, args.rounds)
    elif args.what == "fs":
        bench_fs(args.volumes, args.files, args.workers)
    else:
        bench_block(args.size_mib)


if __name__ == "__main__":
    main()

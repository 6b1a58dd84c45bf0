"""The programs the benchmarks put side by side, and the one way each is measured.

A program is a command line and an environment. Each is started as a process of its own
and measured from outside, the same way whichever it is: CPU time (user + system, of the
process and the children it waited for) and resident set size, read through psutil.

localpv's programs run from this checkout. Upstream's Go programs run when they are
built and named in the environment (docs/benchmarks.md says how they were built):

    LOCALPV_BENCH_UPSTREAM_LSP   local-volume-provisioner (sig-storage-local-static-provisioner)
    LOCALPV_BENCH_UPSTREAM_NFS   nfs-subdir-external-provisioner

Without them, the upstream column is skipped with one line saying so. Upstream's programs
read files at fixed paths of their container images (``/etc/provisioner/config``,
``/persistentvolumes``), so each runs as in a container: in a mount namespace of its own,
chrooted into a fresh tmpfs that holds only what the benchmark binds there. Nothing on the
host changes. Mounts in that namespace are slaves of the host's: a mount made later below
a bound directory that is a shared mount (the benchmark makes its discovery directory
one) shows inside, as a ``HostToContainer`` volume does in a pod.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

import localpv

UPSTREAM_LSP_ENV = "LOCALPV_BENCH_UPSTREAM_LSP"
UPSTREAM_NFS_ENV = "LOCALPV_BENCH_UPSTREAM_NFS"
#: The directory holding this checkout's ``localpv`` package, for the programs it starts.
PACKAGE_ROOT = str(Path(localpv.__file__).resolve().parents[1])


@dataclass(frozen=True)
class Program:
    """What to run: a name for the tables, the command line and its environment."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def python_env(env: Mapping[str, str] = {}) -> dict[str, str]:
    """An environment in which this interpreter imports this checkout's ``localpv``, plus ``env``."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": PACKAGE_ROOT, **env}


def localpv_program(name: str, args: list[str], env: Mapping[str, str] = {}) -> Program:
    """``localpv ARGS`` from this checkout, run by this interpreter."""
    return Program(name, [sys.executable, "-m", "localpv", *args], python_env(env))


def upstream_binary(variable: str) -> str | None:
    """The path named by ``variable``, or None after printing why the upstream column is skipped."""
    path = os.environ.get(variable, "")
    if path and os.access(path, os.X_OK):
        return path
    print(f"upstream: skipped ({variable} {'names no executable: ' + path if path else 'is not set'})")
    return None


def in_own_root(argv: list[str], binds: Mapping[str, Path], root: Path) -> list[str]:
    """``argv`` run as in a container: in a private mount namespace, chrooted into a tmpfs
    mounted on the empty directory ``root``, which holds ``/proc`` and each of ``binds``
    (path inside → file or directory on the host) and nothing else. The chain
    unshare → sh → chroot → program is one process (each ``exec``s the next), so the pid
    that ``Popen`` returns is the program's."""
    lines = ["set -e", 'r="$1"; shift', 'mount -t tmpfs -o mode=0755 bench-root "$r"',
             'mkdir "$r/proc"', 'mount --rbind /proc "$r/proc"']
    for inside, source in binds.items():
        target = '"$r"' + shlex.quote(inside)
        make = f"mkdir -p {target}" if source.is_dir() else \
            f"mkdir -p \"$(dirname {target})\" && touch {target}"
        lines += [make, f"mount --rbind {shlex.quote(str(source))} {target}"]
    lines.append('exec chroot "$r" "$@"')
    return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", "\n".join(lines), "sh", str(root), *argv]


class Running:
    """A started program, measured from outside; stopped on leaving the ``with`` block."""

    def __init__(self, program: Program, log: Path) -> None:
        self.program = program
        self.log = log
        self._log = log.open("wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(program.argv, env=program.env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def cpu(self) -> float:
        """CPU seconds used so far (user + system, children included)."""
        t = self.ps.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace").splitlines()[-15:]
            raise SystemExit(f"{self.program.name} exited with {self.proc.returncode}; its log ends:\n"
                             + "\n".join(tail))

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str, every: float = 0.05) -> float:
        """Seconds since the start when ``predicate`` first held; gives up after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not predicate():
            self.check_alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.program.name}: gave up after {timeout:.0f}s waiting for {what}")
            threading.Event().wait(every)
        return time.monotonic() - self.started

    def wait_idle(self, window: float = 2.0, busy: float = 0.02, timeout: float = 120.0) -> float:
        """CPU seconds used when it first spends a ``window`` using less than ``busy`` of a CPU."""
        deadline = time.monotonic() + timeout
        before = self.cpu()
        while True:
            threading.Event().wait(window)
            self.check_alive()
            now = self.cpu()
            if now - before < busy * window or time.monotonic() > deadline:
                return now
            before = now

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()

"""Real mounts and loop devices for tests and the demo, always torn down.

Used by the test suite's fixtures (tests/conftest.py) and by ``localpv demo``; nothing
here is used by the product itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from localpv.host.mounts import mount_points, read_mountinfo

MiB = 1024 * 1024


def sh(*argv: str | os.PathLike[str]) -> str:
    """Run a command, return its stdout; on failure raise with its stderr in the message."""
    proc = subprocess.run([os.fspath(a) for a in argv], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def mounts_under(base: str) -> set[str]:
    return {m for m in mount_points() if m.startswith(base + "/")}


def loops_backed_by(base: str) -> set[str]:
    """Loop devices whose backing file lies under ``base`` (read from sysfs, no tools)."""
    found = set()
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip().startswith(base + "/"):
                found.add("/dev/" + backing.parent.parent.name)
        except OSError:
            continue  # detached meanwhile
    return found


def umount(target: str) -> None:
    try:
        sh("umount", target)
    except RuntimeError:
        sh("umount", "--lazy", target)


class Mounter:
    """Makes real mounts and unmounts them all (newest first) at teardown."""

    def __init__(self) -> None:
        self._targets: list[Path] = []

    def tmpfs(self, target: Path, size: int = 8 * MiB) -> Path:
        return self._mount(target, "-t", "tmpfs", "-o", f"size={size}", "localpv-test")

    def ramfs(self, target: Path) -> Path:
        return self._mount(target, "-t", "ramfs", "localpv-test")

    def bind(self, source: Path, target: Path) -> Path:
        return self._mount(target, "--bind", str(source))

    def device(self, device: str, target: Path, *options: str) -> Path:
        return self._mount(target, *options, device)

    def _mount(self, target: Path, *args: str) -> Path:
        if not target.exists():  # an existing file is a valid target for a file bind mount
            target.mkdir(parents=True)
        sh("mount", *args, target)
        self._targets.append(target)
        return target

    def umount(self, target: Path) -> None:
        self._targets.remove(target)
        umount(str(target))

    def umount_all(self) -> None:
        while self._targets:
            umount(str(self._targets.pop()))


@dataclass(frozen=True)
class LoopDevice:
    path: str  # /dev/loopN
    backing: Path
    size: int


class LoopDevices:
    """Attaches loop devices on sparse files and always detaches them at teardown."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._attached: list[LoopDevice] = []
        self._images = 0

    def attach(self, size: int = 8 * MiB, *, ext4: bool = False, fs: str | None = None) -> LoopDevice:
        """A new sparse image on the first free loop device; ``fs`` (or ``ext4``) formats it."""
        backing = self._dir / f"loop{self._images}.img"
        self._images += 1
        with open(backing, "wb") as f:
            f.truncate(size)
        dev = self.attach_image(backing)
        fs = fs or ("ext4" if ext4 else None)
        if fs is not None:
            mkfs(fs, dev.path)
        return dev

    def attach_image(self, backing: Path, device: str | None = None) -> LoopDevice:
        """Attach an existing image, on ``device`` (``/dev/loopN``, as a test that renumbers
        disks needs) or on the first free one."""
        path = sh("losetup", "--show", *((device,) if device else ("--find",)), backing).strip()
        dev = LoopDevice(path, backing, backing.stat().st_size)
        self._attached.append(dev)
        return dev

    @property
    def attached(self) -> list[LoopDevice]:
        return list(self._attached)

    def detach(self, dev: LoopDevice) -> None:
        self._attached.remove(dev)
        sh("losetup", "-d", dev.path)

    def detach_all(self) -> None:
        while self._attached:
            sh("losetup", "-d", self._attached.pop().path)


def mkfs(fs: str, device: str) -> None:
    """Make a filesystem (ext4, xfs, btrfs) on ``device``, quietly, whatever was there."""
    force = {"ext4": ("-q", "-F"), "xfs": ("-q", "-f"), "btrfs": ("-q", "-f")}[fs]
    sh(f"mkfs.{fs}", *force, device)


# ---------------------------------------------------------------- storage that never answers

_MNT_DETACH = 2
_FUSE_CONNECTIONS = "/sys/fs/fuse/connections"


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def fuse_unavailable() -> str | None:
    """Why a FUSE mount cannot be made here (no root, no ``/dev/fuse``), or None when it can."""
    if os.geteuid() != 0:
        return "needs root to mount FUSE"
    if not os.path.exists("/dev/fuse"):
        subprocess.run(["modprobe", "fuse"], capture_output=True, check=False)
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
    except OSError as e:
        return f"cannot open /dev/fuse ({e.strerror}): FUSE is not available on this kernel"
    return None


_FUSE_INIT = 26
_FUSE_IN_HEADER = struct.Struct("=IIQ")  # len, opcode, unique (the rest of fuse_in_header is not needed)
_FUSE_OUT_HEADER = struct.Struct("=IiQ")  # len, error, unique
#: fuse_init_out as of protocol 7.12 (major, minor, max_readahead, flags, max_background,
#: congestion_threshold, max_write): the kernel accepts this short form.
_FUSE_INIT_OUT = struct.Struct("=IIIIHHI")
_FUSE_READ_SIZE = 1 << 20 | 1 << 16  # more than the kernel's minimum read buffer for any max_write


class _InitOnlyServer:
    """A FUSE daemon that completes the ``INIT`` handshake, then takes every request and never
    answers: whoever waits for an answer sleeps uninterruptibly, even SIGKILL waits."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._stop_read, self._stop_write = os.pipe2(os.O_CLOEXEC)
        self.initialised = threading.Event()
        os.set_blocking(fd, False)
        self._thread = threading.Thread(target=self._serve, name="fuse-never-answers", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._stop_read, select.POLLIN)
        while True:
            for fd, _mask in poller.poll():
                if fd == self._stop_read:
                    return
                try:
                    request = os.read(self._fd, _FUSE_READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError:  # ENODEV: the connection was aborted
                    return
                _length, opcode, unique = _FUSE_IN_HEADER.unpack_from(request)
                if opcode == _FUSE_INIT:
                    body = _FUSE_INIT_OUT.pack(7, 12, 0, 0, 0, 0, 4096)
                    os.write(self._fd, _FUSE_OUT_HEADER.pack(_FUSE_OUT_HEADER.size + len(body), 0, unique) + body)
                    self.initialised.set()
                # Anything else is taken and left unanswered.

    def stop(self) -> None:
        os.write(self._stop_write, b"x")
        self._thread.join()
        os.close(self._stop_read)
        os.close(self._stop_write)


@dataclass
class _Hung:
    target: Path
    fd: int | None
    connection: str  # the fusectl directory name: the superblock's device number
    server: _InitOnlyServer | None = None
    detached: bool = False


class HungFuse:
    """FUSE mounts that never answer: every ``stat``, ``statvfs`` or ``open`` of their root blocks.

    The mount is made with a ``/dev/fuse`` descriptor that nobody serves (not even the
    ``INIT`` handshake), like a FUSE daemon that is stopped or wedged. A thread that touches
    it is stuck in the kernel until the connection is aborted; a process stuck there can
    still be killed. With ``unkillable=True`` a thread completes ``INIT`` and then takes
    every request without answering, like a daemon wedged mid-request: a process waiting
    there sleeps uninterruptibly and not even SIGKILL ends it before the abort.

    :meth:`release` aborts the connection (through fusectl when it is mounted, and by
    closing the descriptor, which aborts it when no other process holds a copy: it is
    close-on-exec and never inherited), then unmounts it lazily without looking at it.
    Every waiter then gets ``ENOTCONN``. Call :meth:`release_all` in a ``finally``: a hung
    mount left behind hangs whoever walks the directory next.
    """

    def __init__(self) -> None:
        self._mounts: list[_Hung] = []

    def mount(self, target: Path, *, unkillable: bool = False) -> Path:
        """Mount a FUSE filesystem that never answers on ``target`` (created if missing)."""
        target.mkdir(parents=True, exist_ok=True)
        fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        options = f"fd={fd},rootmode=40000,user_id=0,group_id=0"
        if _libc().mount(b"localpv-hung", os.fsencode(target), b"fuse", 0, options.encode()) != 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"mount -t fuse on {target}: {os.strerror(err)}")
        real = os.path.join(os.path.realpath(target.parent), target.name)
        mount = next(m for m in reversed(read_mountinfo()) if m.mount_point == real)
        major, minor = (int(x) for x in mount.major_minor.split(":"))
        hung = _Hung(target, fd, str(major << 20 | minor))  # the kernel's dev_t, not glibc's
        self._mounts.append(hung)
        if unkillable:
            hung.server = _InitOnlyServer(fd)
            if not hung.server.initialised.wait(10):
                raise RuntimeError(f"the FUSE mount on {target} never sent INIT")
        return target

    def detach(self, target: Path) -> None:
        """Unmount it lazily but keep the connection: whoever is stuck on it stays stuck."""
        hung = next(h for h in self._mounts if h.target == target and not h.detached)
        _detach(target)
        hung.detached = True

    def abort(self, target: Path) -> None:
        """Abort the connection but leave the mount: a FUSE mount whose daemon died (``ENOTCONN``)."""
        self._abort(next(h for h in self._mounts if h.target == target))

    def release(self, target: Path) -> None:
        """Abort the connection (every waiter gets ``ENOTCONN``) and detach the mount."""
        hung = next(h for h in self._mounts if h.target == target)
        self._mounts.remove(hung)
        self._release(hung)

    def release_all(self) -> None:
        while self._mounts:
            self._release(self._mounts.pop())

    @classmethod
    def _release(cls, hung: _Hung) -> None:
        cls._abort(hung)
        if not hung.detached:
            _detach(hung.target)

    @staticmethod
    def _abort(hung: _Hung) -> None:
        abort = os.path.join(_FUSE_CONNECTIONS, hung.connection, "abort")
        with contextlib.suppress(OSError), open(abort, "w", encoding="ascii") as f:
            f.write("1")
        if hung.server is not None:
            hung.server.stop()
            hung.server = None
        if hung.fd is not None:
            os.close(hung.fd)
            hung.fd = None


def _detach(target: Path) -> None:
    """``umount -l``, by the system call: umount(8) looks at its target first, which could block."""
    if _libc().umount2(os.fsencode(target), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not (or no longer) a mount point
            raise OSError(err, f"umount -l {target}: {os.strerror(err)}")

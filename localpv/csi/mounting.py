"""Mounting a staged volume and its bind mounts: ``mount``/``umount`` and the mount table.

Every answer of the node service is decided from the kernel's mount table, never from
memory: after an agent restart (or a node reboot) the kubelet calls again, and what is
mounted where is the only truth there is.

A Block volume is handed out as its loop device's *node*, bind-mounted onto a file (its
staging file, a pod's target file): the mount table lists such a bind under the filesystem
the node lives on (``/dev``: devtmpfs on a host, tmpfs in a container), not under the device,
so :func:`device_binds` finds them by the device number of the node at each single-file mount
of those filesystems. A bind of a device node holds no open device: it names the device by
its number, which is why a Block volume's loop device is detached only once no bind of its
node is left.
"""

from __future__ import annotations

import os
import stat
import subprocess

from localpv.host.mounts import MountInfo, read_mountinfo


class MountError(Exception):
    """A mount, unmount or filesystem tool failed; the message carries its output."""


def _run(argv: list[str], timeout: float = 120.0) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise MountError(f"{' '.join(argv)} did not finish within {timeout:.0f}s") from err
    if proc.returncode != 0:
        raise MountError(f"{' '.join(argv)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}")
    return proc.stdout


def mount_at(path: str) -> MountInfo | None:
    """The topmost mount whose mount point is ``path`` (None when nothing is mounted there)."""
    real = os.path.realpath(path)
    found = [m for m in read_mountinfo() if m.mount_point == real]
    return found[-1] if found else None


def mounts_of_device(major: int, minor: int) -> list[MountInfo]:
    """Every mount of this block device (its filesystem, however bind-mounted)."""
    wanted = f"{major}:{minor}"
    return [m for m in read_mountinfo() if m.major_minor == wanted]


def device_of(mount: MountInfo) -> tuple[int, int]:
    major, _, minor = mount.major_minor.partition(":")
    return int(major), int(minor)


#: Where the device nodes a Block volume's binds come from live (``/dev``). Only single-file
#: mounts of these are looked at: a stat of them never waits on a disk or a server.
DEVICE_NODE_FILESYSTEMS = frozenset({"devtmpfs", "tmpfs"})


def device_at(path: str) -> tuple[int, int] | None:
    """The block device whose node is at ``path`` (a symlink is not followed); None if none is."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISBLK(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def device_binds(major: int, minor: int) -> list[MountInfo]:
    """Every bind mount of this block device's node (a Block volume's staging and target
    files, and the kubelet's own binds of them)."""
    return all_device_binds().get((major, minor), [])


def all_device_binds(mounts: list[MountInfo] | None = None) -> dict[tuple[int, int], list[MountInfo]]:
    """The bind mounts of device nodes in ``mounts`` (the mount table when None), by device."""
    found: dict[tuple[int, int], list[MountInfo]] = {}
    for m in read_mountinfo() if mounts is None else mounts:
        if m.fs_type in DEVICE_NODE_FILESYSTEMS and m.root != "/" and (rdev := device_at(m.mount_point)):
            found.setdefault(rdev, []).append(m)
    return found


def mount(device: str, target: str, fs_type: str, options: list[str]) -> None:
    os.makedirs(target, exist_ok=True)
    argv = ["mount", "-t", fs_type]
    if options:
        argv += ["-o", ",".join(options)]
    _run([*argv, device, target])


def bind(source: str, target: str, *, readonly: bool, file: bool = False) -> None:
    """Bind ``source`` at ``target`` (made if missing: a directory, or an empty file when
    ``file`` - a device node is bound onto a file); read-only when asked, in one step."""
    if file:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.mknod(target, stat.S_IFREG | 0o600)  # an empty file; never an open of what is there
        except FileExistsError:
            pass
        except OSError as err:
            raise MountError(f"cannot make the file {target} to bind a device onto ({err.strerror})") from err
    else:
        os.makedirs(target, exist_ok=True)
    _run(["mount", "--bind", *(["-o", "ro"] if readonly else []), source, target])
    if readonly:
        info = mount_at(target)
        if info is None or "ro" not in info.mount_options.split(","):
            _run(["mount", "-o", "remount,bind,ro", target])


def umount(target: str) -> bool:
    """Unmount ``target`` if something is mounted there; True if it was."""
    if mount_at(target) is None:
        return False
    _run(["umount", target])
    return True


def fsck(device: str, fs_type: str) -> str:
    """Check a filesystem before it is mounted; repairs what ``e2fsck -p`` may repair alone.

    XFS is checked by its own log replay at mount time (``xfs_repair`` is for a person)."""
    if fs_type != "ext4":
        return ""
    try:
        proc = subprocess.run(["e2fsck", "-p", device], capture_output=True, text=True, check=False, timeout=3600)
    except subprocess.TimeoutExpired as err:
        raise MountError(f"e2fsck -p {device} did not finish within an hour") from err
    if proc.returncode >= 4:  # 0 clean, 1-3 errors corrected
        raise MountError(f"e2fsck -p {device} found errors it cannot repair alone (exit {proc.returncode}): "
                         f"{(proc.stdout + proc.stderr).strip()[-400:]}")
    return proc.stdout


def grow_filesystem(device: str, mount_point: str, fs_type: str) -> None:
    """Grow a mounted filesystem to its device's size (online).

    Online ext4 growth is an ioctl the kernel allows only with CAP_SYS_RESOURCE; without it
    (some hosts withhold it from every process) the error says so, and the volume grows
    offline at its next stage instead (:func:`grow_unmounted`).
    """
    if fs_type == "xfs":
        _run(["xfs_growfs", mount_point])
        return
    try:
        _run(["resize2fs", device])
    except MountError as err:
        if "Permission denied" in str(err):
            raise MountError("growing a mounted ext4 filesystem needs CAP_SYS_RESOURCE, which this process lacks; "
                             "the filesystem grows when the volume is next staged (restart the pod using it)") from err
        raise


def grow_unmounted(device: str) -> None:
    """Grow an unmounted ext4 filesystem to its device's size (a forced check first, which
    resize2fs requires)."""
    proc = subprocess.run(["e2fsck", "-f", "-p", device], capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode >= 4:
        raise MountError(f"e2fsck -f -p {device} found errors it cannot repair alone (exit {proc.returncode}): "
                         f"{(proc.stdout + proc.stderr).strip()[-400:]}")
    _run(["resize2fs", device], timeout=3600)

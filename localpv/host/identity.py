"""What a volume *is*: identities that survive reboots and renumbering, and change with the disk.

Device numbers (``st_dev``, major:minor) and ``/dev/sdX`` names are dealt out by the kernel at
boot, in the order disks answer. Two disks mounted by device name (``/dev/sdb /mnt/disks/a``
in fstab) trade places when they are enumerated in the other order, and a replaced disk comes
up under the old one's name: a record keyed on those numbers then points at another tenant's
disk. So the agent knows a volume by what it is:

* **Filesystem volume**: the UUID of the filesystem (read by util-linux's libblkid from the
  device itself, or from udev's database when the device cannot be opened), plus, for a
  directory bind-mounted out of a larger filesystem, that directory's inode and generation
  (the generation tells a directory from a later one that reuses its inode number; btrfs
  subvolumes add their subvolume id, since every subvolume root has inode 256). A filesystem
  without a UUID is known by its device's identity, as a Block volume below.
* **Block volume**, in this order: the device's WWN (udev ``ID_WWN_WITH_EXTENSION`` or
  ``ID_WWN``, sysfs ``wwid``); its serial (udev ``ID_SERIAL``, sysfs ``serial``); for a
  partition, its partition UUID (from the parent's partition table, which the tenant of the
  partition cannot rewrite), else the parent's WWN or serial and the partition number; for a
  loop device, its backing file (path and inode). A whole disk with none of these has no
  identity: the UUIDs of its *content* belong to the tenant, who formats it at will, so they
  cannot tell a swapped disk from a reformatted one.
* **No identity** (``volatile``): tmpfs, overlay, most FUSE and network filesystems, and the
  whole disks above. The agent then keeps its older behaviour (device and inode numbers) for
  them, and says so.

Reading an identity never writes anything, and every device access is a read-only open of a
node whose device number was checked first. A filesystem's identity is cached per *mount*, by
the mount's unique id (``statx`` ``STATX_MNT_ID_UNIQUE``, Linux 6.8 and later): a mount's
superblock cannot be swapped under it, and a unique id is never given to another mount in the
same boot, whereas the mount id of ``mountinfo``, the device number and ``diskseq`` all come back
the same for a disk reformatted in place and mounted again. Without unique ids nothing is
cached, and the superblock is read at each look; libblkid is then told which type to look for
(the mount table says it): about 30 µs, instead of ~600 µs for a probe of every type.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import functools
import os
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from localpv.host.mounts import MountInfo
from localpv.host.statx import unique_mount_id

__all__ = [
    "BOOT_ID_PATH",
    "DEFAULT_UDEV_DIR",
    "Identity",
    "IdentityReader",
    "boot_id",
    "default_identity_reader",
    "device_name",
    "read_udev_properties",
]

#: Where udev keeps its database (``/run/udev/data/b<major>:<minor>``); the chart mounts the
#: host's copy read-only. Absent on nodes without udev: libblkid and sysfs then do all of it.
DEFAULT_UDEV_DIR = "/run/udev"
_SYS_DEV_BLOCK = "/sys/dev/block"

# _IOR('v', 1, long): the inode generation (ext2/3/4, btrfs and others; not XFS).
_FS_IOC_GETVERSION = (2 << 30) | (struct.calcsize("l") << 16) | (ord("v") << 8) | 1
# LOOP_GET_STATUS64: struct loop_info64, whose first two u64 are the backing file's device and inode.
_LOOP_GET_STATUS64 = 0x4C05
_LOOP_INFO64_SIZE = 232
#: Where lo_file_name[64] starts in struct loop_info64 (after five u64 and four u32).
_LOOP_FILE_NAME = 56
_LOOP_MAJOR = 7


@dataclass(frozen=True)
class Identity:
    """A volume's identity: ``value`` is stable across reboots ("" when there is none).

    ``how`` says where it came from (or why there is none), for ``localpv status``,
    ``doctor`` and events. ``error`` is set when the volume should have an identity but it
    could not be read now (a device that cannot be opened, libblkid missing): the agent then
    cannot prove the volume is the one it recorded, and must not act on it.
    """

    value: str
    how: str
    error: str | None = None

    @property
    def volatile(self) -> bool:
        """No stable identity exists for this volume (by its nature, not because of an error)."""
        return not self.value and self.error is None


#: A random UUID the kernel draws at every boot.
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id(path: str = BOOT_ID_PATH) -> str:
    """This boot's id, "" when it cannot be read. Device and inode numbers (a ``volatile``
    volume's only name) are the kernel's of one boot: a record of them names a volume only
    together with the boot they were seen in."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def read_udev_properties(major: int, minor: int, udev_dir: str = DEFAULT_UDEV_DIR) -> dict[str, str]:
    """udev's properties of block device ``major:minor`` (its ``E:KEY=value`` lines), {} if none."""
    try:
        with open(os.path.join(udev_dir, "data", f"b{major}:{minor}"), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    props = {}
    for line in lines:
        if line.startswith("E:") and "=" in line:
            key, _, value = line[2:].partition("=")
            props[key] = value
    return props


def _sysfs(major: int, minor: int, *parts: str) -> str | None:
    """A sysfs attribute of block device ``major:minor``, stripped; None if absent or empty."""
    try:
        with open(os.path.join(_SYS_DEV_BLOCK, f"{major}:{minor}", *parts), encoding="utf-8",
                  errors="replace") as f:
            value = f.read().strip()
    except OSError:
        return None
    return value or None


def device_name(major: int, minor: int) -> str | None:
    """The kernel's name of block device ``major:minor`` (``sdb1``, ``loop3``), from sysfs: the
    last part of the ``/sys/dev/block`` link (one readlink; always this boot's current name:
    dynamic majors such as NVMe's hand a number to another device after a hot-plug)."""
    try:
        return os.path.basename(os.readlink(os.path.join(_SYS_DEV_BLOCK, f"{major}:{minor}"))) or None
    except OSError:
        return None


def _device_node(major: int, minor: int) -> str:
    """``/dev/<name>`` of ``major:minor``, checked to be that very device; OSError otherwise."""
    name = device_name(major, minor)
    if name is None:
        raise OSError(errno.ENODEV, f"no block device {major}:{minor} in sysfs")
    node = os.path.join("/dev", name)
    st = os.stat(node)
    if not stat.S_ISBLK(st.st_mode) or st.st_rdev != os.makedev(major, minor):
        raise OSError(errno.ENODEV, f"{node} is not block device {major}:{minor} (is the host's /dev mounted?)")
    return node


class _Blkid:
    """The few libblkid calls used to read a superblock's or a partition entry's UUID."""

    _SUBLKS_UUID = 1 << 3
    _SUBLKS_TYPE = 1 << 5
    _PARTS_ENTRY_DETAILS = 1 << 2
    _FLTR_ONLYIN = 2

    def __init__(self) -> None:
        name = ctypes.util.find_library("blkid") or "libblkid.so.1"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError as e:
            self.problem: str | None = f"libblkid (util-linux) cannot be loaded: {e}"
            return
        self.problem = None
        lib.blkid_new_probe_from_filename.restype = ctypes.c_void_p
        lib.blkid_new_probe_from_filename.argtypes = [ctypes.c_char_p]
        for fn in ("blkid_probe_enable_superblocks", "blkid_probe_enable_partitions",
                   "blkid_probe_set_superblocks_flags", "blkid_probe_set_partitions_flags"):
            getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.blkid_probe_filter_superblocks_type.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                            ctypes.POINTER(ctypes.c_char_p)]
        lib.blkid_do_safeprobe.argtypes = [ctypes.c_void_p]
        lib.blkid_probe_lookup_value.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                 ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
        lib.blkid_free_probe.argtypes = [ctypes.c_void_p]
        lib.blkid_free_probe.restype = None
        self._lib = lib

    def probe(self, node: str, *, partitions: bool, fs_type: str | None = None) -> dict[str, str]:
        """``UUID``/``TYPE`` of the superblock on ``node`` and, with ``partitions``, the
        ``PART_ENTRY_*`` values of the partition it is; OSError when it cannot be probed.
        ``fs_type`` (libblkid's name) limits the look to that one type."""
        if self.problem is not None:
            raise OSError(errno.ENOSYS, self.problem)
        lib = self._lib
        pr = lib.blkid_new_probe_from_filename(os.fsencode(node))
        if not pr:
            err = ctypes.get_errno() or errno.EIO
            raise OSError(err, f"libblkid cannot open {node}: {os.strerror(err)}")
        try:
            lib.blkid_probe_enable_superblocks(pr, 1)
            lib.blkid_probe_set_superblocks_flags(pr, self._SUBLKS_UUID | self._SUBLKS_TYPE)
            if fs_type is not None:
                only = (ctypes.c_char_p * 2)(fs_type.encode(), None)
                lib.blkid_probe_filter_superblocks_type(pr, self._FLTR_ONLYIN, only)
            lib.blkid_probe_enable_partitions(pr, 1 if partitions else 0)
            if partitions:
                lib.blkid_probe_set_partitions_flags(pr, self._PARTS_ENTRY_DETAILS)
            rc = lib.blkid_do_safeprobe(pr)
            if rc == -1:
                err = ctypes.get_errno() or errno.EIO
                raise OSError(err, f"libblkid cannot probe {node}: {os.strerror(err)}")
            found: dict[str, str] = {}
            if rc == -2:  # ambivalent: several signatures; none of them identifies the volume
                return found
            for key in ("UUID", "TYPE", "PART_ENTRY_UUID", "PART_ENTRY_NUMBER"):
                data, size = ctypes.c_char_p(), ctypes.c_size_t()
                if lib.blkid_probe_lookup_value(pr, key.encode(), ctypes.byref(data), ctypes.byref(size)) == 0 \
                        and data.value:
                    found[key] = data.value.decode("utf-8", "replace")
            return found
        finally:
            lib.blkid_free_probe(pr)


@functools.cache
def _blkid() -> _Blkid:
    """The one loaded libblkid (loading it twice in a race would be harmless)."""
    return _Blkid()


def _fs_uuid(major: int, minor: int, fs_type: str, udev: Mapping[str, str]) -> tuple[str | None, str]:
    """(filesystem UUID or None, how it was read) of the ``fs_type`` filesystem on ``major:minor``."""
    try:
        node = _device_node(major, minor)
        found = _blkid().probe(node, partitions=False, fs_type=fs_type)
        if found.get("TYPE") != fs_type:  # a type libblkid names otherwise (ext4 driver on ext3...): look at all
            found = _blkid().probe(node, partitions=False)
    except OSError as e:
        if udev.get("ID_FS_UUID"):
            return udev["ID_FS_UUID"], "filesystem UUID (udev)"
        raise OSError(e.errno, f"cannot read the filesystem UUID of device {major}:{minor}: {e.strerror}") from e
    return found.get("UUID"), "filesystem UUID (libblkid)"


def _loop_backing(major: int, minor: int) -> str | None:
    """``<backing file>:ino=<inode>`` of an attached loop device, None if it is not one.

    The file is named as the kernel holds it, whatever mount namespace reads it: sysfs's
    ``backing_file`` is rendered through the mounts of whoever attached the device, so from
    another namespace (the agent's container after a restart, when the file's mount was the
    earlier container's) it reads a path relative to that mount, which resolves nowhere. The
    path counts only when it resolves, here, to the very file the kernel holds (its device and
    inode, ``LOOP_GET_STATUS64``); else the name given when the device was attached
    (``lo_file_name``, what losetup stored: the same absolute path) stands in. So a loop device
    keeps one identity across agent restarts, and the one older releases recorded.
    """
    if major != _LOOP_MAJOR:
        return None
    backing = _sysfs(major, minor, "loop", "backing_file")
    if backing is None:
        return None
    try:
        fd = os.open(_device_node(major, minor), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            buf = bytearray(_LOOP_INFO64_SIZE)
            fcntl.ioctl(fd, _LOOP_GET_STATUS64, buf, True)
        finally:
            os.close(fd)
    except OSError:
        return backing  # cannot be asked: the path alone still tells this image from another one
    device, inode = struct.unpack_from("=QQ", buf)
    name = bytes(buf[_LOOP_FILE_NAME:_LOOP_FILE_NAME + 64]).split(b"\0", 1)[0].decode("utf-8", "replace")
    try:
        st = os.stat(backing)
        resolves = (st.st_dev, st.st_ino) == (device, inode)
    except OSError:
        resolves = False
    return f"{backing if resolves or not name else name}:ino={inode}"


def _hardware(major: int, minor: int, udev: Mapping[str, str]) -> tuple[str, str] | None:
    """(identity, how) from the device's WWN or serial, None when it reports neither."""
    wwn = udev.get("ID_WWN_WITH_EXTENSION") or udev.get("ID_WWN")
    if wwn:
        return f"wwn={wwn}", "WWN (udev)"
    wwid = _sysfs(major, minor, "wwid") or _sysfs(major, minor, "device", "wwid")
    if wwid:
        return f"wwn={wwid}", "WWN (sysfs)"
    serial = udev.get("ID_SERIAL")
    if serial:
        return f"serial={serial}", "serial (udev)"
    serial = _sysfs(major, minor, "serial") or _sysfs(major, minor, "device", "serial")
    if serial:
        return f"serial={serial}", "serial (sysfs)"
    return None


class IdentityReader:
    """Reads identities (see the module docstring for the order of sources, and what is cached)."""

    #: Mounts remembered at most; an agent sees a few hundred volumes, so this is never reached
    #: but by churn (mounts made and gone), and then the cache simply starts again.
    CACHE_LIMIT = 4096

    def __init__(self, udev_dir: str = DEFAULT_UDEV_DIR) -> None:
        self.udev_dir = udev_dir
        self._by_mount: dict[tuple[int, int], Identity] = {}
        #: Superblocks read (not answered from the cache): for tests and benchmarks.
        self.reads = 0

    # ------------------------------------------------------------------ block devices

    def block(self, rdev: int) -> Identity:
        """The identity of block device ``rdev`` (a Block volume, or a filesystem's device)."""
        major, minor = os.major(rdev), os.minor(rdev)
        udev = read_udev_properties(major, minor, self.udev_dir)
        if _sysfs(major, minor, "partition") is not None:
            return self._partition(major, minor, udev)
        hardware = _hardware(major, minor, udev)
        if hardware is not None:
            return Identity(f"blk:{hardware[0]}", hardware[1])
        loop = _loop_backing(major, minor)
        if loop is not None:
            return Identity(f"blk:loop={loop}", "loop device backing file")
        return Identity("", "volatile: the disk reports no WWN or serial (its content's UUIDs are the tenant's "
                            "to change)")

    def _partition(self, major: int, minor: int, udev: Mapping[str, str]) -> Identity:
        part_uuid = udev.get("ID_PART_ENTRY_UUID")
        how = "partition UUID (udev)"
        if not part_uuid:
            try:
                part_uuid = _blkid().probe(_device_node(major, minor), partitions=True).get("PART_ENTRY_UUID")
            except OSError as e:
                return Identity("", "", f"cannot read the partition UUID of device {major}:{minor}: {e.strerror}")
            how = "partition UUID (libblkid)"
        if part_uuid:
            return Identity(f"blk:partuuid={part_uuid}", how)
        number = _sysfs(major, minor, "partition")
        parent = _sysfs(major, minor, "..", "dev")
        if parent is not None and ":" in parent:
            pmajor, pminor = (int(x) for x in parent.split(":", 1))
            hardware = _hardware(pmajor, pminor, read_udev_properties(pmajor, pminor, self.udev_dir))
            if hardware is not None:
                return Identity(f"blk:{hardware[0]}:part={number}", f"{hardware[1]} of its disk, partition {number}")
        return Identity("", "volatile: a partition without a partition UUID on a disk without WWN or serial")

    # ------------------------------------------------------------------ filesystems

    def filesystem(self, mount: MountInfo, root_fd: int, root_st: os.stat_result) -> Identity:
        """The identity of the filesystem volume whose root is open as ``root_fd`` (any open
        mode, ``O_PATH`` included) and mounted as ``mount``."""
        unique = unique_mount_id(root_fd)
        key = (unique, root_st.st_ino) if unique is not None else None
        if key is not None and (known := self._by_mount.get(key)) is not None:
            return known
        identity = self._read_filesystem(mount, root_fd, root_st)
        if key is not None and identity.error is None:
            if len(self._by_mount) >= self.CACHE_LIMIT:
                self._by_mount.clear()
            self._by_mount[key] = identity
        return identity

    def _read_filesystem(self, mount: MountInfo, root_fd: int, root_st: os.stat_result) -> Identity:
        self.reads += 1
        major, minor = (int(x) for x in mount.major_minor.split(":"))
        device = self._filesystem_device(mount, major, minor)
        if device is None:
            return Identity("", f"volatile: {mount.fs_type} has no device to identify it by")
        dmajor, dminor = device
        udev = read_udev_properties(dmajor, dminor, self.udev_dir)
        try:
            uuid, how = _fs_uuid(dmajor, dminor, mount.fs_type, udev)
        except OSError as e:
            return Identity("", "", str(e.strerror or e))
        if uuid:
            value = f"fs:uuid={uuid}"
        else:
            disk = self.block(os.makedev(dmajor, dminor))
            if not disk.value:
                return disk if disk.error else Identity("", f"volatile: the {mount.fs_type} filesystem has no UUID "
                                                            "and its device no identity")
            value, how = f"fs:{disk.value}", f"{disk.how}: the filesystem has no UUID"
        if mount.root != "/":
            value += self._directory_suffix(mount, root_fd, root_st)
            how += ", and the bind-mounted directory's inode"
        return Identity(value, how)

    @staticmethod
    def _filesystem_device(mount: MountInfo, major: int, minor: int) -> tuple[int, int] | None:
        """The block device a filesystem lives on: its own device number, or for filesystems
        reporting an anonymous one (btrfs) the block device the mount names as its source."""
        if major != 0:
            return major, minor
        if mount.source.startswith("/dev/"):
            try:
                st = os.stat(mount.source)
            except OSError:
                return None
            if stat.S_ISBLK(st.st_mode):
                return os.major(st.st_rdev), os.minor(st.st_rdev)
        return None

    @staticmethod
    def _directory_suffix(mount: MountInfo, root_fd: int, root_st: os.stat_result) -> str:
        """``:ino=N[:gen=G]`` (and ``:subvol=ID`` on btrfs) of a bind-mounted directory."""
        suffix = ""
        if mount.fs_type == "btrfs":
            for option in mount.super_options.split(","):
                if option.startswith("subvolid="):
                    suffix += f":subvol={option.removeprefix('subvolid=')}"
        suffix += f":ino={root_st.st_ino}"
        try:
            fd = os.open(f"/proc/self/fd/{root_fd}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return suffix
        try:
            buf = bytearray(struct.calcsize("l"))
            fcntl.ioctl(fd, _FS_IOC_GETVERSION, buf, True)
            suffix += f":gen={struct.unpack('l', buf)[0] & 0xFFFFFFFF}"
        except OSError:
            pass  # XFS and others keep no generation this way: the inode alone
        finally:
            os.close(fd)
        return suffix


@functools.cache
def default_identity_reader() -> IdentityReader:
    """The process-wide reader (its udev dir from ``LOCALPV_UDEV_DIR``, default ``/run/udev``)."""
    return IdentityReader(os.environ.get("LOCALPV_UDEV_DIR", DEFAULT_UDEV_DIR))

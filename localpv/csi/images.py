"""Disk images in a pool: ``<pool>/<volume>/disk.img``, one filesystem each.

The size a claim asks for is enforced by the image: its filesystem cannot grow past the
file, whatever the kernel's quota support (this machine has none). *Thin* images are sparse
files (blocks are taken as the tenant writes); *thick* ones are allocated up front with
``fallocate`` (unwritten extents: instant, and the pool's room is really taken).

**Paths cannot escape the pool.** A volume name is one path component of a restricted
alphabet (:func:`check_name`); the volume directory and the image are opened relative to
the pool's directory, refusing symlinks at each step (``O_NOFOLLOW``), and must be a
directory and a regular file. What the loop device binds and what ``mkfs`` formats is that
checked open file (``/proc/self/fd/N``), not a path looked up again.

**The filesystem is the image's identity.** ``mkfs`` is given a UUID chosen here; it is
recorded in the PV (``fsUUID``) and checked before every stage: a file replaced behind
the agent's back is refused, never mounted as the tenant's volume. The UUID is read from the
superblock directly (ext4 at 1024 + 0x68, XFS at 32), without blkid. It is read back right
after ``mkfs`` too: an exit status of 0 is not a filesystem (a dry run exits 0 having written
nothing), and a create whose image does not hold the chosen filesystem fails, the image
truncated, before any PV names it.

**A Block image is known by a mark the tenant cannot reach.** A ``volumeMode: Block`` volume's
image gets no filesystem: the tenant owns every byte of it, so nothing in its content can say
whose it is (a tenant may well write an ext4 superblock with any UUID). Its identity is a UUID
chosen here and kept in an extended attribute of the image *file* (:data:`BLOCK_XATTR`), which
writes through the loop device never touch; it is recorded in the PV (``imageUUID``) and in the
journal, and checked before every stage as the filesystem UUID is. The attribute is also the
image's mode: an image that has it is never staged as a filesystem (its superblock is the
tenant's), one that lacks it is never handed out as a raw device.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import Enum

from localpv.config.mkfs import MkfsOptionsError, split_options
from localpv.csi import loop
from localpv.host.mounts import opened_at_filesystem_root
from localpv.naming import quote_text

log = logging.getLogger(__name__)

IMAGE_FILE = "disk.img"
#: Volume names: a DNS-1123 label-like component (PV names are ``pvc-<uid>``).
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class FsType(Enum):
    EXT4 = "ext4"
    XFS = "xfs"


class Provisioning(Enum):
    """Sparse (blocks on write) or allocated up front."""

    THIN = "thin"
    THICK = "thick"


#: The smallest image each filesystem can be made on (XFS refuses below 300 MiB).
MIN_SIZE = {FsType.EXT4: 4 << 20, FsType.XFS: 300 << 20}
#: The smallest Block image (sizes are whole MiB; a loop device of 0 bytes is no volume).
MIN_BLOCK_SIZE = 1 << 20

#: The extended attribute of a Block image's file: the UUID chosen for it (its identity and its
#: mode, see above). ``user.``: root owns the image (mode 0600 in a 0700 directory), so no one
#: else can set or change it, and it needs no capability beyond that ownership.
BLOCK_XATTR = "user.localpv.block"


class ImageError(Exception):
    """An image could not be made, grown, opened or removed; ``missing``: it does not exist;
    ``errno``: the system's error when one caused it (ENOSPC, EFBIG, EIO...)."""

    def __init__(self, message: str, *, missing: bool = False, errno: int | None = None) -> None:
        super().__init__(message)
        self.missing = missing
        self.errno = errno

    @property
    def too_large(self) -> bool:
        """The size is more than the pool's filesystem can hold in one file (EFBIG): no other
        node's pool of the same kind would do better, and trying again changes nothing."""
        return self.errno == errno.EFBIG


def _failed(name: str, what: str, err: OSError) -> ImageError:
    """One line for an OSError of image work, keeping its errno."""
    hint = {errno.EFBIG: ": larger than the pool's filesystem allows for one file",
            errno.ENOSPC: ": the pool is full", errno.EIO: ": the pool's disk reports I/O errors"}
    return ImageError(f"volume {name}: {what} ({err.strerror}{hint.get(err.errno or 0, '')})", errno=err.errno)


def check_name(name: str) -> str:
    """``name`` if it is a safe volume name (one path component), else raise ImageError."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise ImageError(f"volume name {name!r} is not a volume name (lowercase letters, digits, '-', '.'; "
                         "one path component)")
    return name


@dataclass(frozen=True)
class Usage:
    """An image's apparent size and the bytes it really takes in the pool."""

    size: int
    allocated: int


def _mkfs_argv(fs: FsType, fs_uuid: str, thick: bool, options: str, target: str) -> list[str]:
    """mkfs's command line: the class's options (read as the tool reads them), then localpv's own.

    mke2fs keeps only the last ``-E`` it is given, so every extended option (the class's, and
    ``nodiscard`` for a thick image: mke2fs "discards" a regular file by punching holes, which
    would make it sparse again) goes into one ``-E``.
    """
    try:
        words = split_options(fs.value, options)
    except MkfsOptionsError as err:
        raise ImageError(f"mkfsOptions {quote_text(options)}: {err}") from err
    extended = [arg for letter, arg in words if letter == "E" and arg]
    extra = [part for letter, arg in words if letter != "E" or fs is not FsType.EXT4
             for part in (f"-{letter}", *([arg] if arg is not None else []))]
    if fs is FsType.EXT4:
        extended += ["nodiscard"] if thick else []
        return ["mkfs.ext4", "-q", "-F", *extra, "-U", fs_uuid, *(["-E", ",".join(extended)] if extended else []),
                target]
    return ["mkfs.xfs", "-q", "-f", *extra, "-m", f"uuid={fs_uuid}", *(["-K"] if thick else []), target]


#: ext4's INCOMPAT_JOURNAL_DEV: the superblock of an external journal (``mke2fs -O journal_dev``),
#: which has ext4's magic and a UUID but is no filesystem.
_EXT4_INCOMPAT_JOURNAL_DEV = 0x8


def read_filesystem(fd: int) -> tuple[FsType, str] | None:
    """The filesystem in an image's superblock (ext4 or XFS) and its UUID, None if neither is there."""
    ext = os.pread(fd, 0x78, 1024)
    if len(ext) == 0x78 and ext[0x38:0x3A] == b"\x53\xef":
        if int.from_bytes(ext[0x60:0x64], "little") & _EXT4_INCOMPAT_JOURNAL_DEV:
            return None
        return FsType.EXT4, str(uuid.UUID(bytes=ext[0x68:0x78]))
    xfs = os.pread(fd, 48, 0)
    if len(xfs) == 48 and xfs[:4] == b"XFSB":
        return FsType.XFS, str(uuid.UUID(bytes=xfs[32:48]))
    return None


def read_fs_uuid(fd: int) -> str | None:
    """The filesystem UUID in an image's superblock (ext4 or XFS), None if neither is there."""
    found = read_filesystem(fd)
    return found[1] if found else None


def read_block_uuid(fd: int) -> str | None:
    """The UUID in a Block image's :data:`BLOCK_XATTR`; None when the file has none (it was not
    made as a Block image) or holds something else than a UUID."""
    try:
        value = os.getxattr(fd, BLOCK_XATTR)
    except OSError as err:
        if err.errno in (errno.ENODATA, errno.ENOTSUP):
            return None
        raise
    try:
        return str(uuid.UUID(value.decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        return None


def mkfs_result_problem(fs: FsType, fs_uuid: str, found: tuple[FsType, str] | None) -> str | None:
    """What is wrong with what mkfs left in an image (``found``: :func:`read_filesystem`), when
    it was to make ``fs`` with ``fs_uuid``; None when that is what is there.

    mkfs's exit status is not enough: a dry run (``mke2fs -n``, ``mkfs.xfs -N``), ``-V``, or a
    filesystem written elsewhere in the file exits 0 with nothing at the place a mount looks.
    """
    if found is None:
        return f"holds no {fs.value} filesystem"
    if found[0] is not fs:
        return f"holds {found[0].value}, not {fs.value}"
    if found[1] != fs_uuid:
        return f"holds filesystem UUID {found[1]}, not the {fs_uuid} chosen for it"
    return None


def _mkfs_said(output: str) -> str:
    """What mkfs said about a failure, in one line: its lines before the usage text mkfs.xfs
    appends (the reason comes first), at most 300 characters."""
    lines = []
    for line in output.splitlines():
        if line.startswith("Usage:"):
            break
        if line.strip():
            lines.append(line.strip())
    return "; ".join(lines)[:300] or "(nothing)"


def make_filesystem(fd: int, fs: FsType, fs_uuid: str, *, thick: bool, options: str) -> None:
    """Format the open image ``fd`` with ``fs`` and ``fs_uuid``, and check that the image then
    holds exactly that filesystem; ImageError (saying what mkfs did) otherwise."""
    argv = _mkfs_argv(fs, fs_uuid, thick, options, f"/proc/self/fd/{fd}")
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, pass_fds=(fd,))
    if proc.returncode != 0:
        raise ImageError(f"{argv[0]} failed ({proc.returncode}): {_mkfs_said(proc.stderr or proc.stdout)}")
    if problem := mkfs_result_problem(fs, fs_uuid, read_filesystem(fd)):
        raise ImageError(f"{argv[0]} exited 0 but the image {problem} (mkfsOptions {quote_text(options)})")


def ext4_size(fd: int) -> int | None:
    """The size an ext4 filesystem spans (blocks x block size, from its superblock), None if
    ``fd`` holds no ext4."""
    sb = os.pread(fd, 0x158, 1024)
    if len(sb) < 0x158 or sb[0x38:0x3A] != b"\x53\xef":
        return None
    blocks = int.from_bytes(sb[4:8], "little")
    if int.from_bytes(sb[0x60:0x64], "little") & 0x80:  # INCOMPAT_64BIT: the high half counts
        blocks |= int.from_bytes(sb[0x150:0x154], "little") << 32
    return blocks * (1024 << int.from_bytes(sb[0x18:0x1C], "little"))


def reallocate(fd: int, name: str) -> None:
    """Allocate whatever blocks of a thick image were given back (a discard punches holes in
    the image file: ``fstrim`` or ``blkdiscard`` in the pod, or a tool that discards). Data is
    never touched: only holes get blocks. A pool too full to give them back is logged; the
    volume is still staged - refusing it would keep its pod from its data - and the health
    watch says so."""
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise ImageError(f"volume {name}: its thick image cannot be allocated again ({err.strerror})") from err
        log.warning("volume %s: its thick image lost blocks that the pool cannot give back now (%s)", name,
                    err.strerror)


class ImageStore:
    """The images of one pool directory (the path as this process sees it)."""

    def __init__(self, pool_dir: str, *, require_mount: bool = False) -> None:
        """``require_mount``: the pool is a disk's filesystem mounted at ``pool_dir`` (the
        pool's ``requireMount``); nothing is read or made there when it is not, at the moment
        the directory is opened."""
        self.pool_dir = pool_dir
        self.require_mount = require_mount

    def image_path(self, name: str) -> str:
        return os.path.join(self.pool_dir, check_name(name), IMAGE_FILE)

    # ------------------------------------------------------------------ safe opening

    def _pool_fd(self) -> int:
        try:
            fd = os.open(self.pool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise ImageError(f"pool directory {self.pool_dir} cannot be opened ({err.strerror})",
                             missing=err.errno == errno.ENOENT) from err
        if self.require_mount and not opened_at_filesystem_root(fd, self.pool_dir):
            os.close(fd)
            raise ImageError(f"pool directory {self.pool_dir}: nothing is mounted at it now (its disk was unmounted "
                             "or is missing); no image is read or made on the filesystem underneath")
        return fd

    def _volume_fd(self, pool_fd: int, name: str, *, create: bool) -> int:
        if create:
            with suppress(FileExistsError):
                os.mkdir(check_name(name), 0o700, dir_fd=pool_fd)
        try:
            return os.open(check_name(name), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=pool_fd)
        except OSError as err:
            if err.errno == errno.ENOENT:
                raise ImageError(f"volume {name}: no directory {name} in pool {self.pool_dir}", missing=True) from err
            raise ImageError(f"volume {name}: {self.pool_dir}/{name} is not a plain directory ({err.strerror}); "
                             "refused") from err

    @contextmanager
    def open_image(self, name: str, *, create: bool = False, writable: bool = True) -> Iterator[int]:
        """The image's file descriptor, opened without following any symlink below the pool."""
        pool_fd = self._pool_fd()
        try:
            with self._image_in(pool_fd, name, create=create, writable=writable) as fd:
                yield fd
        finally:
            os.close(pool_fd)

    @contextmanager
    def _image_in(self, pool_fd: int, name: str, *, create: bool = False, writable: bool = True) -> Iterator[int]:
        """The image of ``name`` in the pool directory open as ``pool_fd`` (see :meth:`open_image`)."""
        vol_fd = self._volume_fd(pool_fd, name, create=create)
        try:
            flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
            if create:
                flags |= os.O_CREAT
            try:
                fd = os.open(IMAGE_FILE, flags, 0o600, dir_fd=vol_fd)
            except OSError as err:
                raise ImageError(f"volume {name}: image {self.image_path(name)} cannot be opened "
                                 f"({err.strerror})", missing=err.errno == errno.ENOENT) from err
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ImageError(f"volume {name}: {self.image_path(name)} is not a regular file; refused")
                yield fd
            finally:
                os.close(fd)
        finally:
            os.close(vol_fd)

    def usages(self, names: Iterable[str]) -> dict[str, Usage]:
        """The usage of each image of ``names`` that is there, through one opening of the pool
        (one look at its mount, not one per image: an account reads every image of a pool)."""
        pool_fd = self._pool_fd()
        found = {}
        try:
            for name in names:
                try:
                    with self._image_in(pool_fd, name, writable=False) as fd:
                        st = os.fstat(fd)
                except ImageError:
                    continue  # being made or removed, or not there: it takes nothing
                found[name] = Usage(st.st_size, st.st_blocks * 512)
        finally:
            os.close(pool_fd)
        return found

    # ------------------------------------------------------------------ life cycle

    def create(self, name: str, size: int, *, fs: FsType, provisioning: Provisioning, mkfs_options: str = "",
               fs_uuid: str | None = None) -> str:
        """Make (or make again) the image and its filesystem; returns the filesystem UUID.

        Whatever an earlier, interrupted attempt left is overwritten: an image is only ever
        made before its PV exists, so nothing in it is anyone's data.
        """
        if size < MIN_SIZE[fs]:
            raise ImageError(f"{fs.value} needs at least {MIN_SIZE[fs] >> 20} MiB, {size} bytes asked")
        fs_uuid = fs_uuid or str(uuid.uuid4())
        thick = provisioning is Provisioning.THICK
        try:
            with self.open_image(name, create=True) as fd:
                self._allocate(fd, name, size, thick=thick)
                try:
                    with suppress(OSError):  # an image with a filesystem is never marked Block
                        os.removexattr(fd, BLOCK_XATTR)
                    make_filesystem(fd, fs, fs_uuid, thick=thick, options=mkfs_options)
                    os.fsync(fd)
                except (ImageError, OSError) as err:
                    with suppress(OSError):
                        os.ftruncate(fd, 0)
                    code = err.errno if isinstance(err, ImageError | OSError) else None
                    raise ImageError(f"volume {name}: {err}; image truncated", errno=code) from err
        except OSError as err:  # the volume directory cannot be made (EIO, ENOSPC, EDQUOT...)
            raise _failed(name, f"cannot make its directory in pool {self.pool_dir}", err) from err
        return fs_uuid

    def create_block(self, name: str, size: int, *, provisioning: Provisioning, image_uuid: str | None = None) -> str:
        """Make (or make again) a Block image: ``size`` bytes, no filesystem, marked with a UUID
        (:data:`BLOCK_XATTR`) that is read back; returns the UUID. As for :meth:`create`, what an
        interrupted attempt left is overwritten: no PV names the image yet."""
        if size < MIN_BLOCK_SIZE:
            raise ImageError(f"a Block image needs at least {MIN_BLOCK_SIZE >> 20} MiB, {size} bytes asked")
        image_uuid = image_uuid or str(uuid.uuid4())
        try:
            with self.open_image(name, create=True) as fd:
                self._allocate(fd, name, size, thick=provisioning is Provisioning.THICK)
                try:
                    os.setxattr(fd, BLOCK_XATTR, image_uuid.encode("ascii"))
                    found = read_block_uuid(fd)
                    if found != image_uuid:
                        raise ImageError(f"its mark {BLOCK_XATTR} reads {found!r} after it was set to {image_uuid}")
                    os.fsync(fd)
                except (ImageError, OSError) as err:
                    with suppress(OSError):
                        os.ftruncate(fd, 0)
                    code = err.errno
                    why = (f"the pool's filesystem keeps no extended attributes ({BLOCK_XATTR} holds a Block "
                           "image's identity)" if code == errno.ENOTSUP else str(err))
                    raise ImageError(f"volume {name}: {why}; image truncated", errno=code) from err
        except OSError as err:  # the volume directory cannot be made (EIO, ENOSPC, EDQUOT...)
            raise _failed(name, f"cannot make its directory in pool {self.pool_dir}", err) from err
        return image_uuid

    def _allocate(self, fd: int, name: str, size: int, *, thick: bool) -> None:
        """Make the open image ``size`` bytes from scratch: sparse, or allocated when ``thick``;
        truncated to nothing when that fails."""
        try:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, size)
            if thick:
                os.posix_fallocate(fd, 0, size)
        except OSError as err:
            with suppress(OSError):
                os.ftruncate(fd, 0)
            raise _failed(name, f"cannot make an image of {size} bytes in pool {self.pool_dir}", err) from err

    def grow(self, name: str, size: int, *, provisioning: Provisioning) -> int:
        """Make the image ``size`` bytes (never smaller); returns its size. The filesystem is
        grown by the node service once the loop device sees the new size."""
        with self.open_image(name) as fd:
            current = os.fstat(fd).st_size
            if size <= current:
                return current
            try:
                if provisioning is Provisioning.THICK:
                    os.posix_fallocate(fd, current, size - current)
                else:
                    os.ftruncate(fd, size)
                os.fsync(fd)
            except OSError as err:
                # Rolled back: a half-allocated tail would take the pool's room for nothing, and
                # the image must stay the size its record and its PV say.
                with suppress(OSError):
                    os.ftruncate(fd, current)
                raise _failed(name, f"cannot grow its image by {size - current} bytes", err) from err
            return os.fstat(fd).st_size

    def fs_uuid(self, name: str) -> str | None:
        with self.open_image(name, writable=False) as fd:
            return read_fs_uuid(fd)

    def block_uuid(self, name: str) -> str | None:
        """The UUID a Block image is marked with (None: the image is not a Block image)."""
        with self.open_image(name, writable=False) as fd:
            return read_block_uuid(fd)

    def fs_type(self, name: str) -> str | None:
        """``ext4`` or ``xfs``, as the image's superblock says (None: neither)."""
        with self.open_image(name, writable=False) as fd:
            if ext4_size(fd) is not None:
                return FsType.EXT4.value
            return FsType.XFS.value if read_fs_uuid(fd) is not None else None

    def usage(self, name: str) -> Usage:
        with self.open_image(name, writable=False) as fd:
            st = os.fstat(fd)
            return Usage(st.st_size, st.st_blocks * 512)

    def in_use(self, name: str) -> list[loop.Loop]:
        """Loop devices bound to the image (by what the kernel holds: its device and inode):
        while there is one, it is not removed."""
        try:
            with self.open_image(name, writable=False) as fd:
                return loop.loops_of(fd, named=f"/{name}/{IMAGE_FILE}")
        except ImageError:
            return []

    def exists(self, name: str) -> bool:
        try:
            with self.open_image(name, writable=False):
                return True
        except ImageError as err:
            if err.missing:
                return False
            raise

    def remove(self, name: str) -> bool:
        """Delete the volume's directory and image; False if there was none. Refused while a
        loop device is bound to the image (it is staged: data would vanish under a mount)."""
        busy = self.in_use(name)
        if busy:
            raise ImageError(f"volume {name}: image is in use by {', '.join(lp.path for lp in busy)}; "
                             "not removed while staged")
        pool_fd = self._pool_fd()
        try:
            try:
                st = os.stat(check_name(name), dir_fd=pool_fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if not stat.S_ISDIR(st.st_mode):
                raise ImageError(f"volume {name}: {self.pool_dir}/{name} is not a plain directory; not removed")
            # rmtree with dir_fd never follows symlinks inside the volume directory.
            shutil.rmtree(check_name(name), dir_fd=pool_fd)
            return True
        finally:
            os.close(pool_fd)

    def names(self) -> list[str]:
        """Volume directories in the pool (what is on disk, whatever the journal says)."""
        try:
            entries = os.listdir(self.pool_dir)
        except OSError:
            return []
        return sorted(e for e in entries if _NAME.fullmatch(e) and os.path.isdir(os.path.join(self.pool_dir, e)))

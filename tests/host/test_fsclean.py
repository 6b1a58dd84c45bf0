"""clean_directory on real volumes (tmpfs and ext4 on loop devices) with hostile contents."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localpv.host.fsclean import (
    CleanError,
    DirtyVolumeError,
    UnsafePathError,
    clean_directory,
    is_within,
    verify_empty,
)

from .conftest import LoopDevice, MiB, Mounter, sh


@pytest.fixture
def volume(tmpfs: Path) -> Path:
    """A volume: the root of its own (tmpfs) filesystem, as a discovered mount point is."""
    return tmpfs


def populate(root: Path) -> None:
    """A little of everything a pod may leave behind."""
    (root / "data.bin").write_bytes(os.urandom(64 * 1024))
    (root / ".hidden").write_text("secret")
    (root / "dir" / "sub" / ".deep").mkdir(parents=True)
    (root / "dir" / "sub" / "file").write_text("secret")
    (root / "new\nline dir").mkdir()
    (root / "new\nline dir" / "ünï 🚀").write_text("secret")
    (root / os.fsdecode(b"raw-\xff")).write_text("secret")
    (root / "link-to-self").symlink_to(root)
    (root / "dangling").symlink_to("/nowhere/at/all")
    os.mkfifo(root / "fifo")
    os.mknod(root / "nulldev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "sock"))
    os.link(root / "data.bin", root / "hardlink")


@pytest.mark.root
def test_everything_inside_is_removed_and_the_root_kept(volume: Path) -> None:
    populate(volume)
    root_ino = volume.stat().st_ino
    report = clean_directory(str(volume))
    assert os.listdir(volume) == []
    assert volume.stat().st_ino == root_ino
    assert (report.files_removed, report.dirs_removed) == (11, 4)
    assert report.bytes_freed >= 64 * 1024


@pytest.mark.root
def test_written_data_is_gone_on_ext4_including_lost_found(
    ext4_loop: LoopDevice, tmp_path: Path, mounter: Mounter
) -> None:
    vol = mounter.device(ext4_loop.path, tmp_path / "vol")
    assert (vol / "lost+found").is_dir()
    (vol / "secret.txt").write_text("LOCALPV-SECRET " * 1000)
    free_before = shutil.disk_usage(vol).free
    report = clean_directory(str(vol))
    assert os.listdir(vol) == []
    with pytest.raises(FileNotFoundError):
        (vol / "secret.txt").read_text()
    assert shutil.disk_usage(vol).free > free_before
    assert report.bytes_freed >= 15000


@pytest.mark.root
def test_symlinks_are_removed_not_followed(volume: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "precious").write_text("keep me")
    (outside / "file").write_text("keep me too")
    (volume / "to-dir").symlink_to(outside / "dir")
    (volume / "to-file").symlink_to(outside / "file")
    (volume / "nested").mkdir()
    (volume / "nested" / "to-parent-of-volume").symlink_to(tmp_path)
    clean_directory(str(volume))
    assert os.listdir(volume) == []
    assert (outside / "dir" / "precious").read_text() == "keep me"
    assert (outside / "file").read_text() == "keep me too"


@pytest.mark.root
def test_foreign_filesystem_inside_survives_and_fails_the_clean(volume: Path, mounter: Mounter) -> None:
    (volume / "a" / "b").mkdir(parents=True)
    (volume / "a" / "removable").write_text("x")
    (volume / "other").write_text("x")
    foreign = mounter.tmpfs(volume / "a" / "b", size=MiB)
    (foreign / "theirs").write_text("not ours")
    with pytest.raises(DirtyVolumeError, match="a filesystem is mounted inside the volume; unmount it") as exc:
        clean_directory(str(volume))
    assert "theirs" not in str(exc.value) and "/a/b" not in str(exc.value)
    assert exc.value.remaining == ("a",)
    assert (foreign / "theirs").read_text() == "not ours"
    assert os.listdir(volume / "a") == ["b"], "the rest of the volume is still cleaned"


@pytest.mark.root
def test_same_filesystem_bind_mount_inside_is_not_entered(tmpfs: Path, tmp_path: Path, mounter: Mounter) -> None:
    """The dangerous case st_dev cannot see: a volume that is a directory on a shared
    filesystem (bind-mounted onto itself), with another directory of that same
    filesystem (think /etc) bind-mounted inside it."""
    (tmpfs / "etc").mkdir()
    (tmpfs / "etc" / "passwd").write_text("root:x:0:0")
    (tmpfs / "vol" / "x").mkdir(parents=True)
    vol = mounter.bind(tmpfs / "vol", tmp_path / "vol")
    mounter.bind(tmpfs / "etc", vol / "x")
    with pytest.raises(DirtyVolumeError, match="a filesystem is mounted inside the volume"):
        clean_directory(str(vol))
    assert (tmpfs / "etc" / "passwd").read_text() == "root:x:0:0"


@pytest.mark.root
def test_file_bind_mounted_over_an_entry_survives(volume: Path, tmp_path: Path, mounter: Mounter) -> None:
    precious = tmp_path / "precious"
    precious.write_text("keep")
    (volume / "f").write_text("")
    mounter.bind(precious, volume / "f")
    with pytest.raises(DirtyVolumeError, match="inside the volume; unmount it"):
        clean_directory(str(volume))
    assert precious.read_text() == "keep"


@pytest.mark.root
def test_read_only_and_inaccessible_directories_are_cleaned(volume: Path) -> None:
    for mode in (0o555, 0o000, 0o100):
        d = volume / f"mode-{mode:o}"
        (d / "inner").mkdir(parents=True)
        (d / "inner" / "f").write_text("x")
        d.chmod(mode)
    clean_directory(str(volume))
    assert os.listdir(volume) == []


@pytest.mark.root
def test_deep_tree(volume: Path) -> None:
    depth = 5000
    fd = os.open(volume, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    report = clean_directory(str(volume))
    assert (report.dirs_removed, report.files_removed) == (depth, 1)
    assert os.listdir(volume) == []
    # No descriptor leaked into the volume. (Counting all descriptors would be racy:
    # other tests' background threads open and close sockets meanwhile.)
    leaked = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(str(volume)):
            leaked.append(target)
    assert leaked == []


@pytest.fixture
def big_tmpfs(tmp_path: Path, mounter: Mounter) -> Path:
    return mounter.tmpfs(tmp_path / "big", size=256 * MiB)


@pytest.mark.root
def test_twenty_thousand_files(big_tmpfs: Path, record_property: Callable[[str, object], None]) -> None:
    files = 20_000
    for d in range(20):
        sub = big_tmpfs / f"d{d}"
        sub.mkdir()
        for f in range(files // 20):
            (sub / f"f{f}").write_bytes(b"x")
    t0 = time.monotonic()
    report = clean_directory(str(big_tmpfs))
    elapsed = time.monotonic() - t0
    assert report.files_removed == files
    assert os.listdir(big_tmpfs) == []
    record_property("fsclean_files_per_second", round(files / elapsed))
    assert elapsed < 20, f"{files} files took {elapsed:.1f}s"


@pytest.mark.parametrize("kind", ["symlink", "file", "missing", "slash"])
@pytest.mark.root
def test_refuses_unsafe_roots(tmp_path: Path, volume: Path, kind: str) -> None:
    (volume / "keep").write_text("x")
    root = {
        "symlink": tmp_path / "link",
        "file": volume / "keep",
        "missing": tmp_path / "missing",
        "slash": Path("/"),
    }[kind]
    if kind == "symlink":
        root.symlink_to(volume)
    with pytest.raises(UnsafePathError):
        clean_directory(str(root))
    assert (volume / "keep").read_text() == "x"


def test_refuses_root_dir_spelled_differently() -> None:
    with pytest.raises(UnsafePathError, match="root directory"):
        clean_directory("/tmp/..//./")


def test_verify_empty_counts_what_remains_without_naming_it(tmp_path: Path) -> None:
    verify_empty(str(tmp_path))
    for i in range(15):
        (tmp_path / f"secret-{i:02}").write_text("")
    with pytest.raises(DirtyVolumeError, match=r"15 entries remain$") as exc:
        verify_empty(str(tmp_path), limit=3)
    assert exc.value.total == 15 and "secret" not in str(exc.value)
    assert exc.value.remaining == ("secret-00", "secret-01", "secret-02")  # for callers, never printed


@pytest.fixture
def nobody_volume() -> Iterator[Path]:
    """A volume (a tmpfs) somewhere 'nobody' can reach (pytest's temp dir is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="localpv-nobody-", dir="/tmp"))
    mounter = Mounter()
    try:
        yield mounter.tmpfs(root)
    finally:
        mounter.umount_all()
        shutil.rmtree(root)


def clean_as_nobody(root: Path) -> str:
    """Fork, drop to uid/gid 65534, clean; return "ok" or the error text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            clean_directory(str(root))
            outcome = "ok"
        except BaseException as e:
            outcome = f"{type(e).__name__}: {e}"
        os.write(write, pickle.dumps(outcome))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return str(pickle.loads(data))


@pytest.mark.root
def test_unprivileged_clean_grants_itself_access(nobody_volume: Path) -> None:
    for mode in (0o555, 0o000):
        d = nobody_volume / f"mode-{mode:o}"
        (d / "inner").mkdir(parents=True)
        (d / "inner" / "f").write_text("x")
    for path in [nobody_volume, *nobody_volume.rglob("*")]:
        os.chown(path, 65534, 65534)
    for mode in (0o555, 0o000):
        (nobody_volume / f"mode-{mode:o}").chmod(mode)
    assert clean_as_nobody(nobody_volume) == "ok"
    assert os.listdir(nobody_volume) == []


class TestIsWithin:
    def test_inside_and_not(self, tmp_path: Path) -> None:
        base = tmp_path / "disks"
        (base / "vol").mkdir(parents=True)
        (tmp_path / "disks-evil").mkdir()
        assert is_within(str(base / "vol"), str(base))
        assert is_within(str(base / "vol" / "not-yet"), str(base))
        assert not is_within(str(base), str(base)), "the discovery dir itself is not a volume"
        assert not is_within(str(tmp_path / "disks-evil"), str(base))
        assert not is_within(str(base / ".." / "disks-evil"), str(base))
        assert not is_within("/etc", str(base))

    def test_symlinks_are_resolved(self, tmp_path: Path) -> None:
        base = tmp_path / "disks"
        base.mkdir()
        (base / "escape").symlink_to("/etc")
        (tmp_path / "alias").symlink_to(base)
        (base / "vol").mkdir()
        assert not is_within(str(base / "escape"), str(base))
        assert is_within(str(tmp_path / "alias" / "vol"), str(base))
        assert is_within(str(base / "vol"), str(tmp_path / "alias"))


@pytest.mark.root
def test_a_clean_can_be_stopped_and_leaves_the_rest(volume: Path) -> None:
    for i in range(2000):
        (volume / f"f{i}").write_text("x")
    asked = []

    def stop() -> str | None:
        asked.append(1)
        return "cancelled" if len(asked) >= 2 else None

    with pytest.raises(CleanError, match="stopped: cancelled"):
        clean_directory(str(volume), should_stop=stop)
    left = len(os.listdir(volume))
    assert 0 < left < 2000


def _unlink_seeing_a_directory(name: str, times: int) -> Callable[..., None]:
    """``os.unlink`` answering EISDIR for ``name`` the first ``times`` calls, as if the entry were a
    directory each time unlinkat looked and a file each time lstat looked (a tenant swapping them)."""
    real, calls = os.unlink, [0]

    def unlink(path: str, *, dir_fd: int | None = None) -> None:
        if path == name and calls[0] < times:
            calls[0] += 1
            raise IsADirectoryError(21, "Is a directory")
        real(path, dir_fd=dir_fd)

    return unlink


@pytest.mark.root
def test_an_entry_swapped_for_a_file_after_unlinkat_saw_a_directory_is_unlinked(
    volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (volume / "swapped").write_text("x")
    (volume / "other").write_text("x")
    monkeypatch.setattr(os, "unlink", _unlink_seeing_a_directory("swapped", times=1))
    report = clean_directory(str(volume))
    assert os.listdir(volume) == []
    assert report.files_removed == 2


@pytest.mark.root
def test_an_entry_that_keeps_changing_kind_fails_the_clean_after_one_more_try(
    volume: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk does not chase an entry for ever: the second EISDIR is a problem, the clean fails."""
    (volume / "flapping").write_text("x")
    (volume / "other").write_text("x")
    monkeypatch.setattr(os, "unlink", _unlink_seeing_a_directory("flapping", times=2))
    with pytest.raises(DirtyVolumeError, match="cannot remove an entry: Is a directory") as exc:
        clean_directory(str(volume))
    assert exc.value.remaining == ("flapping",)


@pytest.mark.root
def test_a_directory_the_kernel_will_not_unlink_for_lack_of_permission_is_still_walked(volume: Path) -> None:
    """unlinkat checks the permission to delete before the kind of the entry: an append-only
    directory answers EPERM, not EISDIR. What it holds is removed as far as the kernel lets
    us (its sub-directory's contents), and the clean fails for what stays."""
    locked = volume / "locked"
    (locked / "sub").mkdir(parents=True)
    (locked / "sub" / "f").write_text("tenant")
    (volume / "other").write_text("tenant")
    sh("chattr", "+a", locked)
    try:
        with pytest.raises(DirtyVolumeError, match="cannot remove directory an entry: Operation not permitted"):
            clean_directory(str(volume))
        assert os.listdir(volume) == ["locked"]
        assert os.listdir(locked / "sub") == []
    finally:
        sh("chattr", "-a", locked)

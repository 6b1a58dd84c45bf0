"""Nothing outside a volume changes while it is cleaned, not even a mode bit (issue 11, finding 5).

Every mutation of the walk (chmod, unlink, rmdir) is tried against something that belongs
to another mount but looks like part of the volume: a bind mount of the *same* filesystem
(``st_dev`` cannot tell it apart), of a directory and of a single file, and a mount stacked
on the volume's root while it is being cleaned. All on real tmpfs and bind mounts.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from localpv.host import fsclean, statx
from localpv.host.fsclean import DirtyVolumeError, UnsafePathError, clean_directory

from .conftest import MiB, Mounter

pytestmark = pytest.mark.root


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def shared_filesystem_volume(tmpfs: Path, tmp_path: Path, mounter: Mounter) -> Path:
    """A volume that is a directory of a filesystem shared with things outside it
    (``tmpfs/vol`` bind-mounted on ``tmp_path/vol``), as a volume on the root disk is."""
    (tmpfs / "vol").mkdir()
    return mounter.bind(tmpfs / "vol", tmp_path / "vol")


@pytest.mark.parametrize("outside_mode", [0o500, 0o000, 0o100, 0o555])
def test_outside_directory_bind_mounted_inside_keeps_its_mode(
    tmpfs: Path, tmp_path: Path, mounter: Mounter, outside_mode: int
) -> None:
    """The chmod that makes a directory removable must never reach another mount."""
    outside = tmpfs / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub" / "precious").write_text("keep")
    outside.chmod(outside_mode)
    vol = shared_filesystem_volume(tmpfs, tmp_path, mounter)
    (vol / "a").mkdir()
    mounter.bind(outside, vol / "a" / "x")
    with pytest.raises(DirtyVolumeError, match="a filesystem is mounted inside the volume"):
        clean_directory(str(vol))
    assert mode_of(outside) == outside_mode, "a mode bit outside the volume changed"
    assert mode_of(outside / "sub") == 0o755
    assert (outside / "sub" / "precious").read_text() == "keep"


def test_outside_directory_bind_mounted_below_a_locked_directory(
    tmpfs: Path, tmp_path: Path, mounter: Mounter
) -> None:
    """A directory of the volume that must be opened up (0500) on the way down to the mount:
    that chmod is inside the volume and fine; the mount below it is left as it is."""
    outside = tmpfs / "outside"
    outside.mkdir(mode=0o500)
    vol = shared_filesystem_volume(tmpfs, tmp_path, mounter)
    (vol / "locked" / "x").mkdir(parents=True)
    mounter.bind(outside, vol / "locked" / "x")
    (vol / "locked").chmod(0o500)
    with pytest.raises(DirtyVolumeError, match="inside the volume; unmount it"):
        clean_directory(str(vol))
    assert mode_of(outside) == 0o500


def test_same_filesystem_file_bind_mounted_inside_is_named_and_untouched(
    tmpfs: Path, tmp_path: Path, mounter: Mounter
) -> None:
    """A single file of the same filesystem bind-mounted over a file of the volume: ``st_dev``
    is the volume's, so only the mount id tells; it is reported as the mount it is."""
    precious = tmpfs / "precious"
    precious.write_text("keep")
    precious.chmod(0o400)
    vol = shared_filesystem_volume(tmpfs, tmp_path, mounter)
    (vol / "d").mkdir()
    (vol / "d" / "f").write_text("tenant")
    (vol / "d" / "other").write_text("tenant")
    inner = mounter.bind(precious, vol / "d" / "f")
    with pytest.raises(DirtyVolumeError, match=f"a filesystem is mounted inside the volume; unmount it "
                                               f"\\(findmnt -R {vol} lists it\\)") as exc:
        clean_directory(str(vol))
    assert str(inner.relative_to(vol)) not in str(exc.value), "tenant names appear in no message"
    assert precious.read_text() == "keep"
    assert mode_of(precious) == 0o400
    assert os.listdir(vol / "d") == ["f"], "the rest of the volume is still cleaned"


def test_a_mount_stacked_on_the_root_mid_clean_does_not_pass_for_clean(tmpfs: Path, mounter: Mounter) -> None:
    """The final emptiness check looks at the directory that was cleaned (by descriptor), not
    at whatever the path names by then: an empty mount stacked on the root must not hide a
    foreign mount left inside the volume. (The walk takes entries in the order they are listed,
    newest first on tmpfs: ``a``, made last, is done before the mount is stacked.)"""
    for i in range(600):
        (tmpfs / f"f{i}").write_text("x")
    (tmpfs / "a" / "m").mkdir(parents=True)
    mounter.tmpfs(tmpfs / "a" / "m", size=MiB)
    stacked: list[Path] = []

    def stack_a_mount_on_the_root() -> str | None:
        if not stacked:
            stacked.append(mounter.tmpfs(tmpfs, size=MiB))
        return None

    with pytest.raises(DirtyVolumeError, match="inside the volume; unmount it") as exc:
        clean_directory(str(tmpfs), should_stop=stack_a_mount_on_the_root)
    assert stacked, "the mount was stacked during the walk"
    assert exc.value.remaining == ("a",)


def test_a_mount_stacked_on_the_root_while_the_walk_is_below_it_stops_the_walk(
    tmpfs: Path, mounter: Mounter
) -> None:
    """Climbing back with ``..`` from a sub-directory lands on whatever is mounted on the
    directory it came from: the walk sees it is not that directory and stops, touching
    nothing of the stacked mount."""
    (tmpfs / "a").mkdir()
    for i in range(600):
        (tmpfs / "a" / f"f{i}").write_text("x")
    stacked: list[Path] = []

    def stack_a_mount_on_the_root() -> str | None:
        if not stacked:
            stacked.append(mounter.tmpfs(tmpfs, size=MiB))
            (stacked[0] / "theirs").write_text("not ours")
        return None

    with pytest.raises(UnsafePathError, match="were moved during cleaning; stopped for safety"):
        clean_directory(str(tmpfs), should_stop=stack_a_mount_on_the_root)
    assert (stacked[0] / "theirs").read_text() == "not ours"


def test_a_plain_directory_is_not_cleaned(tmp_path: Path) -> None:
    """Nothing mounted there: the directory belongs to the filesystem underneath (the disk
    was unmounted, or the path is wrong). Refused before anything is touched."""
    plain = tmp_path / "plain"
    (plain / "d").mkdir(parents=True)
    (plain / "d" / "f").write_text("host data")
    with pytest.raises(UnsafePathError, match="not a mount point"):
        clean_directory(str(plain))
    assert (plain / "d" / "f").read_text() == "host data"


def test_a_directory_bind_mounted_onto_itself_is_a_mount_point(tmp_path: Path, mounter: Mounter) -> None:
    """Upstream's recipe for a volume on a shared disk (``mount --bind d d``) is accepted."""
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "f").write_text("x")
    mounter.bind(d, d)
    clean_directory(str(d))
    assert os.listdir(d) == []


def test_a_plain_directory_can_be_cleaned_when_the_caller_says_so(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    (plain / "d").mkdir(parents=True)
    (plain / "d" / "f").write_text("x")
    clean_directory(str(plain), require_mount_point=False)
    assert os.listdir(plain) == []


def test_a_mount_stacked_on_a_directory_after_its_check_is_not_entered(
    tmpfs: Path, mounter: Mounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory is reopened through the very descriptor that was checked, never by its
    name again: a mount stacked on it between the check and the reopening is not emptied."""
    (tmpfs / "d").mkdir()
    (tmpfs / "d" / "ours").write_text("tenant")
    real_mount_id, stacked = fsclean.mount_id, []

    def mount_id_then_stack(fd: int) -> int:
        found = real_mount_id(fd)
        if not stacked and os.readlink(f"/proc/self/fd/{fd}") == str(tmpfs / "d"):
            stacked.append(mounter.tmpfs(tmpfs / "d", size=MiB))
            (stacked[0] / "theirs").write_text("not ours")
        return found

    monkeypatch.setattr(fsclean, "mount_id", mount_id_then_stack)
    with pytest.raises(DirtyVolumeError, match="a filesystem is mounted inside the volume") as exc:
        clean_directory(str(tmpfs))
    assert stacked, "the mount was stacked between the check and the reopening"
    assert exc.value.remaining == ("d",)
    assert os.listdir(stacked[0]) == ["theirs"]
    mounter.umount(stacked[0])
    assert os.listdir(tmpfs / "d") == [], "the directory that was checked is the one emptied"


@pytest.mark.parametrize("tree", ["directory", "file"])
def test_mount_ids_come_from_fdinfo_where_statx_cannot_tell_them(
    tmpfs: Path, tmp_path: Path, mounter: Mounter, monkeypatch: pytest.MonkeyPatch, tree: str
) -> None:
    """Kernels before 5.8 have no ``stx_mnt_id``: the walk reads ``/proc/self/fdinfo``, which
    gives the same number, and still tells a bind mount of the same filesystem."""
    fd = os.open(tmpfs, os.O_PATH)
    try:
        from_statx = statx.mount_id(fd)
        monkeypatch.setattr(statx, "_libc_statx", lambda: None)
        assert statx.mount_id(fd) == from_statx
    finally:
        os.close(fd)
    precious = tmpfs / "precious"
    if tree == "directory":
        (precious / "inner").mkdir(parents=True)
    else:
        precious.write_text("keep")
    vol = shared_filesystem_volume(tmpfs, tmp_path, mounter)
    (vol / "x").mkdir() if tree == "directory" else (vol / "x").write_text("")
    mounter.bind(precious, vol / "x")
    with pytest.raises(DirtyVolumeError, match="a filesystem is mounted inside the volume"):
        clean_directory(str(vol))
    assert (precious / "inner").is_dir() if tree == "directory" else precious.read_text() == "keep"

"""scan_directory never offers the kernel's own mounts, nor reaches a system directory.

Issue 11, finding 4: a discovery directory that was really ``/`` listed ``/proc``, ``/sys`` and
``/dev`` as Filesystem volumes. The configuration now refuses such directories by name; these
tests cover what only the host can tell: the filesystem type of a mount (by its mount id, not
its path) and where a discovery directory really leads (through symlinks).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localpv.host.mounts import mount_points
from localpv.host.scan import Entry, EntryKind, ScanError, scan_directory
from tests.support.hostfs import sh

from .conftest import ForkedNamespace, MiB, Mounter

#: Kernel filesystems mounted in a discovery directory: (entry name, mount arguments).
PSEUDO_MOUNTS = [
    ("proc", ("-t", "proc", "proc")),
    ("sysfs", ("-t", "sysfs", "sysfs")),
    ("cgroup2", ("-t", "cgroup2", "cgroup2")),
    ("mqueue", ("-t", "mqueue", "mqueue")),
    ("devpts", ("-t", "devpts", "-o", "newinstance", "devpts")),
    ("bind-of-proc", ("--bind", "/proc")),  # a bind mount of proc is still proc
]


def _scan_with_pseudo_mounts(disc: Path) -> list[tuple[str, str, str | None, int | None]]:
    """In a private mount namespace: mount every pseudo filesystem plus one tmpfs, then scan."""
    for name, args in PSEUDO_MOUNTS:
        (disc / name).mkdir()
        sh("mount", *args, disc / name)
    (disc / "tmpfs").mkdir()
    sh("mount", "-t", "tmpfs", "-o", f"size={MiB}", "localpv-test", disc / "tmpfs")
    return [(e.name, e.kind.value, e.reason, e.capacity) for e in scan_directory(str(disc), mount_points())]


@pytest.mark.root
def test_pseudo_filesystem_mounts_are_never_volumes(tmp_path: Path) -> None:
    disc = tmp_path / "disks"
    disc.mkdir()
    got = {name: rest for name, *rest in ForkedNamespace(lambda: _scan_with_pseudo_mounts(disc)).result()}
    assert got.pop("tmpfs") == ["mountpoint", None, MiB]  # a real filesystem stays a volume
    expected_type = {"bind-of-proc": "proc"}
    for name, (kind, reason, capacity) in got.items():
        assert kind != EntryKind.MOUNTPOINT.value, f"{name} would be offered as a volume"
        fs_type = expected_type.get(name, name)
        assert reason == f'path "{disc / name}" is a {fs_type} filesystem, not a volume', name
        assert kind == "pseudofs" and capacity is None, name


@pytest.mark.root
def test_a_symlink_entry_to_a_mount_elsewhere_is_not_a_mount_point(tmp_path: Path, mounter: Mounter) -> None:
    """Upstream only offers mounts made *in* the discovery directory; a link to another mount
    (here a tmpfs standing in for /var or /home) would hand that mount to a tenant."""
    elsewhere = mounter.tmpfs(tmp_path / "elsewhere", size=MiB)
    disc = tmp_path / "disks"
    disc.mkdir()
    (disc / "link").symlink_to(elsewhere)
    (entry,) = scan_directory(str(disc), mount_points())
    assert entry.kind is EntryKind.DIRECTORY, entry
    assert entry.reason == f'path "{disc / "link"}" is not a valid mount point'


@pytest.mark.root
def test_a_symlinked_discovery_dir_still_finds_its_mounts(tmp_path: Path, mounter: Mounter) -> None:
    real = tmp_path / "real"
    vol = mounter.tmpfs(real / "vol", size=MiB)
    (tmp_path / "alias").symlink_to(real)
    (entry,) = scan_directory(str(tmp_path / "alias"), mount_points())
    assert (entry.kind, entry.capacity, entry.device) == (EntryKind.MOUNTPOINT, MiB, os.stat(vol).st_dev)


@pytest.mark.parametrize("target", ["/", "/proc", "/sys", "/dev", "/etc", "/var/lib"])
def test_a_discovery_dir_that_leads_to_a_system_directory_is_refused(tmp_path: Path, target: str) -> None:
    """The configuration cannot see a symlink on the node; the scan, which follows it, must refuse."""
    alias = tmp_path / "disks"
    alias.symlink_to(target)
    with pytest.raises(ScanError) as err:
        scan_directory(str(alias), mount_points())
    assert err.value.path == str(alias)
    assert f'resolves to "{target}"' in str(err.value), str(err.value)


def test_a_dedicated_discovery_dir_is_listed_as_before(tmp_path: Path) -> None:
    plain = tmp_path / "d"
    plain.mkdir()
    reason = f'path "{plain}" is not a valid mount point'
    assert scan_directory(str(tmp_path), frozenset()) == [Entry("d", str(plain), EntryKind.DIRECTORY, reason=reason)]

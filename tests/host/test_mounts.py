"""mountinfo parsing (synthetic and real kernel output) and the mount-table watcher."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv.host.mounts import MountInfo, MountTableWatcher, mount_points, parse_mountinfo, read_mountinfo

from .conftest import ForkedNamespace, Mounter, sh

PROC5_EXAMPLE = "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue"


def kernel_escape(raw: bytes) -> bytes:
    """Escape a path the way the kernel's mangle() does (written independently of the parser)."""
    return b"".join(b"\\%03o" % c if c in b" \t\n\\" else bytes([c]) for c in raw)


def test_parses_the_proc5_example() -> None:
    assert parse_mountinfo(PROC5_EXAMPLE + "\n") == [
        MountInfo(36, 35, "98:0", "/mnt1", "/mnt/parent", "rw,noatime", "ext3", "/dev/root", "rw,errors=continue")
    ]


@pytest.mark.parametrize("optional", ["", " shared:1", " shared:12 master:3 propagate_from:2 unbindable"])
def test_any_number_of_optional_fields(optional: str) -> None:
    (m,) = parse_mountinfo(f"1 0 0:5 / /x rw{optional} - tmpfs none rw")
    assert (m.mount_point, m.fs_type, m.source, m.super_options) == ("/x", "tmpfs", "none", "rw")


def test_decodes_escapes_in_root_mount_point_and_source() -> None:
    line = r"7 1 8:1 /a\040b /mnt/new\012line\011tab\134 rw - ext4 /dev/disk\040one rw"
    (m,) = parse_mountinfo(line)
    assert (m.root, m.mount_point, m.source) == ("/a b", "/mnt/new\nline\ttab\\", "/dev/disk one")


def test_empty_source_field_is_kept() -> None:
    (m,) = parse_mountinfo("9 1 0:40 / /empty rw,relatime - tmpfs  rw")
    assert (m.fs_type, m.source, m.super_options) == ("tmpfs", "", "rw")


def test_blank_lines_are_skipped() -> None:
    assert len(parse_mountinfo(f"\n{PROC5_EXAMPLE}\n\n{PROC5_EXAMPLE}\n")) == 2


@pytest.mark.parametrize(
    "bad",
    [
        "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 ext3 /dev/root rw",  # no separator
        "36 35 98:0 /mnt1 /mnt/parent - ext3 /dev/root rw",  # separator where options belong
        "36 35 98:0 /mnt1 /mnt/parent rw - ext3 /dev/root",  # too few after separator
        "36 35 98:0 /mnt1 /mnt/parent rw - ext3 /dev/root rw extra",  # too many after separator
        "x 35 98:0 /mnt1 /mnt/parent rw - ext3 /dev/root rw",  # id not a number
        "36 35 98-0 /mnt1 /mnt/parent rw - ext3 /dev/root rw",  # bad major:minor
        "36 35",
    ],
)
def test_malformed_line_raises_value_error_naming_the_line(bad: str) -> None:
    with pytest.raises(ValueError, match=r"mountinfo line 2\b"):
        parse_mountinfo(f"{PROC5_EXAMPLE}\n{bad}\n")


path_bytes = st.binary(min_size=1, max_size=300).filter(lambda b: b"\0" not in b)


@given(root=path_bytes, target=path_bytes, source=path_bytes)
def test_round_trip_of_arbitrary_paths(root: bytes, target: bytes, source: bytes) -> None:
    line = b"21 1 0:42 /%s /%s rw shared:3 - tmpfs %s rw\n" % tuple(kernel_escape(p) for p in (root, target, source))
    (m,) = parse_mountinfo(os.fsdecode(line))
    assert m.root == os.fsdecode(b"/" + root)
    assert m.mount_point == os.fsdecode(b"/" + target)
    assert m.source == os.fsdecode(source)


def test_reads_a_mountinfo_file(tmp_path: Path) -> None:
    f = tmp_path / "mountinfo"
    f.write_bytes(b"1 0 0:5 / /caf\xc3\xa9\\040x rw - tmpfs none rw\n2 1 0:6 / /raw\xff rw - tmpfs none rw\n")
    assert [m.mount_point for m in read_mountinfo(str(f))] == ["/café x", os.fsdecode(b"/raw\xff")]
    assert mount_points(str(f)) == frozenset({"/café x", os.fsdecode(b"/raw\xff")})


@pytest.mark.root
def test_real_kernel_escapes_round_trip(tmp_path: Path, mounter: Mounter) -> None:
    names = ["with space", "new\nline", "tab\there", "back\\slash", "ünïcødé 🚀", "x" * 255]
    targets = [mounter.tmpfs(tmp_path / name, size=1024 * 1024) for name in names]
    table = {m.mount_point: m for m in read_mountinfo()}
    for target in targets:
        assert table[str(target)].fs_type == "tmpfs"
        assert table[str(target)].source == "localpv-test"
    assert {str(t) for t in targets} <= mount_points()


@pytest.mark.root
def test_bind_mount_root_is_the_source_directory(tmp_path: Path, tmpfs: Path, mounter: Mounter) -> None:
    (tmpfs / "sub dir").mkdir()
    target = mounter.bind(tmpfs / "sub dir", tmp_path / "bound")
    table = {m.mount_point: m for m in read_mountinfo()}
    assert table[str(target)].root == "/sub dir"
    assert table[str(target)].major_minor == table[str(tmpfs)].major_minor


def _in_thread(*argv: str | Path) -> threading.Thread:
    thread = threading.Thread(target=sh, args=argv)
    thread.start()
    return thread


def _watch_mount_and_umount(target: str) -> dict[str, object]:
    """Runs in a private mount namespace: nobody else's mounts can wake the watcher there."""
    with MountTableWatcher() as watcher:
        quiet_before = watcher.wait(0.3)
        t0 = time.monotonic()
        thread = _in_thread("mount", "-t", "tmpfs", "x", target)
        woke_on_mount = watcher.wait(5.0)
        mount_latency = time.monotonic() - t0
        thread.join()
        quiet_after = watcher.wait(0.2)
        thread = _in_thread("umount", target)
        woke_on_umount = watcher.wait(5.0)
        thread.join()
        sh("mount", "-t", "tmpfs", "x", target)
        sh("umount", target)
        two_changes = [watcher.wait(1.0), watcher.wait(0.2)]
    return {
        "quiet_before": quiet_before,
        "woke_on_mount": woke_on_mount,
        "mount_latency": mount_latency,
        "quiet_after": quiet_after,
        "woke_on_umount": woke_on_umount,
        "two_changes": two_changes,
    }


@pytest.mark.root
def test_watcher_reports_mount_and_umount_and_nothing_else(
    tmp_path: Path, in_private_mount_namespace: Callable[[Callable[[], Any]], Any]
) -> None:
    (tmp_path / "m").mkdir()
    r = in_private_mount_namespace(lambda: _watch_mount_and_umount(str(tmp_path / "m")))
    assert r["quiet_before"] is False, "woke up although nothing was mounted"
    assert r["woke_on_mount"] is True
    assert r["mount_latency"] < 2.0
    assert r["quiet_after"] is False, "a reported change was reported again"
    assert r["woke_on_umount"] is True
    assert r["two_changes"] == [True, False], "changes between two waits are reported once"


def _wait_for_propagated_mount(ready_fd: int, timeout: float) -> bool:
    with MountTableWatcher() as watcher:
        os.write(ready_fd, b"r")
        return watcher.wait(timeout)


@pytest.mark.root
def test_watcher_sees_mounts_propagated_from_the_host(tmp_path: Path, mounter: Mounter) -> None:
    """Like a pod whose discovery dir is mounted with HostToContainer (rslave) propagation."""
    shared = mounter.tmpfs(tmp_path / "shared")
    sh("mount", "--make-shared", shared)
    (shared / "disk").mkdir()
    ready_r, ready_w = os.pipe()
    child = ForkedNamespace(lambda: _wait_for_propagated_mount(ready_w, 5.0), propagation="slave")
    os.close(ready_w)
    ready = os.read(ready_r, 1)
    os.close(ready_r)
    if ready != b"r":
        child.result()  # fails with the child's traceback
    mounter.tmpfs(shared / "disk", size=1024 * 1024)
    assert child.result() is True


def test_watcher_close_is_idempotent_and_final() -> None:
    watcher = MountTableWatcher()
    assert watcher.fileno() >= 0
    watcher.close()
    watcher.close()
    with pytest.raises(ValueError, match="closed"):
        watcher.wait(0)

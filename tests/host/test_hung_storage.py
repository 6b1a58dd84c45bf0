"""Storage that never answers (issue 12): every wait on it is bounded, and the rest keeps working.

The hung storage is real: a FUSE mount whose daemon never answers (``hung_fuse``), so
every ``stat``/``statvfs`` of its root blocks in the kernel until the connection is
aborted at teardown. A thread stuck there cannot be interrupted, so each test runs the
code under test in a helper thread and fails (instead of hanging) when it does not come
back within its bound.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from localpv.agent.cleaning import cleaner_processes, filesystem_cleaner
from localpv.agent.proctable import ProcTable
from localpv.host.cleaner import ProcessRecords, run_cleaner
from localpv.host.mounts import mount_points
from localpv.host.probes import StorageProbes
from localpv.host.scan import Entry, EntryKind, ScanError, scan_directory
from localpv.kube.errors import Backoff
from tests.conftest import wait_for
from tests.support.hostfs import HungFuse, MiB, Mounter

pytestmark = pytest.mark.root

T = TypeVar("T")
NO_RETRY = Backoff(initial=60.0, maximum=60.0, attempts=1_000_000, jitter=0.0)


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()``, run in a daemon thread; fail if it is still blocked after ``seconds``.

    A thread blocked on the hung mount stays blocked until the fixture aborts the mount at
    teardown, then gets ENOTCONN and ends: the test fails, it does not hang.
    """
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True, name="bounded-call")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still blocked on hung storage after {seconds}s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def by_name(entries: list[Entry]) -> dict[str, Entry]:
    return {e.name: e for e in entries}


def discovery_dir(tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse) -> tuple[Path, Path]:
    """A discovery dir with a healthy tmpfs volume ``good`` and a hung FUSE mount ``hung``."""
    disc = tmp_path / "disks"
    disc.mkdir()
    mounter.tmpfs(disc / "good", size=4 * MiB)
    return disc, hung_fuse.mount(disc / "hung")


# ---------------------------------------------------------------- discovery


def test_scan_skips_a_hung_mount_and_classifies_its_neighbour(
    tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse
) -> None:
    disc, hung = discovery_dir(tmp_path, mounter, hung_fuse)
    started = time.monotonic()
    entries = within(5, lambda: scan_directory(str(disc), mount_points()))
    assert time.monotonic() - started < 2.0
    got = by_name(entries)
    assert sorted(got) == ["good", "hung"]
    assert got["good"].kind is EntryKind.MOUNTPOINT and got["good"].capacity == 4 * MiB
    assert got["hung"].kind is EntryKind.HUNG
    assert (got["hung"].capacity, got["hung"].ident) == (None, None)
    assert got["hung"].reason is not None
    assert f'"{hung}" did not answer within' in got["hung"].reason and "hung storage" in got["hung"].reason


def test_a_hung_entry_is_not_probed_again_until_it_answers(
    tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse
) -> None:
    disc, hung = discovery_dir(tmp_path, mounter, hung_fuse)
    probes = StorageProbes(workers=2, timeout=0.5)
    first = within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes))
    assert by_name(first)["hung"].kind is EntryKind.HUNG
    assert probes.stuck() == 1
    # Known hung: answered at once, without leaving another thread behind.
    started = time.monotonic()
    second = within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes))
    assert time.monotonic() - started < 0.4
    assert by_name(second)["hung"] == by_name(first)["hung"]
    assert by_name(second)["good"].kind is EntryKind.MOUNTPOINT
    assert probes.stuck() == 1
    assert list(probes.hung()) == [f"entry:{hung}"]
    # Once the mount answers (here: aborted and unmounted), the stuck probe ends and the
    # entry is looked at again: now it is the plain directory left behind.
    hung_fuse.release(hung)
    wait_for(lambda: probes.stuck() == 0, timeout=5, what="the stuck probe to end")
    third = within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes))
    assert by_name(third)["hung"].kind is EntryKind.DIRECTORY
    assert probes.hung() == {}


def test_a_mount_replacing_a_hung_one_is_probed_again(tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse) -> None:
    """The hung mount is detached but its connection lives on (its stuck probe too): the
    new mount on the same path is a different mount, so it is looked at."""
    disc, hung = discovery_dir(tmp_path, mounter, hung_fuse)
    probes = StorageProbes(workers=2, timeout=0.5)
    assert by_name(within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes)))["hung"].kind \
        is EntryKind.HUNG
    hung_fuse.detach(hung)  # unmounted, connection not aborted: the old probe stays stuck
    mounter.tmpfs(hung, size=2 * MiB)
    entries = by_name(within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes)))
    assert entries["hung"].kind is EntryKind.MOUNTPOINT and entries["hung"].capacity == 2 * MiB
    assert probes.stuck() == 1


def test_many_hung_entries_are_probed_side_by_side(tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse) -> None:
    disc = tmp_path / "disks"
    disc.mkdir()
    for i in range(5):
        hung_fuse.mount(disc / f"hung{i}")
    mounter.tmpfs(disc / "zgood", size=4 * MiB)
    probes = StorageProbes(workers=2, timeout=0.5)
    started = time.monotonic()
    got = by_name(within(10, lambda: scan_directory(str(disc), mount_points(), probes=probes)))
    # Two probes at a time, each stuck one replaced after 0.5 s: three rounds, not five.
    assert time.monotonic() - started < 2.5
    assert [got[f"hung{i}"].kind for i in range(5)] == [EntryKind.HUNG] * 5
    assert got["zgood"].kind is EntryKind.MOUNTPOINT
    assert probes.stuck() == 5


def test_abandoned_probes_are_capped(tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse) -> None:
    """Past the cap no thread is left behind any more: what cannot be looked at is reported, at once."""
    disc = tmp_path / "disks"
    disc.mkdir()
    for name in ("a", "b"):
        hung_fuse.mount(disc / name)
    mounter.tmpfs(disc / "c", size=4 * MiB)
    # One worker, replaced once when it hangs: two threads at most, both stuck on a and b.
    probes = StorageProbes(workers=1, max_stuck=1, timeout=0.3)
    started = time.monotonic()
    got = by_name(within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes)))
    assert time.monotonic() - started < 1.5
    assert [got["a"].kind, got["b"].kind] == [EntryKind.HUNG, EntryKind.HUNG]
    assert "did not answer within 0.3s" in str(got["b"].reason)
    assert got["c"].kind is EntryKind.HUNG and "not looked at" in str(got["c"].reason)
    assert probes.stuck() == 2
    hung_fuse.release(disc / "a")
    wait_for(lambda: probes.stuck() == 1, timeout=5, what="the probe of a to end")
    got = by_name(within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes)))
    assert got["c"].kind is EntryKind.MOUNTPOINT
    assert got["b"].kind is EntryKind.HUNG and "did not answer" in str(got["b"].reason)
    assert probes.stuck() == 1


def test_a_dead_fuse_mount_is_a_broken_entry(tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse) -> None:
    """Its daemon is gone: every look fails with ENOTCONN, at once. That is an entry's
    failure, not the whole scan's (it used to fail every reconcile pass)."""
    disc, hung = discovery_dir(tmp_path, mounter, hung_fuse)
    hung_fuse.abort(hung)
    got = by_name(within(5, lambda: scan_directory(str(disc), mount_points())))
    assert got["hung"].kind is EntryKind.BROKEN
    assert got["hung"].reason == f'cannot stat "{hung}": Transport endpoint is not connected'
    assert got["good"].kind is EntryKind.MOUNTPOINT


def test_a_hung_discovery_dir_is_a_scan_error_within_the_bound(tmp_path: Path, hung_fuse: HungFuse) -> None:
    disc = hung_fuse.mount(tmp_path / "disks")
    probes = StorageProbes(timeout=0.5)
    started = time.monotonic()
    with pytest.raises(ScanError) as caught:
        within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes))
    assert time.monotonic() - started < 1.5
    assert caught.value.hung
    assert f'cannot list discovery directory "{disc}"' in str(caught.value)
    assert "did not answer within" in str(caught.value)
    # Known hung: the next pass says so at once.
    started = time.monotonic()
    with pytest.raises(ScanError):
        within(5, lambda: scan_directory(str(disc), mount_points(), probes=probes))
    assert time.monotonic() - started < 0.4


# ---------------------------------------------------------------- cleaning


def volume(disc: Path, name: str, mounter: Mounter) -> Path:
    vol = mounter.tmpfs(disc / name, size=4 * MiB)
    (vol / "data").mkdir()
    (vol / "data" / "secret").write_text("tenant data")
    return vol


def test_filesystem_cleanup_of_a_volume_with_a_hung_mount_inside_times_out_and_frees_its_worker(
    tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse
) -> None:
    disc = tmp_path / "disks"
    vol = volume(disc, "vol1", mounter)
    hung_fuse.mount(vol / "data" / "fuse")
    other = volume(disc, "vol2", mounter)
    procs = ProcTable(1, retry_backoff=NO_RETRY)
    try:
        started = time.monotonic()
        assert procs.start("pv-hung", filesystem_cleaner(str(vol), str(disc), timeout=3))
        status = wait_for(lambda: (s := procs.status("pv-hung")) and s.state != "running" and s, timeout=8,
                          what="the cleanup to give up")
        assert time.monotonic() - started < 5.5
        assert status.state == "failed"
        assert "timed out after 3s" in status.message
        # The only worker is free again: another volume gets cleaned.
        assert procs.start("pv-ok", filesystem_cleaner(str(other), str(disc), timeout=10))
        ok = wait_for(lambda: (s := procs.status("pv-ok")) and s.state != "running" and s, timeout=10,
                      what="the second cleanup")
        assert ok.state == "succeeded", ok.message
        assert os.listdir(other) == []
    finally:
        within(10, lambda: procs.shutdown(wait=True))


def test_a_cleaner_stuck_for_good_in_the_kernel_is_abandoned_recorded_and_not_started_twice(
    tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse
) -> None:
    """The FUSE daemon took the request and never answers: the cleaner process cannot even
    be killed (uninterruptible sleep) until the connection is aborted. The worker must not
    wait for it; the process stays recorded for a restarted agent to kill."""
    disc = tmp_path / "disks"
    vol = volume(disc, "vol1", mounter)
    fuse = hung_fuse.mount(vol / "data" / "fuse", unkillable=True)
    records = ProcessRecords(tmp_path / "records")
    clean = filesystem_cleaner(str(vol), str(disc), timeout=2, records=records, key="pv-stuck")
    started = time.monotonic()
    outcome = within(10, lambda: clean(threading.Event()))
    assert time.monotonic() - started < 5
    assert not outcome.ok
    assert "timed out after 2s" in outcome.message and "stuck" in outcome.message
    recorded = os.listdir(tmp_path / "records")
    assert len(recorded) == 1
    assert str(vol) in cleaner_processes()
    # A second clean of the same volume does not start while the first one is still there.
    again = within(5, lambda: clean(threading.Event()))
    assert not again.ok and "still there" in again.message
    hung_fuse.release(fuse)
    wait_for(lambda: os.listdir(tmp_path / "records") == [], timeout=10, what="the stuck cleaner to be reaped")
    assert str(vol) not in cleaner_processes()
    hung_fuse.release_all()
    final = within(10, lambda: clean(threading.Event()))
    assert final.ok, final.message
    assert os.listdir(vol) == []


def test_cancelling_a_cleanup_blocked_on_hung_storage_returns_at_once(
    tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse
) -> None:
    disc = tmp_path / "disks"
    vol = volume(disc, "vol1", mounter)
    hung_fuse.mount(vol / "data" / "fuse")
    procs = ProcTable(1, retry_backoff=NO_RETRY)
    assert procs.start("pv-hung", filesystem_cleaner(str(vol), str(disc), timeout=3600))
    wait_for(lambda: (s := procs.status("pv-hung")) and s.state == "running", timeout=5)
    started = time.monotonic()
    within(10, lambda: procs.shutdown(wait=True))
    assert time.monotonic() - started < 5
    status = procs.status("pv-hung")
    assert status is not None and status.state == "failed" and "cancelled" in status.message


def test_a_block_cleaner_stuck_in_the_kernel_does_not_hold_its_worker(tmp_path: Path, hung_fuse: HungFuse) -> None:
    """A cleaner command blocked for good (a dying disk, hung storage) is killed at its
    timeout and, when it cannot even die, left to be reaped in the background."""
    fuse = hung_fuse.mount(tmp_path / "fuse", unkillable=True)
    reaped = threading.Event()
    started = time.monotonic()
    result = within(15, lambda: run_cleaner(["stat", str(fuse)], {}, timeout=1, kill_grace=0.5,
                                            on_line=lambda _line: None, on_exit=lambda _pid: reaped.set()))
    assert time.monotonic() - started < 6
    assert result.timed_out and result.lingering
    assert not reaped.is_set()
    hung_fuse.release(fuse)
    wait_for(reaped.is_set, timeout=10, what="the stuck cleaner to be reaped")



def test_a_filesystem_cleaner_dies_with_the_agent_that_started_it(
    tmp_path: Path, mounter: Mounter, hung_fuse: HungFuse
) -> None:
    """An agent killed with SIGKILL cannot kill its cleaner: the cleaner goes by itself
    (and is recorded for the next agent), it never deletes on behind a new agent's back."""
    disc = tmp_path / "disks"
    vol = volume(disc, "vol1", mounter)
    hung_fuse.mount(vol / "data" / "fuse")
    records = tmp_path / "records"
    agent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import threading
        from localpv.agent.cleaning import cleaner_processes, filesystem_cleaner
        from localpv.host.cleaner import ProcessRecords
        filesystem_cleaner({str(vol)!r}, {str(disc)!r}, timeout=600, records=ProcessRecords({str(records)!r}),
                           key="pv-1")(threading.Event())
    """)], cwd=Path(__file__).resolve().parents[2])
    try:
        # a record is written to NAME.tmp, then renamed: only a renamed one is complete
        recorded = wait_for(lambda: records.is_dir() and [n for n in os.listdir(records) if not n.endswith(".tmp")],
                            timeout=10, what="the cleaner to start")
        pid = int((records / recorded[0]).read_text().split()[0])
        cleaner = os.pidfd_open(pid)
        wait_for(lambda: Path(f"/proc/{pid}/wchan").read_text().startswith("fuse"), timeout=10,
                 what="the cleaner to block on the hung mount")
    finally:
        agent.kill()
        agent.wait()
    try:
        assert select.select([cleaner], [], [], 5)[0], "the cleaner outlived its agent"
    finally:
        os.close(cleaner)
    assert (records / recorded[0]).exists()  # for the next agent's kill_leftovers, which finds it gone
    assert ProcessRecords(records).kill_leftovers() == []

"""ProcTable: a bounded worker pool with running/succeeded/failed states and retry backoff."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from localpv.agent.model import FAILED, RUNNING, SUCCEEDED, CleanupStatus
from localpv.agent.proctable import CleanOutcome, ProcTable
from localpv.clock import ManualClock
from localpv.kube.errors import Backoff
from tests.conftest import wait_for

# Deterministic backoff: 10 s, 20 s, 40 s ... capped at 600 s (no jitter).
BACKOFF = Backoff(initial=10.0, maximum=600.0, factor=2.0, attempts=1_000_000, jitter=0.0)
DEADLINE = 10.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1000.0)


@pytest.fixture
def make_table(clock: ManualClock) -> Iterator[Callable[..., ProcTable]]:
    tables: list[ProcTable] = []
    releases: list[threading.Event] = []

    def make(workers: int = 2, **kwargs: object) -> ProcTable:
        table = ProcTable(workers, clock=clock, retry_backoff=BACKOFF, **kwargs)  # type: ignore[arg-type]
        tables.append(table)
        return table

    make.releases = releases  # type: ignore[attr-defined]
    yield make
    for event in releases:
        event.set()
    for table in tables:
        table.shutdown(wait=1.0)


def finished(table: ProcTable, name: str) -> Callable[[], CleanupStatus | None]:
    def check() -> CleanupStatus | None:
        status = table.status(name)
        return status if status is not None and status.state != RUNNING else None

    return check


def ok(message: str = "cleaned") -> Callable[[threading.Event], CleanOutcome]:
    return lambda _cancel: CleanOutcome(True, message)


def fail(message: str = "exit status 10") -> Callable[[threading.Event], CleanOutcome]:
    return lambda _cancel: CleanOutcome(False, message)


class Gate:
    """A cleaning function that reports when it starts and blocks until released."""

    def __init__(self, outcome: CleanOutcome | None = None) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.cancel: threading.Event | None = None
        self.outcome = outcome or CleanOutcome(True, "done")

    def __call__(self, cancel: threading.Event) -> CleanOutcome:
        self.cancel = cancel
        self.started.set()
        if not self.release.wait(DEADLINE):
            return CleanOutcome(False, "test gate never released")
        return self.outcome


# --------------------------------------------------------------------------- states


def test_success_state(make_table: Callable[..., ProcTable], clock: ManualClock) -> None:
    table = make_table()
    gate = Gate(CleanOutcome(True, "wiped 3 files"))
    assert table.start("pv-a", gate, pv_uid="uid-a")
    status = table.status("pv-a")
    assert status is not None
    assert (status.state, status.started, status.pv_uid, status.attempts) == (RUNNING, 1000.0, "uid-a", 1)
    assert status.finished is None and status.retry_at is None
    assert gate.started.wait(DEADLINE)
    clock.advance(5)
    gate.release.set()
    done = wait_for(finished(table, "pv-a"), DEADLINE)
    assert done == CleanupStatus(SUCCEEDED, 1000.0, "uid-a", finished=1005.0, retry_at=None, attempts=1,
                                 message="wiped 3 files")


def test_failure_state_with_backoff(make_table: Callable[..., ProcTable], clock: ManualClock) -> None:
    table = make_table()
    gate = Gate(CleanOutcome(False, "exit status 10"))
    assert table.start("pv-a", gate)
    assert gate.started.wait(DEADLINE)
    clock.advance(3)
    gate.release.set()
    done = wait_for(finished(table, "pv-a"), DEADLINE)
    assert done.state == FAILED
    assert done.finished == 1003.0
    assert done.retry_at == 1003.0 + 10.0
    assert done.attempts == 1
    assert done.message == "exit status 10"


def test_attempts_increment_and_backoff_grows(make_table: Callable[..., ProcTable], clock: ManualClock) -> None:
    table = make_table()
    delays = []
    for attempt in range(1, 5):
        gate = Gate(CleanOutcome(False, "exit status 10"))
        assert table.start("pv-a", gate)
        assert gate.started.wait(DEADLINE)
        running = table.status("pv-a")
        assert running is not None and running.state == RUNNING and running.attempts == attempt
        # A new attempt starts with a clean slate: no stale retry time or finish time.
        assert running.retry_at is None and running.finished is None
        gate.release.set()
        done = wait_for(finished(table, "pv-a"), DEADLINE)
        assert done.attempts == attempt
        assert done.retry_at is not None and done.finished is not None
        delays.append(done.retry_at - done.finished)
        clock.advance(1000)
    assert delays == [10.0, 20.0, 40.0, 80.0]


def test_backoff_is_capped(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    done = None
    for _ in range(9):
        assert table.start("pv-a", fail())
        done = wait_for(finished(table, "pv-a"), DEADLINE)
    assert done is not None and done.attempts == 9
    assert done.retry_at is not None and done.finished is not None
    assert done.retry_at - done.finished == 600.0


def test_success_after_failures_resets_attempts_for_the_next_run(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    for _ in range(2):
        table.start("pv-a", fail())
        wait_for(finished(table, "pv-a"), DEADLINE)
    table.start("pv-a", ok())
    done = wait_for(finished(table, "pv-a"), DEADLINE)
    assert (done.state, done.attempts) == (SUCCEEDED, 3)
    table.start("pv-a", ok())
    status = table.status("pv-a")
    assert status is not None and status.attempts == 1


def test_exception_in_fn_is_a_failure_with_the_message(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()

    def boom(_cancel: threading.Event) -> CleanOutcome:
        raise PermissionError(13, "Permission denied")

    assert table.start("pv-a", boom)
    done = wait_for(finished(table, "pv-a"), DEADLINE)
    assert done.state == FAILED
    assert "PermissionError" in done.message
    assert "Permission denied" in done.message
    assert done.retry_at is not None
    assert table.stats()["local_volume_provisioner_proctable_failed"] == 1


def test_second_start_while_running_returns_false(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    gate = Gate()
    assert table.start("pv-a", gate, pv_uid="uid-1")
    assert gate.started.wait(DEADLINE)
    calls: list[str] = []
    assert not table.start("pv-a", lambda _c: calls.append("second") or CleanOutcome(True, ""), pv_uid="uid-2")
    status = table.status("pv-a")
    assert status is not None and status.pv_uid == "uid-1"  # the running entry is untouched
    gate.release.set()
    wait_for(finished(table, "pv-a"), DEADLINE)
    assert calls == []
    # Other names are independent.
    assert table.start("pv-b", ok())


def test_start_while_queued_returns_false(make_table: Callable[..., ProcTable]) -> None:
    table = make_table(workers=1)
    gate = Gate()
    table.start("pv-a", gate)
    assert gate.started.wait(DEADLINE)
    assert table.start("pv-b", ok())  # queued behind pv-a
    assert not table.start("pv-b", ok())
    gate.release.set()
    wait_for(finished(table, "pv-b"), DEADLINE)


def test_start_after_finish_is_allowed(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    table.start("pv-a", ok())
    wait_for(finished(table, "pv-a"), DEADLINE)
    assert table.start("pv-a", ok())


# --------------------------------------------------------------------------- concurrency


@pytest.mark.parametrize("workers", [1, 3])
def test_bounded_concurrency(make_table: Callable[..., ProcTable], workers: int) -> None:
    table = make_table(workers=workers)
    lock = threading.Lock()
    active = 0
    peak = 0
    release = threading.Event()
    make_table.releases.append(release)  # type: ignore[attr-defined]
    started: list[str] = []

    def blocking(name: str) -> Callable[[threading.Event], CleanOutcome]:
        def run(_cancel: threading.Event) -> CleanOutcome:
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
                started.append(name)
            try:
                release.wait(DEADLINE)
            finally:
                with lock:
                    active -= 1
            return CleanOutcome(True, "ok")

        return run

    names = [f"pv-{i}" for i in range(workers + 2)]
    for name in names:
        assert table.start(name, blocking(name))
    wait_for(lambda: len(started) == workers, DEADLINE, what=f"{workers} cleanups running")
    # Give the pool every chance to over-commit: the queued ones must still be waiting.
    with lock:
        assert active == workers
    assert all(table.status(n) is not None for n in names)
    assert table.stats()["local_volume_provisioner_proctable_running"] == workers + 2  # queued count as running
    release.set()
    for name in names:
        assert wait_for(finished(table, name), DEADLINE).state == SUCCEEDED
    assert peak == workers
    assert sorted(started) == sorted(names)


# --------------------------------------------------------------------------- bookkeeping


def test_forget_drops_finished_but_ignores_running(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    gate = Gate()
    table.start("pv-run", gate)
    table.start("pv-done", ok())
    table.start("pv-bad", fail())
    wait_for(finished(table, "pv-done"), DEADLINE)
    wait_for(finished(table, "pv-bad"), DEADLINE)
    for name in ("pv-run", "pv-done", "pv-bad", "pv-unknown"):
        table.forget(name)
    assert set(table.statuses()) == {"pv-run"}
    gate.release.set()
    assert wait_for(finished(table, "pv-run"), DEADLINE).state == SUCCEEDED


def test_forget_after_failure_resets_attempts(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    table.start("pv-a", fail())
    wait_for(finished(table, "pv-a"), DEADLINE)
    table.forget("pv-a")
    table.start("pv-a", fail())
    assert wait_for(finished(table, "pv-a"), DEADLINE).attempts == 1


def test_stats_counters(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    assert table.stats() == {
        "local_volume_provisioner_proctable_running": 0,
        "local_volume_provisioner_proctable_succeeded": 0,
        "local_volume_provisioner_proctable_failed": 0,
    }
    gate = Gate()
    table.start("pv-run", gate)
    for name in ("a", "b", "c"):
        table.start(name, ok())
    for name in ("d", "e"):
        table.start(name, fail())
    for name in "abcde":
        wait_for(finished(table, name), DEADLINE)
    assert table.stats() == {
        "local_volume_provisioner_proctable_running": 1,
        "local_volume_provisioner_proctable_succeeded": 3,
        "local_volume_provisioner_proctable_failed": 2,
    }
    # Counters are cumulative: forgetting entries does not lower them.
    for name in "abcde":
        table.forget(name)
    gate.release.set()
    wait_for(finished(table, "pv-run"), DEADLINE)
    assert table.stats() == {
        "local_volume_provisioner_proctable_running": 0,
        "local_volume_provisioner_proctable_succeeded": 4,
        "local_volume_provisioner_proctable_failed": 2,
    }


def test_on_done_called_after_the_final_state_is_recorded(make_table: Callable[..., ProcTable]) -> None:
    seen: list[tuple[str, str | None]] = []
    done = threading.Event()
    table: ProcTable

    def on_done(name: str) -> None:
        status = table.status(name)
        seen.append((name, status.state if status else None))
        if len(seen) == 2:
            done.set()

    table = make_table(on_done=on_done)
    table.start("pv-ok", ok())
    table.start("pv-bad", fail())
    assert done.wait(DEADLINE)
    assert sorted(seen) == [("pv-bad", FAILED), ("pv-ok", SUCCEEDED)]


def test_progress_is_kept_while_running_and_dropped_after(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    gate = Gate()
    table.set_progress("pv-a", "ignored: unknown volume")
    assert table.progress("pv-a") == ""
    table.start("pv-a", gate)
    assert gate.started.wait(DEADLINE)
    table.set_progress("pv-a", "pass 1/3 42%")
    assert table.progress("pv-a") == "pass 1/3 42%"
    gate.release.set()
    wait_for(finished(table, "pv-a"), DEADLINE)
    assert table.progress("pv-a") == ""


def test_statuses_is_a_snapshot(make_table: Callable[..., ProcTable]) -> None:
    table = make_table()
    table.start("pv-a", ok())
    wait_for(finished(table, "pv-a"), DEADLINE)
    snap = table.statuses()
    snap.clear()
    assert table.status("pv-a") is not None


def test_shutdown_sets_the_cancel_event_of_running_cleanups(clock: ManualClock) -> None:
    table = ProcTable(2, clock=clock, retry_backoff=BACKOFF)
    cancelled: list[str] = []
    started = threading.Barrier(3)

    def cancellable(name: str) -> Callable[[threading.Event], CleanOutcome]:
        def run(cancel: threading.Event) -> CleanOutcome:
            started.wait(DEADLINE)
            if cancel.wait(DEADLINE):
                cancelled.append(name)
                return CleanOutcome(False, "cancelled")
            return CleanOutcome(True, "not cancelled")

        return run

    table.start("pv-a", cancellable("pv-a"))
    table.start("pv-b", cancellable("pv-b"))
    started.wait(DEADLINE)  # both are inside their function
    queued_runs: list[bool] = []

    def queued(cancel: threading.Event) -> CleanOutcome:
        queued_runs.append(cancel.is_set())
        return CleanOutcome(not cancel.is_set(), "queued")

    table.start("pv-queued", queued)
    table.shutdown(wait=1.0)
    assert sorted(cancelled) == ["pv-a", "pv-b"]
    for name in ("pv-a", "pv-b"):
        status = table.status(name)
        assert status is not None and status.state == FAILED and status.message == "cancelled"
    # The queued cleanup either never ran or, if a worker freed up before the queue was
    # dropped, saw its cancel event already set.
    assert queued_runs in ([], [True])

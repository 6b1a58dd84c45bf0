"""The keyed work queue: dedupe, one worker per key, per-item backoff on an injected clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from localpv.clock import ManualClock
from localpv.kube.workqueue import ItemBackoff, WorkQueue
from tests.conftest import wait_for


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def queue(clock: ManualClock) -> Iterator[WorkQueue]:
    q = WorkQueue("test", backoff=ItemBackoff(15, 1000), clock=clock)
    yield q
    q.shutdown()


def test_backoff_doubles_from_15s_and_caps_at_1000s() -> None:
    delays = [ItemBackoff().delay(n) for n in range(9)]
    assert delays == [15, 30, 60, 120, 240, 480, 960, 1000, 1000]
    assert ItemBackoff().delay(10_000) == 1000


def test_a_key_added_twice_is_handed_out_once(queue: WorkQueue) -> None:
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert [queue.get(), queue.get()] == ["a", "b"]
    assert len(queue) == 0


def test_a_key_added_while_processing_waits_for_done(queue: WorkQueue) -> None:
    queue.add("a")
    assert queue.get() == "a"
    queue.add("a")
    assert len(queue) == 0  # not handed to a second worker meanwhile
    assert not queue.idle()
    queue.done("a")
    assert queue.get() == "a"
    queue.done("a")
    assert queue.idle()


def test_rate_limited_items_come_back_only_when_the_clock_says_so(queue: WorkQueue, clock: ManualClock) -> None:
    assert queue.add_rate_limited("a") == 15
    assert queue.add_rate_limited("a") == 30  # per-item: a second failure waits longer
    assert queue.add_rate_limited("b") == 15  # ...and other items are not slowed down
    assert not queue.idle()
    clock.advance(14)
    assert len(queue) == 0
    clock.advance(1)
    wait_for(lambda: len(queue) == 2, what="a and b due at 15s")
    assert {queue.get(), queue.get()} == {"a", "b"}
    assert queue.num_requeues("a") == 2
    queue.forget("a")
    assert queue.num_requeues("a") == 0
    assert queue.add_rate_limited("a") == 15


def test_get_returns_none_after_shutdown(clock: ManualClock) -> None:
    q = WorkQueue("stop", clock=clock)
    got: list[str | None] = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(5)
    assert got == [None]

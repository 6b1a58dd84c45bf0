"""StorageProbes with calls that block on purpose (an Event nobody sets stands for hung storage)."""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterator

import pytest

from localpv.host.probes import StorageHung, StorageProbes
from tests.conftest import wait_for


@pytest.fixture
def storage() -> Iterator[threading.Event]:
    """Set it and every "hung" call returns (set at teardown, so no thread stays behind)."""
    answers = threading.Event()
    yield answers
    answers.set()


def test_results_and_errors_come_back_in_order(storage: threading.Event) -> None:
    probes = StorageProbes(workers=2, timeout=5)

    def fail() -> int:
        raise OSError(5, "Input/output error")

    out = probes.run_all([("a", lambda: 1), ("b", fail), ("c", lambda: 3)])
    assert out[0] == 1 and out[2] == 3
    assert isinstance(out[1], OSError) and out[1].errno == 5
    with pytest.raises(OSError, match="Input/output error"):
        probes.run("b", fail)


def test_a_hung_call_is_abandoned_at_its_timeout_and_remembered(storage: threading.Event) -> None:
    probes = StorageProbes(workers=1, timeout=0.2)
    started = time.monotonic()
    out = probes.run_all([("hung", storage.wait), ("ok", lambda: "fine")])
    assert time.monotonic() - started < 1.0
    assert isinstance(out[0], StorageHung) and out[0].probed and out[0].timeout == 0.2
    assert out[1] == "fine"  # its thread was replaced: the one worker was stuck
    assert probes.stuck() == 1 and list(probes.hung()) == ["hung"]
    calls = []
    with pytest.raises(StorageHung) as again:
        probes.run("hung", lambda: calls.append(1))
    assert not again.value.probed and calls == []
    storage.set()
    wait_for(lambda: probes.stuck() == 0, timeout=5, what="the stuck call to return")
    assert probes.run("hung", lambda: "answers now") == "answers now"


def test_a_changed_signature_is_probed_again(storage: threading.Event) -> None:
    probes = StorageProbes(workers=1, timeout=0.1)
    mount = ["first mount"]
    with pytest.raises(StorageHung):
        probes.run("p", storage.wait, signature=lambda: mount[0])
    with pytest.raises(StorageHung) as known:
        probes.run("p", lambda: "x", signature=lambda: mount[0])
    assert not known.value.probed
    mount[0] = "another mount"
    assert probes.run("p", lambda: "x", signature=lambda: mount[0]) == "x"


def test_past_the_cap_calls_are_refused_at_once(storage: threading.Event) -> None:
    probes = StorageProbes(workers=1, max_stuck=1, timeout=0.1)
    out = probes.run_all([(f"k{i}", storage.wait) for i in range(3)])
    assert [type(o) for o in out] == [StorageHung] * 3
    assert [o.refused for o in out if isinstance(o, StorageHung)] == [False, False, True]
    started = time.monotonic()
    with pytest.raises(StorageHung) as refused:
        probes.run("other", lambda: 1)
    assert refused.value.refused and time.monotonic() - started < 0.1
    assert probes.stuck() == 2


def test_a_forked_child_gets_a_pool_of_its_own(storage: threading.Event) -> None:
    """The parent's threads do not exist in a forked child (and its lock may be held at the
    fork): the child must still be able to probe, not wait for a worker that is not there."""
    probes = StorageProbes(workers=1, timeout=0.2)
    assert probes.run("warm", lambda: 1) == 1  # the parent now has an idle worker
    with pytest.raises(StorageHung):
        probes.run("hung", storage.wait)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        try:
            os.write(write, b"ok" if probes.run("hung", lambda: 7) == 7 else b"bad")
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready = select.select([read], [], [], 10)[0]
        answer = os.read(read, 10) if ready else b""
    finally:
        os.close(read)
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert answer == b"ok", "the forked child could not probe"

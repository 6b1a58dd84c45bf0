"""Supervised loops: a crash is logged, counted and the loop restarted; a crash loop is a
health problem; stopping is not a crash."""

from __future__ import annotations

import threading

from localpv.supervise import Supervisor, _Loop
from tests.conftest import wait_for


def test_a_crashing_loop_is_restarted_and_counted() -> None:
    runs: list[int] = []
    crashed: list[str] = []
    done = threading.Event()

    def loop() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RecursionError("maximum recursion depth exceeded")
        done.wait()

    sup = Supervisor(on_crash=crashed.append, initial_delay=0.01)
    sup.spawn("config-watch", loop)
    wait_for(lambda: len(runs) == 3, timeout=5, what="third run")
    assert crashed == ["config-watch", "config-watch"] and sup.crashes("config-watch") == 2
    assert sup.problems() == []
    done.set()
    sup.stop()


def test_a_loop_that_keeps_crashing_is_a_health_problem() -> None:
    def loop() -> None:
        raise ValueError("bad input")

    sup = Supervisor(initial_delay=0.001, max_delay=0.001, crash_limit=3)
    sup.spawn("reconcile", loop)
    wait_for(sup.problems, timeout=5, what="crash loop reported")
    [problem] = sup.problems()
    assert "reconcile" in problem and "ValueError: bad input" in problem
    sup.stop()


def test_a_loop_that_returns_while_running_counts_as_a_crash() -> None:
    sup = Supervisor(initial_delay=0.001, max_delay=0.001, crash_limit=2)
    sup.spawn("watcher", lambda: None)
    wait_for(sup.problems, timeout=5, what="returning loop reported")
    assert "the loop returned" in sup.problems()[0]
    sup.stop()


def test_stopping_is_not_a_crash() -> None:
    stop = threading.Event()
    crashed: list[str] = []
    sup = Supervisor(stopping=stop, on_crash=crashed.append)
    thread = sup.spawn("loop", lambda: stop.wait() and None)
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and crashed == [] and sup.problems() == []


def test_a_loop_registered_but_not_started_yet_is_not_dead() -> None:
    """spawn() registers a loop, then starts its thread: a health check in between reported
    "thread ... is not running" for a provisioner that was starting its workers."""
    sup = Supervisor()
    thread = threading.Thread(target=lambda: None, name="worker")
    sup._loops["worker"] = _Loop("worker", thread)  # the state spawn() leaves before start()
    assert sup.problems() == []
    thread.start()
    thread.join()
    assert sup.problems() == ["thread worker is not running"], "once started and gone, it is dead"

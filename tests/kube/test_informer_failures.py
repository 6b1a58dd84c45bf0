"""The informer's list+watch loop under failure, through both transports: 410 relists from
scratch, a permanent error drops the resourceVersion, garbage (a list body or a watch line
that is not what it should be) never kills the thread, and the periodic relist of
``minResyncPeriod``. Backoff runs on a manual clock that the test moves once the informer
waits on it, so no test sleeps through a delay."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localpv.clock import ManualClock
from localpv.kube.api import KubeApi
from localpv.kube.errors import Backoff
from localpv.kube.informer import Informer, jittered_period
from localpv.kube.resources import PERSISTENT_VOLUMES
from localpv_emulator.apiserver import ApiServer, RequestRecord
from tests.conftest import wait_for
from tests.kube.conftest import Connect
from tests.kube.scripted import RecordingClock, Reply, ScriptedServer, Stream, event_line, status_body

#: One virtual second between tries, whatever the count: the test advances past it.
STEADY = Backoff(initial=1.0, maximum=1.0, attempts=1_000_000, jitter=0.0)


def pv(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": f"/tmp/{name}"}}}


def pv_requests(server: ApiServer) -> list[RequestRecord]:
    return [r for r in server.requests.records() if r.resource == "persistentvolumes"]


def verbs(server: ApiServer) -> list[str]:
    return [r.verb for r in pv_requests(server)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def informers() -> Iterator[list[Informer]]:
    started: list[Informer] = []
    yield started
    for informer in started:
        informer.stop()


def run(informers: list[Informer], informer: Informer) -> Informer:
    informers.append(informer)
    informer.start()
    assert informer.wait_synced(10), "the informer never synced"
    return informer


def test_a_410_relists_from_scratch_and_sees_what_it_missed(apiserver: ApiServer, clock: ManualClock,
                                                            informers: list[Informer], connect_to: Connect) -> None:
    apiserver.create(pv("pv-a"))
    informer = run(informers, Informer(KubeApi(connect_to(apiserver.url)), PERSISTENT_VOLUMES, clock=clock,
                                       backoff=STEADY))
    wait_for(lambda: verbs(apiserver) == ["list", "watch"], what="list, then watch")
    first_rv = informer.resource_version
    apiserver.faults.error_rate("watch", 1.0, code=503)
    apiserver.faults.drop_watches()
    wait_for(lambda: len(verbs(apiserver)) == 3, what="a failed re-watch")
    wait_for(lambda: clock.waiters, what="the informer backing off on the manual clock")
    apiserver.create(pv("pv-b"))
    apiserver.faults.forget_history()
    apiserver.faults.reset()
    clock.advance(5)

    wait_for(lambda: informer.get("pv-b") is not None, what="pv-b after the relist")
    wait_for(lambda: len(verbs(apiserver)) == 6, what="the new watch")
    records = pv_requests(apiserver)
    assert [r.verb for r in records] == ["list", "watch", "watch", "watch", "list", "watch"]
    assert f"resourceVersion={first_rv}&" in records[2].query + "&", "a 503 keeps the version"
    assert f"resourceVersion={first_rv}&" in records[3].query + "&", "the resumed watch that gets 410"
    assert "resourceVersion" not in records[4].query, "the relist starts from scratch"
    assert f"resourceVersion={informer.resource_version}&" in records[5].query + "&"
    assert int(informer.resource_version) > int(first_rv)
    assert informer.stats.relists_after_gone == 1


def test_a_permanent_watch_error_drops_the_version_and_relists(apiserver: ApiServer, clock: ManualClock,
                                                               informers: list[Informer], connect_to: Connect) -> None:
    informer = run(informers, Informer(KubeApi(connect_to(apiserver.url)), PERSISTENT_VOLUMES, clock=clock,
                                       backoff=STEADY))
    wait_for(lambda: verbs(apiserver) == ["list", "watch"], what="list, then watch")
    apiserver.faults.error_rate("watch", 1.0, code=403)
    apiserver.faults.drop_watches()
    wait_for(lambda: [(r.verb, r.status) for r in pv_requests(apiserver)][2:] == [("watch", 403)],
             what="the forbidden watch")
    wait_for(lambda: clock.waiters, what="the informer backing off on the manual clock")
    apiserver.faults.reset()
    clock.advance(5)
    wait_for(lambda: len(verbs(apiserver)) >= 5, what="recovery")
    assert verbs(apiserver)[:5] == ["list", "watch", "watch", "list", "watch"], \
        "after a permanent error the informer must not resume from the version it had"
    assert informer.stats.errors == 1


def test_a_garbage_list_body_does_not_kill_the_informer(informers: list[Informer], connect_to: Connect) -> None:
    with ScriptedServer() as srv:
        srv.script(Reply(200, b"<html>502 from a proxy, said with a 200</html>"),
                   Reply(200, {"kind": "PersistentVolumeList", "metadata": {"resourceVersion": "5"},
                               "items": [pv("pv-a")]}),
                   Stream((), hang=True))
        informer = run(informers, Informer(KubeApi(connect_to(srv.url)), PERSISTENT_VOLUMES, clock=RecordingClock(),
                                           backoff=STEADY))
        srv.wait_requests(3)
        assert informer.get("pv-a") is not None
        assert [("watch" if r.watch else "list") for r in srv.requests] == ["list", "list", "watch"]
        assert informer.stats.errors == 1
        assert informer._thread is not None and informer._thread.is_alive()


@pytest.mark.parametrize("line", [b"this is not JSON\n", b"[1, 2]\n", b'{"type": "ADDED", "object": "x"}\n'],
                         ids=["not JSON", "array", "object not a dict"])
def test_a_garbage_watch_line_makes_the_informer_relist(line: bytes, informers: list[Informer],
                                                        connect_to: Connect) -> None:
    def listing(rv: str, *names: str) -> Reply:
        return Reply(200, {"kind": "PersistentVolumeList", "metadata": {"resourceVersion": rv},
                           "items": [pv(n) for n in names]})

    added = {**pv("pv-b"), "metadata": {"name": "pv-b", "resourceVersion": "6"}}
    with ScriptedServer() as srv:
        srv.script(listing("5", "pv-a"), Stream((event_line("ADDED", added), line)),
                   listing("9", "pv-a", "pv-c"), Stream((), hang=True))
        clock = RecordingClock()
        informer = run(informers, Informer(KubeApi(connect_to(srv.url)), PERSISTENT_VOLUMES, clock=clock,
                                           backoff=STEADY))
        requests = srv.wait_requests(4)
        assert [("watch" if r.watch else "list") for r in requests] == ["list", "watch", "list", "watch"], \
            "after a garbage line events may have been lost: relist, do not resume"
        assert requests[1].query["resourceVersion"] == "5" and requests[3].query["resourceVersion"] == "9"
        wait_for(lambda: informer.get("pv-c") is not None, what="the relisted state")
        assert informer.get("pv-b") is None, "the relist replaced what the broken stream had said"
        assert informer.stats.errors == 1 and clock.waits == [1.0], "counted, and backed off"
        assert informer._thread is not None and informer._thread.is_alive()


def test_an_unexpected_exception_is_logged_counted_and_relisted(apiserver: ApiServer, informers: list[Informer],
                                                                caplog: pytest.LogCaptureFixture,
                                                                connect_to: Connect) -> None:
    class Flaky(KubeApi):
        calls = 0

        def list(self, *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("a bug nobody foresaw")
            return super().list(*args, **kwargs)

    apiserver.create(pv("pv-a"))
    clock = RecordingClock()
    informer = run(informers, Informer(Flaky(connect_to(apiserver.url)), PERSISTENT_VOLUMES, clock=clock,
                                       backoff=STEADY))
    assert informer.get("pv-a") is not None and informer.stats.errors == 1 and clock.waits == [1.0]
    assert "a bug nobody foresaw" in caplog.text


def test_a_429_on_the_list_is_waited_out_for_its_retry_after(informers: list[Informer], connect_to: Connect) -> None:
    with ScriptedServer() as srv:
        srv.script(Reply(429, status_body(429, "TooManyRequests"), {"Retry-After": "4"}),
                   Reply(200, {"kind": "PersistentVolumeList", "metadata": {"resourceVersion": "5"}, "items": []}),
                   Stream((), hang=True))
        clock = RecordingClock()
        run(informers, Informer(KubeApi(connect_to(srv.url)), PERSISTENT_VOLUMES, clock=clock, backoff=STEADY))
        assert clock.waits == [4.0]
        assert len(srv.wait_requests(3)) == 3, "one list refused, one list, one watch: no retries stacked inside"


# ---------------------------------------------------------------- periodic relist (minResyncPeriod)


def test_the_resync_period_is_drawn_in_min_to_twice_min() -> None:
    draw = jittered_period(300.0)
    periods = [draw() for _ in range(200)]
    assert all(300.0 <= p < 600.0 for p in periods)
    assert max(periods) - min(periods) > 100, "spread, so that nodes do not relist in lock-step"
    assert jittered_period(0.0) is None


def test_the_informer_relists_once_its_period_is_over(apiserver: ApiServer, clock: ManualClock,
                                                      informers: list[Informer], connect_to: Connect) -> None:
    apiserver.create(pv("pv-a"))
    informer = run(informers, Informer(KubeApi(connect_to(apiserver.url)), PERSISTENT_VOLUMES, clock=clock,
                                       backoff=STEADY, resync_period=lambda: 100.0))
    wait_for(lambda: verbs(apiserver) == ["list", "watch"], what="list, then watch")
    assert "timeoutSeconds=100" in pv_requests(apiserver)[1].query, "the watch ends when the relist is due"
    clock.advance(50)
    apiserver.faults.drop_watches()
    wait_for(lambda: len(verbs(apiserver)) == 3, what="a re-watch")
    assert verbs(apiserver)[2] == "watch", "before the period a dropped watch resumes"
    assert "timeoutSeconds=50" in pv_requests(apiserver)[2].query
    clock.advance(60)
    apiserver.faults.drop_watches()
    wait_for(lambda: len(verbs(apiserver)) == 5, what="relist and watch")
    assert verbs(apiserver)[3:] == ["list", "watch"]
    assert informer.stats.resyncs == 1 and informer.stats.relists_after_gone == 0

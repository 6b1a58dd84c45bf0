"""A good API citizen: one token bucket per process in front of every request KubeApi sends
(each retry too), watches paying only for being (re)opened, and the ``--kube-api-qps`` /
``--kube-api-burst`` options of the long-running commands."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from localpv.cli import cli
from localpv.clock import ManualClock
from localpv.kube.api import KubeApi
from localpv.kube.errors import NO_RETRY, Backoff
from localpv.kube.ratelimit import AGENT_RATE, CONTROLLER_RATE, TokenBucket, rate_limiter
from localpv.kube.resources import CONFIG_MAPS, PERSISTENT_VOLUMES
from localpv.kube.transport import connect
from tests.kube.scripted import RecordingClock, Reply, ScriptedServer, Stream, event_line, status_body

CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}


class Spy:
    """A limiter that only counts."""

    def __init__(self) -> None:
        self.calls = 0

    def acquire(self, stop: threading.Event | None = None) -> float:
        self.calls += 1
        return 0.0


@pytest.fixture
def srv() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


def test_a_burst_passes_at_once_then_requests_are_spaced_by_one_over_qps() -> None:
    bucket = TokenBucket(2.0, 3, clock=ManualClock())
    assert [bucket.reserve() for _ in range(6)] == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5]


def test_tokens_refill_with_time_but_never_beyond_the_burst() -> None:
    clock = ManualClock()
    bucket = TokenBucket(2.0, 3, clock=clock)
    for _ in range(3):
        bucket.reserve()
    clock.advance(1.0)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.5]
    clock.advance(3600)
    assert [bucket.reserve() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]


def test_concurrent_callers_each_get_a_slot_of_their_own() -> None:
    bucket = TokenBucket(10.0, 10, clock=ManualClock())  # time stands still: only the bucket decides
    delays: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        mine = [bucket.reserve() for _ in range(25)]
        with lock:
            delays.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(round(d, 6) for d in delays) == [0.0] * 10 + [round(i / 10, 6) for i in range(1, 191)]


def test_acquire_waits_on_the_injected_clock() -> None:
    clock = RecordingClock()
    bucket = TokenBucket(4.0, 1, clock=clock)
    assert [bucket.acquire() for _ in range(3)] == [0.0, 0.25, 0.25]
    assert clock.waits == [0.25, 0.25]


def test_no_limit_when_qps_is_zero() -> None:
    assert rate_limiter(0, 10) is None
    limiter = rate_limiter(20, 30)
    assert isinstance(limiter, TokenBucket) and (limiter.qps, limiter.burst) == (20.0, 30)


def test_every_request_through_kubeapi_waits_for_a_token(srv: ScriptedServer) -> None:
    clock = RecordingClock()
    api = KubeApi(connect(srv.url), clock=clock, limiter=TokenBucket(1.0, 2, clock=clock))
    srv.script(*[Reply(200, CM)] * 5)
    for _ in range(5):
        api.get(CONFIG_MAPS, "x", "default")
    assert clock.waits == [1.0, 1.0, 1.0]


def test_each_retry_takes_a_token(srv: ScriptedServer) -> None:
    spy = Spy()
    api = KubeApi(connect(srv.url), clock=RecordingClock(), limiter=spy,
                  backoff=Backoff(initial=0.01, maximum=0.01, attempts=5, jitter=0.0))
    srv.script(Reply(503, status_body(503, "ServiceUnavailable")), Reply(503, status_body(503, "x")), Reply(200, CM))
    api.get(CONFIG_MAPS, "x", "default")
    assert spy.calls == 3


def test_a_watch_takes_one_token_however_many_events_it_brings(srv: ScriptedServer) -> None:
    spy = Spy()
    api = KubeApi(connect(srv.url), limiter=spy)
    srv.script(Stream(tuple(event_line("ADDED", {"metadata": {"name": f"pv-{i}", "resourceVersion": str(i)}})
                            for i in range(50))))
    assert len(list(api.watch(PERSISTENT_VOLUMES, resource_version="0"))) == 50
    assert spy.calls == 1


def test_an_api_with_another_policy_shares_the_process_limiter(srv: ScriptedServer) -> None:
    api = KubeApi(connect(srv.url), limiter=Spy())
    fast = api.with_policy(backoff=NO_RETRY, timeout=2.0)
    assert fast.limiter is api.limiter and fast.observer is api.observer and fast.transport is api.transport
    assert fast.backoff == NO_RETRY and fast.timeout == 2.0 and api.backoff != NO_RETRY


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize(("command", "rate"), [("agent", AGENT_RATE), ("nfs", CONTROLLER_RATE),
                                               ("node-cleanup", CONTROLLER_RATE)])
def test_the_long_running_commands_take_qps_and_burst(command: str, rate: Any) -> None:
    text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).output
    assert "--kube-api-qps" in text and "--kube-api-burst" in text
    assert f"[default: {rate.qps};" in text.split("--kube-api-qps")[1].split("--")[0]
    assert f"[default: {rate.burst};" in text.split("--kube-api-burst")[1].split("--")[0]
    assert CONTROLLER_RATE.qps == 20 and CONTROLLER_RATE.burst == 30


def test_node_cleanup_builds_its_api_with_the_limiter_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                            srv: ScriptedServer) -> None:
    import localpv.kube.client as kube_client
    from localpv.nodecleanup import app as nodecleanup_app

    seen: list[KubeApi] = []

    monkeypatch.setattr(kube_client, "make_api_client", lambda *a, **k: connect(srv.url))
    monkeypatch.setattr(nodecleanup_app, "NodeCleanupController", _controller_that_records(seen))
    result = CliRunner().invoke(cli, ["node-cleanup", "--listen-address", ""],
                                env={"LOCALPV_KUBE_API_QPS": "7.5", "LOCALPV_KUBE_API_BURST": "11"})
    assert result.exit_code == 1 and "stub: stop here" in result.output
    limiter = seen[0].limiter
    assert isinstance(limiter, TokenBucket) and (limiter.qps, limiter.burst) == (7.5, 11)


def test_events_get_a_budget_of_their_own(srv: ScriptedServer) -> None:
    main, own = TokenBucket(5.0, 10), TokenBucket(1.0, 5)
    api = KubeApi(connect(srv.url), limiter=main, event_limiter=own)
    events = api.for_events()
    assert events.limiter is own and api.limiter is main
    for _ in range(5):
        events.limiter.reserve()  # a burst of warnings ...
    assert main.reserve() == 0.0  # ... leaves the volume actions' budget untouched
    # Without an event budget (tests that build a KubeApi by hand): a sibling at the same rate.
    sibling = KubeApi(connect(srv.url), limiter=main).for_events().limiter
    assert isinstance(sibling, TokenBucket) and sibling is not main and (sibling.qps, sibling.burst) == (5.0, 10)
    assert KubeApi(connect(srv.url)).for_events().limiter is None


def test_a_process_sends_at_most_its_rate_plus_a_small_event_share(monkeypatch: pytest.MonkeyPatch,
                                                                  srv: ScriptedServer) -> None:
    """Issue 19: events had their own bucket at the full API rate, so a process sent up to
    twice what its flags advertise (96 requests within a second at 20/30). Now their budget
    is a small share, set by --event-qps / --event-burst (the kubelet's names)."""
    import localpv.kube.client as kube_client
    from localpv.kube.ratelimit import AGENT_EVENT_RATE, AGENT_RATE, CONTROLLER_EVENT_RATE, CONTROLLER_RATE
    from localpv.nodecleanup import app as nodecleanup_app

    assert CONTROLLER_EVENT_RATE.qps <= CONTROLLER_RATE.qps / 5 and AGENT_EVENT_RATE.qps <= AGENT_RATE.qps / 5
    seen: list[KubeApi] = []

    monkeypatch.setattr(kube_client, "make_api_client", lambda *a, **k: connect(srv.url))
    monkeypatch.setattr(nodecleanup_app, "NodeCleanupController", _controller_that_records(seen))
    for env, expected in (({}, (CONTROLLER_EVENT_RATE.qps, CONTROLLER_EVENT_RATE.burst)),
                          ({"LOCALPV_EVENT_QPS": "0.5", "LOCALPV_EVENT_BURST": "3"}, (0.5, 3))):
        seen.clear()
        result = CliRunner().invoke(cli, ["node-cleanup", "--listen-address", ""], env=env)
        assert result.exit_code == 1 and "stub: stop here" in result.output
        limiter = seen[0].for_events().limiter
        assert isinstance(limiter, TokenBucket) and (limiter.qps, limiter.burst) == expected


def _controller_that_records(seen: list[KubeApi]) -> type:
    """A node-cleanup controller that notes the API it was given and stops the command at start."""
    from localpv.nodecleanup.controller import NodeCleanupError

    class Recorder:
        def __init__(self, api: KubeApi, *args: Any, **kwargs: Any) -> None:
            seen.append(api)

        def start(self) -> None:
            raise NodeCleanupError("stub: stop here")

        def stop(self) -> None:
            pass

        def ready(self) -> tuple[bool, str]:
            return False, "stub"

        def healthy(self) -> tuple[bool, str]:
            return True, "stub"

    return Recorder

"""What every failure of a request becomes, and whether it is retried: the kube layer is a
closed boundary (only :class:`ApiError` subclasses leave it), and the one place requests
are retried. Every test runs through both transports (localpv's own and the kubernetes
package's: the ``connect_to`` fixture), over real HTTP. Backoff waits go through an
injected clock, so nothing here sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localpv.kube import errors
from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, Backoff
from localpv.kube.resources import CONFIG_MAPS, PERSISTENT_VOLUMES
from localpv_emulator.apiserver import ApiServer
from tests.kube.conftest import Connect
from tests.kube.kubeconfigs import TOKEN
from tests.kube.scripted import (
    Answer,
    Close,
    Hang,
    RecordingClock,
    Reply,
    Reset,
    ScriptedServer,
    Stream,
    event_line,
    status_body,
)

ATTEMPTS = 3
FAST = Backoff(initial=0.01, maximum=30.0, attempts=ATTEMPTS, jitter=0.0)
CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default",
                                                              "resourceVersion": "1"}}


@pytest.fixture
def srv() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


@pytest.fixture
def clock() -> RecordingClock:
    return RecordingClock()


Seen = list[tuple[str, str, "ApiError | None"]]


@pytest.fixture
def seen() -> Seen:
    return []


@pytest.fixture
def api(srv: ScriptedServer, clock: RecordingClock, seen: Seen, connect_to: Connect) -> KubeApi:
    def observe(verb: str, resource: str, seconds: float, error: ApiError | None) -> None:
        seen.append((verb, resource, error))

    return KubeApi(connect_to(srv.url), backoff=FAST, clock=clock, timeout=0.5, observer=observe)


def error(code: int, reason: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(code, status_body(code, reason), headers or {})


#: (what the server does, the class that must leave KubeApi, whether it is retried)
TABLE: list[tuple[str, Answer, str, bool]] = [
    ("400", error(400, "BadRequest"), "Permanent", False),
    ("401", error(401, "Unauthorized"), "Permanent", False),
    ("403", error(403, "Forbidden"), "Permanent", False),
    ("404", error(404, "NotFound"), "NotFound", False),
    ("409 conflict", error(409, "Conflict"), "Conflict", False),
    ("409 exists", error(409, "AlreadyExists"), "AlreadyExists", False),
    ("410", error(410, "Expired"), "Gone", False),
    ("422", error(422, "Invalid"), "Permanent", False),
    ("429", error(429, "TooManyRequests"), "Retryable", True),
    ("500", error(500, "InternalError"), "Retryable", True),
    ("502 html", Reply(502, b"<html><body>Bad Gateway</body></html>"), "Retryable", True),
    ("503", error(503, "ServiceUnavailable"), "Retryable", True),
    ("504", error(504, "Timeout"), "Retryable", True),
    ("connection reset", Reset(), "Retryable", True),
    ("timeout", Hang(), "Retryable", True),
    ("body cut short", Reply(200, b'{"kind": "ConfigMap", "metad', truncate=True), "Retryable", True),
    ("garbage 200 body", Reply(200, b"<html>login page</html>"), "BadResponse", True),
    ("JSON array body", Reply(200, b"[1, 2, 3]"), "BadResponse", True),
    ("JSON string body", Reply(200, b'"ok"'), "BadResponse", True),
]


@pytest.mark.parametrize(("answer", "cls", "retried"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_each_failure_has_one_class_and_one_retry_decision(srv: ScriptedServer, api: KubeApi, clock: RecordingClock,
                                                           answer: Answer, cls: str, retried: bool) -> None:
    srv.script(*[answer] * ATTEMPTS)
    with pytest.raises(ApiError) as caught:
        api.get(CONFIG_MAPS, "x", "default")
    assert type(caught.value) is getattr(errors, cls)
    assert len(srv.requests) == (ATTEMPTS if retried else 1), "one try, or exactly the backoff's attempts"
    assert len(clock.waits) == (ATTEMPTS - 1 if retried else 0)


def test_a_garbage_body_is_counted_as_a_failure_not_ok(srv: ScriptedServer, api: KubeApi, seen: Seen) -> None:
    srv.script(Reply(200, b"<html>proxy</html>"), Reply(200, CM))
    assert api.get(CONFIG_MAPS, "x", "default")["metadata"]["name"] == "x"
    assert [(verb, type(err).__name__) for verb, _, err in seen] == [("get", "BadResponse"), ("get", "NoneType")]


def test_an_undecodable_error_body_keeps_only_an_excerpt(srv: ScriptedServer, api: KubeApi) -> None:
    srv.script(*[Reply(500, b"<html>" + b"x" * 5000 + b"</html>")] * ATTEMPTS)
    with pytest.raises(errors.Retryable) as caught:
        api.get(CONFIG_MAPS, "x", "default")
    assert caught.value.status == 500 and len(str(caught.value)) < 400


def test_a_list_with_items_that_are_not_objects_is_a_bad_response(srv: ScriptedServer, api: KubeApi) -> None:
    srv.script(*[Reply(200, {"kind": "ConfigMapList", "metadata": {}, "items": ["a", 1]})] * ATTEMPTS)
    with pytest.raises(errors.BadResponse):
        api.list(CONFIG_MAPS, "default")


def test_writes_fail_the_same_way(srv: ScriptedServer, api: KubeApi) -> None:
    srv.script(Reset(), error(422, "Invalid"))
    with pytest.raises(errors.Permanent):
        api.create(CONFIG_MAPS, CM)
    assert [r.method for r in srv.requests] == ["POST", "POST"]


# ---------------------------------------------------------------- Retry-After


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_seconds_are_waited_instead_of_the_backoff(srv: ScriptedServer, api: KubeApi,
                                                               clock: RecordingClock, status: int) -> None:
    srv.script(error(status, "TooManyRequests", {"Retry-After": "7"}), Reply(200, CM))
    assert api.get(CONFIG_MAPS, "x", "default")["metadata"]["name"] == "x"
    assert clock.waits == [7.0]


def test_retry_after_beyond_the_backoff_maximum_is_capped(srv: ScriptedServer, clock: RecordingClock,
                                                          connect_to: Connect) -> None:
    api = KubeApi(connect_to(srv.url), backoff=Backoff(initial=0.01, maximum=5.0, attempts=3, jitter=0.0), clock=clock)
    srv.script(error(429, "TooManyRequests", {"Retry-After": "3600"}), Reply(200, CM))
    api.get(CONFIG_MAPS, "x", "default")
    assert clock.waits == [5.0]


def test_the_emulators_429_is_waited_out_for_its_retry_after(apiserver: ApiServer, clock: RecordingClock,
                                                             connect_to: Connect) -> None:
    api = KubeApi(connect_to(apiserver.url), backoff=FAST, clock=clock)
    apiserver.faults.error_rate("create", 1.0, code=429)
    with pytest.raises(errors.Retryable) as caught:
        api.create(CONFIG_MAPS, {**CM, "metadata": {"name": "y", "namespace": "default"}})
    assert caught.value.retry_after == 1.0
    assert clock.waits == [1.0] * (ATTEMPTS - 1)


# ---------------------------------------------------------------- paging


def test_a_list_follows_every_continue_token(apiserver: ApiServer, kube: KubeApi) -> None:
    for i in range(7):
        apiserver.create({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": f"cm-{i}", "namespace": "default", "labels": {"paged": "yes"}}})
    apiserver.requests.clear()
    items, rv = kube.list(CONFIG_MAPS, "default", label_selector="paged=yes", page_size=3)
    assert sorted(i["metadata"]["name"] for i in items) == [f"cm-{i}" for i in range(7)]
    assert all(i["kind"] == "ConfigMap" for i in items) and rv
    lists = [r for r in apiserver.requests.records() if r.verb == "list"]
    assert len(lists) == 3
    assert "continue=" not in lists[0].query and all("continue=" in r.query for r in lists[1:])
    pages = [len(page) for page, _ in kube.list_pages(CONFIG_MAPS, "default", label_selector="paged=yes",
                                                      page_size=3)]
    assert pages == [3, 3, 1]


def test_a_scripted_list_returns_the_items_of_all_pages(srv: ScriptedServer, api: KubeApi) -> None:
    def page(names: list[str], token: str) -> Reply:
        return Reply(200, {"kind": "PersistentVolumeList", "metadata": {"resourceVersion": "9", "continue": token},
                           "items": [{"metadata": {"name": n}} for n in names]})

    srv.script(page(["a", "b"], "t1"), page(["c"], "t2"), page([], ""))
    items, rv = api.list(PERSISTENT_VOLUMES, page_size=2)
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"] and rv == "9"
    assert [r.query.get("continue") for r in srv.requests] == [None, "t1", "t2"]


# ---------------------------------------------------------------- watch streams


@pytest.mark.parametrize("line", [b"not json at all\n", b"[1, 2]\n", b'{"type": "ADDED", "object": "x"}\n',
                                  b'{"type": "ADDED", "object": {"metadata": [1]}}\n'],
                         ids=["not JSON", "array", "object not a dict", "metadata not a dict"])
def test_a_bad_watch_line_raises_bad_response(srv: ScriptedServer, api: KubeApi, line: bytes) -> None:
    good = event_line("ADDED", {"metadata": {"name": "a", "resourceVersion": "2"}})
    srv.script(Stream((good, line, good)))
    stream = api.watch(PERSISTENT_VOLUMES, resource_version="1")
    events: list[Any] = []
    with pytest.raises(errors.BadResponse):
        for event in stream:
            events.append(event)
    assert [e.type for e in events] == ["ADDED"]


def test_a_watch_cut_mid_chunk_raises_a_retryable_error(srv: ScriptedServer, api: KubeApi) -> None:
    srv.script(Reply(200, event_line("ADDED", {"metadata": {"name": "a"}}), truncate=True))
    with pytest.raises(errors.Retryable):
        list(api.watch(PERSISTENT_VOLUMES, resource_version="1"))


def test_a_watch_is_not_retried_here(srv: ScriptedServer, api: KubeApi) -> None:
    srv.script(error(503, "ServiceUnavailable"))
    with pytest.raises(errors.Retryable):
        api.watch(PERSISTENT_VOLUMES, resource_version="1")
    assert len(srv.requests) == 1


# ---------------------------------------------------------------- conflicts


def test_update_reads_and_changes_again_after_a_conflict(srv: ScriptedServer, api: KubeApi) -> None:
    newer = {**CM, "metadata": {**CM["metadata"], "resourceVersion": "2"}}
    srv.script(Reply(200, CM), error(409, "Conflict"), Reply(200, newer), Reply(200, newer))
    seen_versions: list[str] = []

    def label(obj: dict[str, Any]) -> dict[str, Any]:
        seen_versions.append(obj["metadata"]["resourceVersion"])
        obj["metadata"]["labels"] = {"a": "b"}
        return obj

    assert api.update(CONFIG_MAPS, "x", label, "default") is not None
    assert seen_versions == ["1", "2"], "the change is decided again on what was read again"
    assert [r.method for r in srv.requests] == ["GET", "PUT", "GET", "PUT"]


def test_update_writes_nothing_when_nothing_changes_and_gives_up_after_its_attempts(srv: ScriptedServer,
                                                                                    api: KubeApi) -> None:
    srv.script(Reply(200, CM))
    assert api.update(CONFIG_MAPS, "x", lambda obj: None, "default") is None
    assert [r.method for r in srv.requests] == ["GET"]
    srv.script(*[Reply(200, CM), error(409, "Conflict")] * 2)
    with pytest.raises(errors.Conflict):
        api.update(CONFIG_MAPS, "x", lambda obj: obj, "default", attempts=2)
    assert [r.method for r in srv.requests][1:] == ["GET", "PUT", "GET", "PUT"]


# ---------------------------------------------------------------- a pooled connection closed under us


def test_a_request_the_server_never_answered_is_sent_again_at_once(srv: ScriptedServer, api: KubeApi,
                                                                   clock: RecordingClock, seen: Seen) -> None:
    srv.script(Close(), Reply(200, CM))
    assert api.get(CONFIG_MAPS, "x", "default")["metadata"]["name"] == "x"
    assert len(srv.requests) == 2 and clock.waits == [] and [e for _, _, e in seen] == [None]


def test_a_request_is_sent_again_at_once_only_once(srv: ScriptedServer, api: KubeApi, clock: RecordingClock) -> None:
    srv.script(Close(), Close(), Reply(200, CM))
    assert api.get(CONFIG_MAPS, "x", "default")["metadata"]["name"] == "x"
    assert len(srv.requests) == 3 and clock.waits == [0.01], "the second time, the backoff's wait"


def test_a_reset_after_the_request_went_out_waits_for_the_backoff(srv: ScriptedServer, api: KubeApi,
                                                                  clock: RecordingClock) -> None:
    srv.script(Reset(), Reply(200, CM))
    api.get(CONFIG_MAPS, "x", "default")
    assert len(srv.requests) == 2 and clock.waits == [0.01]


# ---------------------------------------------------------------- what every request carries


def test_every_request_carries_the_user_agent_the_token_and_its_body_type(srv: ScriptedServer,
                                                                           connect_to: Connect) -> None:
    api = KubeApi(connect_to(srv.url), user_agent="localpv-test/1")
    srv.script(Reply(200, CM), Reply(201, CM), Reply(200, CM))
    api.get(CONFIG_MAPS, "x", "default")
    api.create(CONFIG_MAPS, CM)
    api.patch(CONFIG_MAPS, "x", [{"op": "add", "path": "/data", "value": {}}], "default", patch_type="json")
    assert [r.headers["user-agent"] for r in srv.requests] == ["localpv-test/1"] * 3
    assert [r.headers["authorization"] for r in srv.requests] == [f"Bearer {TOKEN}"] * 3
    assert [r.headers.get("content-type") for r in srv.requests][1:] == ["application/json",
                                                                          "application/json-patch+json"]

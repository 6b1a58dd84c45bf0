"""Watches through ``kubernetes.watch``: resume, 410 after compaction, bookmarks, timeouts and
selector transitions."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localpv_emulator.apiserver import ApiServer
from tests.emulator.conftest import Collector, configmap, pv

Collect = Callable[..., Collector]


def summary(event: dict[str, object]) -> tuple[str, str]:
    return str(event["type"]), str(event["raw_object"]["metadata"]["name"])  # type: ignore[index]


def raw_lines(core: client.CoreV1Api, **kwargs: object) -> list[dict[str, object]]:
    response = core.list_persistent_volume(watch=True, _preload_content=False, **kwargs)
    try:
        return [json.loads(line) for line in response.read().splitlines() if line.strip()]
    finally:
        response.release_conn()


def test_a_watch_without_version_starts_with_the_current_state(srv: ApiServer, core: client.CoreV1Api,
                                                                collect: Collect) -> None:
    srv.create(pv("pv-a"))
    watch = collect(core.list_persistent_volume)
    assert summary(watch.next()) == ("ADDED", "pv-a")
    srv.create(pv("pv-b"))
    assert summary(watch.until(lambda e: e["raw_object"]["metadata"]["name"] == "pv-b")) == ("ADDED", "pv-b")


def test_a_watch_resumes_from_a_resource_version(srv: ApiServer, core: client.CoreV1Api, collect: Collect) -> None:
    srv.create(configmap("before"))
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    srv.create(configmap("cm", a="1"))
    srv.update({**srv.get("v1", "ConfigMap", "cm", "default"), "data": {"a": "2"}})  # type: ignore[dict-item]
    srv.delete("v1", "ConfigMap", "cm", "default")
    watch = collect(client.CoreV1Api(core.api_client).list_namespaced_config_map, namespace="default",
                    resource_version=rv)
    events = [watch.next() for _ in range(3)]
    assert [summary(e) for e in events] == [("ADDED", "cm"), ("MODIFIED", "cm"), ("DELETED", "cm")]
    versions = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)


def test_resuming_after_compaction_gets_410(srv: ApiServer, core: client.CoreV1Api, collect: Collect) -> None:
    rv = core.list_persistent_volume().metadata.resource_version
    srv.create(pv("pv-a"))
    srv.faults.forget_history()
    lines = raw_lines(core, resource_version=rv)
    assert len(lines) == 1 and lines[0]["type"] == "ERROR"
    status = lines[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")  # type: ignore[index]
    assert "too old resource version" in status["message"]  # type: ignore[index]

    watch = collect(core.list_persistent_volume, resource_version=rv)
    error = watch.end()
    assert isinstance(error, ApiException) and error.status == 410


def test_history_limit_bounds_how_far_back_a_watch_can_resume() -> None:
    with ApiServer(binder=False, history_limit=10) as small:
        core = client.CoreV1Api(small.api_client())
        rv = core.list_namespaced_config_map("default").metadata.resource_version
        for i in range(40):
            small.create(configmap(f"cm-{i}"))
        response = core.list_namespaced_config_map("default", watch=True, resource_version=rv,
                                                   _preload_content=False)
        first = json.loads(response.read().splitlines()[0])
        response.release_conn()
        assert first["type"] == "ERROR" and first["object"]["code"] == 410


def test_bookmarks_carry_only_the_resource_version(srv: ApiServer, core: client.CoreV1Api,
                                                   collect: Collect) -> None:
    rv = core.list_persistent_volume().metadata.resource_version
    lines = raw_lines(core, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=1)
    bookmarks = [line for line in lines if line["type"] == "BOOKMARK"]
    assert bookmarks, "a 0.2 s bookmark interval must produce bookmarks within a second"
    assert bookmarks[0]["object"] == {"kind": "PersistentVolume", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": rv}}
    watch = collect(core.list_persistent_volume, resource_version=rv, allow_watch_bookmarks=True)
    assert watch.next()["type"] == "BOOKMARK"


def test_timeout_seconds_ends_the_stream(core: client.CoreV1Api, collect: Collect) -> None:
    started = time.monotonic()
    watch = collect(core.list_persistent_volume, timeout_seconds=1)
    assert watch.end(timeout=5) is None
    assert 0.9 <= time.monotonic() - started < 4


def test_an_object_leaving_a_label_selection_is_deleted_for_that_watcher(
        srv: ApiServer, core: client.CoreV1Api, collect: Collect) -> None:
    srv.create(pv("pv-a", labels={"node": "n1"}))
    srv.settle()
    watch = collect(core.list_persistent_volume, label_selector="node=n1")
    assert summary(watch.next()) == ("ADDED", "pv-a")
    core.patch_persistent_volume("pv-a", {"metadata": {"labels": {"node": None}}})
    gone = watch.next()
    assert summary(gone) == ("DELETED", "pv-a")
    assert gone["raw_object"]["metadata"]["labels"] == {"node": "n1"}  # the last state it matched in
    core.patch_persistent_volume("pv-a", {"metadata": {"labels": {"node": "n1"}}})
    assert summary(watch.next()) == ("ADDED", "pv-a")
    srv.create(pv("pv-other", labels={"node": "n2"}))
    core.delete_persistent_volume("pv-a")
    assert summary(watch.next()) == ("DELETED", "pv-a")  # pv-other never shows up


def test_field_selected_and_namespaced_watches(srv: ApiServer, core: client.CoreV1Api, collect: Collect) -> None:
    srv.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    by_name = collect(core.list_namespaced_config_map, namespace="default", resource_version=rv,
                      field_selector="metadata.name=wanted")
    everywhere = collect(core.list_config_map_for_all_namespaces, resource_version=rv)
    srv.create(configmap("other"))
    srv.create(configmap("wanted", "team"))
    srv.create(configmap("wanted"))
    assert [e["raw_object"]["metadata"]["namespace"] for e in (by_name.next(),)] == ["default"]
    assert [summary(everywhere.next()) for _ in range(3)] == [("ADDED", "other"), ("ADDED", "wanted"),
                                                              ("ADDED", "wanted")]


def test_watch_errors_before_streaming_are_plain_http_errors(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.list_persistent_volume(watch=True, field_selector="spec.nothing=1", _preload_content=False)
    assert exc.value.status == 400


@pytest.mark.parametrize("end", ["drop", "timeout"])
def test_a_watch_that_ends_cleanly_leaves_its_connection_usable(srv: ApiServer, end: str) -> None:
    """kube-apiserver ends a watch (timeout, or its watch cache's restart) with the last chunk
    and keeps the connection alive; the client pools it and sends its next request on it.
    A server that closes the connection instead must announce it with ``Connection: close``,
    or that next request meets a closed socket."""
    srv.create(pv("pv-a"))
    srv.settle()  # the binder's phase write would be one more event on the watch (CI saw it)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        timeout = "&timeoutSeconds=1" if end == "timeout" else ""
        conn.request("GET", f"/api/v1/persistentvolumes?watch=true{timeout}")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Transfer-Encoding") == "chunked"
        assert json.loads(resp.readline())["type"] == "ADDED"
        if end == "drop":
            srv.faults.drop_watches()
        assert resp.read() == b""  # up to the terminating chunk: a clean end
        assert not resp.will_close, "a cleanly ended watch keeps the connection alive, as the real server does"
        conn.request("GET", "/version")
        again = conn.getresponse()
        assert again.status == 200 and json.loads(again.read())["gitVersion"]
    finally:
        conn.close()


def test_an_abruptly_cut_watch_closes_its_connection(srv: ApiServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request("GET", "/api/v1/persistentvolumes?watch=true")
        resp = conn.getresponse()
        srv.create(pv("pv-a"))
        assert json.loads(resp.readline())["type"] == "ADDED"
        srv.faults.drop_watches(abrupt=True)
        with pytest.raises(http.client.IncompleteRead):  # no terminating chunk: the body is cut
            resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize(("error", "printed"), [(BrokenPipeError, False), (ConnectionResetError, False),
                                                (ValueError, True)])
def test_a_client_gone_mid_answer_prints_no_traceback(error: type[Exception], printed: bool,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILLed clients (the campaigns kill agents) filled stderr with BrokenPipe tracebacks;
    a real error in the emulator must still print one."""
    from localpv_emulator.apiserver import ApiServer
    from localpv_emulator.apiserver.httpserver import EmulatorHTTPServer

    httpd = EmulatorHTTPServer(("127.0.0.1", 0), ApiServer())
    try:
        try:
            raise error("gone")
        except Exception:
            httpd.handle_error(None, ("127.0.0.1", 1))
    finally:
        httpd.server_close()
    assert ("Traceback" in capsys.readouterr().err) is printed


def test_the_request_log_counts_the_bytes_each_list_and_watch_sent(srv: ApiServer, core: client.CoreV1Api) -> None:
    """What a client's list and watch cost it, for the benchmarks: the bodies as they went out
    (a watch: each event's line), per verb and resource."""
    srv.create(pv("pv-a"))
    srv.create(pv("pv-b", labels={"keep": "yes"}))
    listed = core.list_persistent_volume(_preload_content=False)
    body = listed.read()
    listed.release_conn()
    assert srv.requests.bytes_sent("list", "persistentvolumes") == len(body)
    response = core.list_persistent_volume(watch=True, _preload_content=False, timeout_seconds=1,
                                           label_selector="keep=yes")
    try:
        lines = [line for line in response.read().splitlines() if line.strip()]
    finally:
        response.release_conn()
    assert [json.loads(line)["object"]["metadata"]["name"] for line in lines] == ["pv-b"]
    assert srv.requests.bytes_sent("watch", "persistentvolumes") == sum(len(line) + 1 for line in lines)
    assert srv.requests.bytes_sent("watch", "configmaps") == 0

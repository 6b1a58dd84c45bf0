"""Fault injection, the request log and restarts, each observed through the real client."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client import ApiException

from localpv_emulator.apiserver import ApiServer, LostResponse
from tests.emulator.conftest import Collector, configmap, pv

Collect = Callable[..., Collector]


def test_error_rate_fails_that_verb_only(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.faults.error_rate("list", 1.0, code=503)
    with pytest.raises(ApiException) as exc:
        core.list_persistent_volume()
    assert exc.value.status == 503 and json.loads(exc.value.body)["kind"] == "Status"
    core.create_persistent_volume(pv("pv-a"))  # other verbs are fine
    srv.faults.error_rate("list", 0.0)
    core.list_persistent_volume()


def test_a_partial_error_rate_is_seedable(srv: ApiServer, core: client.CoreV1Api) -> None:
    def failures() -> list[bool]:
        srv.faults.seed(42)
        outcome = []
        for _ in range(40):
            try:
                core.read_namespace("default")
                outcome.append(False)
            except ApiException:
                outcome.append(True)
        return outcome

    srv.faults.error_rate("get", 0.5)
    first = failures()
    assert 5 < sum(first) < 35
    assert failures() == first


def test_429_comes_with_retry_after(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.faults.error_rate("create", 1.0, code=429)
    with pytest.raises(ApiException) as exc:
        core.create_persistent_volume(pv("pv-a"))
    assert exc.value.status == 429
    assert exc.value.headers["Retry-After"] == "1"
    assert json.loads(exc.value.body)["reason"] == "TooManyRequests"


def test_latency_is_added_to_every_request(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.faults.latency(0.2)
    started = time.monotonic()
    core.read_namespace("default")
    assert time.monotonic() - started >= 0.2
    srv.faults.reset()
    started = time.monotonic()
    core.read_namespace("default")
    assert time.monotonic() - started < 0.2


def test_a_conflict_storm_fails_updates_and_patches(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.create(configmap("cm"))
    srv.faults.conflict_storm(1.0)
    with pytest.raises(ApiException) as exc:
        core.patch_namespaced_config_map("cm", "default", {"data": {"a": "1"}})
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "Conflict"
    core.read_namespaced_config_map("cm", "default")
    srv.faults.conflict_storm(0.0)
    core.patch_namespaced_config_map("cm", "default", {"data": {"a": "1"}})


def test_drop_watches_ends_every_open_stream(srv: ApiServer, core: client.CoreV1Api, collect: Collect) -> None:
    srv.create(pv("pv-a"))
    watch = collect(core.list_persistent_volume, timeout_seconds=30)
    assert watch.next()["type"] == "ADDED"
    srv.faults.drop_watches()
    assert watch.end() is None  # a clean end of the stream, as after a server-side timeout


def test_the_client_watch_resumes_after_a_drop(srv: ApiServer, core: client.CoreV1Api, collect: Collect) -> None:
    srv.create(pv("pv-a"))
    watch = collect(core.list_persistent_volume)  # no timeout: the client reconnects by itself
    assert watch.next()["type"] == "ADDED"
    srv.faults.drop_watches()
    srv.create(pv("pv-b"))
    assert watch.until(lambda e: e["raw_object"]["metadata"]["name"] == "pv-b")["type"] == "ADDED"
    assert srv.requests.count("watch", "persistentvolumes") == 2


def test_an_abrupt_drop_breaks_the_connection(srv: ApiServer, core: client.CoreV1Api, collect: Collect) -> None:
    watch = collect(core.list_persistent_volume, timeout_seconds=30)
    srv.create(pv("pv-a"))
    watch.next()
    srv.faults.drop_watches(abrupt=True)
    error = watch.end()
    assert isinstance(error, urllib3.exceptions.HTTPError)


def test_the_request_log_counts_calls_per_verb_and_resource(srv: ApiServer, core: client.CoreV1Api) -> None:
    srv.requests.clear()
    core.create_persistent_volume(pv("pv-a"))
    core.list_persistent_volume()
    core.list_persistent_volume(label_selector="a=b")
    with pytest.raises(ApiException):
        core.read_persistent_volume("absent")
    assert srv.requests.count("list", "persistentvolumes") == 2
    assert srv.requests.count(resource="persistentvolumes", status=404) == 1
    assert srv.requests.counts()[("create", "persistentvolumes")] == 1
    last = srv.requests.records()[-1]
    assert (last.method, last.path, last.status, last.name) == ("GET", "/api/v1/persistentvolumes/absent", 404,
                                                                "absent")
    assert "labelSelector=a%3Db" in srv.requests.records()[-2].query


def test_restart_keeps_state_and_port_and_cuts_watches(srv: ApiServer, core: client.CoreV1Api,
                                                       collect: Collect) -> None:
    srv.create(pv("pv-a"))
    port = srv.port
    watch = collect(core.list_persistent_volume, timeout_seconds=30)
    watch.next()
    srv.restart()
    assert srv.port == port
    assert isinstance(watch.end(), Exception)
    assert [p.metadata.name for p in core.list_persistent_volume().items] == ["pv-a"]
    core.create_persistent_volume(pv("pv-b"))
    srv.settle()
    assert srv.get("v1", "PersistentVolume", "pv-b") is not None


def test_a_stopped_server_refuses_connections() -> None:
    with ApiServer(binder=False) as other:
        url = other.url
    http = urllib3.PoolManager(retries=False)
    with pytest.raises(urllib3.exceptions.HTTPError):
        http.request("GET", url + "/version", timeout=2)


def _raw(srv: ApiServer, method: str, path: str, body: Any = None,
         content_type: str = "application/json") -> urllib3.BaseHTTPResponse:
    """One request, no retries: what the server answered, or the transport error it caused."""
    pool = urllib3.PoolManager(retries=False, timeout=5)
    data = None if body is None else json.dumps(body).encode()
    return pool.request(method, srv.url + path, body=data, headers={"Content-Type": content_type})


@pytest.mark.parametrize(("how", "seen"), [("reset", ConnectionResetError),
                                           ("close", http.client.RemoteDisconnected)])
def test_a_lost_create_is_committed_but_never_answered(srv: ApiServer, core: client.CoreV1Api, collect: Collect,
                                                       how: LostResponse, seen: type[Exception]) -> None:
    watch = collect(core.list_persistent_volume, timeout_seconds=30)
    srv.faults.lose_responses("create", 1.0, how=how)
    with pytest.raises(urllib3.exceptions.ProtocolError) as exc:
        _raw(srv, "POST", "/api/v1/persistentvolumes", pv("pv-a"))
    assert isinstance(exc.value.args[1], seen)
    assert srv.get("v1", "PersistentVolume", "pv-a") is not None  # committed ...
    event = watch.next()
    assert (event["type"], event["raw_object"]["metadata"]["name"]) == ("ADDED", "pv-a")  # ... and seen
    [record] = [r for r in srv.requests.records() if r.verb == "create"]
    assert (record.resource, record.status, record.lost) == ("persistentvolumes", 201, True)
    # The retry fails (nothing is committed), so its answer arrives: the create had happened.
    again = _raw(srv, "POST", "/api/v1/persistentvolumes", pv("pv-a"))
    assert again.status == 409 and json.loads(again.data)["reason"] == "AlreadyExists"


def test_a_lost_delete_is_committed_and_its_retry_gets_not_found(srv: ApiServer) -> None:
    srv.create(pv("pv-a"))
    srv.faults.lose_responses("delete", 1.0)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        _raw(srv, "DELETE", "/api/v1/persistentvolumes/pv-a")
    assert srv.get("v1", "PersistentVolume", "pv-a") is None
    assert _raw(srv, "DELETE", "/api/v1/persistentvolumes/pv-a").status == 404


def test_a_lost_update_is_committed_and_its_retry_conflicts(srv: ApiServer) -> None:
    stored = srv.create(configmap("cm", a="1"))
    srv.faults.lose_responses("update", 1.0)
    stored["data"] = {"a": "2"}
    path = "/api/v1/namespaces/default/configmaps/cm"
    with pytest.raises(urllib3.exceptions.ProtocolError):
        _raw(srv, "PUT", path, stored)
    assert srv.get("v1", "ConfigMap", "cm", "default")["data"] == {"a": "2"}  # type: ignore[index]
    assert _raw(srv, "PUT", path, stored).status == 409  # the resourceVersion it was based on is gone


def test_lost_responses_spare_other_resources_failed_writes_dry_runs_and_reads(srv: ApiServer) -> None:
    srv.faults.lose_responses("create", 1.0, resource="persistentvolumes")
    srv.faults.lose_responses("patch", 1.0)
    assert _raw(srv, "POST", "/api/v1/namespaces/default/configmaps", configmap("cm")).status == 201
    assert _raw(srv, "POST", "/api/v1/persistentvolumes?dryRun=All", pv("pv-a")).status == 201
    assert _raw(srv, "POST", "/api/v1/persistentvolumes", {**pv("pv-a"), "spec": {}}).status == 422
    assert _raw(srv, "GET", "/api/v1/persistentvolumes").status == 200
    assert srv.get("v1", "PersistentVolume", "pv-a") is None
    srv.faults.lose_responses("create", 0.0, resource="persistentvolumes")
    assert _raw(srv, "POST", "/api/v1/persistentvolumes", pv("pv-a")).status == 201
    label = {"metadata": {"labels": {"a": "b"}}}
    merge = "application/merge-patch+json"
    assert _raw(srv, "PATCH", "/api/v1/persistentvolumes/absent", label, merge).status == 404
    srv.faults.reset()
    assert _raw(srv, "PATCH", "/api/v1/persistentvolumes/pv-a", label, merge).status == 200
    assert not any(r.lost for r in srv.requests.records())


def test_lost_responses_take_only_write_verbs_and_known_ways() -> None:
    with ApiServer(binder=False) as server:
        with pytest.raises(ValueError, match="verb"):
            server.faults.lose_responses("get", 1.0)
        with pytest.raises(ValueError, match="how"):
            server.faults.lose_responses("create", 1.0, how="drop")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="rate"):
            server.faults.lose_responses("create", 1.5)

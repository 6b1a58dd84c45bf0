"""Fault injection, the request log and restarts, each observed through the real client."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import urllib3
from kubernetes import client
from kubernetes.client import ApiException

from localpv.testing.apiserver import ApiServer
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

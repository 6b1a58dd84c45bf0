"""Fixtures for the emulator's own tests: a fresh server per test, the real client on it,
object builders, a deadline-bounded ``wait_for`` and a watch collected on a thread."""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from localpv_emulator.apiserver import ApiServer
from tests.conftest import require_tools, wait_for

Obj = dict[str, Any]

KUBECTL = shutil.which("kubectl")

__all__ = ["wait_for"]  # re-exported: the emulator tests import it from here


@pytest.fixture
def srv() -> Iterator[ApiServer]:
    """A fresh emulator with the binder, on a free loopback port."""
    server = ApiServer(binder=True, bookmark_interval=0.2, seed=7)
    server.start()
    try:
        yield server
    finally:
        server.stop()
    assert server.controller_failures == []


@pytest.fixture
def api(srv: ApiServer) -> Iterator[client.ApiClient]:
    api_client = srv.api_client()
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def storage(api: client.ApiClient) -> client.StorageV1Api:
    return client.StorageV1Api(api)


# ---------------------------------------------------------------- object builders


def pv(name: str, size: str = "1Gi", *, cls: str = "", modes: tuple[str, ...] = ("ReadWriteOnce",),
       labels: dict[str, str] | None = None, node: str | None = None, mode: str | None = None,
       claim: tuple[str, str] | None = None, reclaim: str | None = None) -> Obj:
    """A PersistentVolume (hostPath, or local with node affinity when ``node`` is given)."""
    spec: Obj = {"capacity": {"storage": size}, "accessModes": list(modes), "storageClassName": cls}
    if node:
        spec["local"] = {"path": f"/mnt/{name}"}
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}
    else:
        spec["hostPath"] = {"path": f"/tmp/{name}"}
    if mode:
        spec["volumeMode"] = mode
    if claim:
        spec["claimRef"] = {"namespace": claim[0], "name": claim[1]}
    if reclaim:
        spec["persistentVolumeReclaimPolicy"] = reclaim
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def pvc(name: str, size: str = "1Gi", *, cls: str | None = "", modes: tuple[str, ...] = ("ReadWriteOnce",),
        namespace: str = "default", selected_node: str | None = None, mode: str | None = None,
        selector: Obj | None = None, volume: str | None = None) -> Obj:
    spec: Obj = {"accessModes": list(modes), "resources": {"requests": {"storage": size}}}
    if cls is not None:
        spec["storageClassName"] = cls
    if mode:
        spec["volumeMode"] = mode
    if selector:
        spec["selector"] = selector
    if volume:
        spec["volumeName"] = volume
    meta: Obj = {"name": name, "namespace": namespace}
    if selected_node:
        meta["annotations"] = {"volume.kubernetes.io/selected-node": selected_node}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def storage_class(name: str, provisioner: str = "kubernetes.io/no-provisioner", *,
                  wffc: bool = False, default: bool = False) -> Obj:
    meta: Obj = {"name": name}
    if default:
        meta["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta,
            "provisioner": provisioner,
            "volumeBindingMode": "WaitForFirstConsumer" if wffc else "Immediate"}


def node(name: str, labels: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}}


def configmap(name: str, namespace: str = "default", **data: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": dict(data)}


def phase(srv: ApiServer, kind: str, name: str, namespace: str | None = None) -> str | None:
    obj = srv.get("v1", kind, name, namespace)
    return None if obj is None else (obj.get("status") or {}).get("phase")


# ---------------------------------------------------------------- watching on a thread


class Collector:
    """Runs ``kubernetes.watch.Watch().stream(...)`` on a thread and queues what it yields.

    The outcome of the stream (normal end or exception) is queued too, so a test can wait for
    "the next event" or "the end" with a deadline instead of sleeping.
    """

    END = "END"

    def __init__(self, func: Callable[..., Any], **kwargs: Any) -> None:
        self.watch = watch.Watch()
        self.items: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.thread = threading.Thread(target=self._run, args=(func, kwargs), daemon=True)
        self.thread.start()

    def _run(self, func: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        try:
            for event in self.watch.stream(func, **kwargs):
                self.items.put(("event", event))
            self.items.put((self.END, None))
        except Exception as exc:  # the test inspects it
            self.items.put((self.END, exc))

    def next(self, timeout: float = 5.0) -> Obj:
        """The next event (fails the test on timeout or if the stream ended instead)."""
        try:
            kind, value = self.items.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no watch event within {timeout}s")
        if kind == self.END:
            pytest.fail(f"the watch ended instead of yielding an event: {value!r}")
        return value  # type: ignore[no-any-return]

    def until(self, predicate: Callable[[Obj], bool], timeout: float = 5.0) -> Obj:
        """Skip events until one satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.next(max(0.01, deadline - time.monotonic()))
            if predicate(event):
                return event

    def end(self, timeout: float = 5.0) -> BaseException | None:
        """Wait for the stream to finish; returns the exception it raised, if any."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                kind, value = self.items.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the watch did not end within {timeout}s")
            if kind == self.END:
                return value  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.watch.stop()


@pytest.fixture
def collect() -> Iterator[Callable[..., Collector]]:
    """Start watches that are stopped when the test ends."""
    started: list[Collector] = []

    def start(func: Callable[..., Any], **kwargs: Any) -> Collector:
        collector = Collector(func, **kwargs)
        started.append(collector)
        return collector

    yield start
    for collector in started:
        collector.stop()


# ---------------------------------------------------------------- kubectl


Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


def kubectl_for(server: ApiServer, directory: Path) -> Kubectl:
    """A kubectl runner bound to ``server`` (skips the test where kubectl is not installed)."""
    require_tools("kubectl")
    config = server.write_kubeconfig(directory / f"kubeconfig-{server.port}")

    def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(config), *args], input=stdin,
                                capture_output=True, text=True, timeout=30, check=False)
        if check and result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    return run


@pytest.fixture
def kubectl(srv: ApiServer, tmp_path: Path) -> Kubectl:
    """The real kubectl against the emulator (the dispatcher picks the build for /version)."""
    return kubectl_for(srv, tmp_path)

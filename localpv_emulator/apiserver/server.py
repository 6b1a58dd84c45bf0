"""The facade: :class:`ApiServer` ties the store, controllers, faults and HTTP together."""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from localpv_emulator.apiserver.controllers import ClusterView, GarbageCollector, JobCompleter, finish_job
from localpv_emulator.apiserver.dispatcher import Dispatcher
from localpv_emulator.apiserver.faults import Faults
from localpv_emulator.apiserver.httpserver import EmulatorHTTPServer
from localpv_emulator.apiserver.requestlog import RequestLog
from localpv_emulator.apiserver.resources import (
    CAPACITY_VERSIONS,
    CAPACITY_VERSIONS_ENV,
    KUBE_VERSION,
    NAMESPACES,
    Obj,
    ResourceType,
    resource_for,
)
from localpv_emulator.apiserver.store import DeleteOptions, Store
from localpv_emulator.binder import PVBinder, Reconciler

_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class ApiServer:
    """The emulator: a store, its controllers and an HTTP server on a daemon thread.

    Direct methods (:meth:`create`, :meth:`get`, ...) bypass HTTP but not the rules: they
    validate, bump resourceVersions and feed watches exactly like requests, and return
    copies. Every method is thread-safe.

    ``honor_pv_reclaim_policy`` is the feature gate ``HonorPVReclaimPolicy`` of the PV
    controller (on by default from 1.31, the release the emulator answers as; off: as before
    1.31, or a cluster that turned it off): see :class:`~localpv_emulator.binder.PVBinder`.
    """

    def __init__(
        self,
        binder: bool = True,
        job_completer: bool = False,
        history_limit: int = 1000,
        *,
        bookmark_interval: float = 1.0,
        seed: int | None = None,
        kube_version: str = KUBE_VERSION,
        honor_pv_reclaim_policy: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        capacity_versions: Iterable[str] | None = None,
    ) -> None:
        #: The versions of storage.k8s.io CSIStorageCapacity served (routing and discovery):
        #: ``capacity_versions``, else the environment's ``LOCALPV_EMULATOR_CAPACITY_VERSIONS``
        #: (comma-separated; empty or ``none``: none), else v1 as 1.24 and later serve it. Objects
        #: of each version are stored apart (the real server stores one object served at every
        #: version; a client uses one version, so no test sees the difference).
        self.capacity_versions = capacity_version_switch(capacity_versions)
        self.store = Store(history_limit)
        self.faults = Faults(self, seed)
        self.requests = RequestLog()
        self.dispatcher = Dispatcher(self)
        self.bookmark_interval = bookmark_interval
        self.kube_version = kube_version.lstrip("v")
        #: decides the outcome of each Job when the Job completer runs: True, False or None (running)
        self.job_outcome: Callable[[Obj], bool | None] = lambda job: True
        self.watch_epoch = 0
        self.abrupt_cut = False
        self._host, self._port = host, port
        self._denials: list[tuple[str, str, str, str | None, str]] = []
        self._httpd: EmulatorHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lifecycle = threading.Lock()
        self._controllers: list[Reconciler] = [GarbageCollector(self.store)]
        if binder:
            self._controllers.append(PVBinder(ClusterView(self.store),
                                              honor_pv_reclaim_policy=honor_pv_reclaim_policy))
        if job_completer:
            self._controllers.append(JobCompleter(self.store, self._job_outcome))
        for name in _SYSTEM_NAMESPACES:
            self.store.create(NAMESPACES, None, {"metadata": {"name": name}})

    # -- lifecycle

    @property
    def port(self) -> int:
        """The bound port (0 before the first start when none was asked for)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: plain HTTP, no credentials (clients need none)."""
        return f"http://{self._host}:{self._port}"

    def start(self) -> ApiServer:
        """Bind (port 0 picks a free one) and serve on a daemon thread; start the controllers."""
        with self._lifecycle:
            if self._httpd is not None:
                return self
            for controller in self._controllers:
                controller.start()
            self._serve()
        return self

    def _serve(self) -> None:
        self._httpd = EmulatorHTTPServer((self._host, self._port), self)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"emulator-http-{self._port}", daemon=True)
        self._thread.start()

    def _shutdown_http(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self.end_watches(abrupt=True)
        self._httpd.cut_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd, self._thread = None, None

    def stop(self) -> None:
        """Stop serving and stop the controllers (state stays readable through the methods)."""
        with self._lifecycle:
            self._shutdown_http()
            for controller in self._controllers:
                controller.stop()

    def restart(self) -> None:
        """Stop HTTP and serve again on the same port with the state kept; connections are cut."""
        with self._lifecycle:
            self._shutdown_http()
            self._serve()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def end_watches(self, abrupt: bool) -> None:
        """End every open watch (used by stop/restart and :meth:`Faults.drop_watches`)."""
        with self.store.changed:
            self.abrupt_cut = abrupt
            self.watch_epoch += 1
            self.store.changed.notify_all()

    def settle(self, timeout: float = 5.0) -> None:
        """Wait until every controller has reacted to the current state (TimeoutError if not)."""
        deadline = time.monotonic() + timeout
        with self.store.changed:
            while not all(c.idle() for c in self._controllers):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the emulator's controllers did not settle")
                self.store.changed.wait(min(remaining, 0.05))

    def serves(self, rt: ResourceType) -> bool:
        """Whether requests and discovery see ``rt`` (its version switched on)."""
        return rt.kind != "CSIStorageCapacity" or rt.version in self.capacity_versions

    @property
    def controller_failures(self) -> list[str]:
        """Exceptions raised by controller passes (an emulator bug; tests should assert none)."""
        return [f"{c.name}: {failure}" for c in self._controllers for failure in c.failures]

    def version_info(self) -> Obj:
        """The ``/version`` document (kubectl's dispatcher picks its kubectl from it)."""
        major, minor = self.kube_version.split(".")[:2]
        return {"major": major, "minor": minor, "gitVersion": f"v{self.kube_version}", "gitCommit": "emulator",
                "gitTreeState": "clean", "buildDate": "2024-08-13T07:28:49Z", "goVersion": "go1.22.5",
                "compiler": "gc", "platform": "linux/amd64"}

    # -- clients

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig for this server (no credentials); usable by kubectl and the client."""
        name = "localpv-emulator"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": self.url}}],
            "users": [{"name": name, "user": {}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
            "current-context": name,
        }
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(config, indent=2) + "\n")
        return target

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this server (the import happens here, lazily)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    # -- direct store access

    @staticmethod
    def _locate(obj: Obj) -> tuple[ResourceType, str | None, str]:
        rt = resource_for(str(obj.get("apiVersion")), str(obj.get("kind")))
        meta = obj.get("metadata") or {}
        namespace = (meta.get("namespace") or "default") if rt.namespaced else None
        return rt, namespace, str(meta.get("name") or "")

    def create(self, obj: Obj) -> Obj:
        """Create like a POST (a namespaced object without namespace goes to ``default``)."""
        rt, namespace, _ = self._locate(obj)
        return copy.deepcopy(self.store.create(rt, namespace, obj))

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        """A copy of the object, or None (no 404: tests poll for absence with it)."""
        rt = resource_for(api_version, kind)
        obj = self.store.peek(rt, namespace if rt.namespaced else None, name)
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        """Objects with kind/apiVersion (unlike HTTP list items), in key order."""
        return copy.deepcopy(self.store.items(resource_for(api_version, kind), namespace))

    def update(self, obj: Obj, subresource: str | None = None) -> Obj:
        """Update like a PUT; ``subresource="status"`` writes only status, as ``/status`` does."""
        rt, namespace, name = self._locate(obj)
        return copy.deepcopy(self.store.update(rt, namespace, name, obj, subresource))

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation_policy: str | None = None,
    ) -> Obj:
        """Delete like a DELETE; returns the object (marked for deletion when finalizers hold it)."""
        rt = resource_for(api_version, kind)
        obj, _ = self.store.delete(rt, namespace if rt.namespaced else None, name,
                                   DeleteOptions(propagation=propagation_policy))
        return copy.deepcopy(obj)

    def _job_outcome(self, job: Obj) -> bool | None:
        return self.job_outcome(job)  # looked up per call: tests may replace job_outcome any time

    def complete_job(self, namespace: str, name: str, succeeded: bool = True) -> Obj:
        """Mark a Job Complete or Failed, with the status the Job controller would write."""
        return copy.deepcopy(finish_job(self.store, namespace, name, succeeded))

    # -- authorization

    def deny(self, verb: str, resource: str, *, group: str = "", namespace: str | None = None,
             subresource: str = "") -> None:
        """Refuse a verb on a resource ("*" matches anything): requests get 403 Forbidden and
        SelfSubjectAccessReviews answer not allowed. ``namespace=None`` means every namespace."""
        with self._lifecycle:
            self._denials.append((verb, group, resource, namespace, subresource))

    def allow_all(self) -> None:
        """Remove every denial."""
        with self._lifecycle:
            self._denials.clear()

    def is_allowed(self, verb: str, group: str, resource: str, namespace: str | None, subresource: str = "") -> bool:
        """What authorization answers for a request or a SelfSubjectAccessReview."""
        def hit(pattern: str | None, value: str | None) -> bool:
            return pattern is None or pattern in ("*", value or "")

        with self._lifecycle:
            return not any(
                hit(v, verb) and hit(g, group) and hit(r, resource) and hit(n, namespace) and hit(s, subresource)
                for v, g, r, n, s in self._denials
            )


def capacity_version_switch(versions: Iterable[str] | None) -> frozenset[str]:
    """The CSIStorageCapacity versions to serve: as given, else from the environment, else v1.
    An unknown version is a ValueError naming the known ones."""
    if versions is None:
        raw = os.environ.get(CAPACITY_VERSIONS_ENV)
        versions = ["v1"] if raw is None else [v.strip() for v in raw.split(",") if v.strip() not in ("", "none")]
    chosen = frozenset(versions)
    unknown = sorted(chosen - set(CAPACITY_VERSIONS))
    if unknown:
        raise ValueError(f"CSIStorageCapacity versions: expected some of {', '.join(CAPACITY_VERSIONS)}, "
                         f"got {', '.join(unknown)}")
    return chosen

"""The real cluster, the node's host and Helm, for the end-to-end tests (see docs/e2e.md).

Everything goes through the real API server (the project's ``KubeApi`` over the
``kubernetes`` client, and real Helm from helm-sdkpy), and through real mounts on the host
of ``LOCALPV_E2E_NODE``: the suite must run as root on that host.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from localpv.kube.api import KubeApi
from localpv.kube.client import make_api_client
from localpv.kube.errors import NotFound
from localpv.kube.resources import (
    EVENTS,
    JOBS,
    NAMESPACES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
    Resource,
)
from tests.conftest import wait_for as _wait_for

T = TypeVar("T")
Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "localpv"
RUNNER = REPO / "tests" / "helm" / "helm_runner.py"
DAEMON_SETS = Resource("apps", "v1", "daemonsets", "DaemonSet", True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", True)

ENV_VARS = {
    "LOCALPV_E2E_KUBECONFIG": "kubeconfig of the cluster (admin: the suite installs the chart, makes namespaces)",
    "LOCALPV_E2E_IMAGE": "the localpv image, already on the nodes (pods use imagePullPolicy IfNotPresent)",
    "LOCALPV_E2E_NODE": "the node whose host this process runs on (the suite mounts tmpfs volumes there)",
}


def missing_environment() -> str | None:
    """Why the suite cannot run here, or None."""
    missing = [name for name in ENV_VARS if not os.environ.get(name)]
    if missing:
        return (f"e2e: needs a real cluster; set {', '.join(missing)} "
                "(see docs/e2e.md)")
    if os.geteuid() != 0:
        return "e2e: must run as root on the node's host (it mounts tmpfs volumes there)"
    return None


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.25) -> T:
    """The suite-wide wait (tests/conftest.py), with the e2e suite's coarser poll interval."""
    return _wait_for(predicate, timeout=timeout, interval=interval, what=what)  # type: ignore[arg-type]


def run(*cmd: str) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class HostDirs:
    """A discovery directory on the node's host, set up for HostToContainer propagation,
    with tmpfs volumes mounted in it; and a state dir for the agent's journal."""

    root: Path
    disks: Path = field(init=False)
    state: Path = field(init=False)

    def __post_init__(self) -> None:
        self.disks = self.root / "disks"
        self.state = self.root / "state"

    def create(self) -> None:
        self.disks.mkdir(parents=True)
        self.state.mkdir()
        # All mounts may be private on the host (no systemd): the DaemonSet's
        # HostToContainer mount needs the discovery dir on a shared mount.
        run("mount", "--bind", str(self.disks), str(self.disks))
        run("mount", "--make-rshared", str(self.disks))

    def mount_volume(self, name: str, size: str = "16m") -> Path:
        path = self.disks / name
        path.mkdir()
        run("mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", f"localpv-e2e-{name}", str(path))
        return path

    def destroy(self) -> None:
        if self.disks.exists():
            subprocess.run(["umount", "-R", str(self.disks)], capture_output=True, timeout=60, check=False)
            mounts = Path("/proc/self/mounts").read_text()
            if f" {self.disks}" in mounts:
                subprocess.run(["umount", "-R", "-l", str(self.disks)], capture_output=True, timeout=60, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


class Cluster:
    """The cluster named by the environment: API access, Helm, and waiting for things."""

    def __init__(self) -> None:
        self.kubeconfig = os.environ["LOCALPV_E2E_KUBECONFIG"]
        self.image = os.environ["LOCALPV_E2E_IMAGE"]
        self.node = os.environ["LOCALPV_E2E_NODE"]
        self.audit_log = os.environ.get("LOCALPV_E2E_AUDIT_LOG") or None
        self.workdir = Path(os.environ.get("LOCALPV_E2E_WORKDIR") or "/var/tmp/localpv-e2e")
        self.api = KubeApi(make_api_client(self.kubeconfig))
        self._client: Any = None
        node = self.api.get(NODES, self.node)
        self.hostname = str(node["metadata"]["labels"].get("kubernetes.io/hostname") or self.node)

    # -- Helm (helm-sdkpy in its own environment, its default Secret driver)

    def helm(self, helm_python: Path, actions: list[Obj]) -> list[Obj]:
        home = self.workdir / "helm"
        env = dict(os.environ, HELM_CACHE_HOME=str(home / "cache"), HELM_CONFIG_HOME=str(home / "config"),
                   HELM_DATA_HOME=str(home / "data"))
        env.pop("HELM_DRIVER", None)
        for action in actions:
            action.setdefault("kubeconfig", self.kubeconfig)
        proc = subprocess.run([str(helm_python), str(RUNNER), "--real-cluster"], input=json.dumps(actions),
                              capture_output=True, text=True, env=env, timeout=600, check=False)
        assert proc.returncode == 0, f"helm runner exited {proc.returncode}: {proc.stderr[-3000:]}"
        outcomes: list[Obj] = json.loads(proc.stdout)
        return outcomes

    def install(self, helm_python: Path, release: str, namespace: str, values: Obj, chart: Path = CHART) -> Obj:
        [outcome] = self.helm(helm_python, [{"op": "install", "release": release, "namespace": namespace,
                                             "chart": str(chart), "values": values}])
        assert outcome["ok"], f"helm install {release} failed: {outcome['error']}"
        return dict(outcome["result"])

    def upgrade(self, helm_python: Path, release: str, namespace: str, values: Obj, chart: Path = CHART) -> Obj:
        """``helm upgrade`` (the release's values replaced by ``values``), without waiting."""
        [outcome] = self.helm(helm_python, [{"op": "upgrade", "release": release, "namespace": namespace,
                                             "chart": str(chart), "values": values}])
        assert outcome["ok"], f"helm upgrade {release} failed: {outcome['error']}"
        return dict(outcome["result"])

    def uninstall(self, helm_python: Path, release: str, namespace: str) -> None:
        self.helm(helm_python, [{"op": "uninstall", "release": release, "namespace": namespace}])

    # -- objects

    def create(self, res: Resource, obj: Obj, namespace: str | None = None) -> Obj:
        return self.api.create(res, obj, namespace)

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return self.api.get(res, name, namespace)
        except NotFound:
            return None

    def list(self, res: Resource, namespace: str | None = None, **selectors: str) -> list[Obj]:
        return self.api.list(res, namespace, **selectors)[0]

    def delete(self, res: Resource, name: str, namespace: str | None = None, **options: Any) -> None:
        with contextlib.suppress(NotFound):
            self.api.delete(res, name, namespace, **options)

    @property
    def client(self) -> Any:
        """The kubernetes package's ApiClient, for what KubeApi does not do (logs, exec, the
        node proxy: not JSON objects)."""
        if self._client is None:
            from kubernetes import config

            self._client = config.new_client_from_config(config_file=self.kubeconfig)
        return self._client

    def pod_log(self, name: str, namespace: str, container: str | None = None) -> str:
        """The pod's log. A kubelet that cannot open the log file answers 200 with its error as
        the text (1.20: "failed to try resolving symlinks in path ..."): that is raised, never
        returned, or a check that the log holds no refused request would pass on it."""
        from kubernetes import client

        text = str(client.CoreV1Api(self.client).read_namespaced_pod_log(name, namespace, container=container))
        if _UNREADABLE_LOG.match(text):
            raise AssertionError(f"the log of pod {namespace}/{name} could not be read: {text.strip()}")
        return text

    def exec(self, pod: str, namespace: str, command: list[str]) -> str:
        """Run a command in a pod (kubectl exec); its stdout and stderr."""
        from kubernetes import client
        from kubernetes.stream import stream

        core = client.CoreV1Api(self.client)
        return str(stream(core.connect_get_namespaced_pod_exec, pod, namespace, command=command,
                          stdout=True, stderr=True, stdin=False, tty=False, _request_timeout=120))

    def force_delete_pod(self, name: str, namespace: str) -> None:
        """Delete a pod at once (grace period 0): for a pod whose node is gone, no kubelet will
        ever confirm a graceful deletion (``kubectl delete --force --grace-period=0``)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            client.CoreV1Api(self.client).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as err:
            if err.status != 404:
                raise

    def events(self, namespace: str) -> list[Obj]:
        return self.list(EVENTS, namespace)

    # -- the suite's objects

    def new_namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name

    def storage_class(self, name: str) -> None:
        self.create(STORAGE_CLASSES, {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                      "metadata": {"name": name}, "provisioner": "kubernetes.io/no-provisioner",
                                      "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"})

    def pv_for(self, path: Path) -> Obj | None:
        found = [pv for pv in self.list(PERSISTENT_VOLUMES)
                 if (pv["spec"].get("local") or {}).get("path") == str(path)]
        assert len(found) <= 1, f"several PVs for {path}: {[p['metadata']['name'] for p in found]}"
        return found[0] if found else None

    def available_pv(self, path: Path, timeout: float = 60, not_uid: str | None = None) -> Obj:
        def check() -> Obj | None:
            pv = self.pv_for(path)
            if pv and (pv.get("status") or {}).get("phase") == "Available" and pv["metadata"]["uid"] != not_uid:
                return pv
            return None
        return wait_for(check, timeout, f"an Available PV for {path}" + (" (a new one)" if not_uid else ""))

    def claim(self, namespace: str, name: str, storage_class: str, volume_name: str | None = None) -> None:
        spec: Obj = {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Mi"}}}
        if volume_name:
            spec["volumeName"] = volume_name
        self.create(PERSISTENT_VOLUME_CLAIMS, {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                               "metadata": {"name": name}, "spec": spec}, namespace)

    def run_pod(self, namespace: str, name: str, claim: str, script: str, timeout: float = 120,
                fs_group: int | None = None) -> tuple[str, str]:
        """Run ``script`` in a pod with the claim at /data; (phase when it ended, its log).
        ``fs_group``: the pod's fsGroup, which the kubelet gives a CSI volume's files to."""
        self.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "restartPolicy": "Never",
            **({"securityContext": {"fsGroup": fs_group}} if fs_group is not None else {}),
            "nodeSelector": {"kubernetes.io/hostname": self.hostname},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "work", "image": self.image, "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", script],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}}, namespace)

        def ended() -> str | None:
            pod = self.get(PODS, name, namespace) or {}
            phase = (pod.get("status") or {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_for(ended, timeout, f"pod {namespace}/{name} to finish")
        return phase, self.pod_log(name, namespace)

    def delete_workload_pods(self, namespace: str, timeout: float = 90) -> None:
        """Delete every pod of the namespace but the release's own (those with an
        ``app.kubernetes.io/component`` label: agents, provisioners; a fixture's teardown needs
        them running to release volumes), all at once, and wait until they are gone."""
        def workload() -> list[str]:
            return [str(p["metadata"]["name"]) for p in self.list(PODS, namespace)
                    if not (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component")]

        for name in workload():
            self.delete(PODS, name, namespace)
        wait_for(lambda: not workload() or None, timeout, f"the workload pods of {namespace} to be gone")

    def delete_and_wait(self, res: Resource, name: str, namespace: str | None = None, timeout: float = 60) -> None:
        self.delete(res, name, namespace)
        wait_for(lambda: self.get(res, name, namespace) is None, timeout, f"{res.kind} {name} to be gone")

    def agent_pod(self, namespace: str, timeout: float = 120) -> Obj:
        """The agent pod on our node, once it is Ready."""
        def ready() -> Obj | None:
            for pod in self.list(PODS, namespace, label_selector="app.kubernetes.io/component=agent"):
                if pod["spec"].get("nodeName") != self.node:
                    continue
                conditions = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
                if conditions.get("Ready") == "True":
                    return pod
            return None
        return wait_for(ready, timeout, f"a Ready agent pod on {self.node} in {namespace}", interval=0.5)

    def ready_pods(self, namespace: str, component: str, timeout: float = 120) -> list[Obj]:
        def ready() -> list[Obj] | None:
            pods = self.list(PODS, namespace, label_selector=f"app.kubernetes.io/component={component}")
            ok = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in (p.get("status") or {}).get("conditions") or [])]
            return ok or None
        return wait_for(ready, timeout, f"a Ready {component} pod in {namespace}", interval=0.5)

    def wait_job_seen(self, namespace: str, name: str, timeout: float = 60) -> Obj:
        return wait_for(lambda: self.get(JOBS, name, namespace), timeout, f"cleanup Job {namespace}/{name}",
                        interval=0.1)

    # -- RBAC and request audit

    def audit_entries(self, namespace: str) -> list[Obj]:
        """Audit log entries of requests made by the release's service accounts (realk8s
        writes one line per request; empty when LOCALPV_E2E_AUDIT_LOG is not set)."""
        if not self.audit_log:
            return []
        prefix = f"system:serviceaccount:{namespace}:"
        out = []
        with open(self.audit_log, encoding="utf-8") as f:
            for line in f:
                if prefix not in line:
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if str((entry.get("user") or {}).get("username", "")).startswith(prefix):
                    out.append(entry)
        return out

    def forbidden(self, namespace: str) -> list[str]:
        """Every request the release's components were refused (403), from the audit log."""
        return [f"{e['user']['username']} {e['verb']} {e['requestURI']}"
                for e in self.audit_entries(namespace) if (e.get("responseStatus") or {}).get("code") == 403]

    def deletes_of(self, namespace: str, pv_name: str) -> list[Obj]:
        """DELETE requests for one PV made by the release's service accounts (audit log)."""
        return [e for e in self.audit_entries(namespace) if e.get("verb") == "delete"
                and (e.get("objectRef") or {}).get("resource") == "persistentvolumes"
                and (e.get("objectRef") or {}).get("name") == pv_name]


_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
_REFUSED = re.compile(r"\b403\b|forbidden", re.IGNORECASE)


#: The text a kubelet answers instead of a log whose file is gone.
_UNREADABLE_LOG = re.compile(r"failed to try resolving symlinks in path \"/var/log/pods/")


def forbidden_in_log(text: str) -> list[str]:
    """Log lines that report a refused request. The timestamp is left out of the match:
    its milliseconds are a 403 one time in a thousand."""
    return [line for line in text.splitlines() if _REFUSED.search(_LOG_PREFIX.sub("", line))]

"""The chart's RBAC is enough: the agent and the NFS provisioner, run through a whole
volume lifecycle against the emulator, make no request their service account's roles
(as the chart installs them) would refuse.

The emulator authorizes by a deny list, so the check is done on its request log: each
request (verb, API group, resource, namespace) must match a rule of a Role bound in that
namespace or of a ClusterRole bound cluster-wide to the component's service account.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localpv.agent.journal import Journal
from localpv.agent.node import AgentOptions, NodeAgent
from localpv.claimlabeller.app import LabellerOptions, LabellerReplica
from localpv.claimlabeller.controller import LabellerSettings
from localpv.config import parse_config, read_config_data
from localpv.csi.capacity import Room
from localpv.csi.publisher import CapacityPublisher, CapacitySettings
from localpv.kube.api import KubeApi
from localpv.kube.errors import Backoff
from localpv.kube.finalizers import EXTERNAL_PROVISIONER_FINALIZER
from localpv.kube.transport import connect
from localpv.naming import MiB
from localpv.nfs.app import NfsOptions, NfsReplica
from localpv.nfs.controller import ControllerSettings
from localpv.nfs.provisioner import NfsSource
from localpv.nodecleanup.controller import NodeCleanupController, NodeCleanupOptions, parse_class_names
from localpv_emulator.apiserver import ApiServer, RequestRecord
from localpv_emulator.binder import PVBinder
from localpv_emulator.objects import claim, node
from tests.conftest import wait_for
from tests.helm.chart import NAMESPACE, Install, helm_runs, load_values
from tests.nfs.conftest import records, volume_entries
from tests.support.hostfs import LoopDevices, Mounter

Obj = dict[str, Any]
NODE = "node-1"
TAINT = "sig-storage-local-static-provisioner/agent-not-ready"
FAST = Backoff(initial=0.05, maximum=0.2, attempts=20, jitter=0.0)

AGENT_VALUES: dict[str, Any] = {
    "useJobForCleaning": True, "removeNodeNotReadyTaint": True,
    "classes": [{"name": "local-fs", "hostDir": "/mnt/local-fs", "storageClass": True},
                {"name": "local-block", "hostDir": "/mnt/local-block", "volumeMode": "Block",
                 "blockCleanerCommand": ["/scripts/quick_reset.sh"], "storageClass": True}],
}
NFS_VALUES: dict[str, Any] = {"nfs": {"server": "nfs.example.com", "path": "/exports"},
                              "storageClass": {"onDelete": "delete"}}
CLEANUP_VALUES: dict[str, Any] = {"nodeCleanup": {"enabled": True, "storageClassNames": ["local-fs", "dyn"]},
                                  "classes": [{"name": "local-fs", "hostDir": "/mnt/local-fs"}],
                                  "dynamic": {"pools": [{"name": "p", "hostDir": "/mnt/p"}],
                                              "classes": [{"name": "dyn", "pool": "p"}]}}


@pytest.fixture(scope="module")
def charts(helm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Install]]:
    done = {"agent": Install(AGENT_VALUES), "nfs": Install(NFS_VALUES), "node-cleanup": Install(CLEANUP_VALUES),
            "dynamic": Install(load_values("dynamic-values.yaml"))}
    with helm_runs(helm_python, done, tmp_path_factory.mktemp("helm")) as installs:
        for name, inst in installs.items():
            assert inst.error is None, f"{name}: {inst.error}"
        yield installs


@dataclass(frozen=True)
class Grant:
    rule: Obj
    namespace: str | None  # None: cluster-wide (ClusterRoleBinding)

    def allows(self, record: RequestRecord) -> bool:
        group = _group(record.path)
        resource = record.resource + (f"/{record.subresource}" if record.subresource else "")
        names = self.rule.get("resourceNames")
        return (record.verb in self.rule["verbs"] and group in self.rule["apiGroups"]
                and resource in self.rule["resources"]
                and (self.namespace is None or record.namespace == self.namespace)
                and (not names or record.name in names))


def _group(path: str) -> str:
    parts = path.split("/")
    return parts[2] if parts[1] == "apis" else ""


def grants_for(inst: Install, service_account: str) -> list[Grant]:
    def bound(binding: Obj) -> bool:
        return any(s["kind"] == "ServiceAccount" and s["name"] == service_account and s["namespace"] == NAMESPACE
                   for s in binding.get("subjects") or [])

    grants = []
    for binding in inst.server.list("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"):
        if bound(binding):
            role = inst.one("rbac.authorization.k8s.io/v1", "ClusterRole", binding["roleRef"]["name"])
            grants += [Grant(rule, None) for rule in role["rules"]]
    for binding in inst.server.list("rbac.authorization.k8s.io/v1", "RoleBinding", NAMESPACE):
        if bound(binding):
            [role] = [r for r in inst.server.list("rbac.authorization.k8s.io/v1", "Role", NAMESPACE)
                      if r["metadata"]["name"] == binding["roleRef"]["name"]]
            grants += [Grant(rule, NAMESPACE) for rule in role["rules"]]
    return grants


def refused(server: ApiServer, grants: list[Grant]) -> list[str]:
    """Requests of the component that no grant allows (discovery is open to everyone)."""
    api_requests = [r for r in server.requests if r.verb != "discovery"]
    assert api_requests, "the component made no request at all"
    return sorted({f"{r.verb} {r.method} {r.path}" for r in api_requests if not any(g.allows(r) for g in grants)})


def test_the_grant_matcher_refuses_what_no_rule_allows() -> None:
    rule = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}
    create = RequestRecord("POST", "/apis/batch/v1/namespaces/a/jobs", "", 201, "create", "jobs", "a", None, None)
    assert Grant(rule, "a").allows(create) and Grant(rule, None).allows(create)
    assert not Grant(rule, "b").allows(create)
    delete = RequestRecord("DELETE", "/apis/batch/v1/namespaces/a/jobs/x", "", 200, "delete", "jobs", "a", "x", None)
    assert not Grant(rule, None).allows(delete)
    core = RequestRecord("POST", "/api/v1/namespaces/a/jobs", "", 201, "create", "jobs", "a", None, None)
    assert not Grant(rule, None).allows(core)
    one = {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}
    kube_system = RequestRecord("GET", "/api/v1/namespaces/kube-system", "", 200, "get", "namespaces", None,
                                "kube-system", None)
    assert Grant(one, None).allows(kube_system)
    other = RequestRecord("GET", "/api/v1/namespaces/default", "", 200, "get", "namespaces", None, "default", None)
    assert not Grant(one, None).allows(other)


def _agent_config(inst: Install, fs_dir: Path, block_dir: Path, tmp_path: Path) -> Any:
    """The chart's ConfigMap, with the classes' container directories moved under the test dir."""
    cm_dir = tmp_path / "config"
    cm_dir.mkdir()
    for key, value in inst.one("v1", "ConfigMap")["data"].items():
        (cm_dir / key).write_text(value)
    data = read_config_data(cm_dir)
    data["storageClassMap"]["local-fs"]["mountDir"] = str(fs_dir)
    data["storageClassMap"]["local-block"]["mountDir"] = str(block_dir)
    return parse_config(data).config


def _phase(server: ApiServer, host_path: str) -> tuple[str, str] | None:
    for pv in server.list("v1", "PersistentVolume"):
        if pv["spec"].get("local", {}).get("path") == host_path:
            return str(pv["metadata"]["uid"]), str((pv.get("status") or {}).get("phase"))
    return None


def _cycle(server: ApiServer, host_path: str, sc: str, mode: str, on_released: Any = None) -> None:
    """Available -> claimed -> Bound -> claim deleted -> cleaned -> Available again (new PV)."""
    first = wait_for(lambda: (p := _phase(server, host_path)) and p[1] == "Available" and p, what=f"{host_path} PV")
    server.create(claim(f"c-{sc}", sc, mode=mode, namespace=NAMESPACE, selected_node=NODE))
    wait_for(lambda: (p := _phase(server, host_path)) and p[1] == "Bound", what=f"{host_path} Bound")
    server.delete("v1", "PersistentVolumeClaim", f"c-{sc}", NAMESPACE)
    if on_released is not None:
        on_released()
    wait_for(lambda: (p := _phase(server, host_path)) and p[0] != first[0] and p[1] == "Available", timeout=15,
             what=f"{host_path} cleaned and offered again")


@pytest.mark.root
def test_agent_lifecycle_needs_nothing_beyond_the_charts_rbac(
        charts: dict[str, Install], tmp_path: Path, mounter: Mounter, loops: LoopDevices) -> None:
    inst = charts["agent"]
    sa = inst.one("apps/v1", "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    fs_dir, block_dir = tmp_path / "fs", tmp_path / "block"
    block_dir.mkdir()
    mounter.tmpfs(fs_dir / "vol1")
    (block_dir / "disk1").symlink_to(loops.attach().path)
    server = ApiServer(binder=True).start()
    try:
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        tainted = node(NODE)
        tainted["spec"] = {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}
        server.create(tainted)
        for sc in inst.server.list("storage.k8s.io/v1", "StorageClass"):  # the chart's own classes
            server.create({k: v for k, v in sc.items() if k != "metadata"} | {"metadata": {
                "name": sc["metadata"]["name"]}})
        server.requests.clear()
        options = AgentOptions(node_name=NODE, namespace=NAMESPACE, job_image="localpv:test", discovery_period=0.2,
                               config_sync_period=0.2, retry_backoff=FAST, state_dir=str(tmp_path / "state"))
        os.makedirs(options.state_dir or "", exist_ok=True)
        agent = NodeAgent(KubeApi(connect(server.url), backoff=FAST), options,
                          _agent_config(inst, fs_dir, block_dir, tmp_path),
                          Journal.initialise(str(tmp_path / "state" / "journal.json")))
        agent.start()
        try:
            wait_for(lambda: not (server.get("v1", "Node", NODE) or {}).get("spec", {}).get("taints"),
                     what="startup taint removed")
            _cycle(server, "/mnt/local-fs/vol1", "local-fs", "Filesystem")

            def finish_job() -> None:
                job = wait_for(lambda: server.list("batch/v1", "Job", NAMESPACE), what="cleanup Job")[0]
                server.complete_job(NAMESPACE, job["metadata"]["name"], succeeded=True)

            _cycle(server, "/mnt/local-block/disk1", "local-block", "Block", on_released=finish_job)
        finally:
            agent.stop()
        assert refused(server, grants_for(inst, sa)) == []
        used = {(r.verb, r.resource) for r in server.requests}
        assert {("update", "nodes"), ("create", "jobs"), ("delete", "persistentvolumes")} <= used
    finally:
        server.stop()


@pytest.mark.parametrize("version", ["v1", "v1beta1", "v1alpha1"])
def test_capacity_publishing_needs_nothing_beyond_the_charts_rbac(charts: dict[str, Install], version: str,
                                                                   tmp_path: Path) -> None:
    """The capacity publisher creates, updates and deletes its node's CSIStorageCapacity objects
    (at each version a cluster may serve) with only the chart's grants. Its inputs are data here
    (the pools' room): what it asks of the API is the question."""
    inst = charts["dynamic"]
    sa = inst.one("apps/v1", "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    for key, value in inst.one("v1", "ConfigMap")["data"].items():
        (tmp_path / key).write_text(value)
    config = parse_config(read_config_data(tmp_path)).config
    rooms: dict[str, Room | None] = {"fast": Room(thin=100 * MiB, thick=50 * MiB)}
    server = ApiServer(binder=False, capacity_versions=(version,)).start()
    try:
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        server.create(node(NODE))
        publisher = CapacityPublisher(KubeApi(connect(server.url), backoff=FAST), node_name=NODE,
                                      namespace=NAMESPACE, config=lambda: config, rooms=lambda: rooms,
                                      settings=CapacitySettings(min_interval=0.0))
        kind = f"storage.k8s.io/{version}"
        publisher.run_pass()
        assert {o["capacity"] for o in server.list(kind, "CSIStorageCapacity", NAMESPACE)} == {"100Mi", "50Mi"}
        rooms["fast"] = Room(thin=10 * MiB, thick=0)
        publisher.run_pass()
        assert {o["capacity"] for o in server.list(kind, "CSIStorageCapacity", NAMESPACE)} == {"10Mi", "0"}
        rooms.clear()
        publisher.run_pass()
        assert server.list(kind, "CSIStorageCapacity", NAMESPACE) == []
        used = {(r.verb, r.resource) for r in server.requests}
        assert {("create", "csistoragecapacities"), ("update", "csistoragecapacities"),
                ("delete", "csistoragecapacities"), ("list", "csistoragecapacities")} <= used
        assert refused(server, grants_for(inst, sa)) == []
    finally:
        server.stop()


def test_nfs_lifecycle_needs_nothing_beyond_the_charts_rbac(charts: dict[str, Install], tmp_path: Path) -> None:
    inst = charts["nfs"]
    deploy = inst.one("apps/v1", "Deployment")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    sc = inst.one("storage.k8s.io/v1", "StorageClass")
    export = tmp_path / "export"
    export.mkdir()
    server = ApiServer(binder=True).start()
    try:
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        server.create({k: v for k, v in sc.items() if k != "metadata"} | {"metadata": {"name": sc["metadata"]["name"]}})
        server.requests.clear()
        options = NfsOptions(source=NfsSource(str(env["NFS_SERVER"]), str(env["NFS_PATH"]), str(export), 0o777),
                             controller=ControllerSettings(provisioner_name=str(env["PROVISIONER_NAME"])),
                             leader_election=True, namespace=NAMESPACE)
        replica = NfsReplica(KubeApi(connect(server.url), backoff=FAST), options)
        replica.start()
        try:
            server.create(claim("data", sc["metadata"]["name"], namespace=NAMESPACE, access_modes=("ReadWriteMany",)))
            pv_name = wait_for(lambda: (c := server.get("v1", "PersistentVolumeClaim", "data", NAMESPACE))
                               and c.get("status", {}).get("phase") == "Bound" and c["spec"]["volumeName"],
                               what="claim bound")
            assert volume_entries(export) and records(export)
            # the claimRef of its Bound PV removed by hand: the provisioner puts it back (a patch)
            binder = next(c for c in server._controllers if isinstance(c, PVBinder))
            binder.stop()
            try:
                pv = server.get("v1", "PersistentVolume", str(pv_name))
                assert pv is not None
                pv["spec"].pop("claimRef")
                server.update(pv)
                wait_for(lambda: ((server.get("v1", "PersistentVolume", str(pv_name)) or {}).get("spec") or {})
                         .get("claimRef"), what="the claimRef put back")
            finally:
                binder.start()
            server.delete("v1", "PersistentVolumeClaim", "data", NAMESPACE)
            wait_for(lambda: server.get("v1", "PersistentVolume", str(pv_name)) is None, what="PV deleted")
            assert volume_entries(export) == [] and records(export) == []  # onDelete: delete
        finally:
            replica.stop()
        sa = deploy["spec"]["template"]["spec"]["serviceAccountName"]
        assert refused(server, grants_for(inst, sa)) == []
        assert ("update", "leases") in {(r.verb, r.resource) for r in server.requests} or (
            "create", "leases") in {(r.verb, r.resource) for r in server.requests}
        assert ("get", "namespaces", "kube-system") in {(r.verb, r.resource, r.name) for r in server.requests}
    finally:
        server.stop()


def test_node_cleanup_needs_nothing_beyond_the_charts_rbac(charts: dict[str, Install]) -> None:
    inst = charts["node-cleanup"]
    deploy = inst.one("apps/v1", "Deployment", f"{inst.release}-localpv-node-cleanup")
    args = dict(a.split("=", 1) for a in deploy["spec"]["template"]["spec"]["containers"][0]["args"] if "=" in a)
    server = ApiServer(binder=True).start()
    try:
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        server.create(node("gone-soon"))
        affinity = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gone-soon"]}]}]}}
        server.create({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "local-pv-1"},
                       "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                                "storageClassName": "local-fs", "persistentVolumeReclaimPolicy": "Delete",
                                "local": {"path": "/mnt/local-fs/d1"}, "nodeAffinity": affinity}})
        data = claim("data", "local-fs", namespace=NAMESPACE)
        data["spec"]["volumeName"] = "local-pv-1"
        server.create(data)
        wait_for(lambda: (server.get("v1", "PersistentVolume", "local-pv-1") or {}).get("status", {}).get("phase")
                 == "Bound", what="volume bound")
        # A dynamic volume held by its agent's deletion protection finalizer: that agent went with
        # the node, so node cleanup takes the finalizer off (a patch) once it deletes the PV.
        driver = args["--csi-driver-name"]
        server.create({"apiVersion": "v1", "kind": "PersistentVolume",
                       "metadata": {"name": "pvc-dyn", "finalizers": [EXTERNAL_PROVISIONER_FINALIZER],
                                    "annotations": {"pv.kubernetes.io/provisioned-by": driver}},
                       "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                                "storageClassName": "dyn", "persistentVolumeReclaimPolicy": "Delete",
                                "csi": {"driver": driver, "volumeHandle": "pvc-dyn"}, "nodeAffinity": affinity}})
        dyn = claim("dyn-data", "dyn", namespace=NAMESPACE)
        dyn["spec"]["volumeName"] = "pvc-dyn"
        server.create(dyn)
        wait_for(lambda: (server.get("v1", "PersistentVolume", "pvc-dyn") or {}).get("status", {}).get("phase")
                 == "Bound", what="dynamic volume bound")
        server.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-0", "namespace": NAMESPACE},
                       "spec": {"nodeName": "gone-soon", "containers": [{"name": "db", "image": "db"}],
                                "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}})
        server.requests.clear()
        flags = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--delete-pods" in flags and "--no-out-of-service-taint" in flags  # the chart's defaults
        options = NodeCleanupOptions(parse_class_names(args["--storageclass-names"]), pvc_deletion_delay=0.2,
                                     stale_pv_discovery_interval=0.2, worker_threads=2, sync_timeout=10.0,
                                     driver=args["--csi-driver-name"], delete_pods=True)
        controller = NodeCleanupController(KubeApi(connect(server.url), backoff=FAST), options)
        controller.start()
        try:
            server.delete("v1", "Node", "gone-soon")
            wait_for(lambda: server.get("v1", "PersistentVolume", "local-pv-1") is None, timeout=15,
                     what="claim and volume of the deleted node removed")
            assert server.get("v1", "PersistentVolumeClaim", "data", NAMESPACE) is None
            wait_for(lambda: server.get("v1", "PersistentVolume", "pvc-dyn") is None, timeout=15,
                     what="the dynamic volume of the deleted node removed, not left Terminating")
            wait_for(lambda: server.get("v1", "Pod", "db-0", NAMESPACE) is None, what="its pod on the node removed")
        finally:
            controller.stop()
        sa = deploy["spec"]["template"]["spec"]["serviceAccountName"]
        assert refused(server, grants_for(inst, sa)) == []
        used = {(r.verb, r.resource) for r in server.requests}
        assert {("delete", "persistentvolumeclaims"), ("delete", "persistentvolumes"), ("list", "pods"),
                ("delete", "pods"), ("patch", "persistentvolumes")} <= used
    finally:
        server.stop()


def test_claim_labeller_needs_nothing_beyond_the_charts_rbac(charts: dict[str, Install]) -> None:
    """The labeller, leader-elected as the chart runs it: a claim labelled, relabelled when its
    selected node changes, unlabelled when it goes; every request within its service account's
    roles."""
    inst = charts["dynamic"]
    deploy = next(d for d in inst.server.list("apps/v1", "Deployment", NAMESPACE)
                  if d["metadata"]["name"].endswith("claim-labeller"))
    args = dict(a.split("=", 1) for a in deploy["spec"]["template"]["spec"]["containers"][0]["args"] if "=" in a)
    server = ApiServer(binder=True).start()
    try:
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for sc in inst.server.list("storage.k8s.io/v1", "StorageClass"):  # the chart's own classes
            server.create({k: v for k, v in sc.items() if k != "metadata"} | {"metadata": {
                "name": sc["metadata"]["name"]}})
        dynamic_class = next(sc["metadata"]["name"] for sc in inst.server.list("storage.k8s.io/v1", "StorageClass")
                             if sc["provisioner"] == args["--driver-name"])
        server.requests.clear()
        options = LabellerOptions(LabellerSettings(args["--driver-name"]), leader_election=True, namespace=NAMESPACE)
        replica = LabellerReplica(KubeApi(connect(server.url), backoff=FAST), options)
        replica.start()

        def label() -> str | None:
            found = server.get("v1", "PersistentVolumeClaim", "data", NAMESPACE) or {}
            return (found.get("metadata", {}).get("labels") or {}).get("localpv.dev/node")

        try:
            server.create(claim("data", dynamic_class, namespace=NAMESPACE, selected_node=NODE))
            wait_for(lambda: label() == NODE, what="the claim labelled")
            pvc = server.get("v1", "PersistentVolumeClaim", "data", NAMESPACE)
            assert pvc is not None
            del pvc["metadata"]["annotations"]["volume.kubernetes.io/selected-node"]
            server.update(pvc)
            wait_for(lambda: label() is None, what="the label removed with the annotation")
        finally:
            replica.stop()
        sa = deploy["spec"]["template"]["spec"]["serviceAccountName"]
        assert refused(server, grants_for(inst, sa)) == []
        used = {(r.verb, r.resource) for r in server.requests}
        assert {("patch", "persistentvolumeclaims"), ("watch", "persistentvolumeclaims")} <= used
        assert ("create", "leases") in used or ("update", "leases") in used
    finally:
        server.stop()

"""``localpv node-cleanup`` against the API emulator: Nodes are really deleted, the emulator's
binder really binds and releases, and the 60 s grace runs on a ManualClock that the tests
drive (research/local-static.md §1.11 and the node-cleanup scenarios of §7.2)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from localpv.cli import cli
from localpv.clock import ManualClock
from localpv.httpserver import StatusServer
from localpv.kube.api import KubeApi
from localpv.kube.events import EventRecorder
from localpv.kube.informer import Informer
from localpv.kube.resources import NODES
from localpv.kube.workqueue import ItemBackoff
from localpv.nodecleanup.controller import (
    EVENT_COMPONENT,
    REFERENCED_NODE_DELETED,
    NodeCleanupController,
    NodeCleanupOptions,
)
from localpv.nodecleanup.lookups import NodeCleanupLookups
from localpv.nodecleanup.metrics import NodeCleanupMetrics
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim, node, storage_class
from tests.conftest import wait_for

Obj = dict[str, Any]
HOST = "kubernetes.io/hostname"
NS = "default"


def local_pv(name: str, nodes: tuple[str, ...] = ("n1",), *, sc: str = "local", policy: str = "Delete",
             claim_ref: Obj | None = None, source: str = "local") -> Obj:
    spec: Obj = {
        "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": sc,
        "persistentVolumeReclaimPolicy": policy, source: {"path": f"/mnt/disks/{name}"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOST, "operator": "In", "values": list(nodes)}]}]}},
    }
    if claim_ref:
        spec["claimRef"] = claim_ref
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


@dataclass
class Env:
    """The emulator with two classes, a virtual clock and controllers to stop afterwards."""

    apiserver: ApiServer
    api: KubeApi
    clock: ManualClock = field(default_factory=ManualClock)
    controllers: list[NodeCleanupController] = field(default_factory=list)

    def start(self, classes: tuple[str, ...] = ("local",), **overrides: Any) -> NodeCleanupController:
        settings: dict[str, Any] = {"worker_threads": 2, "retry": ItemBackoff(initial=1.0, maximum=5.0),
                                    "sync_timeout": 10.0, **overrides}
        options = NodeCleanupOptions(frozenset(classes), **settings)
        recorder = EventRecorder(self.api, component=EVENT_COMPONENT, min_update_interval=0.0)
        controller = NodeCleanupController(self.api, options, metrics=NodeCleanupMetrics(), recorder=recorder,
                                           clock=self.clock)
        controller.start()
        self.controllers.append(controller)
        return controller

    def pv(self, name: str) -> Obj | None:
        return self.apiserver.get("v1", "PersistentVolume", name)

    def pvc(self, name: str) -> Obj | None:
        return self.apiserver.get("v1", "PersistentVolumeClaim", name, NS)

    def phase(self, pv_name: str) -> str:
        return str(((self.pv(pv_name) or {}).get("status") or {}).get("phase") or "")

    def bound_pair(self, pv_name: str, claim_name: str, nodes: tuple[str, ...] = ("n1",), **pv_args: Any) -> Obj:
        """A PV and a claim that names it, bound by the emulator's binder; returns the claim."""
        self.apiserver.create(local_pv(pv_name, nodes, **pv_args))
        self.apiserver.create(claim_for(claim_name, pv_name, pv_args.get("sc", "local")))
        wait_for(lambda: self.phase(pv_name) == "Bound" and _phase(self.pvc(claim_name)) == "Bound",
                 what=f"{pv_name} bound to {claim_name}")
        return self.pvc(claim_name) or {}

    def delete_node(self, name: str) -> None:
        self.apiserver.delete("v1", "Node", name)

    def drive(self, predicate: Callable[[], object], what: str, step: float = 5.0) -> None:
        """Move virtual time forward in steps until ``predicate`` holds (a real-time deadline)."""
        def advanced() -> bool:
            if predicate():
                return True
            self.clock.advance(step)
            return False
        wait_for(advanced, timeout=10.0, interval=0.02, what=what)

    def events(self, reason: str = REFERENCED_NODE_DELETED) -> list[Obj]:
        return [e for e in self.apiserver.list("v1", "Event", NS) if e.get("reason") == reason]


def claim_for(name: str, volume: str, sc: str = "local") -> Obj:
    """A claim that names its volume, so the binder binds exactly that one."""
    pvc = claim(name, sc)
    pvc["spec"]["volumeName"] = volume
    return pvc


def _phase(obj: Obj | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase") or "")


def outcomes(controller: NodeCleanupController, pv_name: str) -> list[str]:
    return [outcome for name, outcome in controller.history if name == pv_name]


def counter(controller: NodeCleanupController, name: str, **labels: str) -> float:
    value = controller.metrics.registry.get_sample_value(f"local_volume_node_cleanup_{name}_total", labels)
    return value or 0.0


def pvc_deletes(apiserver: ApiServer) -> int:
    return apiserver.requests.count(verb="delete", resource="persistentvolumeclaims")


@pytest.fixture
def env(apiserver: ApiServer, kube: KubeApi) -> Iterator[Env]:
    for sc in ("local", "other"):
        apiserver.create(storage_class(sc, binding="Immediate"))
    for name in ("n1", "n2", "n3"):
        apiserver.create(node(name))
    environment = Env(apiserver, kube)
    try:
        yield environment
    finally:
        for controller in environment.controllers:
            controller.stop()


# ---------------------------------------------------------------- claim path


def test_claim_of_deleted_node_is_deleted_after_the_delay_then_its_volume(env: Env) -> None:
    pvc = env.bound_pair("pv-a", "data-a")
    env.bound_pair("pv-b", "data-b", nodes=("n2",))  # a bystander on a live node
    ctl = env.start()
    start = env.clock.monotonic()

    env.delete_node("n1")
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled")
    assert ctl.scheduled() == {"pv-a": start + 60.0}
    wait_for(env.events, what="ReferencedNodeDeleted event")
    [event] = env.events()
    assert event["type"] == "Warning"
    assert event["source"]["component"] == "cleanup-controller"
    assert event["involvedObject"]["kind"] == "PersistentVolumeClaim"
    assert (event["involvedObject"]["name"], event["involvedObject"]["uid"]) == ("data-a", pvc["metadata"]["uid"])
    assert "1m0s" in event["message"]
    assert env.pvc("data-a") is not None and outcomes(ctl, "pv-a") == []

    # Outcomes and counters are written after the API call: wait on them, not on the objects.
    env.drive(lambda: outcomes(ctl, "pv-a"), "claim deleted")
    assert outcomes(ctl, "pv-a") == ["claim default/data-a deleted"] and env.pvc("data-a") is None
    env.drive(lambda: counter(ctl, "persistentvolume_delete", phase="Released"), "released volume deleted")
    assert env.pv("pv-a") is None
    assert counter(ctl, "persistentvolumeclaim_delete") == 1
    assert counter(ctl, "persistentvolumeclaim_delete_failed") == 0
    assert env.pvc("data-b") is not None and env.phase("pv-b") == "Bound"
    assert ctl.scheduled() == {}


def test_claim_is_kept_when_the_node_comes_back(env: Env) -> None:
    env.bound_pair("pv-a", "data-a")
    ctl = env.start()
    env.delete_node("n1")
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled")
    env.apiserver.create(node("n1"))
    env.drive(lambda: outcomes(ctl, "pv-a"), "pv-a re-checked")
    assert "node of the volume's affinity is live" in outcomes(ctl, "pv-a")[0]
    assert env.pvc("data-a") is not None and env.phase("pv-a") == "Bound"
    assert pvc_deletes(env.apiserver) == 0


def test_node_is_found_by_hostname_label_when_its_name_differs(env: Env) -> None:
    env.apiserver.create(node("machine-7", labels={HOST: "n9"}))
    env.bound_pair("pv-a", "data-a", nodes=("n9",))
    ctl = env.start()
    env.delete_node("n2")
    wait_for(lambda: ctl.scans >= 2, what="scan after a node deletion")
    assert ctl.scheduled() == {}

    env.delete_node("machine-7")
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled once no node carries the label")
    env.drive(lambda: env.pvc("data-a") is None, "claim deleted")


def test_every_node_of_the_affinity_must_be_gone(env: Env) -> None:
    env.bound_pair("pv-a", "data-a", nodes=("n1", "n2"))
    ctl = env.start()
    env.delete_node("n1")
    wait_for(lambda: ctl.scans >= 2, what="scan after n1 deletion")
    assert ctl.scheduled() == {} and env.events() == []

    env.delete_node("n2")
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled once n1 and n2 are gone")
    env.drive(lambda: env.pvc("data-a") is None, "claim deleted")


def test_claim_bound_to_another_volume_is_kept(env: Env) -> None:
    created = env.apiserver.create(claim_for("data-a", "pv-elsewhere"))
    ref = {"kind": "PersistentVolumeClaim", "namespace": NS, "name": "data-a", "uid": created["metadata"]["uid"]}
    env.apiserver.create(local_pv("pv-a", claim_ref=ref))
    ctl = env.start()
    env.delete_node("n1")
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled")
    env.drive(lambda: outcomes(ctl, "pv-a"), "pv-a re-checked")
    assert outcomes(ctl, "pv-a") == ["claim kept: claim is bound to another volume"]
    assert env.pvc("data-a") is not None and env.pv("pv-a") is not None
    assert pvc_deletes(env.apiserver) == 0


def test_claim_replaced_by_a_namesake_is_kept(env: Env) -> None:
    env.bound_pair("pv-a", "data-a", policy="Retain")
    ctl = env.start()
    env.delete_node("n1")
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled")
    env.apiserver.delete("v1", "PersistentVolumeClaim", "data-a", NS)
    env.apiserver.create(claim_for("data-a", "pv-a"))
    env.drive(lambda: outcomes(ctl, "pv-a"), "pv-a re-checked")
    assert outcomes(ctl, "pv-a")[0].startswith("claim kept:")
    assert env.pvc("data-a") is not None and pvc_deletes(env.apiserver) == 0


def test_volume_whose_claim_ref_has_another_uid_never_costs_the_claim(env: Env) -> None:
    env.apiserver.create(claim_for("data-a", "pv-a"))
    ref = {"kind": "PersistentVolumeClaim", "namespace": NS, "name": "data-a", "uid": "0b5e6a3c-dead-beef"}
    env.apiserver.create(local_pv("pv-a", claim_ref=ref, policy="Retain"))
    wait_for(lambda: env.phase("pv-a") == "Released", what="binder releases the mismatched volume")
    ctl = env.start()
    env.delete_node("n1")
    wait_for(lambda: ctl.scans >= 2, what="scan after node deletion")
    env.drive(lambda: ctl.stale_passes >= 3, "stale passes")
    assert ctl.scheduled() == {} and env.pvc("data-a") is not None and env.pv("pv-a") is not None
    assert pvc_deletes(env.apiserver) == 0


def test_claim_deleted_meanwhile_is_not_an_error(env: Env) -> None:
    env.bound_pair("pv-a", "data-a", policy="Retain")
    ctl = env.start()
    env.delete_node("n1")
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled")
    env.apiserver.delete("v1", "PersistentVolumeClaim", "data-a", NS)
    env.drive(lambda: outcomes(ctl, "pv-a"), "pv-a re-checked")
    assert outcomes(ctl, "pv-a") == ["done: claim is gone and no pod waits on it"]
    assert counter(ctl, "persistentvolumeclaim_delete") == 0 and pvc_deletes(env.apiserver) == 0
    assert env.pv("pv-a") is not None  # Released + Retain: the stale PV path keeps it too


@pytest.mark.parametrize(("classes", "pv_args"), [
    ((), {}),
    (("other",), {}),
    (("local",), {"source": "hostPath"}),
], ids=["no-class-opted-in", "wrong-class", "not-a-local-volume"])
def test_volumes_outside_the_opt_in_are_never_touched(env: Env, classes: tuple[str, ...], pv_args: Obj) -> None:
    env.bound_pair("pv-a", "data-a", **pv_args)
    env.apiserver.create(local_pv("pv-free", **pv_args))
    wait_for(lambda: env.phase("pv-free") == "Available", what="pv-free available")
    ctl = env.start(classes)
    env.delete_node("n1")
    wait_for(lambda: ctl.scans >= 2, what="scan after node deletion")
    env.drive(lambda: ctl.stale_passes >= 3 and ctl.scans >= 3, "stale passes and a resync", step=200.0)
    assert ctl.scheduled() == {} and env.events() == []
    assert env.pvc("data-a") is not None and env.pv("pv-a") is not None and env.pv("pv-free") is not None
    assert env.apiserver.requests.count(verb="delete") == 0


# ---------------------------------------------------------------- stale PV path


def test_stale_volumes_available_or_released_delete_are_deleted_others_kept(env: Env) -> None:
    ghost = {"kind": "PersistentVolumeClaim", "namespace": NS, "name": "ghost", "uid": "6f1d-ghost"}
    for name, policy in (("avail-delete", "Delete"), ("avail-retain", "Retain"), ("avail-recycle", "Recycle")):
        env.apiserver.create(local_pv(name, policy=policy))
    env.apiserver.create(local_pv("released-delete", claim_ref=ghost))
    env.apiserver.create(local_pv("released-retain", claim_ref=ghost, policy="Retain"))
    env.apiserver.create(local_pv("alive-avail", nodes=("n2",)))
    env.bound_pair("bound", "data-a")
    wait_for(lambda: [env.phase(n) for n in ("avail-delete", "released-delete", "released-retain")]
             == ["Available", "Released", "Released"], what="binder phases")
    env.delete_node("n1")
    ctl = env.start(pvc_deletion_delay=3600.0)
    server = StatusServer("127.0.0.1:0", ctl.metrics.registry, ready=ctl.ready, healthy=ctl.healthy)
    server.start()
    try:
        doomed = ("avail-delete", "avail-retain", "avail-recycle", "released-delete")
        env.drive(lambda: all(env.pv(n) is None for n in doomed), "stale volumes deleted")
        passes = ctl.stale_passes
        env.drive(lambda: ctl.stale_passes >= passes + 2, "two more stale passes")
        assert env.pv("released-retain") is not None and env.pv("alive-avail") is not None
        assert env.phase("bound") == "Bound" and env.pvc("data-a") is not None
        assert counter(ctl, "persistentvolume_delete", phase="Available") == 3
        assert counter(ctl, "persistentvolume_delete", phase="Released") == 1
        assert env.apiserver.requests.count(verb="delete", resource="persistentvolumes") == 4
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'local_volume_node_cleanup_persistentvolume_delete_total{phase="Available"} 3.0' in text
        assert "local_volume_node_cleanup_persistentvolumeclaim_delete_failed_total 0.0" in text
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        server.stop()


def test_volume_whose_claim_still_exists_is_left_to_the_claim_path(env: Env) -> None:
    """Available with a claimRef to a live claim (the binder's claimRef written, phase not yet)."""
    live = env.apiserver.create(claim_for("data-a", "pv-other"))
    ref = {"kind": "PersistentVolumeClaim", "namespace": NS, "name": "data-a", "uid": live["metadata"]["uid"]}
    env.apiserver.create(local_pv("pv-a", claim_ref=ref))
    pv = env.pv("pv-a") or {}
    pv["status"] = {"phase": "Available"}
    env.apiserver.update(pv, subresource="status")
    env.delete_node("n1")
    ctl = env.start(pvc_deletion_delay=3600.0)
    env.drive(lambda: ctl.stale_passes >= 3, "stale passes")
    assert env.pv("pv-a") is not None
    assert env.apiserver.requests.count(verb="delete", resource="persistentvolumes") == 0


# ---------------------------------------------------------------- faults and the command


def test_server_errors_are_retried_and_the_outcome_is_still_right(env: Env) -> None:
    env.bound_pair("pv-a", "data-a")
    env.bound_pair("pv-b", "data-b", nodes=("n2",))
    env.apiserver.faults.seed(7)
    for verb, rate in (("get", 0.4), ("list", 0.4), ("delete", 0.7), ("create", 0.4)):
        env.apiserver.faults.error_rate(verb, rate, 503 if verb == "list" else 500)
    ctl = env.start()
    env.delete_node("n1")
    env.drive(lambda: counter(ctl, "persistentvolume_delete", phase="Released"), "volume deleted despite faults",
              step=2.0)
    env.apiserver.faults.reset()
    assert env.apiserver.requests.count(status=500) > 0
    assert env.pvc("data-a") is None and env.pv("pv-a") is None
    assert env.pvc("data-b") is not None and env.phase("pv-b") == "Bound"
    assert counter(ctl, "persistentvolumeclaim_delete") == 1


def test_failed_claim_deletion_is_counted_and_retried_with_backoff(env: Env) -> None:
    env.bound_pair("pv-a", "data-a", policy="Retain")
    env.apiserver.deny("delete", "persistentvolumeclaims")  # 403: permanent, so the queue must retry
    ctl = env.start()
    env.delete_node("n1")
    env.drive(lambda: counter(ctl, "persistentvolumeclaim_delete_failed") >= 2, "two failed attempts")
    assert env.pvc("data-a") is not None and "pv-a" in ctl.scheduled()
    assert all(outcome.startswith("retry: 403") for outcome in outcomes(ctl, "pv-a"))
    env.apiserver.allow_all()
    env.drive(lambda: "claim default/data-a deleted" in outcomes(ctl, "pv-a"), "claim deleted once allowed")
    env.drive(lambda: ctl.scheduled() == {}, "release finished")
    assert env.pvc("data-a") is None
    assert counter(ctl, "persistentvolumeclaim_delete") == 1


def test_probes_report_synced_caches_and_a_stuck_stale_loop(env: Env) -> None:
    ctl = env.start()
    assert ctl.ready()[0] and ctl.healthy()[0]
    ctl.stop()  # no more passes from here on
    env.clock.advance(301.0)
    ok, message = ctl.healthy()
    assert not ok and "301s ago" in message


# ---------------------------------------------------------------- node lookups


def test_node_lookup_asks_the_server_when_the_cache_does_not_know(env: Env) -> None:
    env.apiserver.create(node("machine-7", labels={HOST: "n9"}))
    empty = Informer(env.api, NODES)  # never started: it knows no node
    view = NodeCleanupLookups(env.api, empty)
    assert view.node_exists("n1") and view.node_exists("n9")
    assert not view.node_exists("n4")
    assert not view.node_exists("x" * 70)  # too long for a label value: no label query at all
    env.apiserver.faults.error_rate("get", 1.0, 500)
    assert view.assume_node("n4")  # cannot tell: assume it exists


def test_node_lookup_trusts_the_cache_for_existence(env: Env) -> None:
    env.apiserver.create(node("machine-7", labels={HOST: "n9"}))
    nodes = Informer(env.api, NODES)
    nodes.start()
    try:
        wait_for(lambda: len(nodes) == 4, what="node cache")
        view = NodeCleanupLookups(env.api, nodes)
        env.apiserver.requests.clear()
        assert view.node_in_cache("n1") and view.node_in_cache("n9") and not view.node_in_cache("n4")
        assert view.node_exists("n9")
        assert len(env.apiserver.requests) == 0
    finally:
        nodes.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_command_cleans_up_serves_metrics_and_stops_on_sigterm(env: Env, tmp_path: Path) -> None:
    env.bound_pair("pv-a", "data-a")
    kubeconfig = env.apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "localpv", "-v", "node-cleanup", "--storageclass-names", "other, local",
         "--pvc-deletion-delay", "300ms", "--stale-pv-discovery-interval", "200ms", "--worker-threads", "1",
         "--listen-address", f"127.0.0.1:{port}"],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: env.apiserver.requests.count(verb="watch", resource="nodes"), what="controller watching")
        env.delete_node("n1")
        wait_for(lambda: env.pvc("data-a") is None and env.pv("pv-a") is None, what="claim and volume deleted")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert "local_volume_node_cleanup_persistentvolumeclaim_delete_total 1.0" in resp.read().decode()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
        assert proc.returncode == 0, stderr
        assert "claim default/data-a deleted" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("args", [["--pvc-deletion-delay", "soon"], ["--worker-threads", "0"],
                                  ["--csi-driver-name", "Local_Driver"], ["--out-of-service-delay", "0s"]])
def test_command_rejects_bad_flags(args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["node-cleanup", *args])
    assert result.exit_code == 2 and "Invalid value" in result.output


def test_a_dead_cache_makes_node_cleanup_unhealthy(env: Env) -> None:
    controller = env.start()
    assert controller.healthy()[0]
    controller.pvs.stop()
    ok, why = controller.healthy()
    assert not ok and "node-cleanup-pvs is not running" in why

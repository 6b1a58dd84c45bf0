"""``localpv node-cleanup`` and lost nodes (issue 25.3), against the API emulator: a Node
deleted or tainted ``node.kubernetes.io/out-of-service``; static and dynamic (CSI) volumes;
the claim released, the pods that wait on it deleted so their StatefulSet re-creates pod and
claim. The emulator runs no StatefulSet, pvc-protection or pod-GC controller: the tests play
those parts where the order of events matters (:func:`protect_claims`), and assert what
node-cleanup itself deletes, when, and what it never touches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localpv.kube.api import KubeApi
from localpv.kube.finalizers import EXTERNAL_PROVISIONER_FINALIZER as PV_FINALIZER
from localpv.kube.informer import Informer
from localpv.kube.objects import Obj
from localpv.kube.resources import NODES, PERSISTENT_VOLUMES
from localpv.nodecleanup.controller import (
    POD_DELETED_FOR_LOST_NODE,
    REFERENCED_NODE_DELETED,
    REFERENCED_NODE_OUT_OF_SERVICE,
)
from localpv.nodecleanup.lookups import NodeCleanupLookups
from localpv.nodecleanup.lostnode import OUT_OF_SERVICE_TAINT, Action, NodeState, Step
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node, storage_class
from tests.agent.test_nodecleanup import HOST, NS, Env, claim_for, counter, local_pv, outcomes
from tests.conftest import wait_for

DRIVER = "local.csi.localpv.dev"
PROTECTION = "kubernetes.io/pvc-protection"
OUT_OF_SERVICE: dict[str, Any] = {"out_of_service": True}


def dynamic_pv(name: str, node_name: str = "n1", *, sc: str = "fast", driver: str = DRIVER) -> Obj:
    """A PV as localpv's CSI driver makes it (provisioner.build_volume): csi source, hostname affinity."""
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"localpv.dev/node": node_name},
                         "annotations": {"pv.kubernetes.io/provisioned-by": driver}},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                     "persistentVolumeReclaimPolicy": "Delete", "volumeMode": "Filesystem",
                     "csi": {"driver": driver, "volumeHandle": name, "fsType": "ext4",
                             "volumeAttributes": {"localpv.dev/pool": "fast", "localpv.dev/node": node_name}},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": HOST, "operator": "In", "values": [node_name]}]}]}}}}


class Cluster(Env):
    """:class:`Env` with a StatefulSet, its pods, and the pvc-protection rule played by hand."""

    def statefulset(self, name: str = "db") -> Obj:
        template = {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        return self.apiserver.create({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name},
                                      "spec": {"serviceName": name, "selector": {"matchLabels": {"app": name}},
                                               "template": template}})

    def pod(self, name: str, claim: str, *, node_name: str = "", owner: Obj | None = None,
            phase: str = "Pending") -> Obj:
        meta: Obj = {"name": name, "namespace": NS}
        if owner is not None:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "controller": True,
                                        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]
        spec: Obj = {"containers": [{"name": "c", "image": "i"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}
        if node_name:
            spec["nodeName"] = node_name
        made = self.apiserver.create({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
        if phase != "Pending":
            made["status"]["phase"] = phase
            made = self.apiserver.update(made, subresource="status")
        return made

    def get_pod(self, name: str) -> Obj | None:
        return self.apiserver.get("v1", "Pod", name, NS)

    def bound(self, pv: Obj, claim_name: str, sc: str, *, protected: bool = True) -> Obj:
        self.apiserver.create(pv)
        pvc = claim_for(claim_name, pv["metadata"]["name"], sc)
        if protected:
            pvc["metadata"]["finalizers"] = [PROTECTION]
        self.apiserver.create(pvc)
        name = pv["metadata"]["name"]
        wait_for(lambda: self.phase(name) == "Bound", what=f"{name} bound to {claim_name}")
        return self.pvc(claim_name) or {}

    def taint(self, name: str, *keys: str) -> None:
        obj = self.apiserver.get("v1", "Node", name) or {}
        obj.setdefault("spec", {})["taints"] = [{"key": k, "effect": "NoExecute"} for k in keys]
        self.apiserver.update(obj)

    def protect_claims(self) -> bool:
        """The pvc-protection controller's rule: a claim being deleted loses its finalizer once
        no *scheduled*, unfinished pod uses it. Returns True (a predicate that always holds)."""
        pods = self.apiserver.list("v1", "Pod", NS)
        for pvc in self.apiserver.list("v1", "PersistentVolumeClaim", NS):
            meta = pvc["metadata"]
            if not meta.get("deletionTimestamp") or PROTECTION not in (meta.get("finalizers") or []):
                continue
            if not any(p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed")
                       and meta["name"] in [(v.get("persistentVolumeClaim") or {}).get("claimName")
                                            for v in p["spec"].get("volumes") or []] for p in pods):
                meta["finalizers"] = [f for f in meta["finalizers"] if f != PROTECTION]
                self.apiserver.update(pvc)
        return True

    def drive_protected(self, predicate: Callable[[], object], what: str, step: float = 5.0) -> None:
        self.drive(lambda: self.protect_claims() and predicate(), what, step)

    def deletes(self, resource: str) -> int:
        return self.apiserver.requests.count(verb="delete", resource=resource)


@pytest.fixture
def env(apiserver: ApiServer, kube: KubeApi) -> Iterator[Cluster]:
    apiserver.create(storage_class("local", binding="Immediate"))
    apiserver.create(storage_class("fast", binding="Immediate", provisioner=DRIVER))
    apiserver.create(storage_class("other", binding="Immediate", provisioner=DRIVER))
    for name in ("n1", "n2"):
        apiserver.create(node(name))
    cluster = Cluster(apiserver, kube)
    try:
        yield cluster
    finally:
        for controller in cluster.controllers:
            controller.stop()


def uid(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def names(objs: list[Obj]) -> list[str]:
    return sorted(o["involvedObject"]["name"] for o in objs)


# ---------------------------------------------------------------- node deleted


def test_deleted_node_releases_static_and_dynamic_claims_and_their_pods_in_order(env: Cluster) -> None:
    sts = env.statefulset()
    env.bound(local_pv("pv-a"), "data-db-0", "local")
    env.bound(dynamic_pv("pvc-d"), "data-db-1", "fast")
    env.bound(local_pv("pv-live", nodes=("n2",)), "data-db-2", "local")
    old0 = env.pod("db-0", "data-db-0", node_name="n1", owner=sts, phase="Running")
    old1 = env.pod("db-1", "data-db-1", node_name="n1", owner=sts, phase="Running")
    live = env.pod("db-2", "data-db-2", node_name="n2", owner=sts, phase="Running")
    ctl = env.start(("local", "fast"))

    env.delete_node("n1")
    wait_for(lambda: len(env.events(REFERENCED_NODE_DELETED)) == 2, what="a warning on each claim of n1")
    assert names(env.events(REFERENCED_NODE_DELETED)) == ["data-db-0", "data-db-1"]
    assert env.deletes("persistentvolumeclaims") == 0 and env.deletes("pods") == 0

    # Claim first; the pods on the dead node hold its protection finalizer, so they go next.
    env.drive(lambda: env.get_pod("db-0") is None and env.get_pod("db-1") is None, "pods on n1 deleted")
    assert (env.pvc("data-db-0") or {})["metadata"].get("deletionTimestamp")
    # The StatefulSet re-creates its pods at once - while the old claims still terminate: such a
    # pod is left alone, or it would be re-created again before the claim is gone.
    new0 = env.pod("db-0", "data-db-0", owner=sts)
    new1 = env.pod("db-1", "data-db-1", owner=sts)
    env.drive(lambda: any(o.startswith("waiting:") for o in outcomes(ctl, "pv-a")), "release waits on the claim")
    assert env.get_pod("db-0") is not None and env.get_pod("db-1") is not None

    # The pvc-protection controller lets the claims go; now the Pending pods are deleted.
    env.drive_protected(lambda: env.get_pod("db-0") is None and env.get_pod("db-1") is None,
                        "pending pods deleted once their claims are gone")
    assert env.pvc("data-db-0") is None and env.pvc("data-db-1") is None
    wait_for(lambda: len(env.events(POD_DELETED_FOR_LOST_NODE)) == 4, what="an event on each deleted pod")
    deleted = env.events(POD_DELETED_FOR_LOST_NODE)
    assert sorted((e["involvedObject"]["name"], e["involvedObject"]["uid"]) for e in deleted) == sorted(
        [("db-0", uid(old0)), ("db-1", uid(old1)), ("db-0", uid(new0)), ("db-1", uid(new1))])
    assert all(e["type"] == "Warning" and "empty volume" in e["message"] for e in deleted)
    assert counter(ctl, "pod_delete", cause="deleted") == 4 and counter(ctl, "persistentvolumeclaim_delete") == 2

    # Released volumes of a deleted node go, the dynamic one with an event saying the image stays.
    env.drive(lambda: env.pv("pv-a") is None and env.pv("pvc-d") is None, "released volumes deleted")
    [pv_event] = wait_for(lambda: [e for e in env.events(REFERENCED_NODE_DELETED)
                                   if e["involvedObject"]["name"] == "pvc-d"], what="event on the deleted PV")
    assert pv_event["involvedObject"]["kind"] == "PersistentVolume" and "image" in pv_event["message"]
    env.drive(lambda: ctl.scheduled() == {}, "releases finished")
    assert env.get_pod("db-2") is not None and uid(env.get_pod("db-2")) == uid(live)
    assert env.pvc("data-db-2") is not None and env.phase("pv-live") == "Bound"


def test_a_protected_dynamic_volume_of_a_deleted_node_is_not_left_terminating(env: Cluster) -> None:
    """A dynamic PV carries its agent's deletion protection finalizer (KEP-2644); its agent died
    with the node, so nobody else would ever remove it: the PV would stay Terminating for good.
    Node cleanup deletes it and takes the finalizer off, on a PV it deletes and on one found
    already Terminating; a protected PV on a live node keeps its finalizer."""
    def protected(pv: Obj) -> Obj:
        pv["metadata"]["finalizers"] = [PV_FINALIZER]
        return pv

    env.bound(protected(dynamic_pv("pvc-d")), "data-db-1", "fast")
    env.bound(protected(dynamic_pv("pvc-t")), "data-db-3", "fast")
    env.bound(protected(dynamic_pv("pvc-live", node_name="n2")), "data-db-2", "fast")
    ctl = env.start(("fast",))
    env.api.delete(PERSISTENT_VOLUMES, "pvc-t")  # deleted before its claim: Terminating, held
    assert ((env.pv("pvc-t") or {}).get("metadata") or {}).get("deletionTimestamp")

    env.delete_node("n1")
    env.drive_protected(lambda: env.pv("pvc-d") is None and env.pv("pvc-t") is None,
                        "the dynamic volumes of the deleted node gone, not left Terminating")
    env.drive(lambda: ctl.scheduled() == {}, "releases finished")
    live = env.pv("pvc-live") or {}
    assert live["metadata"].get("finalizers") == [PV_FINALIZER] and not live["metadata"].get("deletionTimestamp")


def test_claim_recreated_by_the_statefulset_and_its_pod_are_never_touched(env: Cluster) -> None:
    """Same namespace and name as the released claim, bound to a volume on a live node."""
    sts = env.statefulset()
    env.bound(local_pv("pv-a", policy="Retain"), "data-db-0", "local", protected=False)
    env.pod("db-0", "data-db-0", node_name="n1", owner=sts, phase="Running")
    ctl = env.start()
    env.delete_node("n1")
    env.drive(lambda: env.pvc("data-db-0") is None and env.get_pod("db-0") is None, "claim and pod released")
    env.drive(lambda: ctl.scheduled() == {}, "release finished")
    # The StatefulSet creates claim and pod anew; the claim is provisioned on n2.
    new_claim = env.bound(local_pv("pv-b", nodes=("n2",)), "data-db-0", "local", protected=False)
    new_pod = env.pod("db-0", "data-db-0", owner=sts)
    pod_deletes = env.deletes("pods")
    scans = ctl.scans
    ctl._rescan.set()  # a Node event's effect: the Released volume of n1 is looked at again
    env.drive(lambda: ctl.scans > scans and ctl.scheduled() == {} and
              outcomes(ctl, "pv-a")[-1].startswith("claim kept: claim was replaced"), "released volume re-checked")
    assert uid(env.pvc("data-db-0")) == uid(new_claim) and uid(env.get_pod("db-0")) == uid(new_pod)
    assert env.deletes("pods") == pod_deletes and env.pv("pv-a") is not None  # Retain: kept


# ---------------------------------------------------------------- out of service


def test_out_of_service_node_releases_after_its_longer_delay_and_keeps_its_volumes(env: Cluster) -> None:
    sts = env.statefulset()
    env.bound(local_pv("pv-a"), "data-db-0", "local")
    env.bound(dynamic_pv("pvc-d"), "data-db-1", "fast")
    env.pod("db-0", "data-db-0", node_name="n1", owner=sts, phase="Running")
    ctl = env.start(("local", "fast"), **OUT_OF_SERVICE)
    start = env.clock.monotonic()

    env.taint("n1", OUT_OF_SERVICE_TAINT)
    wait_for(lambda: len(env.events(REFERENCED_NODE_OUT_OF_SERVICE)) == 2, what="out-of-service warnings")
    assert ctl.scheduled() == {"pv-a": start + 300.0, "pvc-d": start + 300.0}
    assert all("5m0s" in e["message"] for e in env.events(REFERENCED_NODE_OUT_OF_SERVICE))
    assert env.events(REFERENCED_NODE_DELETED) == []
    env.clock.advance(290.0)
    assert env.deletes("persistentvolumeclaims") == 0

    env.drive_protected(lambda: env.pvc("data-db-0") is None and env.pvc("data-db-1") is None
                        and env.get_pod("db-0") is None, "claims and pod released")
    assert counter(ctl, "pod_delete", cause="out-of-service") == 1
    [event] = wait_for(lambda: env.events(POD_DELETED_FOR_LOST_NODE), what="pod event")
    assert "out-of-service" in event["message"]
    # The node exists: its Released volumes wait for its agent, should it come back.
    env.drive(lambda: env.phase("pv-a") == "Released" and env.phase("pvc-d") == "Released"
              and ctl.stale_passes >= 5, "stale passes over Released volumes")
    assert env.deletes("persistentvolumes") == 0


def test_taint_removed_before_the_delay_keeps_everything(env: Cluster) -> None:
    sts = env.statefulset()
    env.bound(local_pv("pv-a"), "data-db-0", "local")
    env.pod("db-0", "data-db-0", node_name="n1", owner=sts, phase="Running")
    ctl = env.start(**OUT_OF_SERVICE)
    env.taint("n1", OUT_OF_SERVICE_TAINT)
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled")
    env.taint("n1")
    env.drive(lambda: outcomes(ctl, "pv-a"), "pv-a re-checked", step=30.0)
    assert outcomes(ctl, "pv-a") == ["claim kept: a node of the volume's affinity is live (or no node is named)"]
    assert env.deletes("persistentvolumeclaims") == 0 and env.deletes("pods") == 0


@pytest.mark.parametrize("options", [OUT_OF_SERVICE, {}], ids=["taint-honoured", "taint-not-opted-in"])
def test_not_ready_and_unreachable_nodes_are_never_lost(env: Cluster, options: Obj) -> None:
    sts = env.statefulset()
    env.bound(local_pv("pv-a"), "data-db-0", "local")
    env.bound(local_pv("pv-b", nodes=("n2",)), "data-db-1", "local")
    env.pod("db-0", "data-db-0", node_name="n1", owner=sts, phase="Running")
    env.pod("db-1", "data-db-1", owner=sts)
    ctl = env.start(**options)
    env.taint("n1", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    if not options:
        env.taint("n2", OUT_OF_SERVICE_TAINT)  # without the opt-in, the taint is just a taint
    env.drive(lambda: ctl.scans >= 3 and ctl.stale_passes >= 3, "resyncs and stale passes", step=300.0)
    assert ctl.scheduled() == {} and env.events(REFERENCED_NODE_OUT_OF_SERVICE) == []
    assert env.apiserver.requests.count(verb="delete") == 0


def test_classes_not_opted_in_and_other_drivers_are_never_touched(env: Cluster) -> None:
    sts = env.statefulset()
    env.bound(dynamic_pv("pvc-o", sc="other"), "data-db-0", "other")
    env.bound(dynamic_pv("pvc-x", driver="other.csi.example.com"), "data-db-1", "fast")
    env.pod("db-0", "data-db-0", node_name="n1", owner=sts, phase="Running")
    env.pod("db-1", "data-db-1", node_name="n1", owner=sts, phase="Running")
    ctl = env.start(("local", "fast"), **OUT_OF_SERVICE)
    env.taint("n1", OUT_OF_SERVICE_TAINT)
    env.drive(lambda: ctl.scans >= 3, "resyncs", step=300.0)
    env.delete_node("n1")
    env.drive(lambda: ctl.scans >= 5 and ctl.stale_passes >= 5, "resyncs after the deletion", step=300.0)
    assert ctl.scheduled() == {} and env.apiserver.requests.count(verb="delete") == 0


def test_pods_are_left_when_pod_deletion_is_off(env: Cluster) -> None:
    sts = env.statefulset()
    env.bound(local_pv("pv-a"), "data-db-0", "local", protected=False)
    env.pod("db-0", "data-db-0", owner=sts)
    ctl = env.start(delete_pods=False)
    env.delete_node("n1")
    env.drive(lambda: outcomes(ctl, "pv-a") == ["claim default/data-db-0 deleted"] and ctl.scheduled() == {},
              "claim deleted, nothing more")
    env.drive(lambda: env.pv("pv-a") is None, "released volume deleted")
    assert env.get_pod("db-0") is not None and env.deletes("pods") == 0


# ---------------------------------------------------------------- identity and restarts


def test_pod_recreated_between_judgement_and_deletion_is_kept(env: Cluster) -> None:
    sts = env.statefulset()
    env.apiserver.create(local_pv("pv-a", claim_ref={"kind": "PersistentVolumeClaim", "namespace": NS,
                                                     "name": "data-db-0", "uid": "gone"}))
    judged = env.pod("db-0", "data-db-0", owner=sts)
    env.delete_node("n1")
    ctl = env.start(resync=3600.0)
    env.apiserver.delete("v1", "Pod", "db-0", NS)
    again = env.pod("db-0", "data-db-0", owner=sts)  # the StatefulSet was quicker
    step = Step(Action.DELETE_PODS, "pods wait on a claim released for a lost node", NodeState.DELETED, (judged,))
    outcome = ctl._delete_pods(env.pv("pv-a") or {}, step)
    assert "db-0 kept (replaced meanwhile: UID precondition)" in outcome
    assert uid(env.get_pod("db-0")) == uid(again)
    assert counter(ctl, "pod_delete", cause="deleted") == 0 and env.events(POD_DELETED_FOR_LOST_NODE) == []


def test_a_restart_in_the_middle_picks_the_release_up_from_the_cluster(env: Cluster) -> None:
    sts = env.statefulset()
    env.bound(local_pv("pv-a"), "data-db-0", "local")
    env.pod("db-0", "data-db-0", node_name="n1", owner=sts, phase="Running")
    env.apiserver.deny("delete", "pods")
    first = env.start()
    env.delete_node("n1")
    env.drive(lambda: counter(first, "pod_delete_failed", cause="deleted") >= 1, "claim deleted, pod deletion fails")
    assert (env.pvc("data-db-0") or {})["metadata"].get("deletionTimestamp") and env.get_pod("db-0") is not None
    first.stop()  # a crash: nothing of its memory survives

    env.apiserver.allow_all()
    second = env.start()
    env.drive(lambda: env.get_pod("db-0") is None, "the new controller deletes the pod on n1")
    new = env.pod("db-0", "data-db-0", owner=sts)  # re-created while the claim still terminates
    env.drive(lambda: any(o.startswith("waiting:") for o in outcomes(second, "pv-a")), "release waits on the claim")
    second.stop()  # stopped again, just before the claim goes

    env.protect_claims()
    assert env.pvc("data-db-0") is None
    wait_for(lambda: env.phase("pv-a") == "Released", what="the binder releases the volume")
    third = env.start()
    env.drive(lambda: env.get_pod("db-0") is None, "the third controller deletes the waiting pod")
    wait_for(lambda: uid(new) in [e["involvedObject"]["uid"] for e in env.events(POD_DELETED_FOR_LOST_NODE)],
             what="event on the waiting pod")
    env.drive(lambda: env.pv("pv-a") is None, "the released volume goes last")
    assert counter(third, "persistentvolumeclaim_delete") == 0


def test_released_volume_stays_while_pods_wait_on_its_claim(env: Cluster) -> None:
    """The Released PV is the only record tying the waiting pod to the lost node: it goes last."""
    sts = env.statefulset()
    ref = {"kind": "PersistentVolumeClaim", "namespace": NS, "name": "data-db-0", "uid": "gone"}
    env.apiserver.create(local_pv("pv-a", claim_ref=ref))
    wait_for(lambda: env.phase("pv-a") == "Released", what="the binder releases the volume")
    env.pod("db-0", "data-db-0", owner=sts)
    env.delete_node("n1")
    env.apiserver.deny("delete", "pods")
    ctl = env.start()
    env.drive(lambda: ctl.stale_passes >= 4 and counter(ctl, "pod_delete_failed", cause="deleted") >= 2,
              "stale passes while the pod cannot be deleted")
    assert env.pv("pv-a") is not None and env.get_pod("db-0") is not None
    env.apiserver.allow_all()
    env.drive(lambda: env.get_pod("db-0") is None and env.pv("pv-a") is None, "pod, then volume, deleted")


def test_a_taint_in_the_cache_is_confirmed_by_the_server(env: Cluster) -> None:
    """The cache may only propose a lost node: one the server shows untainted is live."""
    nodes = Informer(env.api, NODES)
    nodes.start()
    try:
        env.taint("n1", OUT_OF_SERVICE_TAINT)
        view = NodeCleanupLookups(env.api, nodes, honour_taint=True)
        wait_for(lambda: view.cached_state("n1") is NodeState.OUT_OF_SERVICE, what="the cache sees the taint")
        nodes.stop()  # the cache is stale from here on
        env.taint("n1")
        assert view.cached_state("n1") is NodeState.OUT_OF_SERVICE
        assert view.node_state("n1") is NodeState.LIVE
        env.taint("n1", OUT_OF_SERVICE_TAINT)
        assert view.node_state("n1") is NodeState.OUT_OF_SERVICE
        assert view.node_state("n9") is NodeState.DELETED
        assert NodeCleanupLookups(env.api, nodes).node_state("n1") is NodeState.LIVE  # taint not opted in
        env.apiserver.faults.error_rate("get", 1.0, 500)
        assert view.assume_state("n1") is NodeState.LIVE  # cannot tell: live
    finally:
        nodes.stop()


def test_node_deleted_then_back_out_of_service_gets_the_longer_delay(env: Cluster) -> None:
    env.bound(local_pv("pv-a"), "data-db-0", "local", protected=False)
    ctl = env.start(**OUT_OF_SERVICE)
    env.delete_node("n1")
    wait_for(lambda: "pv-a" in ctl.scheduled(), what="pv-a scheduled for the deleted node")
    back = node("n1")
    back["spec"] = {"taints": [{"key": OUT_OF_SERVICE_TAINT, "effect": "NoExecute"}]}
    env.apiserver.create(back)
    env.clock.advance(60.0)
    wait_for(lambda: env.events(REFERENCED_NODE_OUT_OF_SERVICE) and outcomes(ctl, "pv-a"),
             what="rescheduled as out of service")
    assert outcomes(ctl, "pv-a") == ["claim kept: its node is back, out of service; scheduled again with that delay"]
    assert ctl.scheduled() == {"pv-a": env.clock.monotonic() + 300.0} and env.pvc("data-db-0") is not None
    env.drive(lambda: env.pvc("data-db-0") is None, "claim deleted after the longer delay", step=30.0)


def test_command_takes_the_out_of_service_and_pod_flags(env: Cluster, tmp_path: Path) -> None:
    sts = env.statefulset()
    env.bound(dynamic_pv("pvc-d"), "data-db-0", "fast", protected=False)
    env.pod("db-0", "data-db-0", node_name="n1", owner=sts, phase="Running")
    kubeconfig = env.apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    proc = subprocess.Popen(
        [sys.executable, "-m", "localpv", "node-cleanup", "--storageclass-names", "fast", "--csi-driver-name", DRIVER,
         "--out-of-service-taint", "--out-of-service-delay", "300ms", "--pvc-deletion-delay", "1h",
         "--delete-pods", "--listen-address", ""],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: env.apiserver.requests.count(verb="watch", resource="nodes"), what="controller watching")
        env.taint("n1", OUT_OF_SERVICE_TAINT)
        wait_for(lambda: env.pvc("data-db-0") is None and env.get_pod("db-0") is None, what="claim and pod deleted")
        assert env.pv("pvc-d") is not None  # the node exists: its volume waits for its agent
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
        assert proc.returncode == 0, stderr
        assert "PodDeletedForLostNode" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

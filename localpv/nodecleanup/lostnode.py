"""When is a node lost, and what does releasing a lost node's claim take? Pure rules.

A node is **lost** when its Node object is gone for good (the claim path has always handled
that), or - opt-in - when it carries the ``node.kubernetes.io/out-of-service`` taint, with
any effect. That taint is the non-graceful node shutdown signal (beta in Kubernetes 1.26,
GA in 1.28): a person or automation asserts the machine is really off; Kubernetes then
force-deletes the node's pods that do not tolerate it and detaches their volumes at once.
A node that is merely ``NotReady`` or ``unreachable`` is never lost here: those taints come
and go with a network blip, and a claim released on a blip costs its data.

Releasing a claim of a lost node is a small state machine that is rebuilt from fresh reads
every time (a restart in the middle loses nothing):

1. the claim is deleted (UID precondition). The ``kubernetes.io/pvc-protection`` finalizer
   keeps it while a *scheduled* pod uses it, so
2. the pods on the lost node that use it are deleted (force: no kubelet will ever confirm
   them), after which the claim goes;
3. once no claim of that name exists, the controlled pods still ``Pending`` on it are
   deleted: their StatefulSet re-creates the pod and, since the claim is missing, a new
   claim from its template, which is provisioned on a live node - **empty**.

Step 3 waits for the claim to be gone because a StatefulSet controller (before 1.27) only
creates missing claims when it creates the pod: a pod re-created while the old claim is
still terminating would wait for ever on a claim that then disappears.

The functions here take objects and lookups and return verdicts; the controller gathers
the inputs and carries the verdicts out.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localpv.csi.provisioner import is_ours
from localpv.kube import objects as k8s
from localpv.kube.finalizers import EXTERNAL_PROVISIONER_FINALIZER
from localpv.kube.objects import Obj
from localpv.naming import HOSTNAME_LABEL_KEY

#: The non-graceful node shutdown taint (any effect; Kubernetes documents NoExecute and NoSchedule).
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


class NodeState(enum.Enum):
    LIVE = "live"
    OUT_OF_SERVICE = "out-of-service"
    DELETED = "deleted"


#: Answers "what state is the node of this name (or hostname label) in?"; one that cannot
#: tell must answer LIVE.
NodeStateOf = Callable[[str], NodeState]


def out_of_service(node: Mapping[str, Any]) -> bool:
    """The node carries the out-of-service taint, whatever its effect or value."""
    taints = (node.get("spec") or {}).get("taints") or []
    return any(isinstance(t, dict) and t.get("key") == OUT_OF_SERVICE_TAINT for t in taints)


def node_state_of(nodes: Iterable[Mapping[str, Any]], *, honour_taint: bool) -> NodeState:
    """The state of a node name given the Node objects that answer to it (by name or by
    hostname label): DELETED when none does; LIVE when one is live (believing in a live node
    can only spare objects); OUT_OF_SERVICE when all carry the taint and it is honoured."""
    found = list(nodes)
    if not found:
        return NodeState.DELETED
    if honour_taint and all(out_of_service(n) for n in found):
        return NodeState.OUT_OF_SERVICE
    return NodeState.LIVE


def pv_node_names(pv: Obj | None) -> frozenset[str]:
    """The nodes a PV's required affinity can place it on, as far as hostnames say.

    Per node-selector term, the values of all ``kubernetes.io/hostname In`` expressions are
    intersected (a node must satisfy every expression of the term); terms are alternatives,
    so their results are united. Expressions on other keys or operators name no node.
    Static PVs and localpv's dynamic PVs (:func:`localpv.csi.provisioner.build_volume`)
    both pin their node this way.
    """
    affinity = ((pv or {}).get("spec") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("required") or {}).get("nodeSelectorTerms") or []
    names: set[str] = set()
    for term in terms:
        names |= _term_hostnames(term or {})
    return frozenset(names)


def _term_hostnames(term: Obj) -> set[str]:
    value_sets = [
        set(expr.get("values") or [])
        for expr in term.get("matchExpressions") or []
        if expr.get("key") == HOSTNAME_LABEL_KEY and expr.get("operator") == "In"
    ]
    return set.intersection(*value_sets) if value_sets else set()


def volume_state(pv: Obj, state_of: NodeStateOf) -> NodeState | None:
    """Where a PV's nodes stand: None when its affinity names no node (nothing proves a loss);
    LIVE when any named node is live; DELETED when all are deleted; else OUT_OF_SERVICE."""
    states = {state_of(name) for name in sorted(pv_node_names(pv))}
    if not states:
        return None
    if NodeState.LIVE in states:
        return NodeState.LIVE
    return NodeState.DELETED if states == {NodeState.DELETED} else NodeState.OUT_OF_SERVICE


@dataclass(frozen=True)
class Scope:
    """What node-cleanup may touch: the opted-in classes, the CSI driver whose PVs are
    localpv's dynamic volumes, and the two opt-ins of the lost-node release."""

    class_names: frozenset[str]
    driver: str = ""
    honour_taint: bool = False
    delete_pods: bool = False


def is_opted_in_volume(pv: Obj, scope: Scope) -> bool:
    """A PV of an opted-in class that is a static local volume (``spec.local``) or a dynamic
    volume of localpv's own CSI driver (created by it and naming it)."""
    if k8s.pv_class(pv) not in scope.class_names:
        return False
    return k8s.pv_spec(pv).get("local") is not None or bool(scope.driver and is_ours(pv, scope.driver))


# ---------------------------------------------------------------------------- pods


def pod_claim_names(pod: Obj) -> frozenset[str]:
    """The claims a pod's volumes name (in the pod's namespace)."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return frozenset(str((v.get("persistentVolumeClaim") or {}).get("claimName") or "")
                     for v in volumes if isinstance(v, dict) and v.get("persistentVolumeClaim")) - {""}


def pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def has_controller(pod: Obj) -> bool:
    return any(ref.get("controller") for ref in (pod.get("metadata") or {}).get("ownerReferences") or [])


def pods_on_lost_nodes(pods: Iterable[Obj], claim_name: str, lost: frozenset[str]) -> list[Obj]:
    """Pods using the claim that are scheduled to a lost node and not finished: they hold the
    claim's protection finalizer, and no kubelet will ever end them. Terminating ones are
    included: a graceful deletion on a dead node never completes."""
    return [p for p in pods if claim_name in pod_claim_names(p)
            and (p.get("spec") or {}).get("nodeName") in lost
            and pod_phase(p) not in ("Succeeded", "Failed")]


def pods_waiting(pods: Iterable[Obj], claim_name: str) -> list[Obj]:
    """Unscheduled ``Pending`` pods that use the claim and have a controller to re-create
    them (a bare pod deleted is gone for good: it is left to its owner)."""
    return [p for p in pods if claim_name in pod_claim_names(p)
            and not (p.get("spec") or {}).get("nodeName") and pod_phase(p) == "Pending"
            and not k8s.deleting(p) and has_controller(p)]


def stranded_pods(pods: Iterable[Obj], claim_name: str, lost: frozenset[str]) -> list[Obj]:
    """The pods that wait on a claim released for a lost node: those on the lost node and
    the controlled ones ``Pending`` unscheduled."""
    pods = list(pods)
    return pods_on_lost_nodes(pods, claim_name, lost) + pods_waiting(pods, claim_name)


# ---------------------------------------------------------------------------- the release


class Action(enum.Enum):
    KEEP = "keep"  # nothing to do, now or later: the item is finished
    DELETE_CLAIM = "delete-claim"
    DELETE_PODS = "delete-pods"
    WAIT = "wait"  # something is under way (a claim terminating): look again later


@dataclass(frozen=True)
class Step:
    action: Action
    reason: str
    state: NodeState | None = None
    pods: tuple[Obj, ...] = field(default=())


def release_step(pv: Obj, claim: Obj | None, pods: Iterable[Obj], scope: Scope, state_of: NodeStateOf) -> Step:
    """The next step of releasing ``pv``'s claim from fresh reads: ``claim`` is the object of
    the claimRef's namespace/name (None if absent), ``pods`` the pods of that namespace.

    Cheap checks come first so that ``state_of`` (possibly API calls) is asked last.
    """
    if not is_opted_in_volume(pv, scope):
        return Step(Action.KEEP, "not a local volume of an opted-in StorageClass")
    ref = k8s.pv_claim_ref(pv)
    if ref is None:
        return Step(Action.KEEP, "volume has no claim")
    ours = claim is not None and k8s.uid(claim) == str(ref.get("uid") or "")
    if claim is not None and not ours:
        return Step(Action.KEEP, "claim was replaced (UID differs from the volume's claimRef)")
    if claim is None and not scope.delete_pods:
        return Step(Action.KEEP, "claim no longer exists")
    state = volume_state(pv, state_of)
    if state in (None, NodeState.LIVE):
        return Step(Action.KEEP, "a node of the volume's affinity is live (or no node is named)", state)
    name = str(ref["name"])
    if claim is not None:
        if (claim.get("spec") or {}).get("volumeName") != k8s.name(pv):
            return Step(Action.KEEP, "claim is bound to another volume", state)
        if not k8s.deleting(claim):
            if k8s.pv_phase(pv) == "Released":
                return Step(Action.KEEP, "volume is released: its claim is gone already", state)
            return Step(Action.DELETE_CLAIM, "every node of the volume is lost", state)
        if not scope.delete_pods:
            return Step(Action.KEEP, "claim is being deleted already", state)
        holders = pods_on_lost_nodes(pods, name, pv_node_names(pv))
        if holders:
            return Step(Action.DELETE_PODS, "pods on the lost node hold the claim", state, tuple(holders))
        return Step(Action.WAIT, "claim is being deleted", state)
    stranded = stranded_pods(pods, name, pv_node_names(pv))
    if stranded:
        return Step(Action.DELETE_PODS, "pods wait on a claim released for a lost node", state, tuple(stranded))
    return Step(Action.KEEP, "claim is gone and no pod waits on it", state)


def held_by_its_agent(pv: Obj) -> bool:
    """A dynamic PV carrying the deletion protection finalizer its agent removes once the
    image is gone (KEP-2644). On a lost node that agent is gone: such a PV, deleted before its
    claim, still has a claim to release, and once its node is deleted for good it would stay
    Terminating forever unless node cleanup lets it go."""
    return k8s.pv_is_csi(pv) and EXTERNAL_PROVISIONER_FINALIZER in (pv["metadata"].get("finalizers") or [])


def scan_candidate(pv: Obj, scope: Scope, state_of: NodeStateOf) -> NodeState | None:
    """The lost-node state that makes ``pv`` worth a fresh look by the claim path, else None:
    a claimed volume of an opted-in class on lost nodes; a Released one only when pods may
    still wait on its claim (pod deletion on), since its claim is gone already."""
    if not is_opted_in_volume(pv, scope) or k8s.pv_claim_ref(pv) is None or (
            k8s.deleting(pv) and not held_by_its_agent(pv)):
        return None
    if k8s.pv_phase(pv) == "Released" and not scope.delete_pods:
        return None
    state = volume_state(pv, state_of)
    return state if state in (NodeState.DELETED, NodeState.OUT_OF_SERVICE) else None

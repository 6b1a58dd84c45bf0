"""Which node's agent sees a claim: the node label a claim of a dynamic class carries.

A claim names its node only in an annotation (``volume.kubernetes.io/selected-node``, written
by the scheduler), and a watch cannot select on annotations. So the claim labeller
(``localpv claim-labeller``) copies the annotation into a label, ``localpv.dev/node`` with the
same value the node's PVs carry (:func:`~localpv.naming.node_label_value`), and each agent
watches only the claims labelled with its node: its cache and watch grow with its own claims,
not with the cluster's.

The label is a filter, never the truth. The annotation is: an agent provisions a claim only
when both name its node (:func:`agrees`), and the label follows the annotation - it is set when
the scheduler selects a node, changed when the annotation changes (an agent with no room
removed it and the scheduler picked another node), removed when the annotation goes.

Pure functions of a claim; the labeller (:mod:`localpv.claimlabeller`) and the agent's
controller (:mod:`localpv.csi.controller`) both decide by them.
"""

from __future__ import annotations

from localpv.kube.objects import Obj, annotations_of, labels_of, resource_version
from localpv.naming import NODE_LABEL_KEY, lock_name, node_label_value

ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_STORAGE_PROVISIONER_BETA = "volume.beta.kubernetes.io/storage-provisioner"
ANN_STORAGE_CLASS_BETA = "volume.beta.kubernetes.io/storage-class"
#: The claims' label: the key the node's PVs carry too.
CLAIM_NODE_LABEL = NODE_LABEL_KEY


def claim_class_name(claim: Obj) -> str:
    """The claim's StorageClass: the beta annotation when present (as the PV controller reads it)."""
    beta = annotations_of(claim).get(ANN_STORAGE_CLASS_BETA)
    return str(beta if beta is not None else (claim.get("spec") or {}).get("storageClassName") or "")


def names_driver(claim: Obj, driver: str) -> bool:
    """The PV controller has handed the claim to ``driver`` (either storage-provisioner key)."""
    ann = annotations_of(claim)
    return driver in (ann.get(ANN_STORAGE_PROVISIONER), ann.get(ANN_STORAGE_PROVISIONER_BETA))


def node_selector(node_name: str) -> str:
    """The label selector of one node's claims (and PVs)."""
    return f"{CLAIM_NODE_LABEL}={node_label_value(node_name)}"


def wanted_label(claim: Obj) -> str | None:
    """The label value the claim should carry: its selected node's, or none when no node is selected."""
    node = annotations_of(claim).get(ANN_SELECTED_NODE)
    return node_label_value(node) if node else None


def agrees(claim: Obj, node_name: str) -> bool:
    """The claim is ``node_name``'s to provision: its annotation selects that node and its label says
    so too. A label that lags the annotation (the labeller has not caught up) means wait."""
    return (annotations_of(claim).get(ANN_SELECTED_NODE) == node_name
            and labels_of(claim).get(CLAIM_NODE_LABEL) == node_label_value(node_name))


def label_patch(claim: Obj) -> Obj | None:
    """The merge patch that makes the claim's label follow its annotation (None: it does already).

    It carries the claim's resourceVersion: the API server applies it only to the version the
    label was computed from, so an annotation changed in between (409 Conflict) is read again
    instead of being labelled with the node it no longer names.
    """
    wanted = wanted_label(claim)
    if labels_of(claim).get(CLAIM_NODE_LABEL) == wanted:
        return None
    return {"metadata": {"resourceVersion": resource_version(claim), "labels": {CLAIM_NODE_LABEL: wanted}}}


def labeller_lease_name(driver: str) -> str:
    """The claim labeller's leader Lease: one per driver (two releases with two drivers coexist).
    The agents read it to tell whether a labeller runs (:mod:`localpv.csi.labellerlease`)."""
    return f"{lock_name(driver)}-claim-labeller"

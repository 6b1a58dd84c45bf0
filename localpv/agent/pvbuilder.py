"""Building PersistentVolume objects exactly as upstream does (research §3.2-3.4).

Pure: plain data in, a plain dict out. The only deliberate addition is our node label
(:data:`localpv.naming.NODE_LABEL_KEY`), which the agent's informer selects on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localpv.config import ClassConfig, ProvisionerConfig
from localpv.naming import (
    HOSTNAME_LABEL_KEY,
    NODE_LABEL_KEY,
    PROVISIONED_BY_ANNOTATION,
    format_binary_quantity,
    node_label_value,
    round_capacity,
)

#: Annotations on the Node by which an operator accepts, for the record of PV ``<name>``, the
#: volume now at its path: ``accept-volume.localpv.dev/<PV name>: <numbers>@<boot id>`` (see
#: :mod:`localpv.agent.planner.volatile`).
ACCEPT_VOLUME_PREFIX = "accept-volume.localpv.dev/"


@dataclass(frozen=True)
class NodeInfo:
    """The facts about this node that PVs are built from, and what its operator said about
    its volumes (:data:`ACCEPT_VOLUME_PREFIX`)."""

    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    #: PV name -> the volume its record is to take (``<numbers>@<boot id>``), from annotations.
    accepted: Mapping[str, str] = field(default_factory=dict)

    @property
    def hostname(self) -> str | None:
        return self.labels.get(HOSTNAME_LABEL_KEY)

    @classmethod
    def from_object(cls, node: Mapping[str, Any]) -> NodeInfo:
        meta = node.get("metadata") or {}
        accepted = {key.removeprefix(ACCEPT_VOLUME_PREFIX): str(value).strip()
                    for key, value in (meta.get("annotations") or {}).items() if key.startswith(ACCEPT_VOLUME_PREFIX)}
        return cls(name=str(meta.get("name")), uid=str(meta.get("uid") or ""), labels=dict(meta.get("labels") or {}),
                   accepted=accepted)


@dataclass(frozen=True)
class StorageClassInfo:
    """The StorageClass fields discovery copies into PVs."""

    name: str
    reclaim_policy: str = "Delete"
    mount_options: tuple[str, ...] = ()

    @classmethod
    def from_object(cls, sc: Mapping[str, Any]) -> StorageClassInfo:
        return cls(
            name=str((sc.get("metadata") or {}).get("name")),
            reclaim_policy=str(sc.get("reclaimPolicy") or "Delete"),
            mount_options=tuple(sc.get("mountOptions") or ()),
        )


@dataclass(frozen=True)
class VolumeSpec:
    """One discovered volume, ready to become a PV."""

    pv_name: str
    host_path: str
    capacity_bytes: int
    volume_mode: str
    cls: ClassConfig


def node_affinity(node: NodeInfo, cls: ClassConfig) -> dict[str, Any]:
    """Term 0 pins the node by its hostname label value; class selector terms are ORed."""
    terms: list[Any] = [{
        "matchExpressions": [
            {"key": HOSTNAME_LABEL_KEY, "operator": "In", "values": [node.hostname or node.name]},
        ],
    }]
    terms.extend(json.loads(json.dumps(list(cls.selector))))
    return {"required": {"nodeSelectorTerms": terms}}


def pv_labels(node: NodeInfo, config: ProvisionerConfig) -> dict[str, str]:
    """Node labels listed in ``nodeLabelsForPV`` (when present), then ``labelsForPV``, then ours."""
    labels = {key: node.labels[key] for key in config.node_labels_for_pv if key in node.labels}
    labels.update(config.labels_for_pv)
    labels[NODE_LABEL_KEY] = node_label_value(node.name)
    return labels


def build_pv(
    spec: VolumeSpec,
    node: NodeInfo,
    sc: StorageClassInfo,
    config: ProvisionerConfig,
    provisioner: str,
) -> dict[str, Any]:
    """The PV object for ``spec``; identical in shape to upstream's."""
    affinity = node_affinity(node, spec.cls)
    annotations = {PROVISIONED_BY_ANNOTATION: provisioner}
    pv_spec: dict[str, Any] = {
        "capacity": {"storage": format_binary_quantity(round_capacity(spec.capacity_bytes))},
        "local": {"path": spec.host_path},
        "accessModes": [spec.cls.access_mode],
        "storageClassName": spec.cls.name,
        "volumeMode": spec.volume_mode,
        "persistentVolumeReclaimPolicy": sc.reclaim_policy,
        # Always the field: upstream's useAlphaAPI annotation is refused by the configuration.
        "nodeAffinity": affinity,
    }
    if spec.cls.fs_type:
        pv_spec["local"]["fsType"] = spec.cls.fs_type
    if sc.mount_options and spec.volume_mode == "Filesystem":
        pv_spec["mountOptions"] = list(sc.mount_options)
    metadata: dict[str, Any] = {
        "name": spec.pv_name,
        "labels": pv_labels(node, config),
        "annotations": annotations,
    }
    if config.set_pv_owner_ref:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}]
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": metadata, "spec": pv_spec}

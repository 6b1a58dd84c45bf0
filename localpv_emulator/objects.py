"""Small builders for the Kubernetes objects tests and the demo create."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def node(name: str, labels: dict[str, str] | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}}


def storage_class(name: str, *, binding: str = "WaitForFirstConsumer", reclaim: str = "Delete",
                  provisioner: str = "kubernetes.io/no-provisioner", parameters: dict[str, str] | None = None,
                  mount_options: list[str] | None = None) -> Obj:
    sc: Obj = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
               "provisioner": provisioner, "volumeBindingMode": binding, "reclaimPolicy": reclaim}
    if parameters:
        sc["parameters"] = parameters
    if mount_options:
        sc["mountOptions"] = mount_options
    return sc


def claim(name: str, storage_class_name: str, *, size: str = "1Mi", mode: str = "Filesystem",
          namespace: str = "default", selected_node: str | None = None,
          access_modes: tuple[str, ...] = ("ReadWriteOnce",)) -> Obj:
    pvc: Obj = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"accessModes": list(access_modes), "storageClassName": storage_class_name, "volumeMode": mode,
                 "resources": {"requests": {"storage": size}}},
    }
    if selected_node:
        pvc["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": selected_node}
    return pvc

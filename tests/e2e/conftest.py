"""End-to-end tests on a real cluster (marker ``e2e``); skipped, with the reason, unless
LOCALPV_E2E_KUBECONFIG, LOCALPV_E2E_IMAGE and LOCALPV_E2E_NODE are set (docs/e2e.md)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localpv.kube.resources import NAMESPACES, PERSISTENT_VOLUMES, PODS, STORAGE_CLASSES
from tests.e2e.cluster import Cluster, HostDirs, missing_environment, wait_for

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = missing_environment()
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    why = missing_environment()
    if why:
        pytest.skip(why)
    return Cluster()


@pytest.fixture(scope="session")
def helm_python() -> Path:
    from tests.helm.helmenv import HelmUnavailable, ensure_helm_python

    try:
        return ensure_helm_python()
    except HelmUnavailable as err:
        pytest.fail(f"e2e needs real Helm (helm-sdkpy): {err}")


@dataclass
class Release:
    """One install of the chart in its own namespace, with its own discovery dir on the host."""

    cluster: Cluster
    helm_python: Path
    name: str
    namespace: str
    storage_class: str
    host: HostDirs
    manifest: str = ""

    def values(self, base: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        """``base`` (a values file) with what the suite must set: the image, the host paths,
        and a node selector that keeps the agent (and the NFS provisioner) on the suite's node:
        its discovery dir and journal are on that node's host, and on a cluster whose nodes
        share one host (realk8s's two nodes) a second agent would offer the same volumes as
        PVs of its node and find the journal locked (``extra`` may set another selector)."""
        values = dict(base or {})
        values.update({
            "image": self.cluster.image,
            "imagePullPolicy": "IfNotPresent",
            "agent": {**(values.get("agent") or {}), "stateDir": str(self.host.state)},
            "classes": [{"name": self.storage_class, "hostDir": str(self.host.disks)}],
            "nodeSelector": {**(values.get("nodeSelector") or {}), "kubernetes.io/hostname": self.cluster.hostname},
        })
        values.update(extra)
        return values

    def install(self, values: dict[str, Any]) -> None:
        result = self.cluster.install(self.helm_python, self.name, self.namespace, values)
        self.manifest = str(result.get("manifest") or "")


@pytest.fixture(scope="module")
def release_factory(cluster: Cluster, helm_python: Path) -> Iterator[Callable[..., Release]]:
    """Makes releases for one test module and removes everything they left: the release,
    its namespace, the PVs of its class, the StorageClass, the mounts and dirs on the host."""
    made: list[Release] = []

    def make(short: str, storage_class: bool = True) -> Release:
        """A release's namespace, host dirs and (unless told not to) a local StorageClass."""
        suffix = uuid.uuid4().hex[:5]
        namespace = cluster.new_namespace(f"lpe2e-{short}")
        host = HostDirs(cluster.workdir / f"{short}-{suffix}")
        rel = Release(cluster, helm_python, name=f"e2e-{short}", namespace=namespace,
                      storage_class=f"lpe2e-{short}-{suffix}", host=host)
        made.append(rel)
        host.create()
        if storage_class:
            cluster.storage_class(rel.storage_class)
        return rel

    try:
        yield make
    finally:
        for rel in made:
            cleanup(rel)


def cleanup(rel: Release) -> None:
    c = rel.cluster
    try:
        c.uninstall(rel.helm_python, rel.name, rel.namespace)
    finally:
        c.delete(NAMESPACES, rel.namespace)
        # the kubelet unmounts the volumes from the pods before the host's mounts go
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not c.list(PODS, rel.namespace), 90, f"the pods of {rel.namespace} to be gone")
        for pv in c.list(PERSISTENT_VOLUMES):
            if pv["spec"].get("storageClassName") == rel.storage_class:
                c.delete(PERSISTENT_VOLUMES, pv["metadata"]["name"])
        c.delete(STORAGE_CLASSES, rel.storage_class)
        rel.host.destroy()

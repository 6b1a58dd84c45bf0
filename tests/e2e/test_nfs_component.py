"""The NFS provisioner of the chart on a real cluster, under exactly the chart's RBAC.

No NFS server here: ``buildMode`` (nfs-subdir's CI switch) gives the provisioner an
emptyDir instead of the export. What is real: the Deployment, leader election on a real
Lease, a claim provisioned into a PV the real API server accepts and the PV controller binds,
the claim's directory made, and the PV deleted when the claim is.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS, Resource
from tests.e2e.cluster import Cluster, forbidden_in_log, wait_for
from tests.e2e.conftest import Release

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def rel(release_factory: Callable[..., Release], cluster: Cluster) -> Release:
    rel = release_factory("nfs", storage_class=False)
    storage_class = rel.storage_class  # made by the chart (nfs-subdir's storageClass values)
    rel.install({"image": cluster.image, "imagePullPolicy": "IfNotPresent", "buildMode": True,
                 "nfs": {"server": "127.0.0.1", "path": "/export"},
                 "storageClass": {"name": storage_class, "provisionerName": f"e2e.localpv.dev/{storage_class}"},
                 "podDisruptionBudget": {"enabled": True}})
    return rel


def test_a_claim_is_provisioned_bound_and_released(cluster: Cluster, rel: Release) -> None:
    cluster.ready_pods(rel.namespace, "nfs")
    ns = rel.namespace
    cluster.claim(ns, "shared", rel.storage_class)

    def bound() -> dict[str, object] | None:
        claim = cluster.get(PERSISTENT_VOLUME_CLAIMS, "shared", ns) or {}
        return claim if (claim.get("status") or {}).get("phase") == "Bound" else None

    claim = wait_for(bound, 60, "the NFS claim to be Bound")
    pv_name = str(claim["spec"]["volumeName"])  # type: ignore[index]
    pv = cluster.get(PERSISTENT_VOLUMES, pv_name)
    assert pv is not None and pv["spec"]["nfs"]["server"] == "127.0.0.1"
    assert pv["spec"]["nfs"]["path"].startswith("/export/")
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, "shared", ns)
    wait_for(lambda: cluster.get(PERSISTENT_VOLUMES, pv_name) is None, 60, "the NFS PV to be deleted")


def test_the_disruption_budget_uses_an_api_version_the_cluster_serves(cluster: Cluster, rel: Release) -> None:
    """policy/v1 from Kubernetes 1.21; the chart falls back to policy/v1beta1 before."""
    group = "v1" if _serves(cluster, "policy/v1") else "v1beta1"
    pdbs = cluster.list(Resource("policy", group, "poddisruptionbudgets", "PodDisruptionBudget", True), rel.namespace)
    assert [p["metadata"]["name"] for p in pdbs] == [f"{rel.name}-localpv-nfs"]


def _serves(cluster: Cluster, group_version: str) -> bool:
    from kubernetes import client

    groups = client.ApisApi(cluster.client).get_api_versions().groups
    return any(v.group_version == group_version for g in groups for v in g.versions)


def test_no_component_was_refused_anything(cluster: Cluster, rel: Release) -> None:
    assert cluster.forbidden(rel.namespace) == []
    for pod in cluster.list(PODS, rel.namespace, label_selector="app.kubernetes.io/component=nfs"):
        assert forbidden_in_log(cluster.pod_log(pod["metadata"]["name"], rel.namespace)) == []

"""An NFS claim identity includes its cluster (issue 17): two clusters on one export.

Prod and staging mount the same export, with the same class (``pathPattern:
${.PVC.namespace}/${.PVC.name}``, ``onDelete: delete``). Staging's ``default/postgres`` must
never be given prod's ``default/postgres`` directory, and nothing staging does erases it.
Each cluster is its own API-server emulator (its own ``kube-system`` uid), each with its own
provisioner, over one real directory as the export.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from localpv.testing.apiserver import ApiServer
from tests.conftest import wait_for
from tests.nfs.conftest import (
    Cluster,
    Layout,
    Replicas,
    content,
    directory,
    no_pv_for,
    plant,
    release,
    settled,
)

PATTERN = "${.PVC.namespace}/${.PVC.name}"


@dataclass
class Site:
    """One cluster: its API server, in test vocabulary, and the provisioner replicas it runs."""

    cluster: Cluster
    replicas: Replicas

    @property
    def kube_system_uid(self) -> str:
        namespace = self.cluster.server.get("v1", "Namespace", "kube-system")
        assert namespace is not None
        return str(namespace["metadata"]["uid"])


@pytest.fixture
def prod(cluster: Cluster, replicas: Replicas) -> Site:
    return Site(cluster, replicas)


@pytest.fixture
def staging(layout: Layout) -> Iterator[Site]:
    """A second cluster on the same export."""
    server = ApiServer(binder=True)
    server.start()
    replicas = Replicas(server, layout)
    try:
        yield Site(Cluster(server), replicas)
    finally:
        replicas.stop_all()
        server.stop()


@pytest.mark.xfail(strict=True, reason="issue 17: ownership records do not name the cluster yet")
def test_staging_never_gets_nor_erases_prods_directory_of_the_same_claim(prod: Site, staging: Site,
                                                                         layout: Layout) -> None:
    for site in (prod, staging):
        site.cluster.storage_class(pathPattern=PATTERN, onDelete="delete")
    prod.cluster.claim("postgres")
    prod.replicas.start()
    prods = wait_for(lambda: prod.cluster.bound_pv("postgres"), what="prod's postgres bound")
    plant(directory(prods, layout), "prod rows")

    staging.cluster.claim("postgres")
    replica = staging.replicas.start()
    result, detail = settled(staging.cluster, replica, "postgres", "default")
    if result == "bound":  # what happened before: releasing it erased prod's data
        release(staging.cluster, detail, "postgres", "default")
    else:
        staging.cluster.delete_claim("postgres")

    assert content(directory(prods, layout)) == "prod rows"
    assert result == "refused", "staging was given prod's directory"
    assert "another cluster" in detail and prod.kube_system_uid in detail
    assert no_pv_for(staging.cluster, "default", "postgres")
    assert prod.cluster.bound_pv("postgres") is not None

"""An NFS claim identity includes its cluster (issue 17): two clusters on one export.

Prod and staging mount the same export, with the same class (``pathPattern:
${.PVC.namespace}/${.PVC.name}``, ``onDelete: delete``). Staging's ``default/postgres`` must
never be given prod's ``default/postgres`` directory, and nothing staging does erases it.
Each cluster is its own API-server emulator (its own ``kube-system`` uid), each with its own
provisioner, over one real directory as the export.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from localpv.kube.api import KubeApi
from localpv.kube.errors import NotFound
from localpv.kube.objects import Obj
from localpv.kube.resources import Resource
from localpv.nfs.cluster import ClusterIdUnavailable, read_cluster_id
from localpv.nfs.ownership import RECORD_FILE, cluster_id_problem, record_location
from localpv_emulator.apiserver import ApiServer
from tests.conftest import wait_for
from tests.nfs.conftest import (
    Cluster,
    Layout,
    Replicas,
    content,
    directory,
    history,
    no_pv_for,
    plant,
    release,
    settled,
)

PATTERN = "${.PVC.namespace}/${.PVC.name}"


def record_of(layout: Layout, path: str) -> dict[str, Any]:
    """The ownership record of directory ``path`` on the export, as stored."""
    stored: dict[str, Any] = json.loads(layout.export.joinpath(*record_location(path.split("/")), RECORD_FILE)
                                        .read_bytes())
    return stored


def as_version_1(layout: Layout, path: str) -> None:
    """Rewrite the record of ``path`` as the previous release wrote it: version 1, no cluster."""
    record = record_of(layout, path)
    del record["cluster"]
    record["version"] = 1
    layout.export.joinpath(*record_location(path.split("/")), RECORD_FILE).write_text(json.dumps(record))


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


def test_the_cluster_id_is_read_once_and_written_into_every_record(prod: Site, layout: Layout) -> None:
    prod.cluster.storage_class(pathPattern=PATTERN)
    prod.cluster.claim("postgres")
    prod.cluster.claim("redis")
    replica = prod.replicas.start()
    for name in ("postgres", "redis"):
        wait_for(lambda name=name: prod.cluster.bound_pv(name), what=f"{name} bound")  # type: ignore[misc]
    assert replica.cluster_id == prod.kube_system_uid
    reads = [r for r in prod.cluster.server.requests if r.resource == "namespaces"]
    assert [(r.verb, r.name) for r in reads] == [("get", "kube-system")]
    assert {record_of(layout, f"default/{name}")["cluster"] for name in ("postgres", "redis")} == {
        prod.kube_system_uid}


@pytest.mark.parametrize("parameters", [{"onDelete": "delete"}, {"archiveOnDelete": "true"}])
def test_staging_never_deletes_nor_archives_a_directory_prod_recorded(prod: Site, staging: Site, layout: Layout,
                                                                      parameters: dict[str, str]) -> None:
    """Staging holds a PV of prod's directory (bound before the upgrade, or applied by hand):
    releasing it retains the directory, whatever the class says."""
    prod.cluster.storage_class(pathPattern=PATTERN, onDelete="retain")
    prod.cluster.claim("postgres")
    prod.replicas.start()
    prods = wait_for(lambda: prod.cluster.bound_pv("postgres"), what="prod's postgres bound")
    plant(directory(prods, layout), "prod rows")

    staging.cluster.storage_class(pathPattern=PATTERN, **parameters)
    name = staging.cluster.released_pv(prods["spec"]["nfs"]["path"], claim=("default", "postgres"))
    replica = staging.replicas.start()
    wait_for(lambda: staging.cluster.pv(name) is None, what="staging's PV deleted")

    assert content(directory(prods, layout)) == "prod rows"
    assert sorted(os.listdir(layout.export / "default")) == ["postgres"]  # not archived either
    assert record_of(layout, "default/postgres")["cluster"] == prod.kube_system_uid
    retained = history(replica, "DirectoryRetained")
    assert retained and "another cluster" in retained[0].message and prod.kube_system_uid in retained[0].message


def test_a_class_that_allows_other_clusters_uses_their_directory_but_never_disposes_of_it(
        prod: Site, staging: Site, layout: Layout) -> None:
    """The opt-in is for sharing data between clusters on purpose (a read replica, a migration)."""
    prod.cluster.storage_class(pathPattern=PATTERN, onDelete="delete")
    prod.cluster.claim("postgres")
    prod.replicas.start()
    prods = wait_for(lambda: prod.cluster.bound_pv("postgres"), what="prod's postgres bound")
    plant(directory(prods, layout), "prod rows")

    staging.cluster.storage_class(pathPattern=PATTERN, onDelete="delete", allowOtherClusters="true")
    staging.cluster.claim("postgres")
    replica = staging.replicas.start()
    guest = wait_for(lambda: staging.cluster.bound_pv("postgres"), what="staging's postgres bound")
    assert guest["spec"]["nfs"]["path"] == prods["spec"]["nfs"]["path"]
    warned = wait_for(lambda: history(replica, "DirectoryOfOtherCluster"), what="warning on the claim")
    assert prod.kube_system_uid in warned[0].message
    assert record_of(layout, "default/postgres")["cluster"] == prod.kube_system_uid  # still prod's

    release(staging.cluster, guest, "postgres", "default")
    assert content(directory(prods, layout)) == "prod rows"
    assert record_of(layout, "default/postgres")["cluster"] == prod.kube_system_uid
    assert wait_for(lambda: history(replica, "DirectoryRetained"), what="retained")

    release(prod.cluster, prods, "postgres", "default")  # the owner's release does dispose of it
    assert not (layout.export / "default" / "postgres").exists()


def test_a_rebuilt_cluster_takes_its_directory_back_with_its_old_cluster_id(prod: Site, staging: Site,
                                                                            layout: Layout) -> None:
    """Prod is rebuilt (a new kube-system uid) over the same export: run with the old id, the
    re-created claim gets its data back; its own default id would be refused (as staging's is)."""
    prod.cluster.storage_class(pathPattern=PATTERN, onDelete="retain")
    prod.cluster.claim("postgres")
    old = prod.replicas.start()
    prods = wait_for(lambda: prod.cluster.bound_pv("postgres"), what="prod's postgres bound")
    plant(directory(prods, layout), "prod rows")
    old_id = prod.kube_system_uid
    prod.replicas.stop_all()
    assert old.finished.is_set()

    rebuilt = staging  # a new cluster: its own API server, its own kube-system uid
    assert rebuilt.kube_system_uid != old_id
    rebuilt.cluster.storage_class(pathPattern=PATTERN, onDelete="retain")
    rebuilt.cluster.claim("postgres")
    replica = rebuilt.replicas.start(cluster_id=old_id)
    result, detail = settled(rebuilt.cluster, replica, "postgres", "default")
    assert result == "bound", detail
    assert detail["spec"]["nfs"]["path"] == prods["spec"]["nfs"]["path"]
    assert content(directory(detail, layout)) == "prod rows"
    assert not [r for r in rebuilt.cluster.server.requests if r.resource == "namespaces"]  # given, not read


def test_after_the_upgrade_records_without_a_cluster_serve_the_cluster_whose_volumes_name_them(
        prod: Site, staging: Site, layout: Layout) -> None:
    """Prod's volume was provisioned before records named a cluster (a version 1 record); both
    clusters now run this release. Prod's PV vouches for the record, staging has nothing that does."""
    prod.cluster.storage_class(pathPattern=PATTERN, onDelete="delete")
    prod.cluster.claim("postgres")
    prod.replicas.start()
    prods = wait_for(lambda: prod.cluster.bound_pv("postgres"), what="prod's postgres bound")
    plant(directory(prods, layout), "prod rows")
    as_version_1(layout, "default/postgres")

    staging.cluster.storage_class(pathPattern=PATTERN, onDelete="delete")
    staging.cluster.claim("postgres")
    replica = staging.replicas.start()
    result, detail = settled(staging.cluster, replica, "postgres", "default")
    if result == "bound":
        release(staging.cluster, detail, "postgres", "default")
    assert content(directory(prods, layout)) == "prod rows"
    assert result == "refused"
    assert "recorded before records named their cluster" in detail and "allowOtherClusters" in detail

    release(prod.cluster, prods, "postgres", "default")  # prod's own release works as before the upgrade
    assert not (layout.export / "default" / "postgres").exists()


# ---------------------------------------------------------------- reading the cluster id


def test_the_default_cluster_id_is_the_kube_system_namespaces_uid(apiserver: ApiServer, kube: KubeApi) -> None:
    namespace = apiserver.get("v1", "Namespace", "kube-system")
    assert namespace is not None
    assert read_cluster_id(kube) == namespace["metadata"]["uid"]


def test_a_forbidden_read_is_for_the_operator_to_fix(apiserver: ApiServer, kube: KubeApi) -> None:
    apiserver.deny("get", "namespaces")
    with pytest.raises(ClusterIdUnavailable, match="403") as exc:
        read_cluster_id(kube)
    assert exc.value.settable


def test_an_api_server_that_does_not_answer_is_not_a_setting_to_change(apiserver: ApiServer, kube: KubeApi) -> None:
    apiserver.faults.error_rate("get", 1.0, code=503)
    with pytest.raises(ClusterIdUnavailable, match="503") as exc:
        read_cluster_id(kube)
    assert not exc.value.settable


class _Answers:
    """A KubeApi stand-in for what the emulator cannot be made to answer (kube-system cannot go)."""

    def __init__(self, answer: Obj | Exception) -> None:
        self.answer = answer

    def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        assert (res.plural, name) == ("namespaces", "kube-system")
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(("answer", "message"), [
    (NotFound(404, "NotFound", 'namespaces "kube-system" not found'), "does not exist"),
    ({"metadata": {"name": "kube-system"}}, "has no uid"),
    ({"metadata": {"name": "kube-system", "uid": ""}}, "has no uid"),
])
def test_a_missing_namespace_or_uid_is_for_the_operator_to_fix(answer: Obj | Exception, message: str) -> None:
    with pytest.raises(ClusterIdUnavailable, match=message) as exc:
        read_cluster_id(_Answers(answer))  # type: ignore[arg-type]
    assert exc.value.settable


@pytest.mark.parametrize("value", ["9de335a0-f972-4c1c-b8e8-78f37cee7be8", "prod-eu-1", "prod.example:1", "x"])
def test_a_cluster_id_is_a_uid_or_a_plain_name(value: str) -> None:
    assert cluster_id_problem(value) is None


@pytest.mark.parametrize("value", ["", " prod", "prod 1", "-prod", "prod/1", "é", "x" * 254, "prod\n"])
def test_anything_else_is_not_a_cluster_id(value: str) -> None:
    assert cluster_id_problem(value) is not None

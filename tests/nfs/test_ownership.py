"""A directory belongs to the claim identity (namespace + name) that it was made for (issue 11
finding 7): with a tenant-controlled ``pathPattern``, another namespace's claim naming the same
directory, an archive or a retained directory is refused; a re-created claim still gets its data
back; deleting a claim only disposes of a directory its identity owns."""

from __future__ import annotations

import os

import pytest

from tests.conftest import wait_for
from tests.nfs.conftest import (
    NFS_PATH,
    RESERVED,
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
    volume_entries,
)

PATTERN = "${.PVC.annotations.x}"
SHARE = {"allowSharedDirectories": "true"}


# ---------------------------------------------------------------- provisioning


def test_a_claim_in_another_namespace_does_not_get_a_directory_in_use(cluster: Cluster, replicas: Replicas,
                                                                      layout: Layout) -> None:
    cluster.storage_class(pathPattern=PATTERN)
    cluster.claim("db", "team-a", annotations={"x": "shared-db"})
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="team-a bound")
    plant(directory(pv, layout), "team-a secrets")

    cluster.claim("db", "team-b", annotations={"x": "shared-db"})
    result, detail = settled(cluster, replica, "db", "team-b")

    assert result == "refused", f"team-b was given {detail['spec']['nfs']['path'] if result == 'bound' else ''}"
    assert "annotations.x" in detail and "team-a/db" in detail
    assert no_pv_for(cluster, "team-b", "db")


def test_a_retained_directory_goes_back_to_its_claim_and_to_no_one_else(cluster: Cluster, replicas: Replicas,
                                                                        layout: Layout) -> None:
    """Upstream's reuse on purpose: a re-created claim gets its data back. Only that claim."""
    cluster.storage_class(pathPattern=PATTERN, onDelete="retain")
    cluster.claim("db", "team-a", annotations={"x": "keep"})
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="team-a bound")
    plant(directory(pv, layout), "team-a data")
    release(cluster, pv, "db", "team-a")
    assert content(str(layout.export / "keep")) == "team-a data"

    cluster.claim("thief", "team-b", annotations={"x": "keep"})
    result, detail = settled(cluster, replica, "thief", "team-b")
    assert result == "refused"
    assert "team-a/db" in detail

    cluster.claim("db", "team-a", annotations={"x": "keep"})
    again = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="re-created claim bound")
    assert again["spec"]["nfs"]["path"] == f"{NFS_PATH}/keep"
    assert content(directory(again, layout)) == "team-a data"
    assert history(replica, "DirectoryReused")


def test_an_archive_cannot_be_claimed(cluster: Cluster, replicas: Replicas, layout: Layout) -> None:
    cluster.storage_class(pathPattern=PATTERN)  # archiveOnDelete absent: archive
    cluster.claim("db", "team-a", annotations={"x": "data"})
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="team-a bound")
    plant(directory(pv, layout), "team-a archive")
    release(cluster, pv, "db", "team-a")
    assert content(str(layout.export / "archived-data")) == "team-a archive"

    cluster.claim("thief", "team-b", annotations={"x": "archived-data"})
    result, detail = settled(cluster, replica, "thief", "team-b")
    assert result == "refused"
    assert "annotations.x" in detail and "archive" in detail


def test_deleting_a_claim_never_erases_another_teams_archive(cluster: Cluster, replicas: Replicas,
                                                             layout: Layout) -> None:
    cluster.storage_class("team-a", pathPattern=PATTERN)
    cluster.storage_class("team-b", pathPattern=PATTERN, onDelete="delete")
    cluster.claim("db", "team-a", storage_class="team-a", annotations={"x": "data"})
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="team-a bound")
    plant(directory(pv, layout), "team-a archive")
    release(cluster, pv, "db", "team-a")

    cluster.claim("thief", "team-b", storage_class="team-b", annotations={"x": "archived-data"})
    result, detail = settled(cluster, replica, "thief", "team-b")
    if result == "bound":
        release(cluster, detail, "thief", "team-b")
    assert content(str(layout.export / "archived-data")) == "team-a archive"
    assert result == "refused"


def test_an_existing_directory_without_an_ownership_record_is_refused(cluster: Cluster, replicas: Replicas,
                                                                      layout: Layout) -> None:
    """Made before this release, or by hand: nothing proves whose it is, so nobody gets it."""
    plant(str(layout.export / "legacy"), "someone's data")
    cluster.storage_class(pathPattern=PATTERN)
    cluster.claim("app", "team-b", annotations={"x": "legacy"})
    replica = replicas.start()
    result, detail = settled(cluster, replica, "app", "team-b")
    assert result == "refused"
    assert "no ownership record" in detail and "allowSharedDirectories" in detail


def test_a_directory_made_before_records_goes_back_to_the_claim_its_volume_names(cluster: Cluster,
                                                                                 replicas: Replicas,
                                                                                 layout: Layout) -> None:
    """A PV (cluster-scoped, not tenant-writable) still naming the claim is proof enough."""
    plant(str(layout.export / "legacy"), "team-a data")
    cluster.storage_class(pathPattern=PATTERN, reclaim="Retain")
    cluster.released_pv(f"{NFS_PATH}/legacy", claim=("team-a", "db"), reclaim="Retain")
    cluster.claim("db", "team-b", annotations={"x": "legacy"})
    replica = replicas.start()
    result, detail = settled(cluster, replica, "db", "team-b")
    assert result == "refused"
    assert "team-a/db" in detail

    cluster.claim("db", "team-a", annotations={"x": "legacy"})
    pv = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="team-a bound")
    assert content(directory(pv, layout)) == "team-a data"


def test_a_class_that_opts_in_shares_but_never_takes_a_private_directory(cluster: Cluster, replicas: Replicas,
                                                                         layout: Layout) -> None:
    cluster.storage_class("private", pathPattern=PATTERN)
    cluster.storage_class("shared", pathPattern=PATTERN, **SHARE)
    cluster.claim("one", "team-a", storage_class="shared", annotations={"x": "common"})
    cluster.claim("mine", "team-a", storage_class="private", annotations={"x": "mine"})
    replica = replicas.start()
    first = wait_for(lambda: cluster.bound_pv("one", "team-a"), what="first sharer bound")
    wait_for(lambda: cluster.bound_pv("mine", "team-a"), what="private claim bound")

    cluster.claim("two", "team-b", storage_class="shared", annotations={"x": "common"})
    second = wait_for(lambda: cluster.bound_pv("two", "team-b"), what="second sharer bound")
    assert second["spec"]["nfs"]["path"] == first["spec"]["nfs"]["path"]
    assert wait_for(lambda: history(replica, "DirectoryShared"), what="shared warning")

    cluster.claim("four", "team-b", storage_class="shared", annotations={"x": "mine"})
    result, detail = settled(cluster, replica, "four", "team-b")
    assert result == "refused"
    assert "team-a/mine" in detail


def test_an_unrecorded_directory_is_adopted_by_a_class_that_opts_in(cluster: Cluster, replicas: Replicas,
                                                                    layout: Layout) -> None:
    plant(str(layout.export / "legacy"), "shared data")
    cluster.storage_class(pathPattern=PATTERN, **SHARE)
    cluster.claim("app", "team-b", annotations={"x": "legacy"})
    replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("app", "team-b"), what="bound")
    assert content(directory(pv, layout)) == "shared data"


@pytest.mark.parametrize("released", [False, True], ids=["in-use", "released"])
@pytest.mark.parametrize(
    ("value", "planted"),
    [
        ("home/sub", True),   # a directory the tenant made inside its own volume
        ("home/new", False),  # a new directory inside someone else's volume: they would read it
        ("proj", False),      # the parent of someone else's volume: it would read theirs
    ],
)
def test_a_directory_inside_or_above_another_claims_volume_is_refused(cluster: Cluster, replicas: Replicas,
                                                                      layout: Layout, value: str, planted: bool,
                                                                      released: bool) -> None:
    """In use, the PVs say whose the neighbours are; released (retained), the records do."""
    cluster.storage_class(pathPattern=PATTERN, onDelete="retain")
    cluster.claim("db", "team-a", annotations={"x": "home"})
    cluster.claim("web", "team-a", annotations={"x": "proj/web"})
    replica = replicas.start()
    home = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="team-a db bound")
    web = wait_for(lambda: cluster.bound_pv("web", "team-a"), what="team-a web bound")
    if planted:
        plant(os.path.join(directory(home, layout), "sub"), "planted by team-a")
    if released:
        release(cluster, home, "db", "team-a")
        release(cluster, web, "web", "team-a")

    cluster.claim("spy", "team-b", annotations={"x": value})
    result, detail = settled(cluster, replica, "spy", "team-b")
    assert result == "refused"
    assert "team-a/" in detail
    if value == "home/new":
        assert not (layout.export / "home" / "new").exists()


@pytest.mark.parametrize("value", [RESERVED, f"{RESERVED}/owners", "archived-x", "team/archived-x"])
def test_reserved_and_archive_names_are_refused_with_an_event(cluster: Cluster, replicas: Replicas,
                                                              layout: Layout, value: str) -> None:
    cluster.storage_class(pathPattern=PATTERN)
    cluster.claim("odd", "team-b", annotations={"x": value})
    replica = replicas.start()
    result, detail = settled(cluster, replica, "odd", "team-b")
    assert result == "refused"
    assert "annotations.x" in detail
    assert volume_entries(layout.export) == []


def test_ownership_is_recorded_outside_every_tenant_directory(cluster: Cluster, replicas: Replicas,
                                                              layout: Layout) -> None:
    """A tenant mounts only its own directory, so nothing there may decide ownership."""
    cluster.storage_class(pathPattern="${.PVC.namespace}/${.PVC.annotations.x}")
    cluster.claim("db", "team-a", annotations={"x": "db"})
    replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="bound")
    assert os.listdir(directory(pv, layout)) == []
    assert os.listdir(layout.export / "team-a") == ["db"]
    records = layout.export / RESERVED
    assert records.is_dir() and not records.is_symlink()
    assert any(files for _, _, files in os.walk(records))


# ---------------------------------------------------------------- release


def test_releasing_a_volume_retains_a_directory_another_claim_owns(cluster: Cluster, replicas: Replicas,
                                                                   layout: Layout) -> None:
    """A PV made before this release (or re-applied by hand) pointing at team-a's directory."""
    cluster.storage_class(pathPattern=PATTERN, onDelete="retain")
    cluster.claim("db", "team-a", annotations={"x": "data"})
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="team-a bound")
    plant(directory(pv, layout), "team-a data")
    release(cluster, pv, "db", "team-a")
    cluster.server.delete("storage.k8s.io/v1", "StorageClass", "nfs")
    cluster.storage_class(pathPattern=PATTERN, onDelete="delete")

    name = cluster.released_pv(f"{NFS_PATH}/data", claim=("team-b", "thief"))
    wait_for(lambda: cluster.pv(name) is None, what="PV deleted")
    assert content(str(layout.export / "data")) == "team-a data"
    retained = history(replica, "DirectoryRetained")
    assert retained and "team-a/db" in retained[0].message


@pytest.mark.parametrize("parameters", [{"onDelete": "delete"}, {"archiveOnDelete": "true"}])
def test_releasing_a_volume_retains_a_directory_without_an_ownership_record(
        cluster: Cluster, replicas: Replicas, layout: Layout, parameters: dict[str, str]) -> None:
    plant(str(layout.export / "legacy"), "whose?")
    cluster.storage_class(**parameters)
    name = cluster.released_pv(f"{NFS_PATH}/legacy")
    replica = replicas.start()
    wait_for(lambda: cluster.pv(name) is None, what="PV deleted")
    assert volume_entries(layout.export) == ["legacy"]
    assert content(str(layout.export / "legacy")) == "whose?"
    retained = history(replica, "DirectoryRetained")
    assert retained and "no ownership record" in retained[0].message


def test_the_owner_releasing_its_directory_removes_it_and_its_record(cluster: Cluster, replicas: Replicas,
                                                                     layout: Layout) -> None:
    cluster.storage_class(pathPattern=PATTERN, onDelete="delete")
    cluster.claim("db", "team-a", annotations={"x": "data"})
    replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("db", "team-a"), what="bound")
    plant(directory(pv, layout), "gone soon")
    release(cluster, pv, "db", "team-a")
    assert volume_entries(layout.export) == []
    assert not any(files for _, _, files in os.walk(layout.export / RESERVED))

    cluster.claim("next", "team-b", annotations={"x": "data"})  # a fresh, empty directory is anyone's
    fresh = wait_for(lambda: cluster.bound_pv("next", "team-b"), what="fresh directory bound")
    assert os.listdir(directory(fresh, layout)) == []

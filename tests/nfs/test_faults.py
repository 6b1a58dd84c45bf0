"""A misbehaving API server: conflicts, 5xx on writes, dropped watches. Every claim still gets
exactly one PV and one directory, and every released volume is cleaned up exactly once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from localpv_emulator.apiserver import ApiServer
from tests.conftest import wait_for
from tests.nfs.conftest import Cluster, Layout, Replicas, metric, records, volume_entries

CLAIMS = 40


@pytest.fixture
def watch_dropper(apiserver: ApiServer) -> Iterator[None]:
    """Cut every watch every 150 ms (alternating clean ends and severed connections)."""
    stop = threading.Event()

    def drop() -> None:
        abrupt = False
        while not stop.wait(0.15):  # fault cadence, not synchronisation
            apiserver.faults.drop_watches(abrupt=abrupt)
            abrupt = not abrupt

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.mark.usefixtures("watch_dropper")
def test_faults_do_not_duplicate_or_lose_volumes(apiserver: ApiServer, cluster: Cluster, replicas: Replicas,
                                                 layout: Layout) -> None:
    apiserver.faults.seed(7)
    cluster.storage_class(archiveOnDelete="false")
    apiserver.faults.conflict_storm(0.5)
    apiserver.faults.error_rate("create", 0.3, 500)
    apiserver.faults.error_rate("delete", 0.3, 503)
    apiserver.faults.error_rate("get", 0.1, 500)
    replica = replicas.start()
    for i in range(CLAIMS):
        cluster.claim(f"c{i}", "load")

    wait_for(lambda: all(cluster.bound_pv(f"c{i}", "load") for i in range(CLAIMS)), timeout=30, what="all bound")
    per_claim = Counter(pv["spec"]["claimRef"]["uid"] for pv in cluster.pvs())
    assert len(per_claim) == CLAIMS and set(per_claim.values()) == {1}
    assert metric(replica, "localpv_nfs_directories_created_total") == CLAIMS
    assert len(volume_entries(layout.export)) == len(records(layout.export)) == CLAIMS
    assert apiserver.requests.count("create", "persistentvolumes", status=500) > 0, "the faults must have bitten"

    for i in range(CLAIMS):
        cluster.delete_claim(f"c{i}", "load")
    wait_for(lambda: cluster.pvs() == [], timeout=30, what="all PVs deleted")
    assert volume_entries(layout.export) == records(layout.export) == []
    wait_for(lambda: metric(replica, "controller_persistentvolume_delete_total", **{"class": "nfs"}) == CLAIMS,
             what="deletes counted")
    assert apiserver.requests.count("delete", "persistentvolumes", status=503) > 0


def test_a_forgotten_history_makes_the_informers_relist_and_carry_on(apiserver: ApiServer, cluster: Cluster,
                                                                     replicas: Replicas) -> None:
    cluster.storage_class()
    replica = replicas.start()
    cluster.claim("one")
    wait_for(lambda: cluster.bound_pv("one"), what="first bound")
    apiserver.faults.forget_history()
    apiserver.faults.drop_watches()
    cluster.claim("two")
    wait_for(lambda: cluster.bound_pv("two"), what="second bound after relist")
    assert replica.controller is not None
    caches = replica.controller.cache
    assert sum(i.stats.relists_after_gone for i in (caches.claims, caches.pvs, caches.classes)) >= 1
    wait_for(lambda: metric(replica, "controller_persistentvolumeclaim_provision_total", **{"class": "nfs"}) == 2,
             what="both counted")

"""Lease leader election against the emulator, and two provisioner replicas behind it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from localpv.kube.api import KubeApi
from localpv.kube.errors import NO_RETRY
from localpv.kube.events import EventRecorder
from localpv.kube.leader import LeaderElector, LeaseConfig
from localpv.kube.transport import connect
from localpv.kube.workqueue import ItemBackoff
from localpv.naming import lock_name
from localpv.nfs.controller import ClusterCache, ControllerSettings, ProvisionController
from localpv.nfs.export import Export
from localpv.nfs.metrics import NfsMetrics
from localpv.nfs.provisioner import NfsProvisioner, NfsSource
from localpv_emulator.apiserver import ApiServer
from tests.conftest import wait_for
from tests.nfs.conftest import NFS_PATH, PROVISIONER, SERVER, Cluster, Layout, Replicas, metric, records, volume_entries

LEASE = 1.0
RETRY = 0.1


class Candidate:
    """An elector plus a record of its callbacks."""

    def __init__(self, server: ApiServer, identity: str, recorder: bool = False) -> None:
        api = KubeApi(connect(server.url), backoff=NO_RETRY, timeout=2.0)
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.recorder = EventRecorder(api, component="test") if recorder else None
        self.elector = LeaderElector(
            api, LeaseConfig("kube-system", "lock", identity, LEASE, 0.7, RETRY),
            on_started=self.started.set, on_stopped=self.stopped.set, recorder=self.recorder,
        )
        if self.recorder is not None:
            self.recorder.start()
        self.elector.start()


@pytest.fixture
def candidates(apiserver: ApiServer) -> Iterator[list[Candidate]]:
    made: list[Candidate] = []
    yield made
    for c in made:
        c.elector.stop()
        if c.recorder is not None:
            c.recorder.stop()


def lease(server: ApiServer) -> dict[str, object]:
    obj = server.get("coordination.k8s.io/v1", "Lease", "lock", "kube-system")
    assert obj is not None
    return dict(obj["spec"])


def test_lock_name_and_timing_rules() -> None:
    assert lock_name("k8s-sigs.io/nfs-subdir-external-provisioner") == "k8s-sigs.io-nfs-subdir-external-provisioner"
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        LeaseConfig("ns", "n", "me", lease_duration=10, renew_deadline=10, retry_period=2)


def test_exactly_one_of_two_leads_and_a_crashed_leader_is_replaced_within_a_lease(
        apiserver: ApiServer, candidates: list[Candidate]) -> None:
    candidates += [Candidate(apiserver, "a", recorder=True), Candidate(apiserver, "b", recorder=True)]
    wait_for(lambda: any(c.started.is_set() for c in candidates), what="a leader")
    leader, follower = sorted(candidates, key=lambda c: not c.started.is_set())
    assert not follower.started.is_set()
    assert lease(apiserver)["holderIdentity"] == leader.elector.config.identity
    assert lease(apiserver)["leaseDurationSeconds"] == 1
    assert leader.elector.is_leader() and not follower.elector.is_leader()
    wait_for(lambda: follower.elector.holder == leader.elector.config.identity, what="follower observes")

    crashed = time.monotonic()
    leader.elector.stop(release=False)  # no hand-over: the lease must expire
    assert leader.stopped.is_set() and not leader.elector.is_leader()
    wait_for(follower.started.is_set, timeout=5, what="takeover")
    took = time.monotonic() - crashed
    assert took <= LEASE + 3 * RETRY + 0.5, f"takeover took {took:.2f}s"
    spec = lease(apiserver)
    assert spec["holderIdentity"] == follower.elector.config.identity
    assert spec["leaseTransitions"] == 1
    assert follower.recorder is not None
    follower.recorder.flush()
    became = [e for e in apiserver.list("v1", "Event", "kube-system") if e["reason"] == "LeaderElection"]
    assert {e["message"] for e in became} == {"a became leader", "b became leader"}
    assert {e["involvedObject"]["kind"] for e in became} == {"Lease"}


def test_a_clean_stop_hands_the_lease_over_at_once(apiserver: ApiServer, candidates: list[Candidate]) -> None:
    candidates.append(Candidate(apiserver, "first"))
    wait_for(candidates[0].started.is_set, what="first leads")
    candidates.append(Candidate(apiserver, "second"))
    wait_for(lambda: candidates[1].elector.holder == "first", what="second sees first")
    stopped = time.monotonic()
    candidates[0].elector.stop()
    assert lease(apiserver)["holderIdentity"] == ""
    wait_for(candidates[1].started.is_set, timeout=5, what="takeover")
    assert time.monotonic() - stopped < LEASE, "a released lease should not need to expire"


def test_a_leader_that_cannot_renew_stops_before_its_lease_could_expire(apiserver: ApiServer,
                                                                        candidates: list[Candidate]) -> None:
    candidates.append(Candidate(apiserver, "lonely"))
    c = candidates[0]
    wait_for(c.started.is_set, what="leads")
    cut = time.monotonic()
    apiserver.faults.error_rate("update", 1.0, 503)
    wait_for(c.stopped.is_set, timeout=5, what="gives up leadership")
    assert time.monotonic() - cut < LEASE, "must stop leading before anyone else may take over"
    assert not c.elector.is_leader()
    assert c.elector.finished.is_set() and not c.elector.healthy()


# ---------------------------------------------------------------- two provisioner replicas


def test_two_replicas_provision_each_claim_once_and_the_survivor_takes_over(cluster: Cluster, replicas: Replicas,
                                                                            layout: Layout) -> None:
    cluster.storage_class(archiveOnDelete="false")
    first = replicas.start(leader_election=True, identity="replica-1")
    second = replicas.start(leader_election=True, identity="replica-2")
    wait_for(lambda: first.is_leader() or second.is_leader(), what="a leader")
    leader, standby = (first, second) if first.is_leader() else (second, first)
    assert standby.controller is None  # a standby runs no informers at all

    for i in range(10):
        cluster.claim(f"before-{i}")
    wait_for(lambda: all(cluster.bound_pv(f"before-{i}") for i in range(10)), what="first batch bound")

    crashed = time.monotonic()
    leader.stop(release=False)
    for i in range(10):
        cluster.claim(f"after-{i}")
    wait_for(standby.is_leader, timeout=5, what="standby leads")
    assert time.monotonic() - crashed < LEASE + 1.0
    wait_for(lambda: all(cluster.bound_pv(f"after-{i}") for i in range(10)), what="second batch bound")

    def provisioned() -> dict[object, float]:
        return {r: metric(r, "controller_persistentvolumeclaim_provision_total", **{"class": "nfs"})
                for r in (leader, standby)}

    wait_for(lambda: sum(provisioned().values()) == 20, what="all counted")
    assert provisioned() == {leader: 10, standby: 10}
    made = sum(metric(r, "localpv_nfs_directories_created_total") for r in (leader, standby))
    assert made == 20 and len(volume_entries(layout.export)) == len(records(layout.export)) == 20
    claims_with_pv = [pv["spec"]["claimRef"]["uid"] for pv in cluster.pvs()]
    assert len(claims_with_pv) == len(set(claims_with_pv)) == 20
    holder = cluster.server.get("coordination.k8s.io/v1", "Lease", lock_name(PROVISIONER), "kube-system")
    assert holder is not None and holder["spec"]["holderIdentity"] == standby.options.identity


def test_a_controller_that_may_not_act_touches_nothing_and_catches_up_later(apiserver: ApiServer, cluster: Cluster,
                                                                            layout: Layout) -> None:
    """``may_act`` is the lease check before disk and API writes; a late renewal must delay
    work, not drop it."""
    allowed = threading.Event()
    api = KubeApi(connect(apiserver.url))
    cache = ClusterCache(api)
    provisioner = NfsProvisioner(NfsSource(SERVER, NFS_PATH, str(layout.export)), Export(str(layout.export)), cache,
                                 cluster="cluster-a")
    recorder = EventRecorder(api, component="test")
    controller = ProvisionController(api, cache, provisioner,
                                     ControllerSettings(PROVISIONER, backoff=ItemBackoff(0.05, 0.2)),
                                     recorder=recorder, metrics=NfsMetrics(), may_act=allowed.is_set)
    cluster.storage_class()
    cluster.claim("patient")
    controller.start()
    try:
        wait_for(lambda: controller.claim_queue.num_requeues("default/patient") >= 2, what="retried, not dropped")
        assert cluster.pvs() == [] and list(layout.export.iterdir()) == []
        assert recorder.history == []
        allowed.set()
        wait_for(lambda: cluster.bound_pv("patient"), what="provisioned once allowed")
    finally:
        controller.stop()

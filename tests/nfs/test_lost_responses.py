"""PV writes of the NFS provisioner whose answers are lost: the server committed them, the
request failed with a reset connection, and the retry met the consequence. A create
retried into AlreadyExists is the claim's PV; a delete retried into NotFound is done."""

from __future__ import annotations

from localpv_emulator.apiserver import ApiServer
from tests.conftest import wait_for
from tests.nfs.conftest import Cluster, Layout, Replicas, history, metric, records, volume_entries


def test_pv_writes_whose_answers_are_lost_are_taken_as_done(apiserver: ApiServer, cluster: Cluster,
                                                            replicas: Replicas, layout: Layout) -> None:
    apiserver.faults.lose_responses("create", 1.0, resource="persistentvolumes")
    apiserver.faults.lose_responses("delete", 1.0, resource="persistentvolumes")
    cluster.storage_class(archiveOnDelete="false")
    replica = replicas.start()
    cluster.claim("c1")
    pv = wait_for(lambda: cluster.bound_pv("c1"), what="the claim bound to the PV whose create answer was lost")
    wait_for(lambda: apiserver.requests.count("create", "persistentvolumes", status=409), timeout=5,
             what="the provisioner's retry to meet the PV it had created")
    assert [p["metadata"]["name"] for p in cluster.pvs()] == [pv["metadata"]["name"]]
    wait_for(lambda: metric(replica, "controller_persistentvolumeclaim_provision_total", **{"class": "nfs"}) == 1,
             what="the provision counted as a success")
    assert len(volume_entries(layout.export)) == 1

    cluster.delete_claim("c1")
    wait_for(lambda: cluster.pvs() == [], what="the PV deleted")
    # The PV carries the finalizer: a repeated delete would answer 200, never 404; the provisioner
    # reads it, finds it marked for deletion, and removes the finalizer.
    assert apiserver.requests.count("delete", "persistentvolumes") >= 1
    wait_for(lambda: metric(replica, "controller_persistentvolume_delete_total", **{"class": "nfs"}) == 1,
             what="the delete counted as a success")
    assert volume_entries(layout.export) == records(layout.export) == []
    assert all(r.lost for r in apiserver.requests.records()
               if r.resource == "persistentvolumes" and r.verb in ("create", "delete") and r.status < 300)
    assert not history(replica, "ProvisioningFailed") and not history(replica, "VolumeFailedDelete")
    assert metric(replica, "controller_persistentvolumeclaim_provision_failed_total", **{"class": "nfs"}) == 0

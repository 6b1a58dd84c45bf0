"""Our PV put back on offer by hand: the claimRef removed while it still names a tenant's directory.

The operator "unsticks" a Released PV whose directory cannot be deleted with
``kubectl patch pv <pv> --type json -p '[{"op":"remove","path":"/spec/claimRef"}]'`` (or
does it to a Bound PV by mistake). The PV controller makes it Available, and the next claim
of the class is bound to it - with the previous tenant's directory and data. A dynamically
provisioned NFS PV is never meant to be offered (one PV per claim), so an unclaimed PV of
ours with reclaim policy Delete is never left on offer: the claimRef is put back while its
claim exists, otherwise the PV is retracted (deleted with uid and resourceVersion
preconditions; its finalizer keeps it Terminating, which no claim is bound to, until its
directory is disposed of as the release would have). The first test
failed on the controller that acted only on Released PVs: the new claim got the old PV.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from localpv.kube.api import KubeApi
from localpv.kube.objects import Obj
from localpv.kube.resources import PERSISTENT_VOLUMES
from localpv.kube.transport import connect
from localpv_emulator.binder import PVBinder
from tests.conftest import wait_for
from tests.nfs.conftest import Cluster, Layout, Replicas, history, records
from tests.nfs.test_lifecycle import dir_of

pytestmark = pytest.mark.root

REMOVE_CLAIM_REF = [{"op": "remove", "path": "/spec/claimRef"}]


def unclaim(cluster: Cluster, pv: Obj) -> None:
    """What the operator runs (through the API, as kubectl would)."""
    KubeApi(connect(cluster.server.url)).patch(PERSISTENT_VOLUMES, pv["metadata"]["name"], REMOVE_CLAIM_REF,
                                               patch_type="json")


def withdrawn(cluster: Cluster, name: str) -> bool:
    """Deleted: gone, or Terminating while its finalizer waits for its directory."""
    pv = cluster.pv(name)
    return pv is None or bool(pv["metadata"].get("deletionTimestamp"))


def binder(cluster: Cluster) -> PVBinder:
    return next(c for c in cluster.server._controllers if isinstance(c, PVBinder))


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """Files made immutable (``chattr +i``) by a test: a directory holding one cannot be deleted."""
    made: list[Path] = []
    try:
        yield made
    finally:
        for path in made:
            subprocess.run(["chattr", "-i", str(path)], check=False)


def make_immutable(path: Path, registry: list[Path]) -> None:
    subprocess.run(["chattr", "+i", str(path)], check=True)
    registry.append(path)


def test_released_pv_unclaimed_while_its_delete_fails_is_retracted_not_given_to_the_next_claim(
    cluster: Cluster, replicas: Replicas, layout: Layout, immutable: list[Path]
) -> None:
    cluster.storage_class(onDelete="delete")
    cluster.claim("old", "team-a")
    replica = replicas.start()
    old = wait_for(lambda: cluster.bound_pv("old", "team-a"), what="old claim bound")
    directory = Path(dir_of(old, layout))
    (directory / "secret").write_text("tenant a")
    make_immutable(directory / "secret", immutable)  # every delete of the directory fails from now on
    cluster.delete_claim("old", "team-a")
    wait_for(lambda: history(replica, "VolumeFailedDelete"), what="the delete fails")

    unclaim(cluster, old)
    name = old["metadata"]["name"]
    wait_for(lambda: withdrawn(cluster, name), timeout=5, what="the unclaimed PV retracted")
    [retracted] = wait_for(lambda: history(replica, "VolumeRetracted"), what="VolumeRetracted")
    assert retracted.object_name == name and "claimRef was removed" in retracted.message

    fresh_claim = cluster.claim("next", "team-b")
    fresh = wait_for(lambda: cluster.bound_pv("next", "team-b"), what="the next claim bound")
    assert fresh["metadata"]["name"] == f"pvc-{fresh_claim['metadata']['uid']}" != name
    assert os.listdir(dir_of(fresh, layout)) == []
    assert (directory / "secret").read_text() == "tenant a"  # still failing: kept, on offer to nobody

    failures = len(history(replica, "VolumeFailedDelete"))
    wait_for(lambda: len(history(replica, "VolumeFailedDelete")) > failures, what="the delete is retried")
    subprocess.run(["chattr", "-i", str(directory / "secret")], check=True)
    wait_for(lambda: not directory.exists(), what="the directory deleted as the release would have")
    wait_for(lambda: cluster.pv(name) is None, what="the PV gone with it")
    wait_for(lambda: len(records(layout.export)) == 1, what="only the next claim's record is left")


def test_bound_pv_unclaimed_by_mistake_gets_its_claim_ref_back(cluster: Cluster, replicas: Replicas,
                                                              layout: Layout) -> None:
    # The PV controller binds such a PV back to its claim at its next resync (up to 15 s
    # later on a real cluster), unless a pending claim of the class gets it first. Deleting
    # it instead would make the claim Lost and dispose of a directory a pod may be writing
    # to. Here the binder is paused to hold that window open; the PV controller's first step
    # (Available) is done by hand.
    cluster.storage_class(onDelete="delete")
    claim = cluster.claim("live", "team-a")
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("live", "team-a"), what="bound")
    name = pv["metadata"]["name"]
    (Path(dir_of(pv, layout)) / "data").write_text("tenant a")

    paused = binder(cluster)
    paused.stop()
    try:
        unclaim(cluster, pv)
        now = cluster.pv(name)
        assert now is not None
        cluster.server.update({**now, "status": {"phase": "Available"}}, subresource="status")
        ref = wait_for(lambda: ((cluster.pv(name) or {}).get("spec") or {}).get("claimRef"), timeout=5,
                       what="the claimRef put back")
        assert {k: ref[k] for k in ("namespace", "name", "uid")} == {
            "namespace": "team-a", "name": "live", "uid": claim["metadata"]["uid"]}
    finally:
        paused.start()
    [restored] = wait_for(lambda: history(replica, "VolumeClaimRestored"), what="VolumeClaimRestored")
    assert restored.object_name == name
    wait_for(lambda: (cluster.pv(name) or {}).get("status", {}).get("phase") == "Bound", what="Bound again")
    assert (cluster.pvc("live", "team-a") or {})["status"]["phase"] == "Bound"
    assert (Path(dir_of(pv, layout)) / "data").read_text() == "tenant a"
    assert history(replica, "VolumeRetracted") == []
    cluster.claim("next", "team-b")
    fresh = wait_for(lambda: cluster.bound_pv("next", "team-b"), what="the next claim bound")
    assert fresh["metadata"]["name"] != name


def test_retained_pv_unclaimed_is_left_to_the_operator_with_one_warning(cluster: Cluster, replicas: Replicas,
                                                                        layout: Layout) -> None:
    cluster.storage_class(reclaim="Retain")
    cluster.claim("kept", "team-a")
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("kept", "team-a"), what="bound")
    (Path(dir_of(pv, layout)) / "data").write_text("tenant a")
    cluster.delete_claim("kept", "team-a")
    name = pv["metadata"]["name"]
    wait_for(lambda: (cluster.pv(name) or {}).get("status", {}).get("phase") == "Released", what="Released")

    unclaim(cluster, pv)
    wait_for(lambda: history(replica, "VolumeRetainedReoffered"), what="the warning")
    wait_for(lambda: (cluster.pv(name) or {}).get("status", {}).get("phase") == "Available", what="on offer")
    assert replica.controller is not None
    replica.controller.resync()
    wait_for(replica.controller.idle, what="queues drained")
    assert len(history(replica, "VolumeRetainedReoffered")) == 1
    assert (Path(dir_of(pv, layout)) / "data").read_text() == "tenant a"


def test_retracted_pv_directory_is_archived_once_the_release_can_go_on(cluster: Cluster, replicas: Replicas,
                                                                       layout: Layout) -> None:
    cluster.storage_class(archiveOnDelete="true")
    cluster.claim("old", "team-a")
    replica = replicas.start()
    old = wait_for(lambda: cluster.bound_pv("old", "team-a"), what="bound")
    directory = Path(dir_of(old, layout))
    (directory / "secret").write_text("tenant a")
    cluster.server.delete("storage.k8s.io/v1", "StorageClass", "nfs")  # every release attempt fails now
    cluster.delete_claim("old", "team-a")
    wait_for(lambda: history(replica, "VolumeFailedDelete"), what="the release fails")

    unclaim(cluster, old)
    wait_for(lambda: withdrawn(cluster, old["metadata"]["name"]), timeout=5, what="retracted")
    failures = len(history(replica, "VolumeFailedDelete"))
    wait_for(lambda: len(history(replica, "VolumeFailedDelete")) > failures, what="the release is retried")
    assert directory.exists()
    cluster.storage_class(archiveOnDelete="true")
    archived = layout.export / f"archived-{directory.name}"
    wait_for(archived.exists, what="archived as the release would have")
    assert (archived / "secret").read_text() == "tenant a" and not directory.exists()
    wait_for(lambda: records(layout.export) == [], what="the record dropped")
    wait_for(lambda: cluster.pv(old["metadata"]["name"]) is None, what="the PV gone once the directory is")

"""PV deletion protection for NFS volumes (KEP-2644, as external-provisioner and the provisioner
library's ``AddFinalizer`` do it): a PV with reclaim policy Delete carries
``external-provisioner.volume.kubernetes.io/finalizer`` from its creation, so whichever of claim
and PV is deleted first, the directory is disposed of as the class says before the object goes.
Without it, ``kubectl delete pv`` before the claim took the PV away at once and left its
directory on the export for ever, never deleted or archived (the first five tests here failed
on the provisioner that added no finalizer)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from localpv.kube.api import KubeApi
from localpv.kube.resources import PERSISTENT_VOLUMES
from localpv.kube.transport import connect
from tests.conftest import require_tools, wait_for
from tests.nfs.conftest import PROVISIONER, Cluster, Layout, Replicas, content, history, plant, records, volume_entries
from tests.nfs.test_lifecycle import dir_of

FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
Obj = dict[str, Any]


def finalizers(pv: Obj | None) -> list[str]:
    return list(((pv or {}).get("metadata") or {}).get("finalizers") or [])


def settle(replicas: Replicas) -> None:
    """Every replica looked at everything once more and has nothing left to do."""
    for replica in replicas.running:
        assert replica.controller is not None
        replica.controller.resync()
        wait_for(replica.controller.idle, what="queues drained")


def test_a_pv_with_delete_carries_the_finalizer_and_one_with_retain_does_not(cluster: Cluster, replicas: Replicas,
                                                                             layout: Layout) -> None:
    cluster.storage_class()
    cluster.storage_class("keep", reclaim="Retain")
    cluster.claim("web")
    cluster.claim("kept", storage_class="keep")
    replicas.start()
    assert finalizers(wait_for(lambda: cluster.bound_pv("web"), what="web bound")) == [FINALIZER]
    assert finalizers(wait_for(lambda: cluster.bound_pv("kept"), what="kept bound")) == []


@pytest.mark.parametrize(("parameters", "left"), [({"onDelete": "delete"}, "nothing"),
                                                  ({"archiveOnDelete": "true"}, "the archive")])
def test_the_pv_deleted_before_its_claim_waits_for_it_then_its_directory_goes_as_the_class_says(
        cluster: Cluster, replicas: Replicas, layout: Layout, parameters: dict[str, str], left: str) -> None:
    cluster.storage_class(**parameters)
    cluster.claim("web")
    replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("web"), what="claim bound")
    name, path = pv["metadata"]["name"], dir_of(pv, layout)
    plant(path, "tenant data")

    cluster.server.delete("v1", "PersistentVolume", name)  # kubectl delete pv, its claim still Bound
    settle(replicas)
    held = cluster.pv(name)
    assert held is not None and held["metadata"].get("deletionTimestamp") and finalizers(held) == [FINALIZER]
    assert (cluster.pvc("web") or {}).get("status", {}).get("phase") == "Bound"
    assert content(path) == "tenant data", "the claim's pods keep their directory while it is Bound"

    cluster.delete_claim("web")
    wait_for(lambda: cluster.pv(name) is None, what="the PV gone once its directory is")
    entries = volume_entries(layout.export)
    if left == "nothing":
        assert entries == [] and records(layout.export) == []
    else:
        assert entries == [f"archived-{path.rsplit('/', 1)[1]}"]
        assert content(f"{layout.export}/{entries[0]}") == "tenant data"


def test_a_bound_pv_of_an_earlier_release_gets_the_finalizer_and_loses_it_with_retain(
        cluster: Cluster, replicas: Replicas, layout: Layout) -> None:
    """A PV made before this release has none: it gets it once Bound (as external-provisioner
    does); a PV whose policy an operator turns to Retain loses it, and keeps its directory."""
    cluster.storage_class(onDelete="delete")
    cluster.claim("web")
    first = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("web"), what="claim bound")
    name = pv["metadata"]["name"]
    replicas.stop(first)
    api = KubeApi(connect(cluster.server.url))
    api.patch(PERSISTENT_VOLUMES, name, {"metadata": {"finalizers": None}})  # as an earlier release made it
    assert finalizers(cluster.pv(name)) == []

    replicas.start()
    wait_for(lambda: finalizers(cluster.pv(name)) == [FINALIZER], what="the finalizer added")

    api.patch(PERSISTENT_VOLUMES, name, {"spec": {"persistentVolumeReclaimPolicy": "Retain"}})
    wait_for(lambda: finalizers(cluster.pv(name)) == [], what="the finalizer removed")
    path = dir_of(pv, layout)
    plant(path, "kept")
    cluster.delete_claim("web")
    wait_for(lambda: (cluster.pv(name) or {}).get("status", {}).get("phase") == "Released", what="Released")
    settle(replicas)
    assert cluster.pv(name) is not None and content(path) == "kept", "Retain: the operator's"


def test_a_restart_while_the_pv_waits_deleted_finishes_the_release(cluster: Cluster, replicas: Replicas,
                                                                   layout: Layout) -> None:
    """No replica runs while the claim goes (its PV deleted first): the next one disposes of
    the directory and lets the PV go. Nothing but the finalizer remembered it."""
    cluster.storage_class(onDelete="delete")
    cluster.claim("web")
    first = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("web"), what="claim bound")
    name = pv["metadata"]["name"]
    replicas.stop(first)
    cluster.server.delete("v1", "PersistentVolume", name)
    cluster.delete_claim("web")
    wait_for(lambda: (cluster.pv(name) or {}).get("status", {}).get("phase") == "Released", what="Released")

    replica = replicas.start()
    wait_for(lambda: cluster.pv(name) is None, what="the PV gone")
    assert volume_entries(layout.export) == [] and history(replica, "VolumeFailedDelete") == []


def test_the_documented_rollback_command_removes_only_this_finalizer_of_only_the_nfs_pvs(
        cluster: Cluster, replicas: Replicas, layout: Layout, tmp_path: Path) -> None:
    """docs/operations.md's command for the NFS provisioner's PVs, run as written with the real
    kubectl (the chart's default provisioner name replaced by this test's)."""
    require_tools("kubectl")
    cluster.storage_class()
    cluster.claim("web")
    replica = replicas.start()
    pv = wait_for(lambda: cluster.bound_pv("web"), what="claim bound")
    replicas.stop(replica)
    pv["metadata"]["finalizers"] = ["kubernetes.io/pv-protection", FINALIZER]
    cluster.server.update(pv)
    other = cluster.server.create({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "theirs", "finalizers": [FINALIZER],
                     "annotations": {"pv.kubernetes.io/provisioned-by": "example.com/someone-else"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "hostPath": {"path": "/srv/theirs"}}})
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    command = re.search(r"from every PV of the NFS provisioner.*?```sh\n(.+?)\n```", doc, re.S)
    assert command is not None and "cluster.local/localpv" in command.group(1), "the command left the doc"
    kubeconfig = cluster.server.write_kubeconfig(str(tmp_path / "kubeconfig"))
    subprocess.run(["bash", "-o", "pipefail", "-c", command.group(1).replace("cluster.local/localpv", PROVISIONER)],
                   check=True, timeout=60, env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True)
    assert finalizers(cluster.pv(pv["metadata"]["name"])) == ["kubernetes.io/pv-protection"]
    assert finalizers(cluster.pv(other["metadata"]["name"])) == [FINALIZER]

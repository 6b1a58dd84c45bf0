"""Writes whose answers are lost (committed by the server, the connection reset or closed
where the answer was due): the API seam retries them, and the caller gets the retry's
answer - the consequence of its own first attempt, never a success it cannot see. The
callers (agent, NFS provisioner, leader election) treat those answers as done."""

from __future__ import annotations

import pytest

from localpv.kube.api import KubeApi
from localpv.kube.errors import AlreadyExists, Conflict, NotFound
from localpv.kube.resources import CONFIG_MAPS, PERSISTENT_VOLUMES
from localpv_emulator.apiserver import ApiServer, LostResponse

PV = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-a"},
      "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/a"}}}


@pytest.mark.parametrize("how", ["reset", "close"])
def test_a_create_whose_answer_is_lost_surfaces_as_already_exists(apiserver: ApiServer, kube: KubeApi,
                                                                  how: LostResponse) -> None:
    apiserver.faults.lose_responses("create", 1.0, resource="persistentvolumes", how=how)
    with pytest.raises(AlreadyExists):
        kube.create(PERSISTENT_VOLUMES, PV)
    assert apiserver.get("v1", "PersistentVolume", "pv-a") is not None
    assert [r.status for r in apiserver.requests.records() if r.verb == "create"] == [201, 409]


def test_a_delete_whose_answer_is_lost_surfaces_as_not_found(apiserver: ApiServer, kube: KubeApi) -> None:
    uid = apiserver.create(PV)["metadata"]["uid"]
    apiserver.faults.lose_responses("delete", 1.0)
    with pytest.raises(NotFound):
        kube.delete(PERSISTENT_VOLUMES, "pv-a", uid=uid)
    assert apiserver.get("v1", "PersistentVolume", "pv-a") is None


def test_an_update_whose_answer_is_lost_is_redecided_on_the_new_state(apiserver: ApiServer, kube: KubeApi) -> None:
    apiserver.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "default"},
                      "data": {"n": "0"}})
    apiserver.faults.lose_responses("update", 1.0)
    cm = kube.get(CONFIG_MAPS, "cm", "default")
    cm["data"] = {"n": "1"}
    with pytest.raises(Conflict):  # a bare replace retried under a resourceVersion that is gone
        kube.replace(CONFIG_MAPS, cm)
    # read-change-write sees its own change already made, and writes nothing
    assert kube.update(CONFIG_MAPS, "cm", lambda obj: None if obj["data"] == {"n": "1"} else obj, "default") is None
    stored = apiserver.get("v1", "ConfigMap", "cm", "default")
    assert stored is not None and stored["data"] == {"n": "1"}

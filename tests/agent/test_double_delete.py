"""A PV the agent deleted after its clean is deleted once, even while the PV cache lags.

Seen on a real cluster after a Job clean: DELETE for the same PV twice, 50 ms apart. The
planner works from the PV informer; until the watch event of the first DELETE arrives the
PV still looks Released and clean per the journal, so the next pass plans DeletePV again.
The executor remembers the uids it deleted and does not send a second DELETE.
"""

from __future__ import annotations

from typing import Any

import pytest

from localpv.agent.model import SUCCEEDED, CleanupStatus, DeletePV
from localpv.kube.resources import JOBS, PERSISTENT_VOLUMES
from localpv.naming import cleanup_job_name
from tests.agent.conftest import AgentEnv
from tests.conftest import wait_for


def _released_pv(name: str, path: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "local-fs",
                     "local": {"path": path},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}]}]}}}}


def settled(env: AgentEnv, created: dict[str, Any]) -> dict[str, Any]:
    """The PV as the agent's cache shows it once the binder is done with it (this one has no
    claimRef: Available): the DELETE carries the resourceVersion of the object the plan saw."""
    name = created["metadata"]["name"]
    return wait_for(lambda: (p := env.apiserver.get("v1", "PersistentVolume", name)) is not None
                    and p.get("status", {}).get("phase") == "Available" and p, what=f"{name} settled")


def test_a_pv_deleted_after_its_job_clean_is_not_deleted_again(
        agent_env: AgentEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    config = agent_env.config(useJobForCleaning=True)
    agent = agent_env.start_agent(config, discovery_period=3600, job_image="localpv:test")
    executor = agent.executor
    assert executor is not None and agent.jobs is not None
    pv = settled(agent_env, agent_env.apiserver.create(_released_pv("local-pv-double", "/mnt/disks/vol1")))
    agent_env.apiserver.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": cleanup_job_name("local-pv-double"), "namespace": "default",
        "labels": {"pv": "local-pv-double", "kubernetes.io/hostname": "node-1"}},
        "spec": {"template": {"spec": {"restartPolicy": "OnFailure",
                                       "containers": [{"name": "c", "image": "localpv:test"}]}}}})
    deletes: list[tuple[str, str]] = []
    real_delete = executor.api.delete

    def counting_delete(resource: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        deletes.append((resource.kind, name))
        return real_delete(resource, name, *args, **kwargs)

    monkeypatch.setattr(executor.api, "delete", counting_delete)
    done = CleanupStatus(SUCCEEDED, 0.0, pv["metadata"]["uid"], 1.0)
    # The planner's DeletePV, twice, from the same (stale) cached PV object.
    for _ in range(2):
        executor.delete(DeletePV(pv, "/mnt/disks/vol1", False, done))
    assert deletes.count((PERSISTENT_VOLUMES.kind, "local-pv-double")) == 1, deletes
    assert deletes.count((JOBS.kind, cleanup_job_name("local-pv-double"))) <= 1, deletes
    assert agent_env.apiserver.get("v1", "PersistentVolume", "local-pv-double") is None
    # A new PV of the same name (the volume offered again) is a new uid: deleted when asked.
    again = settled(agent_env, agent_env.apiserver.create(_released_pv("local-pv-double", "/mnt/disks/vol1")))
    executor.delete(DeletePV(again, "/mnt/disks/vol1", False, done))
    assert deletes.count((PERSISTENT_VOLUMES.kind, "local-pv-double")) == 2, deletes
    # Long after, the old object shown again (an etcd restore brings back its uid): deleted again.
    later = executor.clock.now() + 31
    monkeypatch.setattr(executor.clock, "now", lambda: later)
    executor.delete(DeletePV(pv, "/mnt/disks/vol1", False, done))
    assert deletes.count((PERSISTENT_VOLUMES.kind, "local-pv-double")) == 3, deletes

"""The PV deleted after its clean is the PV the plan saw, not whatever now has its name and uid.

Found by the multi-pass simulation once admins clearing claimRefs were part of it: the
cleanup of a Released PV succeeds, and before the agent's DELETE (a stale cache, a slow
pass) an operator clears the claimRef and another claim binds the PV and writes. A DELETE
guarded by the uid alone removes that PV too (on a real cluster it waits on the
pv-protection finalizer until that claim lets go); the journal says clean, so the volume
is then offered again with the new tenant's data. The DELETE carries the resourceVersion
the plan saw, as the retract of an unclaimed PV does.
"""

from __future__ import annotations

from localpv.agent.model import SUCCEEDED, CleanupStatus, DeletePV
from localpv.kube.resources import PERSISTENT_VOLUMES
from tests.agent.conftest import AgentEnv
from tests.agent.test_double_delete import _released_pv
from tests.conftest import wait_for


def test_a_pv_that_changed_after_its_clean_was_planned_is_not_deleted(agent_env: AgentEnv) -> None:
    agent = agent_env.start_agent(discovery_period=3600)
    executor = agent.executor
    assert executor is not None
    body = _released_pv("local-pv-stale", "/mnt/disks/vol1")
    body["spec"]["claimRef"] = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
                                "name": "gone", "uid": "uid-of-a-deleted-claim"}
    agent_env.apiserver.create(body)
    planned = wait_for(lambda: (p := agent_env.apiserver.get("v1", "PersistentVolume", "local-pv-stale"))
                       and p.get("status", {}).get("phase") == "Released" and p, what="Released")
    # After the plan: the claimRef is cleared (the PV controller makes it Available).
    agent_env.api.patch(PERSISTENT_VOLUMES, "local-pv-stale", [{"op": "remove", "path": "/spec/claimRef"}],
                        patch_type="json")
    wait_for(lambda: agent_env.phase("/mnt/disks/vol1") == "Available", what="Available")
    done = CleanupStatus(SUCCEEDED, 0.0, planned["metadata"]["uid"], 1.0)
    executor.delete(DeletePV(planned, "/mnt/disks/vol1", False, done))
    assert agent_env.apiserver.get("v1", "PersistentVolume", "local-pv-stale") is not None
    # The PV as it is now (still Released, unchanged) is deleted as before.
    current = agent_env.apiserver.get("v1", "PersistentVolume", "local-pv-stale")
    assert current is not None
    current["status"] = {"phase": "Released"}  # what the plan would have needed to see
    executor.delete(DeletePV(current, "/mnt/disks/vol1", False, done))
    assert agent_env.apiserver.get("v1", "PersistentVolume", "local-pv-stale") is None

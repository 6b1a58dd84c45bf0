"""The figures an operator alerts on: this node's PVs by phase, and how long a volume has
been stuck Released (real agent, real tmpfs volumes, the emulator's PV controller)."""

from __future__ import annotations

import pytest

from localpv_emulator.objects import claim
from tests.agent.conftest import AgentEnv
from tests.conftest import wait_for
from tests.support.hostfs import Mounter

pytestmark = pytest.mark.root


def test_a_volume_stuck_released_is_counted_and_aged_until_it_is_cleaned(agent_env: AgentEnv,
                                                                          mounter: Mounter) -> None:
    for name in ("vol1", "vol2"):
        mounter.tmpfs(agent_env.fs_dir / name)
    agent = agent_env.start_agent()

    def sample(name: str, **labels: str) -> float | None:
        return agent.metrics.registry.get_sample_value(name, labels)

    def volumes(phase: str) -> float | None:
        return sample("localpv_persistentvolumes", **{"class": "local-fs", "phase": phase})

    def released_for() -> float | None:
        return sample("localpv_persistentvolume_released_seconds", **{"class": "local-fs"})

    wait_for(lambda: volumes("Available") == 2, timeout=10, what="two Available PVs counted")
    assert volumes("Released") == 0 and released_for() == 0
    agent_env.apiserver.create(claim("c1", "local-fs"))
    wait_for(lambda: volumes("Bound") == 1 and volumes("Available") == 1, timeout=10, what="one Bound")

    [bound] = [name for name in ("vol1", "vol2") if agent_env.phase(f"/mnt/disks/{name}") == "Bound"]
    inner = mounter.tmpfs(agent_env.fs_dir / bound / "foreign")  # a mount inside the volume fails every clean
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    wait_for(lambda: volumes("Released") == 1, timeout=10, what="the released PV counted")
    wait_for(lambda: (released_for() or 0) >= 1.0, timeout=10, what="its time Released growing")
    assert volumes("Bound") == 0

    mounter.umount(inner)
    wait_for(lambda: volumes("Available") == 2 and volumes("Released") == 0, timeout=30,
             what="cleaned and offered again")
    assert released_for() == 0, "a PV no longer Released is forgotten"

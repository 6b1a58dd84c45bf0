"""``minResyncPeriod`` reaches every informer of the node agent, as upstream uses it: each
relists after a period drawn anew in [min, 2·min), so the nodes of a cluster spread their
LISTs instead of relisting in lock-step."""

from __future__ import annotations

from pathlib import Path

from localpv.agent.journal import Journal
from localpv.agent.node import AgentOptions, NodeAgent
from localpv.config import parse_config
from localpv.kube.api import KubeApi
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import node


def test_every_agent_informer_relists_within_min_and_twice_min(apiserver: ApiServer, kube: KubeApi,
                                                               tmp_path: Path) -> None:
    apiserver.create(node("node-1"))
    config = parse_config({"minResyncPeriod": "2m", "useJobForCleaning": "true", "storageClassMap": {
        "local": {"hostDir": "/mnt/disks", "mountDir": str(tmp_path / "disks")}}}).config
    agent = NodeAgent(kube, AgentOptions(node_name="node-1", watch_host=False, job_image="img",
                                         state_dir=str(tmp_path / "state")),
                      config, Journal(tmp_path / "journal.json"))
    agent.start(run_loop=False)
    try:
        informers = agent._informers()
        assert len(informers) >= 3  # PVs, StorageClasses, Jobs (and whatever else the agent watches)
        for informer in informers:
            assert informer.resync_period is not None, informer.name
            periods = [informer.resync_period() for _ in range(50)]
            assert all(120.0 <= p < 240.0 for p in periods), informer.name
            assert len(set(periods)) > 1, "drawn anew each time"
    finally:
        agent.stop()

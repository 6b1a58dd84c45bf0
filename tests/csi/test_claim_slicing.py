"""Each node sees its own claims (issue 25.2): the agent's claim cache and watch hold only the
claims labelled with its node, it provisions a claim only when its label and its selected-node
annotation agree, and what the labeller does (label, relabel on rescheduling) moves claims in
and out of the right agent's view. Real pools and images, the real labeller, the emulator."""

from __future__ import annotations

from typing import Any

import pytest

from localpv.kube.objects import Obj
from tests.conftest import wait_for
from tests.csi.test_controller import CLASS, NODE_NAME, Env, env  # noqa: F401 - a fixture
from tests.support.labeller import running_labeller

pytestmark = pytest.mark.root
KEY = "localpv.dev/node"


def _labelled(name: str, node_name: str, label: str | None, size: str = "64Mi") -> Obj:
    from localpv_emulator.objects import claim

    made = claim(name, CLASS, size=size, selected_node=node_name)
    if label is not None:
        made["metadata"]["labels"] = {KEY: label}
    return made


def test_claims_of_other_nodes_never_reach_the_agents_cache_or_watch(env: Env) -> None:  # noqa: F811
    controller = env.start()
    seen: list[str] = []
    controller.claims.handlers.append(lambda _k, old, new: seen.append(
        str(((new or old or {}).get("metadata") or {}).get("name"))))
    watched_before = controller.claims.stats.events
    for i in range(40):  # another node's claims, labelled by the real labeller as they come
        env.claim(f"other-{i}", node_name="node-2")
    env.claim("mine")
    wait_for(lambda: env.bound_pv("mine"), what="this node's claim Bound")
    wait_for(lambda: all((env.pvc(f"other-{i}")["metadata"].get("labels") or {}).get(KEY) == "node-2"
                         for i in range(40)), what="the other node's claims labelled")
    assert [c["metadata"]["name"] for c in controller.claims.list()] == ["mine"]
    assert set(seen) == {"mine"}
    assert controller.claims.stats.events - watched_before < 10  # this claim's own changes only
    agent_reads = [r for r in env.server.requests if r.resource == "persistentvolumeclaims"
                   and r.verb in ("list", "watch") and "labelSelector" in r.query]
    assert agent_reads and all("localpv.dev%2Fnode%3Dnode-1" in r.query for r in agent_reads), agent_reads


def test_the_agent_provisions_only_a_claim_whose_label_and_selected_node_agree(env: Env) -> None:  # noqa: F811
    """Labeller stopped: a claim scheduled here but not labelled is not seen; one whose label a
    tenant set to this node while the scheduler chose another is seen and left alone. Once the
    labeller runs, the first is labelled and provisioned, the second relabelled away."""
    controller = env.start(labeller=False)
    env.server.create(_labelled("unlabelled", NODE_NAME, None))
    env.server.create(_labelled("lying", "node-2", NODE_NAME))
    env.server.create(_labelled("sentinel", NODE_NAME, NODE_NAME))  # as the labeller would have left it
    wait_for(lambda: env.bound_pv("sentinel"), what="the agreeing claim Bound")
    assert env.bound_pv("unlabelled") is None and env.bound_pv("lying") is None
    assert controller.claims.get("unlabelled", "default") is None
    assert controller.claims.get("lying", "default") is not None  # seen, and refused: the annotation decides
    assert len(env.pool_env.pool.images.names()) == 1
    with running_labeller(env.kube):
        wait_for(lambda: env.bound_pv("unlabelled"), what="the claim provisioned once labelled")
        wait_for(lambda: controller.claims.get("lying", "default") is None, what="the lying claim relabelled away")
    assert (env.pvc("lying")["metadata"].get("labels") or {}).get(KEY) == "node-2"
    assert env.bound_pv("lying") is None and len(env.pool_env.pool.images.names()) == 2


def test_a_rescheduled_claim_leaves_the_agents_view_with_its_label(env: Env) -> None:  # noqa: F811
    controller = env.start()
    env.claim("huge", size="2Gi")  # more than the pool holds: rescheduled
    wait_for(lambda: "volume.kubernetes.io/selected-node" not in (env.pvc("huge")["metadata"].get("annotations")
                                                                   or {}), what="the selected node removed")
    wait_for(lambda: KEY not in (env.pvc("huge")["metadata"].get("labels") or {}), what="its label removed")
    wait_for(lambda: controller.claims.get("huge", "default") is None, what="gone from this agent's cache")
    pvc: Any = env.pvc("huge")
    pvc["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] = "node-2"  # the scheduler's next pick
    env.server.update(pvc)
    wait_for(lambda: (env.pvc("huge")["metadata"].get("labels") or {}).get(KEY) == "node-2", what="relabelled")
    assert controller.claims.get("huge", "default") is None


def test_recovery_asks_the_api_server_about_a_claim_that_left_the_agents_view(env: Env) -> None:  # noqa: F811
    """An image whose PV's uid never reached the journal (the create's answer lost), its PV then
    deleted by hand: it is kept as orphaned because its claim is bound to it. That claim may have
    left this agent's cache (its selected-node annotation removed after binding, so its label
    went): recovery reads it from the API server, and the tenant's image is kept."""
    from localpv.csi.journal import ImageState

    env.start()
    env.claim("data")
    pv = wait_for(lambda: env.bound_pv("data"), what="Bound")
    volume = pv["metadata"]["name"]
    env.stop()
    journal = env.journal()
    record = journal.get(volume)
    assert record is not None and record.pv_uid
    journal.put(record.moved(record.state, record.since, pv_uid=""))  # the create's answer was lost
    pvc: Any = env.pvc("data")
    del pvc["metadata"]["annotations"]["volume.kubernetes.io/selected-node"]
    env.server.update(pvc)
    wait_for(lambda: KEY not in (env.pvc("data")["metadata"].get("labels") or {}), what="its label removed")
    env.server.delete("v1", "PersistentVolume", volume)
    held: Any = env.server.get("v1", "PersistentVolume", volume)  # its deletion protection, removed by hand too
    held["metadata"]["finalizers"] = []
    env.server.update(held)
    assert env.server.get("v1", "PersistentVolume", volume) is None
    controller = env.start()
    assert controller.claims.get("data", "default") is None
    assert env.journal().get(volume).state is ImageState.ORPHANED  # type: ignore[union-attr]
    assert env.pool_env.pool.images.exists(volume)

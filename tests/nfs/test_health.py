"""The NFS provisioner's liveness means it is doing its job (issue 12): a dead cache or a
crash-looping worker makes /healthz fail, not only a lost lease."""

from __future__ import annotations

from typing import Any

from tests.conftest import wait_for
from tests.nfs.conftest import Replicas


def test_a_dead_cache_makes_the_provisioner_unhealthy(replicas: Replicas) -> None:
    replica = replicas.start()
    wait_for(lambda: replica.controller is not None and replica.controller.synced.is_set(), what="synced")
    assert replica.healthy() == (True, "ok")
    assert replica.controller is not None
    replica.controller.cache.claims.stop()
    ok, why = replica.healthy()
    assert not ok and "informer-pvcs is not running" in why


def test_a_crash_looping_worker_makes_the_provisioner_unhealthy(replicas: Replicas, monkeypatch: Any) -> None:
    replica = replicas.start()
    wait_for(lambda: replica.controller is not None and replica.controller.synced.is_set(), what="synced")
    controller = replica.controller
    assert controller is not None
    controller.supervisor.initial_delay = controller.supervisor.max_delay = 0.001

    def broken() -> None:
        raise RuntimeError("worker bug")

    controller._spawn(broken, "claim-worker-extra")
    # Wait for this loop's problem, not for any unhealthy moment: the controller's own workers
    # are started just after it is synced, and one not yet running is unhealthy too.
    wait_for(lambda: "claim-worker-extra" in replica.healthy()[1], timeout=5, what="the crash-looping worker said")
    ok, why = replica.healthy()
    assert not ok and "worker bug" in why

"""An informer whose watch is cut resumes after the last event it applied (found by the
agent campaign: replayed events brought back a deleted PV's older incarnation, and the
agent cleaned a volume whose current PV was Bound)."""

from __future__ import annotations

from typing import Any

from localpv.kube.api import KubeApi
from localpv.kube.errors import Backoff
from localpv.kube.informer import Informer
from localpv.kube.resources import PERSISTENT_VOLUMES
from localpv_emulator.apiserver import ApiServer
from tests.conftest import wait_for
from tests.kube.conftest import Connect


def pv(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "s",
                     "local": {"path": f"/mnt/{name}"}, "persistentVolumeReclaimPolicy": "Delete",
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n"]}]}]}}}}


def test_a_cut_watch_never_replays_an_older_incarnation(connect_to: Connect) -> None:
    server = ApiServer(binder=False)
    server.start()
    try:
        api = KubeApi(connect_to(server.url))
        seen: list[str] = []

        def record(kind: str, _old: Any, new: Any) -> None:
            seen.append(f"{kind}:{((new or {}).get('metadata') or {}).get('uid', '')}")

        inf = Informer(api, PERSISTENT_VOLUMES, backoff=Backoff(initial=0.01, maximum=0.05, attempts=1_000_000),
                       on_change=record)
        inf.start()
        assert inf.wait_synced(10)
        first = server.create(pv("p"))["metadata"]["uid"]
        server.delete("v1", "PersistentVolume", "p")
        second = server.create(pv("p"))["metadata"]["uid"]
        wait_for(lambda: (o := inf.get("p")) is not None and o["metadata"]["uid"] == second, what="second seen")
        watches = inf.stats.watches
        server.faults.drop_watches(abrupt=True)
        wait_for(lambda: inf.stats.watches > watches, what="watch resumed")
        server.create(pv("sentinel"))
        wait_for(lambda: inf.get("sentinel") is not None, what="events after the resume applied")
        after = seen[seen.index(f"ADDED:{second}") + 1:]
        assert f"ADDED:{first}" not in after and f"MODIFIED:{first}" not in after, seen
        inf.stop()
    finally:
        server.stop()


def test_a_watch_that_keeps_being_cut_is_retried_at_the_first_delay_not_ever_slower(connect_to: Connect) -> None:
    # Found by the agent campaign: each cut counted as one more failure in a row, so after a
    # few API-server restarts the PV cache waited seconds, then tens of seconds, to watch again.
    server = ApiServer(binder=False)
    server.start()
    try:
        inf = Informer(KubeApi(connect_to(server.url)), PERSISTENT_VOLUMES,
                       backoff=Backoff(initial=0.01, maximum=5.0, attempts=1_000_000, jitter=0.0))
        runs: list[int] = []
        original = inf._back_off

        def recording(failures: int, what: str, retry_after: float | None = None) -> None:
            runs.append(failures)
            original(failures, what, retry_after)

        inf._back_off = recording  # type: ignore[method-assign]
        inf.start()
        assert inf.wait_synced(10)
        for i in range(5):
            watches = inf.stats.watches
            server.faults.drop_watches(abrupt=True)
            wait_for(lambda w=watches: inf.stats.watches > w, what=f"watch {i} resumed")
        assert runs and set(runs) == {1}, runs
        inf.stop()
    finally:
        server.stop()

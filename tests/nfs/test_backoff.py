"""Retries on the controller's clock: 15 s doubling per failure, give up after the threshold,
re-armed by the resync. A manual clock drives it, so the test takes no wall time."""

from __future__ import annotations

from localpv.clock import ManualClock
from localpv.kube.workqueue import ItemBackoff
from tests.conftest import wait_for
from tests.nfs.conftest import NFS_PATH, Cluster, Layout, Replicas, history, metric

RESYNC = 5000.0


def test_failed_deletes_back_off_give_up_and_are_rearmed_by_resync(cluster: Cluster, replicas: Replicas,
                                                                   layout: Layout) -> None:
    clock = ManualClock()
    cluster.storage_class(archiveOnDelete="maybe")  # unparsable: every delete attempt fails
    (layout.export / "stuck").mkdir()
    name = cluster.released_pv(f"{NFS_PATH}/stuck")
    replica = replicas.start(clock=clock, backoff=ItemBackoff(15, 1000), failed_delete_threshold=3,
                             resync_period=RESYNC)
    wait_for(lambda: replica.controller is not None, what="leading")
    assert replica.controller is not None
    queue = replica.controller.volume_queue

    def failures() -> int:
        return len(history(replica, "VolumeFailedDelete"))

    wait_for(lambda: failures() == 1, what="first attempt")
    assert "parameters.archiveOnDelete: invalid boolean 'maybe'" in history(replica, "VolumeFailedDelete")[0].message
    for attempt, delay in enumerate((15.0, 30.0, 60.0), start=2):
        wait_for(lambda delay=delay: queue.waiting() == [(delay, name)], what=f"requeued after {delay}s")
        clock.advance(delay - 0.5)
        assert failures() == attempt - 1 and queue.waiting() == [(0.5, name)]
        clock.advance(0.5)
        wait_for(lambda attempt=attempt: failures() == attempt, what=f"attempt {attempt}")

    # Threshold 3 reached: given up, nothing scheduled, until the resync re-arms it.
    wait_for(lambda: metric(replica, "localpv_nfs_gave_up_total", queue="volumes") == 1, what="gave up")
    assert queue.waiting() == [] and failures() == 4
    clock.advance(RESYNC)
    wait_for(lambda: failures() == 5, what="resync re-armed the volume")
    wait_for(lambda: queue.waiting() == [(15.0, name)], what="backoff starts over")
    assert cluster.pv(name) is not None

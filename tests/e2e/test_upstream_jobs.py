"""The chart with upstream local-static-provisioner 2.9.0's own values.yaml (tests/e2e/data,
unchanged) on a real cluster, cleaning through Jobs (upstream's ``useJobForCleaning``).

Before the fix a real API server refused the DaemonSet those values rendered (a liveness
probe with httpGet and tcpSocket: "may not specify more than 1 handler type"). Here the
agent must run and be ready, and a released volume must be wiped by a cleanup Job whose
pod really runs, then offered again under the same PV name, empty, with one DELETE of the
old PV (it was sent twice, 50 ms apart, after a Job clean).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS
from localpv.naming import cleanup_job_name
from tests.e2e.cluster import DAEMON_SETS, Cluster, forbidden_in_log, wait_for
from tests.e2e.conftest import Release

pytestmark = pytest.mark.e2e

UPSTREAM_VALUES = Path(__file__).with_name("data") / "lsp-2.9.0-values.yaml"


@pytest.fixture(scope="module")
def rel(release_factory: Callable[[str], Release]) -> Release:
    rel = release_factory("lsp")
    rel.host.mount_volume("vol1", "16m")
    with open(UPSTREAM_VALUES, encoding="utf-8") as f:
        upstream = yaml.safe_load(f)
    # as a user migrating would: `-f values.yaml --set image=... --set useJobForCleaning=true`
    # plus the class's hostDir and the journal's place on this host
    rel.install(rel.values(upstream, useJobForCleaning=True, useJobForFilesystemCleaning=True))
    return rel


def test_upstream_values_give_a_daemonset_the_api_server_accepts_and_a_ready_agent(
        cluster: Cluster, rel: Release) -> None:
    [ds] = cluster.list(DAEMON_SETS, rel.namespace)
    [c] = ds["spec"]["template"]["spec"]["containers"]
    assert set(c["livenessProbe"]) & {"httpGet", "tcpSocket", "exec"} == {"tcpSocket"}
    assert "readinessProbe" not in c  # upstream's readinessProbe: {}
    cluster.agent_pod(rel.namespace)


def test_a_released_volume_is_cleaned_by_a_job_and_offered_again_empty(cluster: Cluster, rel: Release) -> None:
    cluster.agent_pod(rel.namespace)
    ns = rel.namespace
    path = rel.host.disks / "vol1"
    pv = cluster.available_pv(path)
    pv_name = pv["metadata"]["name"]
    cluster.claim(ns, "data", rel.storage_class)
    phase, log = cluster.run_pod(ns, "writer", "data", "echo secret > /data/file && ls -A /data")
    assert phase == "Succeeded", log
    assert (path / "file").read_text() == "secret\n"
    cluster.delete_and_wait(PODS, "writer", ns)
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, "data", ns)

    job = cluster.wait_job_seen(ns, cleanup_job_name(pv_name))
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == cluster.image
    again = cluster.available_pv(path, timeout=120, not_uid=pv["metadata"]["uid"])
    assert again["metadata"]["name"] == pv_name
    assert os.listdir(path) == []
    # the Job's pod really ran to completion (the kubelet's events outlive the deleted Job)
    started = wait_for(lambda: [e for e in cluster.events(ns)
                                if e["involvedObject"].get("kind") == "Pod"
                                and str(e["involvedObject"].get("name", "")).startswith(cleanup_job_name(pv_name))
                                and e.get("reason") == "Started"], 30, "the cleanup pod's Started event")
    assert started
    completed = [e for e in cluster.events(ns) if e["involvedObject"].get("kind") == "Job"
                 and e.get("reason") == "Completed"]
    assert completed, [(e["involvedObject"]["kind"], e.get("reason")) for e in cluster.events(ns)]
    assert cluster.get(PERSISTENT_VOLUMES, pv_name) is not None

    cluster.claim(ns, "again", rel.storage_class, volume_name=pv_name)
    phase, log = cluster.run_pod(ns, "reader", "again", 'ls -A /data; test -z "$(ls -A /data)" && echo EMPTY')
    assert phase == "Succeeded" and "EMPTY" in log, log
    if cluster.audit_log:
        deletes = cluster.deletes_of(ns, pv_name)
        assert len(deletes) == 1, [(e["requestReceivedTimestamp"], e["responseStatus"]) for e in deletes]


def test_no_component_was_refused_anything(cluster: Cluster, rel: Release) -> None:
    assert cluster.forbidden(rel.namespace) == []
    pod = cluster.agent_pod(rel.namespace)
    assert forbidden_in_log(cluster.pod_log(pod["metadata"]["name"], rel.namespace)) == []

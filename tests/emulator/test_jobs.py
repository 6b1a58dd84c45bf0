"""Jobs: generated selector, validation, and the Job completer (automatic and on request)."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localpv_emulator.apiserver import ApiServer
from tests.emulator.conftest import wait_for


def job(name: str, restart: str = "Never") -> dict[str, object]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": {"template": {"spec": {"restartPolicy": restart,
                                           "containers": [{"name": "clean", "image": "busybox"}]}}}}


def conditions(obj: dict[str, object]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in obj["status"].get("conditions", [])}  # type: ignore[attr-defined]


def test_jobs_get_a_generated_selector_and_a_restart_policy_check(api: client.ApiClient) -> None:
    batch = client.BatchV1Api(api)
    created = batch.create_namespaced_job("default", job("clean"))
    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert created.spec.template.metadata.labels["job-name"] == "clean"
    assert created.spec.backoff_limit == 6
    with pytest.raises(ApiException) as exc:
        batch.create_namespaced_job("default", job("bad", restart="Always"))
    assert exc.value.status == 422
    with pytest.raises(ApiException) as exc:
        batch.patch_namespaced_job("clean", "default", {"spec": {"template": {"spec": {"containers": [
            {"name": "clean", "image": "other"}]}}}})
    assert exc.value.status == 422  # the template is immutable


def test_complete_job_marks_success_or_failure(srv: ApiServer, api: client.ApiClient) -> None:
    srv.create(job("ok"))
    srv.create(job("broken"))
    srv.complete_job("default", "ok", succeeded=True)
    srv.complete_job("default", "broken", succeeded=False)
    batch = client.BatchV1Api(api)
    ok = batch.read_namespaced_job_status("ok", "default").status
    assert ok.succeeded == 1 and ok.completion_time is not None and ok.start_time is not None
    assert {c.type for c in ok.conditions} == {"SuccessCriteriaMet", "Complete"}
    broken = batch.read_namespaced_job_status("broken", "default").status
    assert broken.failed == 7 and broken.completion_time is None
    failed = next(c for c in broken.conditions if c.type == "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    assert batch.list_namespaced_job("default", field_selector="status.successful=1").items[0].metadata.name == "ok"


def test_the_job_completer_decides_every_new_job() -> None:
    with ApiServer(binder=False, job_completer=True) as server:
        server.job_outcome = lambda obj: obj["metadata"]["name"] != "doomed"
        server.create(job("fine"))
        server.create(job("doomed"))
        wait_for(lambda: conditions(server.get("batch/v1", "Job", "fine", "default") or {"status": {}})
                 .get("Complete") == "True", what="fine completes")
        wait_for(lambda: conditions(server.get("batch/v1", "Job", "doomed", "default") or {"status": {}})
                 .get("Failed") == "True", what="doomed fails")
        server.job_outcome = lambda obj: None
        server.create(job("running"))
        server.settle()
        running = server.get("batch/v1", "Job", "running", "default")
        assert running is not None and conditions(running) == {}

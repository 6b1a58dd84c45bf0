"""Cleaning volumes with Kubernetes Jobs (``useJobForCleaning``), upstream's format.

A Job ``cleanup-<pv>`` runs on this node with the discovery dir and ``/dev`` mounted and
the class's cleaner command (research §3.9). Its state lives in the API, so it survives
agent restarts. Unlike upstream, where a failed Job counts as "running" until an admin
deletes it, a failed Job here is reported (event, metric), deleted after a backoff and
created again; the volume stays unavailable meanwhile.

State comes from a Job informer filtered to this node's cleanup Jobs, and is exposed
in the same :class:`~localpv.agent.model.CleanupStatus` shape as the in-process
:class:`~localpv.agent.proctable.ProcTable`, so the planner does not care which is used.
"""

from __future__ import annotations

import logging
import shlex
from datetime import UTC, datetime
from typing import Any

from localpv.agent.model import FAILED, RUNNING, SUCCEEDED, CleanupStatus, StartCleanup
from localpv.agent.proctable import DEFAULT_RETRY_BACKOFF
from localpv.clock import Clock
from localpv.config import ProvisionerConfig
from localpv.kube.api import KubeApi
from localpv.kube.errors import AlreadyExists, ApiError, Backoff, NotFound
from localpv.kube.informer import Informer
from localpv.kube.objects import Obj
from localpv.kube.resources import JOBS
from localpv.naming import HOSTNAME_LABEL_KEY, cleanup_job_name, job_volume_name

log = logging.getLogger(__name__)

ATTEMPT_ANNOTATION = "localpv.dev/attempt"


def _rfc3339nano(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def build_cleanup_job(
    cleanup: StartCleanup,
    *,
    node_name: str,
    namespace: str,
    image: str,
    config: ProvisionerConfig,
    now: float,
    attempt: int = 1,
    image_pull_secrets: tuple[str, ...] = (),
) -> Obj:
    """The Job manifest: upstream's labels, annotations, volumes and node selector."""
    cls = cleanup.cls
    pv_uid = str(((cleanup.pv or {}).get("metadata") or {}).get("uid") or "")
    mount_volume = job_volume_name(cls.host_dir, cls.mount_dir)
    mounts: list[dict[str, Any]] = [{"name": mount_volume, "mountPath": cls.mount_dir}]
    volumes: list[dict[str, Any]] = [{"name": mount_volume, "hostPath": {"path": cls.host_dir}}]
    if cleanup.block:
        command = list(cls.block_cleaner_command)
        if cleanup.identity:
            # Through our own entrypoint, which checks the device is the one the cleanup was
            # decided for before it runs the class's command (upstream runs it directly).
            command = ["localpv", "cleanup", "--device", cleanup.container_path, "--command", shlex.join(command),
                       "--timeout", f"{int(config.cleanup_timeout)}s"]
        env = [{"name": "LOCAL_PV_BLKDEVICE", "value": cleanup.container_path}]
        mounts.append({"name": "dev", "mountPath": "/dev"})
        volumes.append({"name": "dev", "hostPath": {"path": "/dev"}})
    else:
        # Upstream's fsclean.sh would work too; our own cleaner does not follow symlinks
        # nor cross mounts, and verifies the directory is empty before exiting 0. It also
        # refuses a path that is not a mount point directly inside the class's mountDir
        # (an unmounted disk leaves the host's directory there).
        command = ["localpv", "cleanup", "--dir", cleanup.container_path, "--discovery-dir", cls.mount_dir]
        env = [{"name": "LOCAL_PV_FILESYSTEM", "value": cleanup.container_path}]
    if cleanup.identity:
        # A Job's pod may start minutes after the decision: the cleaner refuses another volume.
        env.append({"name": "LOCALPV_EXPECT_IDENTITY", "value": cleanup.identity})
    pod_spec: dict[str, Any] = {
        "restartPolicy": "OnFailure",
        "nodeSelector": {HOSTNAME_LABEL_KEY: node_name},
        "tolerations": [dict(t) for t in config.job_tolerations],
        "containers": [{
            "name": "cleaner",
            "image": image,
            "command": command,
            "env": env,
            # root: the image's default user is unprivileged (it serves node
            # cleanup as is), and wiping a device or tenants' files needs root.
            "securityContext": {"privileged": True, "runAsUser": 0},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }
    if image_pull_secrets:
        # The agent's own (the chart's imagePullSecrets): the Job runs the agent's image.
        pod_spec["imagePullSecrets"] = [{"name": name} for name in image_pull_secrets]
    labels = {HOSTNAME_LABEL_KEY: node_name, "pv": cleanup.pv_name}
    if pv_uid:
        labels["pvuuid"] = pv_uid
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": cleanup_job_name(cleanup.pv_name),
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                "device": cleanup.container_path,
                "start-time": _rfc3339nano(now),
                ATTEMPT_ANNOTATION: str(attempt),
            },
        },
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": int(config.cleanup_timeout),
            "template": {
                "metadata": {"labels": {"pv": cleanup.pv_name}},
                "spec": pod_spec,
            },
        },
    }


def job_status(job: Obj, backoff: Backoff = DEFAULT_RETRY_BACKOFF) -> CleanupStatus:
    """Translate a Job's status into the tracker's vocabulary."""
    meta = job.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    status = job.get("status") or {}
    started = _parse_time(annotations.get("start-time")) or _parse_time(meta.get("creationTimestamp")) or 0.0
    attempt = int(annotations.get(ATTEMPT_ANNOTATION) or 1)
    uid = (meta.get("labels") or {}).get("pvuuid")
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    if int(status.get("succeeded") or 0) > 0 or "Complete" in conditions:
        finished = _parse_time(status.get("completionTime")) or started
        return CleanupStatus(SUCCEEDED, started, uid, finished, attempts=attempt, message="cleanup Job succeeded")
    if "Failed" in conditions:
        cond = conditions["Failed"]
        finished = _parse_time(cond.get("lastTransitionTime")) or started
        message = f"cleanup Job failed: {cond.get('reason', '')} {cond.get('message', '')}".strip()
        return CleanupStatus(FAILED, started, uid, finished, retry_at=finished + backoff.delay(attempt),
                             attempts=attempt, message=message)
    return CleanupStatus(RUNNING, started, uid, attempts=attempt, message="cleanup Job running")


class JobCleaner:
    """Creates, watches and removes this node's cleanup Jobs."""

    def __init__(self, api: KubeApi, *, node_name: str, namespace: str, image: str | None, clock: Clock,
                 backoff: Backoff = DEFAULT_RETRY_BACKOFF, image_pull_secrets: tuple[str, ...] = ()) -> None:
        self.api = api
        self.image_pull_secrets = image_pull_secrets
        self.node_name = node_name
        self.namespace = namespace
        self.image = image
        self.clock = clock
        self.backoff = backoff
        self.informer = Informer(api, JOBS, namespace=namespace, label_selector=f"{HOSTNAME_LABEL_KEY}={node_name}",
                                 clock=clock, name="job-informer")

    def statuses(self) -> dict[str, CleanupStatus]:
        out = {}
        for job in self.informer.list():
            pv = ((job.get("metadata") or {}).get("labels") or {}).get("pv")
            if pv:
                out[str(pv)] = job_status(job, self.backoff)
        return out

    def start_cleanup(self, cleanup: StartCleanup, config: ProvisionerConfig) -> str | None:
        """Create the Job (deleting a failed predecessor first); returns an error or None."""
        if not self.image:
            return "JOB_CONTAINER_IMAGE is not set: cleanup Jobs cannot be created"
        name = cleanup_job_name(cleanup.pv_name)
        existing = self.informer.get(name, self.namespace)
        attempt = 1
        if existing is not None:
            previous = job_status(existing, self.backoff)
            if previous.state != FAILED:
                return None  # running or succeeded: nothing to start
            attempt = previous.attempts + 1
            self.remove(cleanup.pv_name)
        job = build_cleanup_job(cleanup, node_name=self.node_name, namespace=self.namespace, image=self.image,
                                config=config, now=self.clock.now(), attempt=attempt,
                                image_pull_secrets=self.image_pull_secrets)
        try:
            self.api.create(JOBS, job)
        except AlreadyExists:
            return None  # the old one is still being deleted, or another agent won: next pass
        except ApiError as err:
            return f"cannot create cleanup Job {name}: {err}"
        log.info("created cleanup Job %s/%s (attempt %d)", self.namespace, name, attempt)
        return None

    def remove(self, pv_name: str) -> None:
        """Delete the Job and its pods (after success, or before a retry)."""
        try:
            self.api.delete(JOBS, cleanup_job_name(pv_name), self.namespace, propagation="Background")
        except NotFound:
            pass
        except ApiError as err:
            log.warning("cannot delete cleanup Job for %s: %s", pv_name, err)

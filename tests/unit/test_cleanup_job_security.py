"""Cleanup Jobs run as root in a privileged container whatever the image's default user.

The localpv image runs as an unprivileged user by default (see the Dockerfile); a cleaner
must open block devices and delete files owned by any tenant, so the Job asks for root.
"""

from __future__ import annotations

from localpv.agent.jobs import build_cleanup_job
from localpv.agent.model import StartCleanup
from localpv.config import ClassConfig, ProvisionerConfig


def _job(block: bool) -> dict[str, object]:
    cls = ClassConfig(name="fast", host_dir="/mnt/fast", mount_dir="/mnt/fast",
                      volume_mode="Block" if block else "Filesystem")
    cleanup = StartCleanup(pv_name="local-pv-1", host_path="/mnt/fast/d1", container_path="/mnt/fast/d1", cls=cls,
                           block=block, reason="released")
    return build_cleanup_job(cleanup, node_name="n1", namespace="storage", image="localpv:test",
                             config=ProvisionerConfig(), now=0.0)


def test_cleanup_job_container_is_privileged_root_for_block_and_filesystem_volumes() -> None:
    for block in (True, False):
        [container] = _job(block)["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
        assert container["securityContext"] == {"privileged": True, "runAsUser": 0}

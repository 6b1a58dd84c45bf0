"""The configuration model: what a ConfigMap means once read (immutable, fresh at each load)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from localpv.namepattern import NamePattern

if TYPE_CHECKING:
    from localpv.config.dynamic import DynamicClass, PoolConfig
    from localpv.config.overrides import NodeOverride


DEFAULT_CONFIG_DIR = "/etc/provisioner/config"


DEFAULT_BLOCK_CLEANER = ("/scripts/quick_reset.sh",)


VOLUME_MODES = ("Filesystem", "Block")


ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


TOLERATION_OPERATORS = ("Exists", "Equal")


TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class ConfigError(Exception):
    """The configuration is unusable. ``problems`` lists every finding, one per line."""

    def __init__(self, problems: list[str], warnings: tuple[str, ...] = ()) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        #: Unknown keys seen while failing; often the cause (``mountdir`` for ``mountDir``).
        self.warnings = warnings


@dataclass(frozen=True)
class ClassConfig:
    """One ``storageClassMap`` entry: where to discover volumes for one StorageClass."""

    name: str
    host_dir: str
    mount_dir: str
    block_cleaner_command: tuple[str, ...] = DEFAULT_BLOCK_CLEANER
    volume_mode: str = "Filesystem"
    access_mode: str = "ReadWriteOnce"
    fs_type: str | None = None
    name_pattern: NamePattern = field(default_factory=lambda: NamePattern("*"))
    selector: tuple[Mapping[str, Any], ...] = ()
    #: false: discovered on no node but those whose override in ``nodes`` enables it.
    enabled: bool = True
    #: Per-node overrides (:mod:`localpv.config.overrides`); none once resolved for a node.
    nodes: tuple[NodeOverride, ...] = ()

    def container_path(self, host_path: str) -> str | None:
        """Map a PV's host path (``hostDir/entry``) to the path inside this container.

        Returns None when the path is not directly inside ``hostDir``: such a PV was
        not made from this class's discovery dir and must not be cleaned through it.
        """
        host_dir = self.host_dir.rstrip("/") or "/"
        parent, _, entry = host_path.rstrip("/").rpartition("/")
        if (parent or "/") != host_dir or not entry or entry in (".", ".."):
            return None
        return os.path.join(self.mount_dir, entry)


@dataclass(frozen=True)
class ProvisionerConfig:
    """The whole agent configuration (ConfigMap keys), immutable."""

    classes: Mapping[str, ClassConfig] = field(default_factory=dict)
    node_labels_for_pv: tuple[str, ...] = ()
    labels_for_pv: Mapping[str, str] = field(default_factory=dict)
    #: Always false: upstream's `true` (an annotation Kubernetes ignores since 1.11) is refused.
    use_alpha_api: bool = False
    use_job_for_cleaning: bool = False
    use_job_for_filesystem_cleaning: bool = False
    job_tolerations: tuple[Mapping[str, Any], ...] = ()
    min_resync_period: float = 300.0
    use_node_name_only: bool = False
    set_pv_owner_ref: bool = False
    remove_node_not_ready_taint: bool = False
    provisioner_not_ready_node_taint_key: str = ""
    clean_before_first_discovery: bool = False
    cleanup_workers: int = 4
    cleanup_timeout: float = 6 * 3600.0
    # Dynamic volumes (issue 18): parsed by localpv.config.dynamic.
    dynamic_pools: Mapping[str, PoolConfig] = field(default_factory=dict)
    dynamic_classes: Mapping[str, DynamicClass] = field(default_factory=dict)
    csi_driver_name: str = "local.csi.localpv.dev"

    def cleans_by_job(self, block: bool) -> bool:
        """Whether a volume is cleaned by a Job rather than in-process (upstream: block only)."""
        return self.use_job_for_cleaning and (block or self.use_job_for_filesystem_cleaning)


@dataclass(frozen=True)
class LoadedConfig:
    """A parsed configuration plus the warnings found while reading it."""

    config: ProvisionerConfig
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuntimeEnv:
    """Process environment upstream's DaemonSet sets through the downward API."""

    node_name: str | None
    namespace: str
    job_image: str | None
    kubeconfig: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RuntimeEnv:
        return cls(
            node_name=environ.get("MY_NODE_NAME") or None,
            namespace=environ.get("MY_NAMESPACE") or "default",
            job_image=environ.get("JOB_CONTAINER_IMAGE") or None,
            kubeconfig=environ.get("KUBECONFIG") or None,
        )


def replace(config: ProvisionerConfig, **changes: Any) -> ProvisionerConfig:
    """A copy with changes (tests and the CLI's overrides)."""
    return dataclasses.replace(config, **changes)

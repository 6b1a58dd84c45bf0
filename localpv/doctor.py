"""``localpv doctor``: why are no PVs being created on this node?

That is upstream's most common complaint (research §8.3), and its causes are few: the
discovery directory is missing or holds plain directories, the pod's mount of it does not
receive mounts made later on the host (propagation), ``/dev`` is the container's own so
by-id links dangle, the StorageClass or the Node's hostname label is missing, or RBAC
denies a call. Each is checked here and reported with its fix on one line.

Shape: *gather* functions read the host and the API into plain fact records; *check*
functions turn facts into :class:`Finding` objects without touching anything, so every
verdict is tested on constructed facts, and the gatherers on real mounts and the emulator.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localpv.config import ClassConfig, ProvisionerConfig
from localpv.host.mounts import MountInfo, read_mountinfo
from localpv.host.scan import Entry, EntryKind, ScanError, scan_directory
from localpv.naming import HOSTNAME_LABEL_KEY

OK, WARN, ERROR = "ok", "warn", "error"


@dataclass(frozen=True)
class Finding:
    """One verdict: what was checked, what was found, and (unless fine) the one-line fix."""

    level: str
    subject: str
    message: str
    fix: str = ""


# ---------------------------------------------------------------- facts


@dataclass(frozen=True)
class ClassFacts:
    """What this process sees of one class's discovery directory."""

    cls: ClassConfig
    #: why mountDir cannot be listed (missing, not a directory, unreadable), else None
    dir_error: str | None
    entries: tuple[Entry, ...] = ()
    #: the mount that contains mountDir (the longest mount point above or at it)
    mount: MountInfo | None = None
    #: entry name -> what it points to, for the entries that are symlinks (a scan follows them)
    symlinks: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolFacts:
    """A dynamic pool as the agent sees it before making or staging an image there."""

    name: str
    host_dir: str
    #: a :class:`localpv.csi.pools.PoolState` value
    state: str
    why: str


@dataclass(frozen=True)
class HostFacts:
    classes: tuple[ClassFacts, ...]
    #: running in a pod: mounts made on the host reach mountDir only through propagation
    in_pod: bool
    #: filesystem type of the mount at /dev ("devtmpfs" when it is the host's)
    dev_fs_type: str | None
    pools: tuple[PoolFacts, ...] = ()


@dataclass(frozen=True)
class Access:
    """One permission the agent needs, and whether the API server grants it."""

    verb: str
    resource: str
    group: str = ""
    namespace: str | None = None
    allowed: bool | None = None
    reason: str = ""

    def describe(self) -> str:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        where = f' in namespace "{self.namespace}"' if self.namespace else ""
        return f"{self.verb} {resource}{where}"


@dataclass(frozen=True)
class ClusterFacts:
    node_name: str
    node: dict[str, Any] | None
    node_error: str | None = None
    #: StorageClass name -> the object, or None when it does not exist
    storage_classes: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    #: StorageClass name -> why it could not be read (e.g. forbidden)
    storage_class_errors: dict[str, str] = field(default_factory=dict)
    access: tuple[Access, ...] = ()
    #: the API server could not be reached or answered an error for everything
    unreachable: str | None = None


# ---------------------------------------------------------------- checks (pure)


def propagation(mount: MountInfo) -> str:
    """``slave`` (receives host mounts: HostToContainer), ``shared`` (Bidirectional),
    ``private`` or ``unbindable``, from the mountinfo optional fields."""
    tags = {tag.split(":")[0] for tag in mount.optional_fields}
    if "master" in tags:
        return "slave"
    if "shared" in tags:
        return "shared"
    return "unbindable" if "unbindable" in tags else "private"


def containing_mount(mounts: Sequence[MountInfo], path: str) -> MountInfo | None:
    """The mount ``path`` lies on: the deepest mount point at or above it (the last one
    listed when mounts are stacked on the same point, as the kernel lists them in order)."""
    path = os.path.normpath(path)
    best: MountInfo | None = None
    for mount in mounts:
        point = mount.mount_point
        if (path == point or path.startswith(point.rstrip("/") + "/")) and (
                best is None or len(point) >= len(best.mount_point)):
            best = mount
    return best


def check_directory(facts: ClassFacts) -> list[Finding]:
    cls = facts.cls
    subject = f"class {cls.name}"
    if facts.dir_error:
        return [Finding(ERROR, subject, f"discovery directory {cls.mount_dir}: {facts.dir_error}",
                        f"create {cls.host_dir} on the node and mount it at {cls.mount_dir} in the agent pod "
                        "(the chart mounts each class's hostDir)")]
    counts = {kind: sum(1 for e in facts.entries if e.kind is kind) for kind in EntryKind}
    usable = counts[EntryKind.BLOCK] if cls.volume_mode == "Block" else counts[EntryKind.MOUNTPOINT] + counts[
        EntryKind.BLOCK]
    findings = [Finding(OK, subject, f"discovery directory {cls.mount_dir} has {len(facts.entries)} entries, "
                                     f"{usable} usable as {cls.volume_mode} volumes")]
    findings += [f for f in (_entry_finding(cls, entry, facts.symlinks) for entry in facts.entries) if f is not None]
    findings += [f for f in (_identity_finding(cls, entry) for entry in facts.entries) if f is not None]
    return findings


def _identity_finding(cls: ClassConfig, entry: Entry) -> Finding | None:
    """A volume whose identity cannot be read, or that has none although it is a disk: the
    agent cannot tell it from another disk that takes its device name after a reboot."""
    if entry.kind not in (EntryKind.MOUNTPOINT, EntryKind.BLOCK):
        return None
    subject = f"class {cls.name}"
    identity = entry.identity
    if identity.error:
        return Finding(ERROR, subject, f"{entry.path}: its identity cannot be read ({identity.error}): the agent "
                                       "neither cleans nor offers it while a record of it may hold data",
                       "mount the host's /dev (chart: mountDevVolume: true) and /run/udev (chart: "
                       "mountUdevData: true); check the disk (dmesg)")
    if identity.value or not entry.device or "no device" in identity.how:
        return None  # known by what it is, or a tmpfs-like volume that does not outlive a reboot anyway
    return Finding(WARN, subject, f"{entry.path} has no stable identity ({identity.how}): if disks are renumbered "
                                  "at boot, the agent cannot tell it from the disk that takes its device name",
                   "use disks that report a WWN or serial, a partition (its partition UUID identifies it), or "
                   "for a Filesystem class a filesystem with a UUID")


@dataclass(frozen=True)
class AgentFacts:
    """What the running agent reports (its ``/status``): volumes it holds and volumes not healthy."""

    #: (path, why) of each volume the agent will not clean, offer or delete the PV of
    held: tuple[tuple[str, str], ...] = ()
    #: (path, PV, abnormal conditions) of each volume in use that is not healthy
    unhealthy: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    #: why the agent could not be asked (not running, another address), or None
    unavailable: str | None = None

    @classmethod
    def from_status(cls, doc: Mapping[str, Any]) -> AgentFacts:
        volumes = doc.get("volumes") or []
        return cls(tuple((str(v["path"]), str(v["held"])) for v in volumes if v.get("held")),
                   tuple((str(v["path"]), str(v.get("pv") or ""), tuple(v["health"]))
                         for v in volumes if v.get("health")))


def check_agent(agent: AgentFacts | None) -> list[Finding]:
    """Volumes the running agent holds (disks renumbered, swapped, replaced) or sees unhealthy."""
    if agent is None:
        return []
    if agent.unavailable:
        return [Finding(WARN, "agent", f"cannot ask the running agent: {agent.unavailable}",
                        "run this in the agent's pod, or give --agent-url")]
    findings = [Finding(ERROR, "identity", f"{path} is held: {why}",
                        "mount each disk at its own path again, by UUID or WWN (e.g. UUID=... in /etc/fstab); "
                        "`localpv status` lists the identity recorded for each path")
                for path, why in agent.held]
    findings += [Finding(ERROR, "health", f"{path} (PV {pv}) is not healthy: {', '.join(conditions)}",
                         "see the VolumeConditionAbnormal event on its claim (kubectl describe pvc) and the "
                         "runbook for each condition (docs/operations.md, \"Volume health\")")
                 for path, pv, conditions in agent.unhealthy]
    if not findings:
        findings.append(Finding(OK, "agent", "no volume is held or unhealthy"))
    return findings


def _entry_finding(cls: ClassConfig, entry: Entry, symlinks: Mapping[str, str]) -> Finding | None:
    """Why one discovery-directory entry gets no PV, with its fix (None: it is a volume)."""
    subject = f"class {cls.name}"
    host_path = os.path.join(cls.host_dir, entry.name)
    if entry.kind in (EntryKind.DIRECTORY, EntryKind.OTHER):
        target = symlinks.get(entry.name)
        if target is not None:
            # Never advise a mount on it: mount follows the link, and a bind mount of
            # "link -> /etc" onto itself binds /etc onto /etc.
            return Finding(ERROR, subject, f"{entry.path} is a symlink to {target}, not a mount point: no PV",
                           f"on the node: remove the symlink {host_path} (that leaves {target} alone); to make "
                           f"a volume there, mount a disk on a real directory {host_path} made in its place")
    if entry.kind is EntryKind.DIRECTORY:
        return Finding(ERROR, subject, f"{entry.path} is a plain directory, not a mount point: no PV",
                       f"on the node: mount a disk on {host_path}, or `mount --bind {host_path} "
                       f"{host_path}` (and add it to /etc/fstab)")
    if entry.kind is EntryKind.BROKEN:
        return Finding(ERROR, subject, f"{entry.reason}: no PV",
                       "fix or remove the symlink; if it points into /dev, mount the host's /dev "
                       "(chart: mountDevVolume: true)")
    if entry.kind is EntryKind.OTHER:
        return Finding(ERROR, subject, f"{entry.reason}: no PV",
                       f"remove {host_path}: only mount points and block devices are volumes")
    if entry.kind is EntryKind.PSEUDOFS:
        return Finding(ERROR, subject, f"{entry.reason}: no PV",
                       f"on the node: `umount {host_path}` and mount a disk there: a kernel filesystem "
                       "is never a volume")
    if entry.kind is EntryKind.MOUNTPOINT and cls.volume_mode == "Block":
        return Finding(ERROR, subject, f"{entry.path} is a mounted directory in a Block class: no PV",
                       "put symlinks to block devices in a Block class's hostDir, or use a "
                       "Filesystem class")
    return None


def _symlink_target(path: str) -> str | None:
    """What the symlink ``path`` points to (as written in the link), or None when it is not one."""
    try:
        return os.readlink(path)
    except OSError:  # not a symlink, or gone
        return None


def check_propagation(facts: ClassFacts, in_pod: bool) -> list[Finding]:
    cls = facts.cls
    subject = f"class {cls.name}"
    if facts.dir_error:
        return []
    if not in_pod:
        return [Finding(OK, subject, "not in a pod: this process sees the host's mounts directly")]
    mount = facts.mount
    if mount is None or (mount.mount_point == "/" and cls.mount_dir != "/"):
        return [Finding(ERROR, subject, f"{cls.mount_dir} is on the container's own filesystem, not a volume: "
                                        "the host's disks are not visible here",
                        f"mount hostDir {cls.host_dir} at {cls.mount_dir} with a hostPath volume "
                        "(mountPropagation: HostToContainer)")]
    mode = propagation(mount)
    if mode in ("slave", "shared"):
        return [Finding(OK, subject, f"{mount.mount_point} receives mounts made on the host ({mode} propagation)")]
    return [Finding(ERROR, subject, f"{mount.mount_point} has {mode} propagation: disks mounted on the host after "
                                    "this pod started will never appear here",
                    f"set mountPropagation: HostToContainer on the volumeMount of {mount.mount_point} "
                    "(the chart does), then restart the pod")]


def check_dev(host: HostFacts) -> list[Finding]:
    """Block classes need the host's /dev: by-id symlinks resolve through it."""
    block = [f.cls.name for f in host.classes if f.cls.volume_mode == "Block"]
    if not block or not host.in_pod:
        return []
    if host.dev_fs_type == "devtmpfs":
        return [Finding(OK, "/dev", "the host's /dev is mounted (devtmpfs)")]
    return [Finding(ERROR, "/dev", f"/dev is the container's own ({host.dev_fs_type or 'not mounted'}), but "
                                   f"{', '.join(block)} hold block devices: their links cannot resolve",
                    "mount the host's /dev at /dev (chart: mountDevVolume: true)")]


_POOL_FIXES = {
    "missing": "create {dir} on the pool's disk and mount that disk there",
    "not-mounted": "mount the pool's disk at {dir} (or set requireMount: false for a plain directory)",
    "volatile": "give the pool a hostDir on a disk's filesystem, then move its images there",
}


def check_pools(pools: Iterable[PoolFacts]) -> list[Finding]:
    """A pool the agent would refuse (missing, not mounted, in memory) makes no dynamic volume."""
    return [Finding(OK, f"pool {p.name}", f"{p.host_dir} is ready for images") if p.state == "ready" else
            Finding(ERROR, f"pool {p.name}", p.why, _POOL_FIXES.get(p.state, "").format(dir=p.host_dir))
            for p in pools]


def check_node(cluster: ClusterFacts) -> list[Finding]:
    subject = f"node {cluster.node_name}"
    if cluster.node is None:
        return [Finding(ERROR, subject, f"Node not readable: {cluster.node_error or 'not found'}",
                        "set MY_NODE_NAME to this node's name (the chart passes spec.nodeName)")]
    labels = (cluster.node.get("metadata") or {}).get("labels") or {}
    if not labels.get(HOSTNAME_LABEL_KEY):
        return [Finding(ERROR, subject, f"no {HOSTNAME_LABEL_KEY} label: PVs cannot be pinned to this node",
                        f"kubectl label node {cluster.node_name} {HOSTNAME_LABEL_KEY}={cluster.node_name}")]
    return [Finding(OK, subject, f"{HOSTNAME_LABEL_KEY}={labels[HOSTNAME_LABEL_KEY]}")]


def check_storage_classes(config: ProvisionerConfig, cluster: ClusterFacts) -> list[Finding]:
    findings = []
    for name in config.classes:
        sc = cluster.storage_classes.get(name)
        subject = f"class {name}"
        if name in cluster.storage_class_errors:
            findings.append(Finding(ERROR, subject, f"StorageClass {name} cannot be read: "
                                                    f"{cluster.storage_class_errors[name]}",
                                    "grant get/list/watch on storageclasses (the chart's agent role does)"))
        elif sc is None:
            findings.append(Finding(ERROR, subject, f"StorageClass {name} does not exist: discovery skips the class",
                                    f"create StorageClass {name} (chart: classes[].storageClass: true)"))
        elif sc.get("volumeBindingMode") != "WaitForFirstConsumer":
            findings.append(Finding(WARN, subject, f"StorageClass {name} binds Immediately: claims may get a PV on a "
                                                   "node their pod cannot run on",
                                    "recreate it with volumeBindingMode: WaitForFirstConsumer"))
        else:
            findings.append(Finding(OK, subject, f"StorageClass {name} exists (WaitForFirstConsumer)"))
    return findings


def required_access(config: ProvisionerConfig, namespace: str) -> list[Access]:
    """Every permission the agent uses with this configuration (the chart's agent role)."""
    needed = [Access(verb, "persistentvolumes") for verb in ("get", "list", "watch", "create", "patch", "delete")]
    needed += [Access(verb, "storageclasses", "storage.k8s.io") for verb in ("get", "list", "watch")]
    needed += [Access(verb, "nodes") for verb in ("get", "list", "watch")]
    needed += [Access(verb, "events", namespace="default") for verb in ("create", "patch")]
    if config.remove_node_not_ready_taint:
        needed.append(Access("update", "nodes"))
    if config.use_job_for_cleaning:
        needed += [Access(verb, "jobs", "batch", namespace) for verb in ("get", "list", "watch", "create", "delete")]
    return needed


def check_access(cluster: ClusterFacts) -> list[Finding]:
    denied = [a for a in cluster.access if not a.allowed]
    if not denied:
        return [Finding(OK, "rbac", f"all {len(cluster.access)} permissions the agent needs are granted")]
    return [Finding(ERROR, "rbac", f"cannot {a.describe()}" + (f" ({a.reason})" if a.reason else ""),
                    "grant it to the agent's service account (the chart's rbac.create: true does)")
            for a in denied]


def diagnose(config: ProvisionerConfig, host: HostFacts, cluster: ClusterFacts | None,
             agent: AgentFacts | None = None) -> list[Finding]:
    """Every finding, host first, then the running agent's, then the cluster's (None: not asked)."""
    findings: list[Finding] = []
    if not config.classes and not config.dynamic_classes:
        findings.append(Finding(ERROR, "config", "no storage classes configured: nothing is discovered",
                                "add classes to storageClassMap (chart: classes[])"))
    for facts in host.classes:
        findings += check_directory(facts) + check_propagation(facts, host.in_pod)
    findings += check_dev(host)
    findings += check_pools(host.pools)
    findings += check_agent(agent)
    if cluster is None:
        return findings
    if cluster.unreachable:
        return [*findings, Finding(ERROR, "api", f"the API server cannot be used: {cluster.unreachable}",
                                   "check --kubeconfig / the pod's service account and network")]
    return findings + check_node(cluster) + check_storage_classes(config, cluster) + check_access(cluster)


def for_this_node(config: ProvisionerConfig, node_name: str | None,
                  labels: Mapping[str, str] | None) -> tuple[ProvisionerConfig, list[Finding]]:
    """The configuration this node's agent uses (its ``nodes`` overrides applied) and what to
    say about it: which override gave each entry, which entries are off here. ``labels``:
    the Node's, None when they were not read (``--no-cluster``). The host is then checked with
    the node's directories, not the ConfigMap's defaults."""
    from localpv.config import ConfigError, for_node, is_uniform

    if is_uniform(config):
        return config, []
    subject = f"config (node {node_name})" if node_name else "config"
    if node_name is None:
        return config, [Finding(WARN, subject, "the ConfigMap has per-node overrides (nodes), and this node's name is "
                                               "not known: the directories checked are the defaults",
                                "give --node (or MY_NODE_NAME)")]
    findings = []
    if labels is None:
        findings.append(Finding(WARN, subject, "the Node's labels were not read (--no-cluster, or no Node): "
                                               "overrides by matchLabels are not applied",
                                f"localpv config check PATH --node {node_name} --node-label KEY=VALUE ..."))
    try:
        mine = for_node(config, node_name, labels or {})
    except ConfigError as err:
        return config, [*findings, *(Finding(ERROR, subject, f"the agent refuses this node's configuration: {p}",
                                             "correct the ConfigMap's nodes overrides (localpv config check PATH "
                                             f"--node {node_name} --node-label ...)") for p in err.problems)]
    for name, cls in mine.config.classes.items():
        key = f"storageClassMap.{name}"
        if key in mine.applied:
            findings.append(Finding(OK, subject, f"{key}: hostDir {cls.host_dir}, mountDir {cls.mount_dir}, from "
                                                 f"{mine.applied[key]}"))
    for name, pool in mine.config.dynamic_pools.items():
        key = f"dynamicPools.{name}"
        if key in mine.applied:
            findings.append(Finding(OK, subject, f"{key}: hostDir {pool.host_dir}, mountDir {pool.mount_dir}, from "
                                                 f"{mine.applied[key]}"))
    off = [f"storageClassMap.{n}" for n in config.classes if n not in mine.config.classes]
    off += [f"dynamicPools.{n}" for n in config.dynamic_pools if n not in mine.config.dynamic_pools]
    for key in off:
        by = mine.applied.get(key, "its enabled: false")
        findings.append(Finding(OK, subject, f"{key} is off on this node, by {by}"))
    return mine.config, findings


# ---------------------------------------------------------------- gathering (real host, real API)


def gather_host(config: ProvisionerConfig, *, in_pod: bool, mountinfo: str = "/proc/self/mountinfo") -> HostFacts:
    mounts = read_mountinfo(mountinfo)
    points = frozenset(m.mount_point for m in mounts)
    classes = []
    for cls in config.classes.values():
        try:
            entries = tuple(scan_directory(cls.mount_dir, points))
            error = None
        except ScanError as err:
            entries, error = (), err.error.strerror or str(err.error)
        if error is None and not os.path.isdir(cls.mount_dir):
            error = "not a directory"
        links = {e.name: target for e in entries if (target := _symlink_target(e.path)) is not None}
        classes.append(ClassFacts(cls, error, entries, containing_mount(mounts, cls.mount_dir), links))
    dev = next((m for m in reversed(mounts) if m.mount_point == "/dev"), None)
    return HostFacts(tuple(classes), in_pod, dev.fs_type if dev else None, gather_pools(config))


def gather_pools(config: ProvisionerConfig) -> tuple[PoolFacts, ...]:
    """Each pool's state, asked exactly as the agent asks it before an image is made."""
    from localpv.csi.pools import Pool

    facts = []
    for pool_config in config.dynamic_pools.values():
        state, why = Pool(pool_config).state()
        facts.append(PoolFacts(pool_config.name, pool_config.host_dir, state.value, why))
    return tuple(facts)


def gather_cluster(api: Any, config: ProvisionerConfig, node_name: str, namespace: str) -> ClusterFacts:
    """Read the Node and StorageClasses and ask a SelfSubjectAccessReview per permission."""
    from localpv.kube.errors import ApiError, NotFound
    from localpv.kube.resources import NODES, SELF_SUBJECT_ACCESS_REVIEWS, STORAGE_CLASSES

    node, node_error = None, None
    try:
        node = api.get(NODES, node_name)
    except NotFound:
        node_error = "not found"
    except ApiError as err:
        if err.status in (0, 401) or err.status >= 500:
            return ClusterFacts(node_name, None, unreachable=str(err))
        node_error = str(err)
    classes: dict[str, dict[str, Any] | None] = {}
    errors: dict[str, str] = {}
    for name in config.classes:
        try:
            classes[name] = api.get(STORAGE_CLASSES, name)
        except NotFound:
            classes[name] = None
        except ApiError as err:
            errors[name] = str(err)
    access = tuple(_review(api, SELF_SUBJECT_ACCESS_REVIEWS, a) for a in required_access(config, namespace))
    return ClusterFacts(node_name, node, node_error, classes, errors, access)


def _review(api: Any, resource: Any, access: Access) -> Access:
    from localpv.kube.errors import ApiError

    attributes = {"verb": access.verb, "group": access.group, "resource": access.resource}
    if access.namespace:
        attributes["namespace"] = access.namespace
    try:
        review = api.create(resource, {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                       "spec": {"resourceAttributes": attributes}})
    except ApiError as err:
        return Access(access.verb, access.resource, access.group, access.namespace, None, f"not verifiable: {err}")
    status = review.get("status") or {}
    return Access(access.verb, access.resource, access.group, access.namespace, bool(status.get("allowed")),
                  str(status.get("reason") or ""))


def render(findings: Iterable[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{f.level.upper():5}  {f.subject}: {f.message}")
        if f.fix:
            lines.append(f"       fix: {f.fix}")
    return "\n".join(lines) + "\n"


def failed(findings: Iterable[Finding]) -> bool:
    return any(f.level == ERROR for f in findings)

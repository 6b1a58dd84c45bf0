"""``localpv discover`` (a dry run, its only mode): what the agent would create, without a cluster.

It runs the very same planner as the agent over the real host (mount table, discovery
directories), with an empty journal. Without a kubeconfig it assumes what it cannot
know - the Node's hostname label equals its name, each StorageClass exists with reclaim
policy Delete, no PV exists yet - and says so. With one, it reads the real Node,
StorageClasses and this node's PVs (read-only: nothing is written).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localpv.agent.journal import Journal
from localpv.agent.model import Plan, World
from localpv.agent.planner import plan
from localpv.agent.pvbuilder import NodeInfo, StorageClassInfo
from localpv.config import ProvisionerConfig, for_node, is_uniform
from localpv.host.mounts import mount_points
from localpv.host.scan import Entry, ScanError, scan_directory
from localpv.naming import HOSTNAME_LABEL_KEY, NODE_LABEL_KEY, node_label_value, provisioner_name

DRY_RUN_UID = "00000000-0000-0000-0000-000000000000"


@dataclass
class DryRunResult:
    plan: Plan
    assumptions: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        skipped = [{"path": s.path, "class": s.cls, "reason": s.reason} for s in self.plan.skipped]
        skipped += [{"path": "", "class": cls, "reason": why} for cls, why in sorted(self.plan.class_errors.items())]
        return {"volumes": [c.pv for c in self.plan.creates], "skipped": skipped}


def dry_run(
    config: ProvisionerConfig,
    node_name: str,
    *,
    api: Any = None,
    mount_table: Callable[[], frozenset[str]] = mount_points,
    scanner: Callable[[str, frozenset[str]], list[Entry]] = scan_directory,
    now: float = 0.0,
) -> DryRunResult:
    """What the agent of ``node_name`` would do now. The configuration is that node's (its
    ``nodes`` overrides applied with the Node's labels; without a cluster, by name only):
    raises :class:`~localpv.config.ConfigError` when they clash there."""
    assumptions: list[str] = []
    if api is None:
        node = NodeInfo(node_name, DRY_RUN_UID, {HOSTNAME_LABEL_KEY: node_name})
        pvs: list[dict[str, Any]] = []
        assumptions += [
            f"no cluster: assuming Node {node_name} has label {HOSTNAME_LABEL_KEY}={node_name}",
            "no cluster: assuming every StorageClass exists with reclaimPolicy Delete and no mountOptions",
            "no cluster: assuming no PV exists yet",
        ]
        if not config.use_node_name_only:
            assumptions.append("no cluster: the Node UID in pv.kubernetes.io/provisioned-by is a placeholder")
        if not is_uniform(config):
            assumptions.append("no cluster: the Node's labels are unknown, so the overrides by matchLabels (nodes) "
                               "are not applied")
        config = for_node(config, node_name, {}).config
        storage_classes: dict[str, StorageClassInfo | None] = {n: StorageClassInfo(n) for n in config.classes}
    else:
        from localpv.kube.resources import NODES, PERSISTENT_VOLUMES, STORAGE_CLASSES

        node = NodeInfo.from_object(api.get(NODES, node_name))
        config = for_node(config, node_name, node.labels).config
        classes, _ = api.list(STORAGE_CLASSES)
        found = {str(sc["metadata"]["name"]): StorageClassInfo.from_object(sc) for sc in classes}
        storage_classes = {n: found.get(n) for n in config.classes}
        pvs, _ = api.list(PERSISTENT_VOLUMES, label_selector=f"{NODE_LABEL_KEY}={node_label_value(node_name)}")
    scans: dict[str, list[Entry] | str] = {}
    mounts = mount_table()
    for name, cls in config.classes.items():
        try:
            scans[name] = scanner(cls.mount_dir, mounts)
        except ScanError as err:
            scans[name] = str(err)
    world = World(
        config=config, node=node,
        provisioner=provisioner_name(node.name, node.uid, use_node_name_only=config.use_node_name_only),
        storage_classes=storage_classes, scans=scans, pvs=pvs, journal=Journal(None).snapshot(), cleanups={},
        collisions={}, now=now,
    )
    return DryRunResult(plan(world), assumptions)


def render_table(result: DryRunResult) -> str:
    rows = [("NAME", "CLASS", "MODE", "CAPACITY", "PATH")]
    for create in result.plan.creates:
        spec = create.pv["spec"]
        rows.append((create.pv["metadata"]["name"], spec["storageClassName"], spec["volumeMode"],
                     spec["capacity"]["storage"], create.host_path))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no volumes would be created)")
    skipped = result.as_json()["skipped"]
    if skipped:
        lines += ["", "Skipped:"]
        lines += [f"  {s['path'] or '(class)'}  [{s['class']}]  {s['reason']}" for s in skipped]
    if result.assumptions:
        lines += ["", "Assumptions:"] + [f"  {a}" for a in result.assumptions]
    return "\n".join(lines) + "\n"

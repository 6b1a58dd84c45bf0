"""One node's configuration: the ConfigMap with the ``nodes`` overrides that apply to it.

:func:`for_node` is pure (configuration, node name, node labels in; the node's configuration
out), so the agent, ``localpv config check --node`` and ``localpv doctor`` show and use the
same answer. The result has no overrides left in it and no disabled entries: a pool or class
off on a node is absent from its configuration, exactly as if the ConfigMap did not name it
(so the agent's pools, the capacity it publishes and its discovery directories all follow).

The directory rules the whole ConfigMap is checked against (pools apart from each other and
from static classes, classes sharing a hostDir) are checked again on the result: an override
may move a pool onto another's directory on one node only. Overrides by name are checked
when the ConfigMap is read (:func:`check_named_nodes`); overrides by label only once a node's
labels are known - here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localpv.config import dynamic
from localpv.config.dynamic import PoolConfig
from localpv.config.model import ClassConfig, ConfigError, ProvisionerConfig
from localpv.config.overrides import NodeOverride, choose
from localpv.config.schema import _check_shared_dirs
from localpv.config.values import _Problems


@dataclass(frozen=True)
class NodeConfig:
    """The configuration of one node, and where each of its entries came from."""

    config: ProvisionerConfig
    #: ``storageClassMap.fast`` -> ``storageClassMap.fast.nodes[1] (matchLabels disk=nvme)``, for
    #: every entry an override applied to (disabled ones included).
    applied: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def _apply(entry: Any, overrides: tuple[NodeOverride, ...], node: str, labels: Mapping[str, str],
           key: str, applied: dict[str, str]) -> Any:
    """The entry for this node (None when it is off here), without overrides."""
    override = choose(overrides, node, labels)
    changes: dict[str, Any] = {"nodes": ()}
    if override is not None:
        applied[key] = f"{override.where} ({override.describe()})"
        changes.update(override.settings)
    resolved = dataclasses.replace(entry, **changes)
    if not resolved.enabled:
        return None
    return resolved


def for_node(config: ProvisionerConfig, node: str, labels: Mapping[str, str], *, strict: bool = False) -> NodeConfig:
    """What ``node`` (with ``labels``) gets. Raises :class:`ConfigError` when the overrides
    make this node's directories clash (one line per problem, naming the overrides); with
    ``strict`` (``config check``) two classes on one directory there are a clash too."""
    applied: dict[str, str] = {}
    classes = {}
    for name, cls in config.classes.items():
        if (resolved := _apply(cls, cls.nodes, node, labels, f"storageClassMap.{name}", applied)) is not None:
            classes[name] = resolved
    pools = {}
    for name, pool in config.dynamic_pools.items():
        if (resolved := _apply(pool, pool.nodes, node, labels, f"dynamicPools.{name}", applied)) is not None:
            pools[name] = resolved
    effective = dataclasses.replace(config, classes=classes, dynamic_pools=pools)
    problems = _Problems()
    _check_shared_dirs(classes, problems, strict=strict)
    dynamic.check({"classes": classes, "dynamic_pools": pools}, problems, references=False)
    if problems.errors:
        via = f" (node {node}, with " + (", ".join(applied.values()) or "no override") + ")"
        raise ConfigError([problem + via for problem in problems.errors], tuple(problems.warnings))
    return NodeConfig(effective, applied, tuple(problems.warnings))


def _entries(config: ProvisionerConfig) -> list[ClassConfig | PoolConfig]:
    return [*config.classes.values(), *config.dynamic_pools.values()]


def is_uniform(config: ProvisionerConfig) -> bool:
    """Whether every node gets the ConfigMap as written (no overrides, nothing off)."""
    return all(e.enabled and not e.nodes for e in _entries(config))


def check_named_nodes(config: ProvisionerConfig, problems: _Problems, *, strict: bool = False) -> None:
    """Resolve every node an override names (its labels unknown: the override by name wins
    whatever they are) and note the clashes, so that they are refused with the ConfigMap."""
    names = sorted({o.node for e in _entries(config) for o in e.nodes if o.node is not None})
    for node in names:
        try:
            for_node(config, node, {}, strict=strict)
        except ConfigError as err:
            problems.errors.extend(err.problems)

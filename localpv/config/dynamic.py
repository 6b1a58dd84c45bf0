"""The ConfigMap keys of dynamic volumes: ``dynamicPools``, ``dynamicClassMap``, ``csiDriverName``.

They live in the same ConfigMap as the static classes (``storageClassMap``) and are read by
the same strict reader (:func:`localpv.config.schema.parse_config` calls the parsers here): every problem is one
line naming the key, what was expected and what was found, unknown keys are warnings with a
"did you mean". A pool's directories are validated as a discovery directory's are.

``dynamicClassMap`` names the StorageClasses whose claims the agent provisions, with the
parameters the chart also writes into each StorageClass (``pool``, ``fsType``,
``provisioning``, ``mkfsOptions``). The ConfigMap is what the agent uses; a parameter that
the StorageClass object spells differently makes provisioning fail with an event naming
both, so the two never silently disagree (see :mod:`localpv.csi.params`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localpv.config import mkfs, overrides
from localpv.config.paths import _parse_abs_path, within
from localpv.config.values import KeySpec, _as_bool, _as_str, _check_keys, _describe, _Parser, _Problems
from localpv.naming import DNS1123_LABEL_RE, DNS1123_SUBDOMAIN_RE, parse_quantity

DEFAULT_DRIVER_NAME = "local.csi.localpv.dev"
FS_TYPES = ("ext4", "xfs")
PROVISIONING = ("thin", "thick")


@dataclass(frozen=True)
class PoolConfig:
    """One ``dynamicPools`` entry: a directory on every node where images are made."""

    name: str
    host_dir: str
    mount_dir: str
    require_mount: bool = True
    overcommit: float = 1.0
    reserved: int = 0
    #: How full the pool's filesystem may get while thin promises are not backed before the
    #: tenants who may still write are warned (and the alert fires): a high-water mark.
    high_water: float = 0.9
    #: false: the pool exists on no node but those whose override in ``nodes`` enables it.
    enabled: bool = True
    #: Per-node overrides (:mod:`localpv.config.overrides`); none once resolved for a node.
    nodes: tuple[overrides.NodeOverride, ...] = ()


@dataclass(frozen=True)
class DynamicClass:
    """One ``dynamicClassMap`` entry: how volumes of a StorageClass are made."""

    name: str
    pool: str
    fs_type: str = "ext4"
    provisioning: str = "thin"
    mkfs_options: str = ""


#: The most a pool may promise, in times its size. With overcommit N the pool is full once its
#: thin images are on average 1/N written; at 100 that is 1% of what each claim was promised,
#: and beyond it a promise is one the pool can almost never keep (1e300 was accepted: every
#: claim fitted, and tenants met ENOSPC far below their sizes).
MAX_OVERCOMMIT = 100.0


def _number_between(low: float, high: float, expected: str) -> _Parser:
    """A parser of a number from ``low`` to ``high``; ``expected`` says what it is, for the error."""
    def parse(value: Any, path: str, problems: _Problems) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            problems.error(path, f"{expected}, got {_describe(value)}")
            return None
        try:
            number = float(value)
        except ValueError:
            number = low - 1
        if not low <= number <= high:  # NaN compares false: refused too
            problems.error(path, f"{expected}, got {_describe(value)}")
            return None
        return number
    return parse


_parse_overcommit = _number_between(
    1.0, MAX_OVERCOMMIT,
    f"expected a number from 1 to {MAX_OVERCOMMIT:g} (thin images may promise that many times the pool's size; "
    f"beyond {MAX_OVERCOMMIT:g} the pool is full while its images are 1% written)")
_parse_high_water = _number_between(
    0.5, 1.0, "expected a fraction from 0.5 to 1 (how full the pool may get while thin promises are not backed "
              "before tenants are warned)")


def _parse_bytes(value: Any, path: str, problems: _Problems) -> int | None:
    text = _as_str(value, path, problems)
    if text is None:
        return None
    try:
        number = parse_quantity(text)
    except ValueError:
        number = -1
    if number < 0:
        problems.error(path, f'expected a quantity of bytes such as "1Gi" or "500M", got {_describe(value)}')
        return None
    if text.strip().endswith("m"):
        # Kubernetes reads "100m" as 0.1 (milli); meant as mebibytes, it reserved 1 byte.
        problems.error(path, 'expected a quantity of bytes such as "1Gi" or "500M" ("m" is milli, a thousandth of a '
                             f'byte; mebibytes are "Mi"), got {_describe(value)}')
        return None
    return number


def _choice(choices: tuple[str, ...]) -> _Parser:
    def parse(value: Any, path: str, problems: _Problems) -> str | None:
        if value in choices:
            return str(value)
        problems.error(path, f"expected one of {', '.join(choices)}, got {_describe(value)}")
        return None
    return parse


def _parse_mkfs_options(value: Any, path: str, problems: _Problems) -> str | None:
    """The text of mkfsOptions; what its options mean depends on the class's fsType, so they are
    read once the class is whole (:func:`parse_classes`, :mod:`localpv.config.mkfs`)."""
    return _as_str(value, path, problems, allow_empty=True)


POOL_KEYS: dict[str, KeySpec] = {
    "hostDir": KeySpec("host_dir", _parse_abs_path,
                            "The pool's directory on every node. Required. Validated as a class's hostDir.",
                            upstream=False),
    "mountDir": KeySpec("mount_dir", _parse_abs_path,
                             "Where hostDir is mounted in the agent container. Default: hostDir.", upstream=False),
    "requireMount": KeySpec("require_mount", _as_bool,
                                 "Refuse to make or stage images unless a filesystem is mounted at hostDir "
                                 "(its disk). Default true.", upstream=False),
    "overcommit": KeySpec("overcommit", _parse_overcommit,
                               "Thin images may promise this many times the pool's size: 1 to 100 (at 100 the pool is "
                               "full while its images are 1% written on average). Default 1.",
                               upstream=False),
    "reserved": KeySpec("reserved", _parse_bytes,
                             "Bytes of the pool never promised nor allocated. Default 0.", upstream=False),
    "highWater": KeySpec("high_water", _parse_high_water,
                         "How full the pool's filesystem may get, while what thin images may still write exceeds "
                         "its free space, before their claims and the Node are warned and the alert fires: 0.5 to 1. "
                         "Default 0.9.", upstream=False),
    "enabled": overrides.ENABLED,
}

#: What a node's override of a pool may set: everything about its disk.
POOL_OVERRIDABLE = ("hostDir", "mountDir", "requireMount", "overcommit", "reserved", "highWater", "enabled")
POOL_KEYS["nodes"] = KeySpec(
    "nodes", overrides.overrides_parser(lambda: POOL_KEYS, POOL_OVERRIDABLE, "pool"),
    "Per-node overrides: a list of `{name: <node>}` or `{matchLabels: {...}}` with the settings those nodes "
    f"get ({', '.join(POOL_OVERRIDABLE)}); by name wins over by label, else the first match in list order "
    "(see docs/dynamic-volumes.md).", upstream=False)

CLASS_KEYS: dict[str, KeySpec] = {
    "pool": KeySpec("pool", _as_str, "The dynamicPools entry images are made in. Required.",
                         upstream=False),
    "fsType": KeySpec("fs_type", _choice(FS_TYPES), "`ext4` (default) or `xfs`.", upstream=False),
    "provisioning": KeySpec("provisioning", _choice(PROVISIONING),
                                 "`thin` (sparse image, default) or `thick` (allocated up front).", upstream=False),
    "mkfsOptions": KeySpec("mkfs_options", _parse_mkfs_options,
                                "Extra options for mkfs.ext4 or mkfs.xfs (per fsType). Refused: what makes no "
                                "filesystem (dry runs), sets what localpv chooses (UUID, label, -F), reads the "
                                "agent's files or a node's device into volumes (see localpv.config.mkfs).",
                                upstream=False),
}


def _name_problem(name: Any, rule: str) -> str | None:
    pattern = DNS1123_LABEL_RE if rule == "label" else DNS1123_SUBDOMAIN_RE
    limit = 63 if rule == "label" else 253
    if not isinstance(name, str) or not name or len(name) > limit or not pattern.fullmatch(name):
        return (f'expected a DNS-1123 {rule} (lowercase letters, digits, "-"{"" if rule == "label" else " and ."}, '
                f"at most {limit} characters), got {_describe(name)}")
    return None


def _entries(value: Any, path: str, problems: _Problems, what: str, rule: str) -> dict[str, dict[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.error(path, f"expected a mapping of {what} name to settings, got {_describe(value)}")
        return {}
    found = {}
    for name, entry in value.items():
        where = f"{path}.{name}"
        if problem := _name_problem(name, rule):
            problems.error(where, problem)
        elif not isinstance(entry, dict):
            problems.error(where, f"expected a mapping of settings, got {_describe(entry)}")
        else:
            found[str(name)] = entry
    return found


def _settings(entry: dict[str, Any], keys: Mapping[str, KeySpec], required: str, where: str,
              problems: _Problems) -> dict[str, Any] | None:
    """One pool's or class's settings, parsed into their fields; None (and the problems
    noted) when a key is unknown to ``keys``, ``required`` is missing or a value is wrong.
    An entry that is off by default (``enabled: false``) may leave ``required`` to its
    per-node overrides."""
    _check_keys(entry, keys, where, problems)
    if required not in entry and not (entry.get("enabled") is False and "nodes" in entry):
        problems.error(f"{where}.{required}", "required, got nothing")
        return None
    values = {spec.field: spec.parse(entry[key], f"{where}.{key}", problems)
              for key, spec in keys.items() if key in entry}
    return None if any(v is None for v in values.values()) else values


def parse_pools(value: Any, path: str, problems: _Problems) -> dict[str, PoolConfig] | None:
    before = len(problems.errors)
    pools = {}
    for name, entry in _entries(value, path, problems, "pool", "label").items():
        values = _settings(entry, POOL_KEYS, "hostDir", f"{path}.{name}", problems)
        if values is not None:
            values.setdefault("host_dir", "")
            values.setdefault("mount_dir", values["host_dir"])
            pool = pools[name] = PoolConfig(name=name, **values)
            overrides.check_enabling(pool.enabled, bool(pool.host_dir), pool.nodes, f"{path}.{name}", problems)
    return pools if len(problems.errors) == before else None


def parse_classes(value: Any, path: str, problems: _Problems) -> dict[str, DynamicClass] | None:
    before = len(problems.errors)
    classes = {}
    for name, entry in _entries(value, path, problems, "StorageClass", "subdomain").items():
        values = _settings(entry, CLASS_KEYS, "pool", f"{path}.{name}", problems)
        if values is not None:
            cls = classes[name] = DynamicClass(name=name, **values)
            if problem := mkfs.options_problem(cls.fs_type, cls.provisioning, cls.mkfs_options):
                problems.error(f"{path}.{name}.mkfsOptions", problem)
    return classes if len(problems.errors) == before else None


def driver_name_problem(value: Any) -> str | None:
    """What is wrong with a CSI driver name (a DNS-1123 subdomain of at most 63 characters,
    what CSIDriver accepts); None when it is valid. One rule for the ConfigMap and the flags."""
    if isinstance(value, str) and 0 < len(value) <= 63 and DNS1123_SUBDOMAIN_RE.fullmatch(value):
        return None
    return ("expected a CSI driver name (a DNS-1123 subdomain of at most 63 characters, such as "
            f'"{DEFAULT_DRIVER_NAME}"), got {_describe(value)}')


def parse_driver_name(value: Any, path: str, problems: _Problems) -> str | None:
    """A CSI driver name (:func:`driver_name_problem`)."""
    problem = driver_name_problem(value)
    if problem is None:
        return str(value)
    problems.error(path, problem)
    return None


def overlap(path: str, other: str) -> str | None:
    """How the normalised directory ``path`` lies against ``other``: "the same directory as",
    "inside", "containing", or None when they are apart (neither holds the other)."""
    if path == other:
        return "the same directory as"
    if within(path, other):
        return "inside"
    if within(other, path):
        return "containing"
    return None


def _first_overlap(mine: Mapping[str, str], theirs: Mapping[str, str]) -> tuple[str, str] | None:
    """The first key (hostDir, then mountDir) whose directories overlap, with how; None if none does.

    Both sides matter: on the node two hostDirs on one directory are one directory; in the
    agent's container a mountDir inside another's is a mount point inside it."""
    for key in ("hostDir", "mountDir"):
        if (how := overlap(mine[key], theirs[key])) is not None:
            return key, how
    return None


def check(values: Mapping[str, Any], problems: _Problems, *, references: bool = True) -> None:
    """Rules across keys: a class names a pool that exists (``references``: not for one
    node's effective configuration, where a pool may be off); a pool is apart from every other
    pool and from every static class's directory (entries without a directory of their own,
    left to their overrides, are checked per node)."""
    pools: Mapping[str, PoolConfig] = values.get("dynamic_pools") or {}
    for name, cls in (values.get("dynamic_classes") or {}).items() if references else ():
        if cls.pool not in pools:
            known = ", ".join(sorted(pools)) or "none"
            problems.error(f"dynamicClassMap.{name}.pool", f"expected a pool of dynamicPools ({known}), got "
                                                           f'"{cls.pool}"')
        if name in (values.get("classes") or {}):
            problems.error(f"dynamicClassMap.{name}", "expected a StorageClass that storageClassMap does not also "
                                                      "name (a class is static or dynamic), got both")
    dirs = {name: {"hostDir": p.host_dir, "mountDir": p.mount_dir} for name, p in pools.items() if p.host_dir}
    static = {name: {"hostDir": c.host_dir, "mountDir": c.mount_dir}
              for name, c in (values.get("classes") or {}).items() if c.host_dir}
    seen: list[str] = []
    for name, mine in dirs.items():
        for other in seen:
            if clash := _first_overlap(mine, dirs[other]):
                key, how = clash
                problems.error(f"dynamicPools.{name}.{key}",
                               f"expected a directory apart from every other pool's, got {mine[key]}, {how} "
                               f"dynamicPools.{other}.{key} ({dirs[other][key]}): each pool would count only its "
                               "own images against one disk and take the other's for its own")
                break
        seen.append(name)
        for cls, theirs in static.items():
            if clash := _first_overlap(mine, theirs):
                key, how = clash
                problems.error(f"dynamicPools.{name}.{key}",
                               f"expected a directory apart from every static class's, got {mine[key]}, {how} "
                               f"storageClassMap.{cls}.{key} ({theirs[key]}) (its images would be offered as "
                               "volumes)")


def pools_to_data(pools: Mapping[str, PoolConfig]) -> dict[str, Any]:
    """Pools in the ConfigMap's spelling; ``enabled`` and ``nodes`` only when they say something."""
    out: dict[str, Any] = {}
    for name, p in pools.items():
        data: dict[str, Any] = {"hostDir": p.host_dir, "mountDir": p.mount_dir, "requireMount": p.require_mount,
                                "overcommit": p.overcommit, "reserved": p.reserved, "highWater": p.high_water}
        if not p.host_dir:  # left to the overrides that enable it
            del data["hostDir"], data["mountDir"]
        if not p.enabled:
            data["enabled"] = False
        if p.nodes:
            data["nodes"] = [o.to_data(POOL_KEYS, lambda _f, v: v) for o in p.nodes]
        out[name] = data
    return out


def classes_to_data(classes: Mapping[str, DynamicClass]) -> dict[str, Any]:
    return {name: {"pool": c.pool, "fsType": c.fs_type, "provisioning": c.provisioning,
                   "mkfsOptions": c.mkfs_options} for name, c in classes.items()}

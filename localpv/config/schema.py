"""The keys of the ConfigMap, declared once (:data:`TOP_LEVEL_KEYS`, :data:`CLASS_KEYS`), and
:func:`parse_config`, which reads a mapping of them into the model. The same tables generate
the configuration reference, so the documentation cannot drift."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localpv.config import dynamic, overrides
from localpv.config.model import ACCESS_MODES, VOLUME_MODES, ClassConfig, ConfigError, LoadedConfig, ProvisionerConfig
from localpv.config.paths import _parse_abs_path
from localpv.config.selectors import _parse_label_keys, _parse_labels, _parse_selector, _parse_tolerations
from localpv.config.values import (
    KeySpec,
    _as_bool,
    _as_duration,
    _as_positive_int,
    _as_str,
    _as_str_list,
    _check_keys,
    _describe,
    _Problems,
)
from localpv.namepattern import BadPatternError, NamePattern
from localpv.naming import (
    DNS1123_SUBDOMAIN_RE,
    SUBDOMAIN_RULE,
    quote_text,
)

# One row per ConfigMap key: (dataclass field, parser, documentation). The order is the
# order of the generated reference.


def _subdomain_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a DNS-1123 subdomain (a found-part for a message), or None."""
    if not text:
        return "an empty name"
    if len(text) > 253:
        return f"{len(text)} characters"
    if not DNS1123_SUBDOMAIN_RE.fullmatch(text):
        return quote_text(text)
    return None


def _parse_class_map(value: Any, path: str, problems: _Problems) -> dict[str, ClassConfig] | None:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.error(path, f"expected a mapping of storage class name to settings, got {_describe(value)}")
        return None
    classes: dict[str, ClassConfig] = {}
    for name, entry in value.items():
        where = f"{path}.{name}"
        if name is None or isinstance(name, bool) or not isinstance(name, str | int | float):
            problems.error(where, f"expected a StorageClass name ({SUBDOMAIN_RULE}), got {_describe(name)}")
            continue
        if problem := _subdomain_problem(str(name)):
            problems.error(where, f"expected a StorageClass name ({SUBDOMAIN_RULE}), got {problem}")
            continue
        parsed = _parse_class(str(name), entry, where, problems)
        if parsed is not None:
            classes[str(name)] = parsed
    return classes if len(classes) == len(value) else None


def _parse_volume_mode(value: Any, path: str, problems: _Problems) -> str | None:
    if value in VOLUME_MODES:
        return str(value)
    problems.error(path, f'expected "Filesystem" or "Block", got {_describe(value)}')
    return None


def _parse_access_mode(value: Any, path: str, problems: _Problems) -> str | None:
    if value in ACCESS_MODES:
        return str(value)
    problems.error(path, f"expected one of {', '.join(ACCESS_MODES)}, got {_describe(value)}")
    return None


def _parse_cleaner(value: Any, path: str, problems: _Problems) -> tuple[str, ...] | None:
    argv = _as_str_list(value, path, problems)
    if argv is not None and not argv:
        problems.error(path, "expected a command (a non-empty list), got an empty list")
        return None
    return argv


def _parse_name_pattern(value: Any, path: str, problems: _Problems) -> NamePattern | None:
    text = _as_str(value, path, problems)
    if text is None:
        return None
    try:
        return NamePattern(text)
    except BadPatternError as err:
        problems.error(path, f"invalid glob: {err}")
        return None


CLASS_KEYS: dict[str, KeySpec] = {
    "hostDir": KeySpec("host_dir", _parse_abs_path,
                       "Discovery directory on the host. Required. PV `local.path` = hostDir/<entry>. "
                       "Normalised first. Refused: `..` components, `/`, `/dev`, `/var`, `/home` "
                       "themselves, and anything in a system tree (`/proc`, `/sys`, `/etc`, `/usr`, "
                       "`/boot`, `/run`, `/var/lib/kubelet`...)."),
    "mountDir": KeySpec("mount_dir", _parse_abs_path,
                        "Where hostDir is mounted inside the agent container. Required (the Helm chart "
                        "defaults it to hostDir). Same rules as hostDir."),
    "blockCleanerCommand": KeySpec("block_cleaner_command", _parse_cleaner,
                                   "Command (argv list) that wipes a block volume; gets LOCAL_PV_BLKDEVICE. "
                                   "Default `[\"/scripts/quick_reset.sh\"]`. An empty list is an error."),
    "volumeMode": KeySpec("volume_mode", _parse_volume_mode,
                          "`Filesystem` (default) or `Block`, exact case."),
    "accessMode": KeySpec("access_mode", _parse_access_mode,
                          "Access mode of created PVs. Default `ReadWriteOnce`."),
    "fsType": KeySpec("fs_type", _as_str,
                      "`local.fsType` of created PVs (for filesystem-on-block volumes)."),
    "namePattern": KeySpec("name_pattern", _parse_name_pattern,
                           "Comma-separated Go globs on entry names. Default `*`."),
    "selector": KeySpec("selector", _parse_selector,
                        "Extra NodeSelectorTerms ORed into PV node affinity (shared disks)."),
    "enabled": overrides.ENABLED,
}

#: What a node's override of a static class may set: where its disks are.
CLASS_OVERRIDABLE = ("hostDir", "mountDir", "enabled")
CLASS_KEYS["nodes"] = KeySpec(
    "nodes", overrides.overrides_parser(lambda: CLASS_KEYS, CLASS_OVERRIDABLE, "class"),
    "Per-node overrides: a list of `{name: <node>}` or `{matchLabels: {...}}` with hostDir, mountDir (default: "
    "that hostDir) or enabled for those nodes; by name wins over by label, else the first match in list order.",
    upstream=False)


def _parse_class(name: str, entry: Any, path: str, problems: _Problems) -> ClassConfig | None:
    if not isinstance(entry, dict):
        problems.error(path, f"expected a mapping with hostDir and mountDir, got {_describe(entry)}")
        return None
    _check_keys(entry, CLASS_KEYS, path, problems)
    before = len(problems.errors)
    values: dict[str, Any] = {}
    # A class off by default may leave its directories to the overrides that enable it.
    left_to_nodes = entry.get("enabled") is False and "nodes" in entry
    for key in ("hostDir", "mountDir"):
        if key not in entry and not left_to_nodes:
            problems.error(f"{path}.{key}", "required, got nothing")
    for key, spec in CLASS_KEYS.items():
        if key in entry:
            values[spec.field] = spec.parse(entry[key], f"{path}.{key}", problems)
    if len(problems.errors) != before:
        return None
    values.setdefault("host_dir", "")
    values.setdefault("mount_dir", values["host_dir"])
    cls = ClassConfig(name=name, **values)
    overrides.check_enabling(cls.enabled, bool(cls.host_dir), cls.nodes, path, problems)
    if not cls.host_dir:
        return cls
    _warn_device_dir(cls, path, problems)
    if "blockCleanerCommand" in entry:
        _warn_missing_cleaner(cls.block_cleaner_command[0], f"{path}.blockCleanerCommand", problems)
    return cls


#: Where the image has the cleaner scripts, and where the package keeps its copy of them.
IMAGE_SCRIPTS_DIR = "/scripts"


PACKAGED_SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "scripts"


def _warn_missing_cleaner(command: str, path: str, problems: _Problems) -> None:
    """A cleaner that is not here is a warning, not an error: the check may run off the node,
    and the image may have it. A ``/scripts/`` script the package ships is there either way."""
    import shutil

    if "/" not in command:
        if shutil.which(command) is None:
            problems.warnings.append(f"{path}: {quote_text(command)} is not on PATH here; block volumes of this "
                                     "class are not cleaned unless the agent's image has it")
        return
    if os.path.exists(command):
        return
    if command.startswith(IMAGE_SCRIPTS_DIR + "/") and (PACKAGED_SCRIPTS_DIR / command[len(IMAGE_SCRIPTS_DIR) + 1:]
                                                        ).is_file():
        return
    problems.warnings.append(f"{path}: {quote_text(command)} does not exist here; block volumes of this class are "
                             "not cleaned unless the agent's image has it")


def _warn_device_dir(cls: ClassConfig, path: str, problems: _Problems) -> None:
    """A directory inside /dev (``/dev/disk/by-id``) lists every disk of the node, the system
    disk and its partitions too. Upstream accepts it and real configurations use it with a
    namePattern, so only a class with nothing narrowing it down is warned about."""
    if cls.host_dir.startswith("/dev/") and cls.name_pattern.spec == "*":
        problems.warnings.append(
            f"{path}.hostDir: {cls.host_dir} lists every disk of the node, the system disk too; "
            "set namePattern to match only the disks meant as volumes"
        )


def _refuse_alpha_api(value: Any, path: str, problems: _Problems) -> bool | None:
    """``useAlphaAPI: true`` asked for node affinity in the annotation
    ``volume.alpha.kubernetes.io/node-affinity`` instead of ``spec.nodeAffinity``. Kubernetes
    stopped reading that annotation in 1.11, and the API server refuses a local PV without
    ``spec.nodeAffinity``: accepted, it made every PV create fail, in silence at load time.
    ``false`` is what the agent does anyway, and upstream files spell it: accepted."""
    flag = _as_bool(value, path, problems)
    if flag:
        problems.error(path, "expected false or no key (true puts node affinity in the annotation "
                             "volume.alpha.kubernetes.io/node-affinity, which Kubernetes ignores since 1.11: every "
                             "local PV would be refused for want of spec.nodeAffinity), got boolean true")
        return None
    return flag


TOP_LEVEL_KEYS: dict[str, KeySpec] = {
    "storageClassMap": KeySpec("classes", _parse_class_map,
                               "One entry per StorageClass name; see the class keys."),
    "nodeLabelsForPV": KeySpec("node_labels_for_pv", _parse_label_keys,
                               "Node label keys whose values are copied onto created PVs."),
    "labelsForPV": KeySpec("labels_for_pv", _parse_labels,
                           "Static labels added to created PVs (win over node labels)."),
    "useAlphaAPI": KeySpec("use_alpha_api", _refuse_alpha_api,
                           "Upstream's node affinity in an alpha annotation (Kubernetes before 1.10): only "
                           "`false` is accepted, `true` is refused (every local PV create would fail)."),
    "useJobForCleaning": KeySpec("use_job_for_cleaning", _as_bool,
                                 "Clean block volumes with a Kubernetes Job instead of in-process workers."),
    "useJobForFilesystemCleaning": KeySpec("use_job_for_filesystem_cleaning", _as_bool,
                                           "With useJobForCleaning, clean Filesystem volumes by Job too "
                                           "(upstream cleans them in-process only).", upstream=False),
    "jobTolerations": KeySpec("job_tolerations", _parse_tolerations, "Tolerations of cleanup Job pods."),
    "minResyncPeriod": KeySpec("min_resync_period", _as_duration,
                               "Informer relist period, randomised in [min, 2*min). Default `5m0s`."),
    "useNodeNameOnly": KeySpec("use_node_name_only", _as_bool,
                               "provisioned-by without the Node UID (survives Node re-creation)."),
    "setPVOwnerRef": KeySpec("set_pv_owner_ref", _as_bool,
                             "PVs get an ownerReference to the Node (deleted with it, data untouched)."),
    "removeNodeNotReadyTaint": KeySpec("remove_node_not_ready_taint", _as_bool,
                                       "Remove the startup taint once discovery is ready."),
    "provisionerNotReadyNodeTaintKey": KeySpec(
        "provisioner_not_ready_node_taint_key",
        lambda v, p, pr: _as_str(v, p, pr, allow_empty=True),
        "Key of the startup taint to remove."),
    "cleanBeforeFirstDiscovery": KeySpec("clean_before_first_discovery", _as_bool,
                                         "Clean a never-seen volume before its first PV (upstream #143).",
                                         upstream=False),
    "cleanupWorkers": KeySpec("cleanup_workers", _as_positive_int,
                              "Size of the in-process cleaning worker pool. Default 4.", upstream=False),
    "cleanupTimeout": KeySpec("cleanup_timeout", _as_duration,
                              "Per-volume cleaning timeout. Default `6h0m0s`.", upstream=False),
    # Dynamic volumes (issue 18): their parsers are in localpv.config.dynamic.
    "dynamicPools": KeySpec("dynamic_pools", dynamic.parse_pools,
                            "Pools of dynamic volumes: name to hostDir, mountDir, requireMount, overcommit, "
                            "reserved (see docs/dynamic-volumes.md).", upstream=False),
    "dynamicClassMap": KeySpec("dynamic_classes", dynamic.parse_classes,
                               "StorageClasses provisioned dynamically: name to pool, fsType, provisioning, "
                               "mkfsOptions.", upstream=False),
    "csiDriverName": KeySpec("csi_driver_name", dynamic.parse_driver_name,
                             "Name of the CSI driver (StorageClass provisioner, CSIDriver object).", upstream=False),
}


def parse_config(data: Mapping[str, Any], *, strict: bool = False) -> LoadedConfig:
    """Validate already-decoded key/value data and build a fresh :class:`ProvisionerConfig`.

    ``strict`` (``localpv config check``): what upstream accepts but is almost surely a
    mistake is an error rather than a warning: two classes sharing a hostDir. The agent reads
    non-strictly, so a configuration upstream ran keeps running.
    """
    problems = _Problems()
    _check_keys(data, TOP_LEVEL_KEYS, "", problems)
    values: dict[str, Any] = {}
    for key, spec in TOP_LEVEL_KEYS.items():
        if key in data and data[key] is not None:
            values[spec.field] = spec.parse(data[key], key, problems)
    if not problems.errors:
        _check_shared_dirs(values.get("classes", {}), problems, strict=strict)
    if not problems.errors and (values.get("dynamic_pools") or values.get("dynamic_classes")):
        dynamic.check(values, problems)
    if not problems.errors:
        from localpv.config.effective import check_named_nodes  # it reads this module's rules

        check_named_nodes(ProvisionerConfig(**values), problems, strict=strict)
    if problems.errors:
        raise ConfigError(problems.errors, tuple(problems.warnings))
    return LoadedConfig(ProvisionerConfig(**values), tuple(problems.warnings))


def _check_shared_dirs(classes: Mapping[str, ClassConfig], problems: _Problems, *, strict: bool) -> None:
    """Two classes sharing a hostDir is legal upstream, but each volume then gets one PV only,
    from whichever class discovers it first: one class silently wins. A warning (an error when
    ``strict``), naming both classes. One hostDir inside another is seen by the outer class as
    an entry, offered (and wiped) as one volume once it is a mount point: a warning. The
    directories are normalised, so equal means the same directory however it is spelled."""
    first: dict[str, str] = {}
    classes = {name: cls for name, cls in classes.items() if cls.host_dir}  # the others: per node
    for name, cls in classes.items():
        if cls.host_dir in first:
            other = first[cls.host_dir]
            where = f"storageClassMap.{name}.hostDir"
            if strict:
                problems.error(where, f"expected a directory no other class uses, found {cls.host_dir}, the "
                                      f"hostDir of class {other} too (classes {other} and {name} would race for "
                                      "each volume in it, and one would silently win)")
            else:
                problems.warnings.append(
                    f"{where}: same directory as class {other}; each volume gets one PV only, from whichever "
                    f"class discovers it first ({other} or {name})"
                )
        else:
            first[cls.host_dir] = name
    for name, cls in classes.items():
        for outer_dir, outer in first.items():
            if cls.host_dir.startswith(outer_dir + "/"):
                entry = cls.host_dir[len(outer_dir) + 1:].split("/")[0]
                problems.warnings.append(
                    f"storageClassMap.{name}.hostDir: inside the hostDir of class {outer} ({outer_dir}); "
                    f"class {outer} offers {outer_dir}/{entry} as one volume once it is a mount point"
                )

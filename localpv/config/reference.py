"""The effective configuration as data (``localpv config check``), and the reference table
(``localpv config reference``), generated from the key tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localpv.config import dynamic
from localpv.config.model import ClassConfig, ProvisionerConfig
from localpv.config.schema import CLASS_KEYS, TOP_LEVEL_KEYS
from localpv.config.values import format_go_duration
from localpv.namepattern import NamePattern


def config_to_data(config: ProvisionerConfig) -> dict[str, Any]:
    """The effective configuration in upstream's key names, defaults filled in."""
    out: dict[str, Any] = {}
    for key, spec in TOP_LEVEL_KEYS.items():
        value = getattr(config, spec.field)
        if key == "storageClassMap":
            value = {name: _class_to_data(cls) for name, cls in value.items()}
        elif key in ("minResyncPeriod", "cleanupTimeout"):
            value = format_go_duration(value)
        elif key == "dynamicPools":
            value = dynamic.pools_to_data(value)
        elif key == "dynamicClassMap":
            value = dynamic.classes_to_data(value)
        out[key] = _plain(value)
    return out


def _class_to_data(cls: ClassConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, spec in CLASS_KEYS.items():
        value = getattr(cls, spec.field)
        if isinstance(value, NamePattern):
            value = value.spec
        if value in (None, "") or (key == "enabled" and value) or (key == "nodes" and not value):
            continue  # enabled and nodes only when they say something: upstream's files print as before
        if key == "nodes":
            value = [o.to_data(CLASS_KEYS, lambda _f, v: v) for o in value]
        out[key] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    """Tuples and mappings to plain lists and dicts, for YAML/JSON output."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def reference_markdown() -> str:
    """The configuration reference, generated from the key tables."""
    defaults = config_to_data(ProvisionerConfig())
    lines = ["| Key | Default | Meaning |", "|---|---|---|"]
    for key, spec in TOP_LEVEL_KEYS.items():
        mark = "" if spec.upstream else " (localpv)"
        lines.append(f"| `{key}`{mark} | `{defaults[key]}` | {spec.doc} |")
    lines += ["", "Per class (`storageClassMap.<name>.<key>`):", "",
              "| Key | Default | Meaning |", "|---|---|---|"]
    sample = _class_to_data(ClassConfig(name="x", host_dir="-", mount_dir="-"))
    for key, spec in CLASS_KEYS.items():
        shown = {"enabled": "true", "nodes": "[]"}  # not printed at their defaults (see _class_to_data)
        default = "required" if key in ("hostDir", "mountDir") else f"`{sample.get(key, shown.get(key, ''))}`"
        lines.append(f"| `{key}` | {default} | {spec.doc} |")
    return "\n".join(lines) + "\n"

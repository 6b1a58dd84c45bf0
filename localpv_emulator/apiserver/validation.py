"""Validation shared by every kind: ``field.Error`` collection, name rules, metadata."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from localpv_emulator.apiserver.resources import Obj, ResourceType
from localpv_emulator.binder import QuantityError, parse_quantity
from localpv_emulator.selectors import DNS1123_SUBDOMAIN, label_value_problems, qualified_name_problems


def _show(value: Any) -> str:
    """Render a value in an error the way Go's ``%q``/``%v`` would, near enough."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class FieldErrors:
    """Collects ``field.Error``s; each becomes a cause in a 422 Invalid Status."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str]] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def required(self, path: str, detail: str = "") -> None:
        self.items.append((path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else "")))

    def invalid(self, path: str, value: Any, detail: str = "") -> None:
        body = f"Invalid value: {_show(value)}" + (f": {detail}" if detail else "")
        self.items.append((path, "FieldValueInvalid", body))

    def forbidden(self, path: str, detail: str) -> None:
        self.items.append((path, "FieldValueForbidden", f"Forbidden: {detail}"))

    def unsupported(self, path: str, value: Any, supported: Iterable[str]) -> None:
        choices = ", ".join(json.dumps(s) for s in supported)
        self.items.append((path, "FieldValueNotSupported",
                           f"Unsupported value: {_show(value)}: supported values: {choices}"))

    def duplicate(self, path: str, value: Any) -> None:
        self.items.append((path, "FieldValueDuplicate", f"Duplicate value: {_show(value)}"))

    def immutable(self, path: str, value: Any) -> None:
        self.invalid(path, value, "field is immutable")

    def add(self, path: str, kind: str, detail: Any) -> None:
        """Record a problem reported as ``(path, kind, detail)`` by the selectors module."""
        if kind == "required":
            self.required(path, str(detail))
        elif kind == "forbidden":
            self.forbidden(path, str(detail))
        elif kind == "unsupported":
            self.unsupported(path, detail, ())
        else:
            self.invalid(path, detail)


_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
    "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
    "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
    "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)


def name_problems(name: str, rule: str) -> list[str]:
    """Why ``name`` is not acceptable under a resource's naming rule."""
    if rule == "path":
        if name in (".", ".."):
            return [f"may not be '{name}'"]
        return [f"may not contain '{c}'" for c in "/%" if c in name]
    if rule == "subdomain":
        if len(name) > 253:
            return ["must be no more than 253 characters"]
        return [] if DNS1123_SUBDOMAIN.match(name) else [_SUBDOMAIN_MSG]
    pattern, msg = (_DNS1035_LABEL, _DNS1035_MSG) if rule == "dns1035" else (_DNS1123_LABEL, _LABEL_MSG)
    if len(name) > 63:
        return ["must be no more than 63 characters"]
    return [] if pattern.match(name) else [msg]


def check_enum(errs: FieldErrors, path: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        errs.unsupported(path, value, allowed)


def check_quantity(errs: FieldErrors, path: str, value: Any, positive: bool = False) -> None:
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        errs.invalid(path, value, str(exc))
        return
    if positive and amount <= 0:
        errs.invalid(path, value, "must be greater than zero")
    elif amount < 0:
        errs.invalid(path, value, "must be greater than or equal to 0")


def _check_label_map(errs: FieldErrors, path: str, labels: Any, values: bool) -> None:
    """Label (or annotation, when ``values`` is False) keys, and label values."""
    if labels is None:
        return
    if not isinstance(labels, dict):
        errs.invalid(path, labels, "must be a map of string keys to string values")
        return
    for key, value in labels.items():
        for problem in qualified_name_problems(str(key)):
            errs.invalid(path, key, problem)
        if not isinstance(value, str):
            errs.invalid(f"{path}[{key}]", value, "must be a string")
        elif values:
            for problem in label_value_problems(value):
                errs.invalid(f"{path}[{key}]", value, problem)


_STANDARD_FINALIZERS = ("kubernetes", "orphan", "foregroundDeletion")


def validate_metadata(rt: ResourceType, obj: Obj, errs: FieldErrors) -> None:
    """``ValidateObjectMeta``: names, labels, annotations, finalizers, owner references."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    if not name:
        errs.required("metadata.name", "name or generateName is required")
    else:
        for problem in name_problems(str(name), rt.name_rule):
            errs.invalid("metadata.name", name, problem)
    _check_label_map(errs, "metadata.labels", meta.get("labels"), values=True)
    _check_label_map(errs, "metadata.annotations", meta.get("annotations"), values=False)
    if len(json.dumps(meta.get("annotations") or {})) > 256 * 1024:
        errs.forbidden("metadata.annotations", "may not be more than 262144 bytes")
    for i, fin in enumerate(meta.get("finalizers") or []):
        if "/" not in str(fin) and fin not in _STANDARD_FINALIZERS:
            errs.invalid(f"metadata.finalizers[{i}]", fin,
                         "name is neither a standard finalizer name nor is it fully qualified")
        elif "/" in str(fin):
            for problem in qualified_name_problems(str(fin)):
                errs.invalid(f"metadata.finalizers[{i}]", fin, problem)
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for part in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(part):
                errs.required(f"metadata.ownerReferences[{i}].{part}", f"{part} must not be empty")
        controllers += bool(ref.get("controller"))
    if controllers > 1:
        errs.invalid("metadata.ownerReferences", meta.get("ownerReferences"),
                     "Only one reference can have Controller set to true")

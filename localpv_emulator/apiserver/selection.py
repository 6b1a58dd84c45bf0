"""List and watch glue: field labels, label/field selection, list items, continue tokens."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from localpv_emulator.apiserver.errors import ApiError
from localpv_emulator.apiserver.resources import Obj, ResourceType
from localpv_emulator.apiserver.routing import HttpRequest
from localpv_emulator.selectors import FieldSelector, LabelSelector, SelectorError

_FIELD_ALIASES = {"source": "source.component", "status.successful": "status.succeeded"}
_FIELD_DEFAULTS = {"spec.unschedulable": "false", "spec.hostNetwork": "false", "status.successful": "0"}


def selectable_fields(rt: ResourceType) -> set[str]:
    """The field labels the real server accepts for a resource."""
    names = {"metadata.name", *rt.fields}
    if rt.namespaced:
        names.add("metadata.namespace")
    return names


def field_value(obj: Obj, name: str) -> str:
    """An object's value for a field label, formatted as the server's field sets do."""
    value: Any = obj
    for part in _FIELD_ALIASES.get(name, name).split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return _FIELD_DEFAULTS.get(name, "")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v.get("ip", v)) if isinstance(v, dict) else str(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class Selection:
    """Label + field selectors of one list or watch request."""

    rt: ResourceType
    labels: LabelSelector
    fields: FieldSelector

    @classmethod
    def parse(cls, rt: ResourceType, req: HttpRequest) -> Selection:
        try:
            labels = LabelSelector.parse(req.query.get("labelSelector", ""))
            fields = FieldSelector.parse(req.query.get("fieldSelector", ""))
        except SelectorError as exc:
            raise ApiError.bad_request(str(exc)) from None
        for name in fields.fields:
            if name not in selectable_fields(rt):
                raise ApiError.bad_request(f'field label not supported: {name}')
        return cls(rt, labels, fields)

    @property
    def empty(self) -> bool:
        return self.labels.empty and not self.fields.requirements

    def matches(self, obj: Obj) -> bool:
        if not self.labels.matches(obj.get("metadata", {}).get("labels")):
            return False
        values = {name: field_value(obj, name) for name in self.fields.fields}
        return self.fields.matches(values)


def list_item(obj: Obj) -> Obj:
    """List items carry no kind/apiVersion in the real server's JSON."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def encode_continue(rv: int, start: str) -> str:
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise ApiError.bad_request("continue key is not valid: incorrect encoded start resourceVersion "
                                   "(version meta.k8s.io/v1)") from None

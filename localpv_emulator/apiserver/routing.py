"""Requests, responses and URL routing: what the dispatcher sees of HTTP."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from localpv_emulator.apiserver.errors import ApiError
from localpv_emulator.apiserver.faults import LostResponse
from localpv_emulator.apiserver.patch import decode_apply_body
from localpv_emulator.apiserver.resources import BY_PATH, STATUS_VERBS, ResourceType


@dataclass
class HttpRequest:
    """What the dispatcher needs of an HTTP request (kept apart from http.server for tests)."""

    method: str
    path: str
    query: dict[str, str]
    raw_query: str
    content_type: str
    body: bytes
    accept: str = ""

    def param(self, name: str) -> str | None:
        value = self.query.get(name)
        return value if value not in (None, "") else None

    def flag(self, name: str) -> bool:
        return (self.query.get(name) or "").lower() in ("true", "1")

    def int_param(self, name: str) -> int | None:
        value = self.param(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ApiError.bad_request(f"invalid value for {name}: {value!r}") from None

    def json(self) -> Any:
        """The body as JSON (YAML accepted too, as the real server's decoders do)."""
        if not self.body:
            raise ApiError.bad_request("the request body is empty")
        if "protobuf" in self.content_type or "cbor" in self.content_type:
            raise ApiError(415, "the body of the request was in an unknown format - accepted media types "
                                "include: application/json, application/yaml", "UnsupportedMediaType")
        try:
            return json.loads(self.body)
        except ValueError as exc:
            if "yaml" in self.content_type:
                return decode_apply_body(self.body)
            raise ApiError.bad_request(f"the body of the request could not be decoded as JSON: {exc}") from None


@dataclass
class HttpResponse:
    """A complete (non-streaming) response."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    #: set on a committed write whose answer is not sent (:meth:`Faults.lose_responses`)
    lost: LostResponse | None = None

    @classmethod
    def of(cls, status: int, obj: Any) -> HttpResponse:
        return cls(status, json.dumps(obj, separators=(",", ":")).encode())

    @classmethod
    def error(cls, err: ApiError) -> HttpResponse:
        response = cls.of(err.code, err.status())
        if err.retry_after is not None:
            response.headers["Retry-After"] = str(err.retry_after)
        return response


@dataclass(frozen=True)
class Route:
    """A resolved resource URL."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None

    def verb(self, method: str, watch: bool) -> str:
        """The Kubernetes verb (RBAC's vocabulary), or 405."""
        if self.name is None:
            verbs = {"GET": "watch" if watch else "list", "POST": "create", "DELETE": "deletecollection"}
        else:
            verbs = {"GET": "watch" if watch else "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        verb = verbs.get(method)
        allowed = STATUS_VERBS if self.subresource else self.rt.verbs
        if verb is None or verb not in allowed:
            raise ApiError.method_not_allowed()
        return verb


def parse_route(path: str) -> Route | None:
    """``/api/v1/...`` or ``/apis/<group>/<version>/...`` to a :class:`Route`; None if not a resource."""
    parts = [unquote(p) for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3 and (group, version, rest[2]) in BY_PATH:
        namespace, rest = rest[1], rest[2:]
    rt = BY_PATH.get((group, version, rest[0]))
    if rt is None or len(rest) > 3 or (namespace is not None and not rt.namespaced):
        return None
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if (rt.namespaced and name is not None and namespace is None) or (subresource and subresource != "status"):
        return None
    if subresource and not rt.status:
        return None
    return Route(rt, namespace, name, subresource)

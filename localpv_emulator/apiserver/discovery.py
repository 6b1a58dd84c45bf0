"""Discovery, ``/version``, health and the minimal OpenAPI documents kubectl needs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from localpv_emulator.apiserver.resources import KUBE_VERSION, RESOURCES, STATUS_VERBS, Obj, ResourceType
from localpv_emulator.apiserver.routing import HttpResponse

if TYPE_CHECKING:
    from localpv_emulator.apiserver.server import ApiServer


def _served(server: ApiServer) -> list[ResourceType]:
    """The resources this server serves (its switches leave some versions out)."""
    return [rt for rt in RESOURCES if server.serves(rt)]


def _group_versions(server: ApiServer) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for rt in _served(server):
        if rt.group:
            seen[(rt.group, rt.version)] = None
    return list(seen)


def _group_doc(server: ApiServer, group: str) -> Obj:
    versions = [{"groupVersion": f"{g}/{v}", "version": v} for g, v in _group_versions(server) if g == group]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _resource_list(server: ApiServer, group: str, version: str) -> Obj:
    """An APIResourceList, with ``/status`` subresources listed as the real server does."""
    resources: list[Obj] = []
    for rt in _served(server):
        if (rt.group, rt.version) != (group, version):
            continue
        entry: Obj = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                      "kind": rt.kind, "verbs": list(rt.verbs)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if rt.status:
            resources.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                              "kind": rt.kind, "verbs": list(STATUS_VERBS)})
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _openapi_root(server: ApiServer) -> Obj:
    """The OpenAPI v3 index: one document per group/version, as kubectl fetches them."""
    paths = {"api/v1": {"serverRelativeURL": f"/openapi/v3/api/v1?hash={_OPENAPI_HASH}"}}
    for group, version in _group_versions(server):
        paths[f"apis/{group}/{version}"] = {
            "serverRelativeURL": f"/openapi/v3/apis/{group}/{version}?hash={_OPENAPI_HASH}"}
    return {"paths": paths}


def _patch_paths(server: ApiServer, group_version: tuple[str, str] | None = None
                 ) -> Iterator[tuple[ResourceType, str]]:
    """Each patchable resource with the path template of its objects, as OpenAPI names them."""
    for rt in _served(server):
        if "patch" in rt.verbs and group_version in (None, (rt.group, rt.version)):
            yield rt, rt.path("{namespace}" if rt.namespaced else None, "{name}")


def _openapi_document(server: ApiServer, group: str, version: str) -> Obj:
    """A minimal OpenAPI v3 document: only the PATCH operations and their ``fieldValidation``
    parameter, which is what kubectl looks for to use server-side field validation instead
    of downloading schemas (the emulator has none; kubectl then builds patches from its
    compiled-in types)."""
    paths: Obj = {}
    for rt, item in _patch_paths(server, (group, version)):
        paths[item] = {"patch": {
            "operationId": f"patch{rt.kind}",
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        }}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": f"v{KUBE_VERSION}"}, "paths": paths,
            "components": {"schemas": {}}}


_OPENAPI_HASH = "emulator"
OPENAPI_V2_PROTOBUF = "application/octet-stream"


def _pb_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _pb(number: int, *parts: bytes | str) -> bytes:
    """One length-delimited protobuf field (strings and messages are all the document needs)."""
    data = b"".join(p.encode() if isinstance(p, str) else p for p in parts)
    return _pb_varint(number << 3 | 2) + _pb_varint(len(data)) + data


def _openapi_v2_protobuf(server: ApiServer) -> bytes:
    """``/openapi/v2`` as gnostic's ``openapi.v2.Document`` protobuf, reduced to PATCH operations
    with their ``fieldValidation`` parameter and GVK extension.

    kubectl before 1.29 reads only this document (protobuf only) to decide whether the server
    validates fields itself; without it, ``kubectl apply`` refuses to run.
    """
    items = []
    for rt, path in _patch_paths(server):
        gvk = f'group: "{rt.group}"\nkind: {rt.kind}\nversion: {rt.version}\n'
        query_param = _pb(3, _pb(2, "query"), _pb(4, "fieldValidation"), _pb(6, "string"))
        parameter = _pb(8, _pb(1, _pb(2, query_param)))  # ParametersItem > Parameter > NonBodyParameter
        extension = _pb(13, _pb(1, "x-kubernetes-group-version-kind"), _pb(2, _pb(2, gvk)))
        operation = _pb(5, f"patch{rt.kind}") + parameter + extension
        items.append(_pb(2, _pb(1, path), _pb(2, _pb(8, operation))))  # Paths.path: NamedPathItem
    return _pb(1, "2.0") + _pb(2, _pb(1, "Kubernetes"), _pb(2, f"v{KUBE_VERSION}")) + _pb(8, *items)


def discovery_response(server: ApiServer, path: str) -> HttpResponse | None:
    """The discovery, version, health and OpenAPI documents; None for any other path."""
    path = path.rstrip("/") or "/"
    if path == "/version":
        return HttpResponse.of(200, server.version_info())
    if path in ("/healthz", "/livez", "/readyz"):
        return HttpResponse(200, b"ok", "text/plain; charset=utf-8")
    if path == "/api":
        address = f"127.0.0.1:{server.port}"
        return HttpResponse.of(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": address}]})
    if path == "/api/v1":
        return HttpResponse.of(200, _resource_list(server, "", "v1"))
    if path == "/apis":
        groups = [_group_doc(server, g) for g in dict.fromkeys(g for g, _ in _group_versions(server))]
        return HttpResponse.of(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    if path == "/openapi/v2":
        return HttpResponse(200, _openapi_v2_protobuf(server), OPENAPI_V2_PROTOBUF)
    if path == "/openapi/v3":
        return HttpResponse.of(200, _openapi_root(server))
    if path == "/openapi/v3/api/v1":
        return HttpResponse.of(200, _openapi_document(server, "", "v1"))
    parts = path.split("/")[2:]
    known = _group_versions(server)
    if path.startswith("/openapi/v3/apis/") and tuple(parts[2:]) in known:
        return HttpResponse.of(200, _openapi_document(server, parts[2], parts[3]))
    if path.startswith("/apis/") and len(parts) == 1 and any(g == parts[0] for g, _ in known):
        return HttpResponse.of(200, {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(server, parts[0])})
    if path.startswith("/apis/") and len(parts) == 2 and tuple(parts) in known:
        return HttpResponse.of(200, _resource_list(server, parts[0], parts[1]))
    return None

"""The dispatcher: one request to one response - routing, faults, authorization, verbs."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from localpv_emulator.apiserver.discovery import discovery_response
from localpv_emulator.apiserver.errors import ApiError
from localpv_emulator.apiserver.faults import WRITE_VERBS
from localpv_emulator.apiserver.patch import PATCH_TYPES
from localpv_emulator.apiserver.requestlog import RequestInfo
from localpv_emulator.apiserver.resources import Obj, ResourceType, resource_for
from localpv_emulator.apiserver.routing import HttpRequest, HttpResponse, Route, parse_route
from localpv_emulator.apiserver.selection import Selection, decode_continue, encode_continue, list_item
from localpv_emulator.apiserver.store import DeleteOptions, Store
from localpv_emulator.apiserver.tables import table_renderer
from localpv_emulator.apiserver.validation import FieldErrors
from localpv_emulator.apiserver.watch import WatchStream
from localpv_emulator.selectors import FieldSelector

if TYPE_CHECKING:
    from localpv_emulator.apiserver.server import ApiServer


class Dispatcher:
    """Turns an :class:`HttpRequest` into a response: routing, faults, authorization, verbs."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.store = server.store

    def handle(self, req: HttpRequest, info: RequestInfo) -> HttpResponse | WatchStream:
        """Answer one request (raises ApiError for failures); ``info`` is filled for the log."""
        delay = self.server.faults.delay()
        if delay:
            time.sleep(delay)
        if req.method == "GET":
            doc = discovery_response(self.server, req.path)
            if doc is not None:
                return doc
        route = parse_route(req.path)
        if route is None or not self.server.serves(route.rt):
            raise ApiError.path_not_found()
        verb = route.verb(req.method, req.flag("watch"))
        info.verb, info.resource, info.subresource = verb, route.rt.plural, route.subresource
        info.namespace, info.name = route.namespace, route.name
        injected = self.server.faults.injected_error(verb)
        if injected is not None:
            raise injected
        if verb in ("update", "patch") and self.server.faults.injected_conflict():
            raise ApiError.stale(route.rt, route.name or "")
        self._authorize(verb, route)
        handler: Callable[[Route, HttpRequest], HttpResponse | WatchStream] = getattr(self, f"_{verb}")
        response = handler(route, req)
        if verb in WRITE_VERBS and isinstance(response, HttpResponse) and not req.param("dryRun"):
            response.lost = self.server.faults.lost_response(verb, route.rt.plural)
        return response

    # -- authorization

    def _authorize(self, verb: str, route: Route) -> None:
        rt = route.rt
        if self.server.is_allowed(verb, rt.group, rt.plural, route.namespace, route.subresource or ""):
            return
        resource = rt.plural + (f"/{route.subresource}" if route.subresource else "")
        scope = f'in the namespace "{route.namespace}"' if route.namespace else "at the cluster scope"
        raise ApiError.forbidden(rt, route.name or "", f'User "system:anonymous" cannot {verb} resource '
                                                       f'"{resource}" in API group "{rt.group}" {scope}')

    # -- reads

    def _get(self, route: Route, req: HttpRequest) -> HttpResponse:
        obj = self.store.peek(route.rt, route.namespace, str(route.name))
        if obj is None:
            raise ApiError.not_found(route.rt, str(route.name))
        render = table_renderer(route.rt, req)
        if render is not None:
            return HttpResponse.of(200, render([obj], {"resourceVersion": obj["metadata"]["resourceVersion"]}))
        return HttpResponse.of(200, obj)

    def _list(self, route: Route, req: HttpRequest) -> HttpResponse:
        rt, selection = route.rt, Selection.parse(route.rt, req)
        limit = req.int_param("limit") or 0
        objects, list_rv, start = self._list_source(route, req)
        matched = [o for o in objects if (not start or self.store.key(rt, o["metadata"].get("namespace"),
                                                                    o["metadata"]["name"]) > start)
                   and selection.matches(o)]
        meta: Obj = {"resourceVersion": str(list_rv)}
        if 0 < limit < len(matched):
            last = matched[limit - 1]["metadata"]
            meta["continue"] = encode_continue(list_rv, self.store.key(rt, last.get("namespace"), last["name"]))
            if selection.empty:
                meta["remainingItemCount"] = len(matched) - limit
            matched = matched[:limit]
        render = table_renderer(rt, req)
        if render is not None:
            return HttpResponse.of(200, render(matched, meta))
        return HttpResponse.of(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta,
                                     "items": [list_item(o) for o in matched]})

    def _list_source(self, route: Route, req: HttpRequest) -> tuple[list[Obj], int, str]:
        """Which state a list reads: a continue token's snapshot, an exact version, or now."""
        rv_text, match, token = req.param("resourceVersion"), req.param("resourceVersionMatch"), req.param("continue")
        with self.store.lock:
            if token:
                if rv_text not in (None, "0"):
                    raise ApiError.bad_request("specifying resource version is not allowed when using continue")
                token_rv, start = decode_continue(token)
                try:
                    return self.store.snapshot(route.rt, token_rv, route.namespace), token_rv, start.rstrip("\x00")
                except ApiError:
                    raise self._continue_expired() from None
            rv = self._parse_rv(rv_text)
            if match not in (None, "Exact", "NotOlderThan"):
                raise ApiError(422, f'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Unsupported '
                                    f'value: "{match}"', "Invalid")
            if match and rv is None:
                raise ApiError(422, 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                                    "resourceVersionMatch is forbidden unless resourceVersion is provided", "Invalid")
            if rv is not None and rv > self.store.rv:
                raise ApiError(504, f"Too large resource version: {rv}, current: {self.store.rv}", "Timeout",
                               {"causes": [{"reason": "ResourceVersionTooLarge",
                                            "message": "Too large resource version"}], "retryAfterSeconds": 1})
            if match == "Exact" and rv is not None:
                return self.store.snapshot(route.rt, rv, route.namespace), rv, ""
            return self.store.items(route.rt, route.namespace), self.store.rv, ""

    @staticmethod
    def _continue_expired() -> ApiError:
        return ApiError.expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a new "
            "list without the continue parameter, or use the continue token in this response to retrieve the "
            "remainder of the results. Continuing with the provided token results in an inconsistent list - "
            "objects that were created, modified, or deleted between the time the first chunk was returned and "
            "now may show up in the list.")

    @staticmethod
    def _parse_rv(text: str | None) -> int | None:
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            raise ApiError.bad_request(f"invalid resource version: {text!r}") from None
        return value if value > 0 else None

    def _watch(self, route: Route, req: HttpRequest) -> WatchStream:
        selection = Selection.parse(route.rt, req)
        if route.name is not None:  # GET .../name?watch=1 is the legacy form of a name selector
            selection = Selection(route.rt, selection.labels, FieldSelector(
                selection.fields.requirements + FieldSelector.parse(f"metadata.name={route.name}").requirements))
        if req.param("resourceVersionMatch") and not req.flag("sendInitialEvents"):
            raise ApiError(422, 'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
                                "resourceVersionMatch is forbidden for watch", "Invalid")
        initial_events = req.flag("sendInitialEvents")
        if initial_events and not req.flag("allowWatchBookmarks"):
            raise ApiError(422, 'ListOptions.meta.k8s.io "" is invalid: allowWatchBookmarks: Required value: '
                                "allowWatchBookmarks must be set to true when sendInitialEvents is specified",
                           "Invalid")
        start = None if initial_events else self._parse_rv(req.param("resourceVersion"))
        timeout = req.int_param("timeoutSeconds")
        return WatchStream(self.server, route, selection, start, req.flag("allowWatchBookmarks"),
                           float(timeout) if timeout else None, initial_events, table_renderer(route.rt, req))

    # -- writes

    def _create(self, route: Route, req: HttpRequest) -> HttpResponse:
        body = req.json()
        if route.rt.kind == "SelfSubjectAccessReview":
            return HttpResponse.of(201, self._access_review(body))
        obj = self.store.create(route.rt, route.namespace, body, dry_run=bool(req.param("dryRun")))
        return HttpResponse.of(201, obj)

    def _update(self, route: Route, req: HttpRequest) -> HttpResponse:
        existed = self.store.peek(route.rt, route.namespace, str(route.name)) is not None
        obj = self.store.update(route.rt, route.namespace, str(route.name), req.json(), route.subresource,
                                dry_run=bool(req.param("dryRun")))
        return HttpResponse.of(200 if existed else 201, obj)

    def _patch(self, route: Route, req: HttpRequest) -> HttpResponse:
        content_type = req.content_type.split(";")[0].strip().lower()
        if content_type not in PATCH_TYPES:
            raise ApiError(415, "the body of the request was in an unknown format - accepted media types "
                                f"include: {', '.join(PATCH_TYPES)}", "UnsupportedMediaType")
        obj, created = self.store.patch(route.rt, route.namespace, str(route.name), content_type, req.body,
                                        route.subresource, req.param("fieldManager"), bool(req.param("dryRun")))
        return HttpResponse.of(201 if created else 200, obj)

    def _delete(self, route: Route, req: HttpRequest) -> HttpResponse:
        body = req.json() if req.body.strip() else None
        options = DeleteOptions.parse(body, req.query)
        obj, gone = self.store.delete(route.rt, route.namespace, str(route.name), options)
        if gone and not route.rt.returns_deleted:
            return HttpResponse.of(200, self._success(route.rt, obj))
        return HttpResponse.of(200, obj)

    def _deletecollection(self, route: Route, req: HttpRequest) -> HttpResponse:
        body = req.json() if req.body.strip() else None
        options = DeleteOptions.parse(body, req.query)
        selection = Selection.parse(route.rt, req)
        with self.store.lock:
            for obj in self.store.items(route.rt, route.namespace):
                if selection.matches(obj):
                    meta = obj["metadata"]
                    self.store.delete(route.rt, meta.get("namespace"), meta["name"], options)
        return HttpResponse.of(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})

    @staticmethod
    def _success(rt: ResourceType, obj: Obj) -> Obj:
        details: Obj = {"name": obj["metadata"]["name"], "kind": rt.plural, "uid": obj["metadata"]["uid"]}
        if rt.group:
            details["group"] = rt.group
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def _access_review(self, body: Any) -> Obj:
        """SelfSubjectAccessReview: answered from the denial list, never stored."""
        review = Store._decoded(resource_for("authorization.k8s.io/v1", "SelfSubjectAccessReview"), body)
        spec = review.get("spec") or {}
        attrs = spec.get("resourceAttributes")
        if not attrs and not spec.get("nonResourceAttributes"):
            errs = FieldErrors()
            errs.required("spec.resourceAttributes",
                          "exactly one of nonResourceAttributes or resourceAttributes must be specified")
            raise ApiError.invalid(resource_for("authorization.k8s.io/v1", "SelfSubjectAccessReview"), "", errs)
        attrs = attrs or {}
        allowed = not attrs or self.server.is_allowed(
            str(attrs.get("verb", "")), str(attrs.get("group", "")), str(attrs.get("resource", "")),
            attrs.get("namespace") or None, str(attrs.get("subresource", "")))
        review["metadata"] = {"creationTimestamp": None}
        review["status"] = {"allowed": allowed} if allowed else {"allowed": False, "reason": "denied by the emulator"}
        return review

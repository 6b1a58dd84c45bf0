"""The store: objects, the global resourceVersion and the watch history, and every write
rule (admission, defaults, validation, concurrency, finalizers) applied under one lock."""

from __future__ import annotations

import bisect
import copy
import json
import random
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from localpv_emulator.apiserver.errors import ApiError
from localpv_emulator.apiserver.patch import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    decode_apply_body,
    json_patch,
    merge_patch,
    strategic_merge,
)
from localpv_emulator.apiserver.pruning import prune
from localpv_emulator.apiserver.registry import strategy_for
from localpv_emulator.apiserver.resources import NAMESPACES, RESOURCES, Obj, ResourceType, now_rfc3339
from localpv_emulator.apiserver.validation import FieldErrors, validate_metadata


@dataclass
class Change:
    """One committed write, as kept in the watch history.

    ``obj`` is the state after the write (for DELETED: the last state, stamped with the
    deletion's resourceVersion, as etcd reports it); ``prev`` the state before, which both
    the selector transitions of watches and the snapshots of paged lists need.
    """

    rv: int
    type: str
    rt: ResourceType
    key: str
    obj: Obj
    prev: Obj | None
    _line: bytes | None = field(default=None, repr=False)

    def line(self) -> bytes:
        """The watch event as one JSON line, encoded once however many watchers get it."""
        if self._line is None:
            self._line = encode_event(self.type, self.obj)
        return self._line


def encode_event(kind: str, obj: Obj) -> bytes:
    """One line of a watch stream."""
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


@dataclass
class DeleteOptions:
    """The parts of ``metav1.DeleteOptions`` the emulator honours."""

    propagation: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    dry_run: bool = False

    @classmethod
    def parse(cls, body: Any, query: Mapping[str, str]) -> DeleteOptions:
        """From the JSON body (what client libraries send) or the query string (kubectl)."""
        body = body if isinstance(body, dict) else {}
        preconditions = body.get("preconditions") or {}
        propagation = body.get("propagationPolicy") or query.get("propagationPolicy")
        orphan = body.get("orphanDependents", query.get("orphanDependents"))
        if propagation is None and orphan is not None:
            propagation = "Orphan" if str(orphan).lower() == "true" else "Background"
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(422, f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
                                f'"{propagation}": supported values: "Foreground", "Background", "Orphan", "nil"',
                           "Invalid")
        dry_run = body.get("dryRun") or query.get("dryRun")
        return cls(propagation, preconditions.get("uid"), preconditions.get("resourceVersion"), bool(dry_run))


def _meta_of(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise ApiError.bad_request("metadata must be an object")
    return meta


def _content(obj: Obj) -> Obj:
    """What ``generation`` tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


_NAME_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_OMITTED_WHEN_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences", "managedFields")
_IMMORTAL_NAMESPACES = ("default", "kube-system", "kube-public")  # NamespaceLifecycle admission


class Store:
    """All objects, the global resourceVersion and the watch history, behind one lock.

    Stored dicts are never mutated after they are stored: a write stores a new dict. That is
    what lets watch events, list snapshots and controller passes share them without copies;
    callers that want to modify an object copy it first.
    """

    def __init__(self, history_limit: int) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 1
        self.history_limit = max(1, history_limit)
        self._objects: dict[ResourceType, dict[str, Obj]] = {rt: {} for rt in RESOURCES}
        self._history: list[Change] = []
        self._floor = self.rv
        self._uids: dict[str, tuple[ResourceType, str]] = {}
        self._dependents: dict[str, set[tuple[ResourceType, str]]] = {}
        self._deleting: set[tuple[ResourceType, str]] = set()
        self._last_change: dict[ResourceType, int] = {}
        self._next_ip = 10

    # -- reads (stored dicts: read-only by contract)

    @staticmethod
    def key(rt: ResourceType, namespace: str | None, name: str) -> str:
        """The storage key; its string order is the order of lists (as etcd's keys)."""
        return f"{namespace}/{name}" if rt.namespaced else name

    def peek(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        """The stored object itself (no copy: callers must not modify it)."""
        with self.lock:
            return self._objects[rt].get(self.key(rt, namespace, name))

    def items(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        """Current objects of a resource, in key order, optionally of one namespace."""
        with self.lock:
            return self._ordered(self._objects[rt], namespace)

    @staticmethod
    def _ordered(objects: Mapping[str, Obj], namespace: str | None) -> list[Obj]:
        if not namespace:
            return [objects[k] for k in sorted(objects)]
        prefix = f"{namespace}/"
        return [objects[k] for k in sorted(objects) if k.startswith(prefix)]

    def by_uid(self, uid: str) -> Obj | None:
        """Owner references name owners by uid; the garbage collector looks them up here."""
        with self.lock:
            where = self._uids.get(uid)
            return self._objects[where[0]].get(where[1]) if where else None

    def changed_since(self, rts: Iterable[ResourceType], rv: int) -> bool:
        """Whether any of these resources was written after ``rv`` (lets controllers skip passes)."""
        with self.lock:
            return any(self._last_change.get(rt, 0) > rv for rt in rts)

    # -- history

    def history_after(self, rv: int) -> list[Change] | None:
        """Changes with a resourceVersion above ``rv``; None when some are forgotten (410)."""
        with self.lock:
            if rv < self._floor:
                return None
            start = bisect.bisect_right(self._history, rv, key=lambda c: c.rv)
            return self._history[start:]

    def too_old(self, rv: int) -> ApiError:
        """The 410 a resume from a forgotten version gets, worded like the real watch cache."""
        return ApiError.expired(f"too old resource version: {rv} ({self._floor + 1})")

    def snapshot(self, rt: ResourceType, rv: int, namespace: str | None) -> list[Obj]:
        """The objects as they were at ``rv``: the current ones with later changes undone."""
        with self.lock:
            changes = self.history_after(rv)
            if changes is None:
                raise self.too_old(rv)
            objects = dict(self._objects[rt])
            for change in reversed(changes):
                if change.rt is not rt:
                    continue
                if change.prev is None:
                    objects.pop(change.key, None)
                else:
                    objects[change.key] = change.prev
            return self._ordered(objects, namespace)

    def forget_history(self) -> None:
        """Compact: every resume from a resourceVersion before now gets 410 Expired."""
        with self.lock:
            self._history.clear()
            self._floor = self.rv
            self.changed.notify_all()

    # -- writes

    def create(self, rt: ResourceType, namespace: str | None, body: Any, dry_run: bool = False) -> Obj:
        """POST: admission (namespace exists), server-set metadata, defaults, validation, 409."""
        obj = self._decoded(rt, body)
        meta = _meta_of(obj)
        self._place(rt, namespace, meta)
        with self.lock:
            if rt.namespaced:
                self._require_namespace(rt, str(namespace))
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, namespace, str(meta["generateName"]))
            if meta.get("resourceVersion"):
                raise ApiError(500, "resourceVersion should not be set on objects to be created")
            for name in ("uid", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"):
                meta.pop(name, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            strategy = strategy_for(rt)
            if rt.status and not strategy.keep_status_on_create:
                obj["status"] = strategy.initial_status(obj)
            strategy.default(obj)
            strategy.prepare_create(obj, self)
            errs = FieldErrors()
            validate_metadata(rt, obj, errs)
            strategy.validate(obj, errs)
            if errs:
                raise ApiError.invalid(rt, str(meta.get("name") or ""), errs)
            key = self.key(rt, namespace, meta["name"])
            existing = self._objects[rt].get(key)
            if existing is not None:
                raise ApiError.already_exists(rt, meta["name"], bool(existing["metadata"].get("deletionTimestamp")))
            if dry_run:
                return obj
            return self._commit("ADDED", rt, key, obj, None)

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """PUT (or a patch's result): optimistic concurrency, status rules, immutability, no-ops."""
        obj = self._decoded(rt, body)
        meta = _meta_of(obj)
        if meta.get("name") and meta["name"] != name:
            raise ApiError.bad_request(f"the name of the object ({meta['name']}) does not match the name on "
                                       f"the URL ({name})")
        meta["name"] = name
        self._place(rt, namespace, meta)
        with self.lock:
            key = self.key(rt, namespace, name)
            old = self._objects[rt].get(key)
            if old is None:
                if rt.create_on_update and subresource is None:
                    meta.pop("resourceVersion", None)
                    return self.create(rt, namespace, obj, dry_run)
                raise ApiError.not_found(rt, name)
            if meta.get("resourceVersion") and meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise ApiError.stale(rt, name)
            new = self._updated(rt, obj, old, subresource)
            if dry_run:
                return new
            return self._write(rt, key, new, old)

    def _updated(self, rt: ResourceType, obj: Obj, old: Obj, subresource: str | None) -> Obj:
        """The object to store for an update: system fields kept, status rules applied, validated."""
        strategy = strategy_for(rt)
        if subresource == "status":
            new = copy.deepcopy(old)
            new["status"] = obj.get("status", {})
        else:
            new = obj
            if rt.status:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
            nm, om = new["metadata"], old["metadata"]
            for name in ("creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
                if name in om:
                    nm[name] = om[name]
                else:
                    nm.pop(name, None)
            nm.pop("managedFields", None)
            if not nm.get("uid"):
                nm["uid"] = om["uid"]
            strategy.prepare_update(new, old)
        strategy.default(new)
        errs = FieldErrors()
        self._validate_meta_update(new, old, errs)
        validate_metadata(rt, new, errs)
        strategy.validate(new, errs)
        strategy.validate_update(new, old, errs)
        if errs:
            raise ApiError.invalid(rt, new["metadata"]["name"], errs)
        if _content(new) != _content(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return new

    @staticmethod
    def _validate_meta_update(new: Obj, old: Obj, errs: FieldErrors) -> None:
        nm, om = new["metadata"], old["metadata"]
        if nm.get("uid") != om.get("uid"):
            errs.immutable("metadata.uid", nm.get("uid"))
        if om.get("deletionTimestamp"):
            added = [f for f in nm.get("finalizers") or [] if f not in (om.get("finalizers") or [])]
            if added:
                errs.forbidden("metadata.finalizers", "no new finalizers can be added if the object is being "
                                                      f"deleted, found new finalizers {json.dumps(added)}")

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        body: bytes,
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Apply a patch of any of the four types; returns (object, created-by-apply)."""
        with self.lock:
            current = self.peek(rt, namespace, name)
            if content_type == APPLY_PATCH:
                applied = decode_apply_body(body)
                if not isinstance(applied, dict):
                    raise ApiError.bad_request("apply patches must be objects")
                if not field_manager:
                    raise ApiError(422, 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                                        "is required for apply patch", "Invalid")
                if current is None:
                    if subresource:
                        raise ApiError.not_found(rt, name)
                    applied.setdefault("metadata", {}).setdefault("name", name)
                    return self.create(rt, namespace, applied, dry_run), True
                patched = strategic_merge(current, applied)
            else:
                if current is None:
                    raise ApiError.not_found(rt, name)
                try:
                    doc = json.loads(body)
                except ValueError as exc:
                    raise ApiError.bad_request(f"error decoding patch: {exc}") from None
                if content_type == JSON_PATCH:
                    patched = json_patch(current, doc)
                elif not isinstance(doc, dict):
                    raise ApiError.bad_request("json: cannot unmarshal array into Go value of type "
                                               "map[string]interface {}")
                elif content_type == MERGE_PATCH:
                    patched = merge_patch(current, doc)
                else:
                    patched = strategic_merge(current, doc)
            if not isinstance(patched, dict):
                raise ApiError(422, "the patch did not produce an object", "Invalid")
            return self.update(rt, namespace, name, patched, subresource, dry_run), False

    def delete(self, rt: ResourceType, namespace: str | None, name: str, options: DeleteOptions) -> tuple[Obj, bool]:
        """Delete, or mark for deletion while finalizers remain; returns (object, gone)."""
        with self.lock:
            key = self.key(rt, namespace, name)
            old = self._objects[rt].get(key)
            if old is None:
                raise ApiError.not_found(rt, name)
            if rt is NAMESPACES and name in _IMMORTAL_NAMESPACES:
                raise ApiError.forbidden(rt, name, "this namespace may not be deleted")
            self._check_preconditions(rt, name, old, options)
            new = copy.deepcopy(old)
            meta = new["metadata"]
            finalizers = self._policy_finalizers(meta.get("finalizers") or [], options.propagation)
            if finalizers:
                meta["finalizers"] = finalizers
            else:
                meta.pop("finalizers", None)
            if not strategy_for(rt).finalizers(new):
                return (old, True) if options.dry_run else (self._remove(rt, key, old), True)
            if not meta.get("deletionTimestamp"):
                meta.update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
                if rt is NAMESPACES:
                    new["status"] = {**(new.get("status") or {}), "phase": "Terminating"}
            if options.dry_run or new == old:
                return new, False
            return self._commit("MODIFIED", rt, key, new, old), False

    @staticmethod
    def _check_preconditions(rt: ResourceType, name: str, obj: Obj, options: DeleteOptions) -> None:
        meta = obj["metadata"]
        if options.uid and options.uid != meta["uid"]:
            raise ApiError.conflict(rt, name, f"Precondition failed: UID in precondition: {options.uid}, "
                                              f"UID in object meta: {meta['uid']}")
        if options.resource_version and options.resource_version != meta["resourceVersion"]:
            raise ApiError.conflict(rt, name, "Precondition failed: ResourceVersion in precondition: "
                                              f"{options.resource_version}, ResourceVersion in meta: "
                                              f"{meta['resourceVersion']}")

    @staticmethod
    def _policy_finalizers(current: list[str], policy: str | None) -> list[str]:
        """The GC finalizers a propagation policy adds or removes (Background removes both)."""
        if policy is None:
            return list(current)
        kept = [f for f in current if f not in ("orphan", "foregroundDeletion")]
        extra = {"Orphan": ["orphan"], "Foreground": ["foregroundDeletion"]}.get(policy, [])
        return kept + extra

    def finalize_namespace(self, name: str) -> None:
        """The namespace controller's last step: drop the ``kubernetes`` spec finalizer."""
        with self.lock:
            key = self.key(NAMESPACES, None, name)
            old = self._objects[NAMESPACES].get(key)
            if old is None:
                return
            new = copy.deepcopy(old)
            new.setdefault("spec", {})["finalizers"] = []
            self._write(NAMESPACES, key, new, old)

    def allocate_cluster_ip(self) -> str:
        """A fresh service IP (clients and kubectl expect services to have one)."""
        with self.lock:
            self._next_ip += 1
            return f"10.96.{self._next_ip // 250}.{self._next_ip % 250 + 1}"

    # -- internals

    @staticmethod
    def _decoded(rt: ResourceType, body: Any) -> Obj:
        """Check and default apiVersion/kind like the real decoder (400 on a mismatch); drop the
        fields the kind does not know, as decoding into its Go type does (:mod:`.pruning`)."""
        if not isinstance(body, dict):
            raise ApiError.bad_request(f"the object provided is unrecognized (must be of type {rt.kind})")
        obj = copy.deepcopy(body)
        api_version, kind = obj.setdefault("apiVersion", rt.api_version), obj.setdefault("kind", rt.kind)
        if api_version != rt.api_version:
            raise ApiError.bad_request(f"the API version in the data ({api_version}) does not match the "
                                       f"expected API version ({rt.api_version})")
        if kind != rt.kind:
            raise ApiError.bad_request(f"the object provided is unrecognized (must be of type {rt.kind}): "
                                       f"kind {kind!r}")
        prune(rt, obj)
        meta = obj.setdefault("metadata", {})
        if isinstance(meta, dict):
            for name in _OMITTED_WHEN_EMPTY:
                if name in meta and not meta[name]:
                    del meta[name]  # Go's omitempty: an empty list or map is not stored
        return obj

    @staticmethod
    def _place(rt: ResourceType, namespace: str | None, meta: Obj) -> None:
        """``EnsureObjectNamespaceMatchesRequestNamespace``."""
        if not rt.namespaced:
            meta.pop("namespace", None)
        elif not meta.get("namespace"):
            meta["namespace"] = namespace
        elif meta["namespace"] != namespace:
            raise ApiError.bad_request("the namespace of the provided object does not match the namespace "
                                       "sent on the request")

    def _require_namespace(self, rt: ResourceType, namespace: str) -> None:
        ns = self._objects[NAMESPACES].get(namespace)
        if ns is None:
            raise ApiError.not_found(NAMESPACES, namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(403, f"{rt.qualified} is forbidden: unable to create new content in namespace "
                                f"{namespace} because it is being terminated", "Forbidden",
                           {"name": namespace, "kind": rt.plural,
                            "causes": [{"reason": "NamespaceTerminating", "message": f"namespace {namespace} is "
                                        "being terminated", "field": "metadata.namespace"}]})

    def _generate_name(self, rt: ResourceType, namespace: str | None, prefix: str) -> str:
        prefix = prefix[: 63 - 5]
        while True:
            name = prefix + "".join(random.choices(_NAME_SUFFIX_CHARS, k=5))
            if self.key(rt, namespace, name) not in self._objects[rt]:
                return name

    def _write(self, rt: ResourceType, key: str, new: Obj, old: Obj) -> Obj:
        """Store an update: a no-op writes nothing; emptied finalizers on a deleted object remove it."""
        if new == old:
            return old
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not strategy_for(rt).finalizers(new):
            gone = self._remove(rt, key, old)
            meta["resourceVersion"] = gone["metadata"]["resourceVersion"]
            return new
        return self._commit("MODIFIED", rt, key, new, old)

    def _commit(self, kind: str, rt: ResourceType, key: str, obj: Obj, prev: Obj | None) -> Obj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._objects[rt][key] = obj
        self._index(rt, key, prev, obj)
        self._record(Change(self.rv, kind, rt, key, obj, prev))
        return obj

    def _remove(self, rt: ResourceType, key: str, last: Obj) -> Obj:
        self.rv += 1
        gone = copy.deepcopy(last)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        del self._objects[rt][key]
        self._index(rt, key, last, None)
        self._record(Change(self.rv, "DELETED", rt, key, gone, last))
        return gone

    def _record(self, change: Change) -> None:
        self._history.append(change)
        self._last_change[change.rt] = change.rv
        excess = len(self._history) - self.history_limit
        if excess > max(16, self.history_limit // 4):  # trim in batches: amortised O(1)
            self._floor = self._history[excess - 1].rv
            del self._history[:excess]
        self.changed.notify_all()

    def _index(self, rt: ResourceType, key: str, old: Obj | None, new: Obj | None) -> None:
        where = (rt, key)
        if old is not None:
            self._uids.pop(old["metadata"]["uid"], None)
            for ref in old["metadata"].get("ownerReferences") or []:
                dependents = self._dependents.get(ref.get("uid"), set())
                dependents.discard(where)
                if not dependents:
                    self._dependents.pop(ref.get("uid"), None)
            self._deleting.discard(where)
        if new is not None:
            self._uids[new["metadata"]["uid"]] = where
            for ref in new["metadata"].get("ownerReferences") or []:
                self._dependents.setdefault(ref.get("uid"), set()).add(where)
            if new["metadata"].get("deletionTimestamp"):
                self._deleting.add(where)

    # -- what the garbage collector reads

    def owners_and_dependents(self) -> list[tuple[str, list[Obj]]]:
        """Each referenced owner uid with the objects that reference it."""
        with self.lock:
            return [
                (uid, [self._objects[rt][key] for rt, key in sorted(deps, key=lambda d: (d[0].plural, d[1]))])
                for uid, deps in sorted(self._dependents.items())
            ]

    def deleting(self) -> list[tuple[ResourceType, Obj]]:
        """Objects marked for deletion and held by finalizers."""
        with self.lock:
            ordered = sorted(self._deleting, key=lambda d: (d[0].plural, d[1]))
            return [(rt, self._objects[rt][key]) for rt, key in ordered]

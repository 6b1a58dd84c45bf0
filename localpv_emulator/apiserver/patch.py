"""The four patch types: JSON merge (RFC 7386), JSON patch (RFC 6902), strategic merge
and server-side apply bodies."""

from __future__ import annotations

import copy
import json
from typing import Any

from localpv_emulator.apiserver.errors import ApiError

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, APPLY_PATCH, STRATEGIC_PATCH)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` deletes, lists replace."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class _PatchFailed(Exception):
    """A JSON patch that cannot apply to this document (the server answers 422)."""


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ApiError.bad_request(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]


def _container(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise _PatchFailed(f"doc is missing path: /{'/'.join(parts)}")
    return doc


def _list_index(parent: list[Any], part: str, adding: bool) -> int:
    if adding and part == "-":
        return len(parent)
    if not part.isdigit() or int(part) > len(parent) - (0 if adding else 1):
        raise _PatchFailed(f"index {part!r} out of bounds")
    return int(part)


def _json_get(doc: Any, parts: list[str]) -> Any:
    return _container(doc, parts)


def _json_remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise _PatchFailed("cannot remove the whole document")
    parent, last = _container(doc, parts[:-1]), parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _PatchFailed(f"unable to remove nonexistent key: {last}: missing value")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_list_index(parent, last, adding=False))
    raise _PatchFailed("cannot remove from a scalar")


def _json_add(doc: Any, parts: list[str], value: Any, replace: bool = False) -> Any:
    if not parts:
        return copy.deepcopy(value)
    parent, last = _container(doc, parts[:-1]), parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise _PatchFailed(f"replace operation does not apply: doc is missing key: /{'/'.join(parts)}")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        index = _list_index(parent, last, adding=not replace)
        if replace:
            parent[index] = copy.deepcopy(value)
        else:
            parent.insert(index, copy.deepcopy(value))
    else:
        raise _PatchFailed("cannot add to a scalar")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a copy of ``doc``."""
    if not isinstance(ops, list):
        raise ApiError.bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise ApiError.bad_request(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], _pointer(op.get("path"))
        try:
            if kind in ("add", "replace", "test") and "value" not in op:
                raise ApiError.bad_request(f"missing value for {kind} operation")
            if kind == "add":
                doc = _json_add(doc, path, op["value"])
            elif kind == "replace":
                doc = _json_add(doc, path, op["value"], replace=True)
            elif kind == "remove":
                _json_remove(doc, path)
            elif kind in ("move", "copy"):
                source = _pointer(op.get("from"))
                value = _json_remove(doc, source) if kind == "move" else copy.deepcopy(_json_get(doc, source))
                doc = _json_add(doc, path, value)
            elif kind == "test":
                if _json_get(doc, path) != op["value"]:
                    raise _PatchFailed(f"testing value {op.get('path')} failed: test failed")
            else:
                raise ApiError.bad_request(f"Unexpected kind: {kind}")
        except _PatchFailed as exc:
            raise ApiError(422, str(exc), "Invalid") from None
    return doc


# Strategic merge: the patchMergeKey of each list this project's objects use, by the last one
# or two field names of its path (Kubernetes declares them on the Go types).
_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("containers",): "name", ("initContainers",): "name", ("ephemeralContainers",): "name",
    ("volumes",): "name", ("env",): "name", ("volumeMounts",): "mountPath", ("volumeDevices",): "devicePath",
    ("imagePullSecrets",): "name", ("hostAliases",): "ip", ("conditions",): "type",
    ("ownerReferences",): "uid", ("containers", "ports"): "containerPort", ("initContainers", "ports"): "containerPort",
    ("spec", "ports"): "port", ("status", "addresses"): "type", ("topologySpreadConstraints",): "topologyKey",
    ("resourceClaims",): "name", ("schedulingGates",): "name",
}
#: lists of scalars merged as sets (patchStrategy "merge" without a key)
_MERGE_SETS = {("metadata", "finalizers")}


def _list_strategy(path: tuple[str, ...]) -> str | None:
    """``"set"`` for set-merged scalars, a merge key, or None for replace."""
    if path[-2:] in _MERGE_SETS:
        return "set"
    return _MERGE_KEYS.get(path[-2:]) or _MERGE_KEYS.get(path[-1:])


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not str(k).startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not (isinstance(v, dict) and "$patch" in v)]
    return value


_DELETE = object()


def strategic_merge(original: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """A strategic merge patch for the fields in :data:`_MERGE_KEYS`; JSON merge elsewhere.

    Supported directives: ``$patch: replace|delete|merge`` in maps and list items,
    ``$deleteFromPrimitiveList/<field>``, ``$retainKeys`` and ``$setElementOrder/<field>``
    (ordering is applied to merged keyed lists). Other lists replace, as for types without
    a patch strategy.
    """
    if not isinstance(patch, dict):
        return _strip_directives(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive == "delete":
        return _DELETE
    result = copy.deepcopy(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in (value or [])]
        elif key.startswith("$") or value is None:
            if value is None:
                result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, (*path, key), patch.get(f"$setElementOrder/{key}"))
        else:
            merged = strategic_merge(result.get(key), value, (*path, key))
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
    if isinstance(patch.get("$retainKeys"), list):
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    return result


def _merge_list(original: Any, patch: list[Any], path: tuple[str, ...], order: Any) -> list[Any]:
    strategy = _list_strategy(path)
    if strategy is None or not isinstance(original, list):
        return list(_strip_directives(patch))
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return list(_strip_directives(patch))
    if strategy == "set":
        return list(original) + [v for v in patch if v not in original]
    result = [copy.deepcopy(item) for item in original]
    for item in patch:
        if not isinstance(item, dict) or strategy not in item:
            result.append(_strip_directives(item))
            continue
        positions = [i for i, mine in enumerate(result)
                     if isinstance(mine, dict) and mine.get(strategy) == item[strategy]]
        if item.get("$patch") == "delete":
            result = [mine for i, mine in enumerate(result) if i not in positions]
        elif positions:
            result[positions[0]] = strategic_merge(result[positions[0]], item, path)
        else:
            result.append(strategic_merge({}, item, path))
    if isinstance(order, list):
        rank = {entry.get(strategy): i for i, entry in enumerate(order) if isinstance(entry, dict)}
        result.sort(key=lambda mine: rank.get(mine.get(strategy), len(rank)) if isinstance(mine, dict) else len(rank))
    return result


def decode_apply_body(body: bytes) -> Any:
    """Server-side apply bodies are YAML (JSON is YAML too); PyYAML is only needed for YAML."""
    try:
        return json.loads(body)
    except ValueError:
        pass
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a project dependency
        raise ApiError(415, "YAML apply bodies need PyYAML; send JSON", "UnsupportedMediaType") from None
    try:
        return yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise ApiError.bad_request(f"error decoding YAML: {exc}") from None

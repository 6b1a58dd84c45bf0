"""Per-node overrides of a pool's or a static class's directories: the ``nodes`` key.

Nodes differ (another disk, another mount point, no fast disk at all), and one DaemonSet
serves them all from one ConfigMap. So a ``dynamicPools`` or ``storageClassMap`` entry may
carry a list of overrides, each naming the nodes it is for and the settings they get::

    fast:
      hostDir: /mnt/fast
      nodes:
        - name: node-7              # this node's disk is mounted elsewhere
          hostDir: /mnt/nvme1
        - matchLabels: {localpv.dev/fast: "none"}
          enabled: false            # no such disk there: the pool does not exist on these nodes

The rules, chosen to be predictable from the text alone:

* An override names its nodes by ``name`` (one node) or by ``matchLabels`` (every node
  carrying all those labels), never both, never neither.
* Exactly one override applies to a node, the rest of its settings come from the entry
  itself (never from another override): the one naming it by ``name`` if any, else the
  *first* ``matchLabels`` one in list order that matches. ``localpv config check --node``
  says which one applied.
* Only what describes the node's disk may differ: a class's ``hostDir``, ``mountDir`` and
  ``enabled``; a pool's directories, ``requireMount``, ``overcommit``, ``reserved``,
  ``highWater`` and ``enabled``. What a StorageClass means (volume mode, filesystem...)
  stays one for the cluster.
* An override that gives ``hostDir`` without ``mountDir`` mounts it at the same path (the
  chart mounts each directory at its host path).
* Unknown keys in an override are errors, not warnings as elsewhere: a misspelt ``hostdir``
  would silently give the node the default directory, which on a shared filesystem is
  another node's disk.

The format is new to localpv; upstream's ConfigMaps, which have no ``nodes`` key, keep
their meaning. Resolving overrides for one node is :mod:`localpv.config.effective`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from localpv.config.values import KeySpec, _as_bool, _describe, _Parser, _Problems
from localpv.naming import DNS1123_SUBDOMAIN_RE, label_key_problem, label_value_problem

#: The keys that say which nodes an override is for.
SELECTOR_KEYS = ("name", "matchLabels")


@dataclass(frozen=True)
class NodeOverride:
    """One entry of a ``nodes`` list: which nodes, and the settings (dataclass fields) they get."""

    #: Its place in the ConfigMap, for messages (``dynamicPools.fast.nodes[1]``).
    where: str
    node: str | None = None
    match_labels: tuple[tuple[str, str], ...] = ()
    settings: tuple[tuple[str, Any], ...] = ()

    def matches(self, node: str, labels: Mapping[str, str]) -> bool:
        if self.node is not None:
            return self.node == node
        return all(labels.get(key) == value for key, value in self.match_labels)

    def describe(self) -> str:
        """What it selects, as written: ``name node-7`` or ``matchLabels a=b,c=d``."""
        if self.node is not None:
            return f"name {self.node}"
        return "matchLabels " + ",".join(f"{k}={v}" for k, v in self.match_labels)

    def to_data(self, keys: Mapping[str, KeySpec], render: Callable[[str, Any], Any]) -> dict[str, Any]:
        """Back into the ConfigMap's spelling (``config check`` without ``--node``)."""
        out: dict[str, Any] = {"name": self.node} if self.node is not None else {"matchLabels": dict(self.match_labels)}
        by_field = {spec.field: key for key, spec in keys.items()}
        for field_name, value in self.settings:
            out[by_field[field_name]] = render(field_name, value)
        return out


def choose(overrides: tuple[NodeOverride, ...], node: str, labels: Mapping[str, str]) -> NodeOverride | None:
    """The override that applies to ``node``: by name first, else the first matching by labels."""
    for override in overrides:
        if override.node is not None and override.node == node:
            return override
    for override in overrides:
        if override.node is None and override.matches(node, labels):
            return override
    return None


def _node_name_problem(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= 253 and DNS1123_SUBDOMAIN_RE.fullmatch(value):
        return None
    return f"expected a Node name (a DNS-1123 subdomain), got {_describe(value)}"


def _match_labels(value: Any, path: str, problems: _Problems) -> tuple[tuple[str, str], ...] | None:
    if not isinstance(value, dict) or not value:
        got = "an empty mapping (it would match every node: set the entry's own keys instead)" \
            if isinstance(value, dict) else _describe(value)
        problems.error(path, f"expected a mapping of Node label keys to string values, got {got}")
        return None
    pairs = []
    for key, item in value.items():
        if not isinstance(key, str) or (problem := label_key_problem(key)) is not None:
            problems.error(f"{path}.{key}", "expected a label key, got "
                           + (_describe(key) if not isinstance(key, str) else str(problem)))
            return None
        if not isinstance(item, str) or (problem := label_value_problem(item)) is not None:
            # YAML reads `ssd: true` and `tier: 1` as a boolean and a number: a Node's label is text.
            hint = ' (quote it: "true", "1")' if isinstance(item, bool | int | float) else ""
            found = _describe(item) if not isinstance(item, str) else str(problem)
            problems.error(f"{path}.{key}", f"expected a label value (a string){hint}, got {found}")
            return None
        pairs.append((key, item))
    return tuple(sorted(pairs))


def overrides_parser(all_keys: Callable[[], Mapping[str, KeySpec]], overridable: tuple[str, ...],
                     what: str) -> _Parser:
    """A parser of a ``nodes`` list whose overrides may set the keys ``overridable`` of
    ``all_keys()`` (read lazily: the table holds this parser). ``what``: "class" or "pool"."""
    def parse(value: Any, path: str, problems: _Problems) -> tuple[NodeOverride, ...] | None:
        if not isinstance(value, list):
            problems.error(path, f"expected a list of per-node overrides (each with name or matchLabels), got "
                                 f"{_describe(value)}")
            return None
        before = len(problems.errors)
        keys = all_keys()
        found: list[NodeOverride] = []
        names: dict[str, str] = {}
        selectors: dict[tuple[tuple[str, str], ...], str] = {}
        for i, entry in enumerate(value):
            where = f"{path}[{i}]"
            override = _parse_one(entry, where, keys, overridable, what, problems)
            if override is None:
                continue
            if override.node is not None:
                if (first := names.setdefault(override.node, where)) != where:
                    problems.error(f"{where}.name", f"expected each node named once, got {override.node} again "
                                                    f"(also {first}): which settings apply would be a guess")
                    continue
            elif (first := selectors.setdefault(override.match_labels, where)) != where:
                problems.error(f"{where}.matchLabels", f"expected each label set once, got the labels of {first} "
                                                       "again (the first matching override applies: this one never "
                                                       "would)")
                continue
            found.append(override)
        return tuple(found) if len(problems.errors) == before else None
    return parse


def _parse_one(entry: Any, where: str, keys: Mapping[str, KeySpec], overridable: tuple[str, ...], what: str,
               problems: _Problems) -> NodeOverride | None:
    if not isinstance(entry, dict):
        problems.error(where, f"expected a mapping with name or matchLabels and the settings of those nodes, got "
                              f"{_describe(entry)}")
        return None
    for key in entry:
        if key in SELECTOR_KEYS or key in overridable:
            continue
        if key in keys:
            problems.error(f"{where}.{key}", f"expected only {', '.join(overridable)} per node (the rest of a {what} "
                                             f"is one for every node), got {key}")
        else:
            hint = difflib.get_close_matches(str(key), [*SELECTOR_KEYS, *overridable], n=1, cutoff=0.6)
            suffix = f' (did you mean "{hint[0]}"?)' if hint else ""
            problems.error(f"{where}.{key}", f"expected name or matchLabels and {', '.join(overridable)}, got an "
                                             f"unknown key{suffix}")
        return None
    has = [key for key in SELECTOR_KEYS if key in entry]
    if len(has) != 1:
        got = "both" if has else "neither"
        problems.error(where, f"expected either name (one node) or matchLabels (nodes by label), got {got}")
        return None
    node: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    if "name" in entry:
        if (problem := _node_name_problem(entry["name"])) is not None:
            problems.error(f"{where}.name", problem)
            return None
        node = entry["name"]
    else:
        parsed_labels = _match_labels(entry["matchLabels"], f"{where}.matchLabels", problems)
        if parsed_labels is None:
            return None
        labels = parsed_labels
    settings = []
    for key in overridable:
        if key not in entry:
            continue
        spec = keys[key]
        parsed = spec.parse(entry[key], f"{where}.{key}", problems)
        if parsed is None:
            return None
        settings.append((spec.field, parsed))
    fields = dict(settings)
    if "host_dir" in fields and "mount_dir" not in fields:
        settings.append(("mount_dir", fields["host_dir"]))
    if len(settings) == 0:
        problems.error(where, f"expected at least one of {', '.join(overridable)}, got none (an override that "
                              "changes nothing)")
        return None
    # One order, whatever the spelling: two ConfigMaps that mean the same compare equal.
    return NodeOverride(where=where, node=node, match_labels=labels, settings=tuple(sorted(settings)))


ENABLED = KeySpec("enabled", _as_bool,
                  "false: this entry exists on no node except those whose `nodes` override sets `enabled: true` "
                  "(hostDir may then be left to the overrides). Default true.", upstream=False)


def check_enabling(enabled: bool, has_host_dir: bool, overrides: tuple[NodeOverride, ...], where: str,
                   problems: _Problems) -> None:
    """Overrides of an entry that is off by default: each must say ``enabled: true`` (else it
    changes nothing), and bring a ``hostDir`` when the entry has none."""
    if enabled:
        return
    for override in overrides:
        fields = dict(override.settings)
        if fields.get("enabled") is not True:
            problems.error(f"{override.where}.enabled", f"expected true, as {where} is disabled on every other node "
                                                        f"(enabled: false), got {_describe(fields.get('enabled'))}")
        elif not has_host_dir and "host_dir" not in fields:
            problems.error(f"{override.where}.hostDir", f"required, as {where} has no hostDir of its own, got "
                                                        "nothing")

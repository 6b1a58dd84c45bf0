"""Generate ``helm/localpv/README.md`` from the chart's ``values.yaml`` and its comments.

    python3 -m tools.chart_readme           # rewrite helm/localpv/README.md
    python3 -m tools.chart_readme --check   # exit 1 if it is stale or a value lacks a description

How ``values.yaml`` is read (``tests/helm/test_chart_readme.py`` holds the file to it):

* The comment lines directly above a key (no blank line in between) describe it.
* A comment line indented further than the prose after its ``#`` (``#   image: {...}``)
  is an example: it is shown as code (several such lines that form YAML, as JSON).
* A value that is unset by default is written commented out, ``# key: example``, at the
  column its key would have, after its own description. It is listed as unset, with the
  example. Only keys that ``values.schema.json`` allows at that place count; any other
  ``# word: ...`` line is prose.
* A banner, ``# ---- title`` at column 0, starts a section of the README; the comment
  lines after it in the same block introduce the section, up to a line holding ``#``
  alone, after which the block describes the key below it as usual.
* Every leaf needs a description. A leaf is a value that is not a map with fixed keys:
  scalars, lists, and maps whose schema lists no properties (``securityContext``,
  ``podAnnotations``...). A map the schema does not know at all (a value added before
  its schema) is taken as a map with fixed keys. A list of maps with fixed keys
  (``classes``) is documented through its first entry: ``classes[0].name``, which is
  also how ``helm --set`` names it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tools import write_or_check

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "localpv"
README = CHART / "README.md"
COMMAND = "python3 -m tools.chart_readme"

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<dash>- +)?(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)\s*:(?:\s+(?P<value>.*))?$")
_DASH_LINE = re.compile(r"^(?P<indent> *)- ")
_BANNER = re.compile(r"^ -{4,}\s*(?P<title>.*?)\s*$")
_OPTIONAL = re.compile(r"^ (?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>(?: .*)?)$")


class ValuesError(Exception):
    """values.yaml does not follow the conventions above."""


@dataclass(frozen=True)
class Comment:
    """One comment line: the column of its ``#`` and the text after it."""

    column: int
    text: str
    line: int

    @property
    def depth(self) -> int:
        """Spaces between ``#`` and the text."""
        return len(self.text) - len(self.text.lstrip(" "))


@dataclass
class Section:
    title: str
    intro: str = ""
    rows: list[Row] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    key: str
    default: str
    description: str


@dataclass
class _Scan:
    """What the line scanner found: each key's comment block, and blocks followed by a blank line."""

    #: dotted path -> (line number, comment lines directly above it)
    keys: dict[str, tuple[int, list[Comment]]] = field(default_factory=dict)
    #: (line number after the block, parent path of each column, comment lines)
    loose: list[tuple[int, dict[int, str], list[Comment]]] = field(default_factory=list)
    #: dotted path -> {column of its children's keys: parent path} when the key's block was read
    parents: dict[str, dict[int, str]] = field(default_factory=dict)


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _scan(text: str) -> _Scan:
    """Find every key's dotted path and the comment block above it, by indentation."""
    scan = _Scan()
    # (column of the children's keys, path): the open maps and list items around the current line
    stack: list[tuple[int, str]] = [(0, "")]
    items: dict[str, int] = {}
    block: list[Comment] = []

    def columns() -> dict[int, str]:
        return dict(stack)

    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped:
            if block:
                scan.loose.append((number, columns(), block))
            block = []
            continue
        if stripped.startswith("#"):
            column = len(raw) - len(raw.lstrip(" "))
            block.append(Comment(column, stripped[1:], number))
            continue
        match = _KEY_LINE.match(raw)
        if match is None:
            if not _DASH_LINE.match(raw) and not raw.startswith(" "):
                raise ValuesError(f"values.yaml:{number}: cannot read this line: {raw!r}")
            block = []  # a scalar list item or a continuation line: not a key
            continue
        column = len(match["indent"])
        if match["dash"]:
            # "- key: value" opens a list item of the key at the enclosing level.
            while len(stack) > 1 and stack[-1][0] > column:
                stack.pop()
            parent = stack[-1][1]
            index = items.get(parent, -1) + 1
            items[parent] = index
            column += len(match["dash"])
            stack.append((column, f"{parent}[{index}]"))
        while len(stack) > 1 and stack[-1][0] > column:
            stack.pop()
        if stack[-1][0] != column:
            raise ValuesError(f"values.yaml:{number}: unexpected indentation of {match['key']!r}")
        path = _join(stack[-1][1], match["key"])
        scan.keys[path] = (number, block)
        scan.parents[path] = columns()
        block = []
        value = (match["value"] or "").strip()
        if not value or value.startswith("#"):
            # A nested map or list follows: its keys sit deeper than this one.
            stack.append((_child_column(text, number, column), path))
    if block:
        scan.loose.append((len(text.splitlines()) + 1, columns(), block))
    return scan


def _child_column(text: str, number: int, column: int) -> int:
    """Column of the first key (or list item) below line ``number`` that is deeper than ``column``."""
    for raw in text.splitlines()[number:]:
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        return indent if indent > column else column + 2
    return column + 2


# --------------------------------------------------------------------------- schema


def _properties(schema: dict[str, Any] | None) -> dict[str, Any]:
    """The fixed keys a schema node allows (its own and those of its oneOf/anyOf branches)."""
    if not schema:
        return {}
    found = dict(schema.get("properties") or {})
    for branch in (*schema.get("oneOf", ()), *schema.get("anyOf", ())):
        for key, sub in (branch.get("properties") or {}).items():
            found.setdefault(key, sub)
    return found


def _items(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    items = (schema or {}).get("items")
    return items if isinstance(items, dict) else None


def _has_fixed_keys(schema: dict[str, Any] | None) -> bool:
    """A map is documented key by key if its schema lists properties, or if there is no schema."""
    return schema is None or bool(_properties(schema))


# --------------------------------------------------------------------------- descriptions


def _render_comments(lines: list[Comment]) -> str:
    """Prose lines joined into one paragraph; deeper-indented lines become code."""
    lines = [c for c in lines if c.text.strip()]
    if not lines:
        return ""
    prose_depth = min(c.depth for c in lines)
    parts: list[str] = []
    code: list[str] = []

    def flush() -> None:
        if code:
            parts.append("`" + _example(code) + "`")
            code.clear()

    for comment in lines:
        text = comment.text.strip()
        if comment.depth > prose_depth:
            code.append(comment.text)
        else:
            flush()
            parts.append(text)
    flush()
    return " ".join(parts)


def _example(lines: list[str]) -> str:
    """Example lines on one line: a block of YAML that spans lines (nested keys would lose
    their structure when joined) as JSON, anything else joined with spaces."""
    if len(lines) > 1:
        try:
            value = yaml.safe_load(textwrap.dedent("\n".join(lines)))
        except yaml.YAMLError:
            value = None
        if isinstance(value, dict | list):
            return json.dumps(value, ensure_ascii=False)
    return " ".join(line.strip() for line in lines)


def _json(value: Any) -> str:
    return "`" + json.dumps(value, ensure_ascii=False) + "`"


@dataclass(frozen=True)
class _Optional:
    path: str
    description: str
    example: Any
    line: int


class _Reader:
    """Pairs the scanned lines with the parsed values and the schema."""

    def __init__(self, values_text: str, schema: dict[str, Any]) -> None:
        self.text = values_text
        self.values = yaml.safe_load(values_text) or {}
        self.schema = schema
        self.scan = _scan(values_text)
        self.optional: dict[str, _Optional] = {}
        self.descriptions: dict[str, str] = {}
        self.sections: list[tuple[int, Section]] = []
        for path, (line, block) in self.scan.keys.items():
            self.descriptions[path] = self._split(block, self.scan.parents[path], line)
        for line, parents, block in self.scan.loose:
            self._split(block, parents, line)
        self.sections.sort(key=lambda s: s[0])

    def _schema_at(self, path: str) -> dict[str, Any] | None:
        """The schema node of a dotted path (``classes[0].name``), None if it has none."""
        node: dict[str, Any] | None = self.schema
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
            if node is None:
                return None
            node = _items(node) if part.startswith("[") else _properties(node).get(part)
        return node

    def _value_at(self, path: str) -> tuple[bool, Any]:
        node: Any = self.values
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
            if part.startswith("["):
                index = int(part[1:-1])
                if not isinstance(node, list) or index >= len(node):
                    return False, None
                node = node[index]
            else:
                if not isinstance(node, dict) or part not in node:
                    return False, None
                node = node[part]
        return True, node

    def _optional_key(self, comment: Comment, parents: dict[int, str]) -> str | None:
        """The path of a commented-out key the schema allows and the values leave unset."""
        match = _OPTIONAL.match(comment.text)
        if match is None or comment.column not in parents:
            return None
        parent = parents[comment.column]
        path = _join(parent, match["key"])
        if match["key"] not in _properties(self._schema_at(parent)) or self._value_at(path)[0]:
            return None
        return path

    def _split(self, block: list[Comment], parents: dict[int, str], line: int) -> str:
        """Register banners and commented-out keys of a block; return the prose left for the key below it."""
        prose: list[Comment] = []
        section: Section | None = None
        index = 0
        while index < len(block):
            comment = block[index]
            banner = _BANNER.match(comment.text) if comment.column == 0 else None
            if banner:
                title = banner["title"]
                section = Section(title[:1].upper() + title[1:])
                self.sections.append((comment.line, section))
                prose = []
                index += 1
                continue
            if section is not None and not comment.text.strip():
                # "#" alone ends the section's introduction; what follows describes the key.
                section.intro, prose, section = _render_comments(prose), [], None
                index += 1
                continue
            path = self._optional_key(comment, parents)
            if path is None:
                prose.append(comment)
                index += 1
                continue
            example = [comment.text[1:]]
            index += 1
            while index < len(block) and block[index].column == comment.column and block[index].depth > 1:
                example.append(block[index].text[1:])
                index += 1
            try:
                value = yaml.safe_load("\n".join(example))[path.rsplit(".", 1)[-1]]
            except (yaml.YAMLError, TypeError, KeyError) as err:
                raise ValuesError(f"values.yaml:{comment.line}: the example of {path} is not YAML: {err}") from err
            if section is not None and prose:
                section.intro, prose = _render_comments(prose), []
                section = None
            self.optional[path] = _Optional(path, _render_comments(prose), value, comment.line)
            prose = []
        if section is not None:
            section.intro = _render_comments(prose)
            return ""
        return _render_comments(prose)

    # ------------------------------------------------------------------ the rows

    def rows(self) -> list[tuple[int, Row]]:
        """Every documented value with the line it is on; raises nothing, see :meth:`undocumented`."""
        out: list[tuple[int, Row]] = []
        self._walk(self.values, "", out)
        for path, optional in self.optional.items():
            description = optional.description
            example = f"Example: {_json(optional.example)}."
            out.append((optional.line, Row(path, "unset", f"{description} {example}".strip())))
        return sorted(out, key=lambda r: r[0])

    def _line(self, path: str) -> int:
        if path not in self.scan.keys:
            raise ValuesError(f"values.yaml: cannot find the line of {path}")
        return self.scan.keys[path][0]

    def _walk(self, value: Any, path: str, out: list[tuple[int, Row]]) -> None:
        schema = self._schema_at(path) if path else self.schema
        if isinstance(value, dict) and (not path or (value and _has_fixed_keys(schema))):
            if path and self.descriptions.get(path):
                out.append((self._line(path), Row(path, "", self.descriptions[path])))
            for key, sub in value.items():
                self._walk(sub, _join(path, key), out)
            return
        line = self._line(path)
        items = _items(schema)
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and _properties(items):
            default = f"{len(value)} entr{'y' if len(value) == 1 else 'ies'}, see `{path}[0].*`"
            out.append((line, Row(path, default, self.descriptions.get(path, ""))))
            self._walk(value[0], f"{path}[0]", out)
            return
        out.append((line, Row(path, _json(value), self.descriptions.get(path, ""))))

    def undocumented(self) -> list[str]:
        """Dotted keys of values (set or unset) without a description."""
        missing = [row.key for _, row in self.rows() if row.default and row.key not in self.optional
                   and not row.description]
        return missing + [path for path, optional in self.optional.items() if not optional.description]

    def sectioned(self) -> list[Section]:
        sections = [Section("General")]
        starts = list(self.sections)
        for line, row in self.rows():
            while starts and starts[0][0] < line:
                sections.append(starts.pop(0)[1])
            sections[-1].rows.append(row)
        sections += [s for _, s in starts]
        return [s for s in sections if s.rows]


# --------------------------------------------------------------------------- the README


def _cell(text: str) -> str:
    """Text for a table cell: ``|`` escaped, and ``<`` outside code spans (``<pv>`` is no HTML tag)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _chart() -> dict[str, Any]:
    chart: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    return chart


def _minimum_kubernetes(kube_version: str) -> str:
    match = re.fullmatch(r">=\s*v?(\d+)\.(\d+)(?:\.\d+)?(?:-0)?", kube_version.strip())
    if match is None:
        raise ValuesError(f"Chart.yaml: kubeVersion {kube_version!r} is not of the form >=X.Y.Z-0")
    return f"{match[1]}.{match[2]}"


#: The chart README's Pod Security table: each kind of pod a release may run, the level its
#: namespace must admit, and why (tests/helm/test_chart_security.py holds the pods to it).
POD_SECURITY: tuple[tuple[str, str, str], ...] = (
    ("node agent (DaemonSet)", "privileged",
     "a privileged container (mounts, block devices, tenants' files) and hostPath volumes: the discovery "
     "directories, `/dev`, the state directory, the kubelet's directory"),
    ("cleanup Jobs", "privileged", "the same, for the one volume each wipes (`useJobForCleaning`)"),
    ("node cleanup (Deployment)", "restricted",
     "API calls only: the image's non-root user, no capabilities, RuntimeDefault seccomp, read-only root "
     "filesystem"),
    ("NFS provisioner (Deployment)", "baseline",
     "root with only DAC_OVERRIDE and FOWNER (it deletes and archives tenants' files on exports that are "
     "usually root-owned), RuntimeDefault seccomp, no privilege escalation. It passes `restricted` with a "
     "non-root `securityContext` (`runAsUser`, `runAsNonRoot: true`, `allowPrivilegeEscalation: false`, "
     "`capabilities.drop: [ALL]`, `seccompProfile.type: RuntimeDefault`) and `nfs.mountOptions` set (the export "
     "is then mounted through a PersistentVolumeClaim; `restricted` allows no `nfs` volume); it can then only "
     "create, archive and delete what that user may on the export"),
)


def _pod_security_table() -> str:
    rows = ["| Pods | Level they need | Why |", "|---|---|---|"]
    rows += [f"| {pods} | `{level}` | {why} |" for pods, level, why in POD_SECURITY]
    return "\n".join(rows)


def intro(chart: dict[str, Any]) -> str:
    kube = chart.get("kubeVersion", "")
    return f"""\
# localpv Helm chart

<!-- Generated by `{COMMAND}` from values.yaml and Chart.yaml: edit the comments in
values.yaml (or the generator's intro), then run it again. A test fails when this file is stale. -->

Chart `{chart['name']}` {chart['version']} (localpv {chart['appVersion']}) installs localpv, a drop-in
successor to local-static-provisioner and nfs-subdir-external-provisioner:

- the **node agent**, a DaemonSet with one privileged pod per node, which publishes the mount
  points and block devices found directly inside each class's `hostDir` as PersistentVolumes
  (upstream's names and format), cleans them when they are released, and keeps a cleanup
  journal on the node (`agent.stateDir`); with `useJobForCleaning` it cleans by Job;
- optionally the **node cleanup** Deployment (`nodeCleanup.enabled`), which frees claims and
  volumes pinned to Nodes that were deleted;
- optionally the **NFS provisioner** Deployment (set `nfs.server`), one subdirectory of an NFS
  export per claim;
- their ConfigMap, StorageClasses (`classes[].storageClass`, `storageClass.create`), exact RBAC,
  and optionally a metrics Service and a Prometheus ServiceMonitor.

It needs **Kubernetes {_minimum_kubernetes(kube)}** or newer (`kubeVersion: {kube}`). It takes
the values files of both upstream charts as they are; `values.schema.json` refuses wrong values
at install time, naming the key.

## Installing

Build the image from the repository's `Dockerfile` and push it where the nodes can pull it
(the chart has no default registry), then:

```sh
kubectl create namespace localpv
kubectl label namespace localpv pod-security.kubernetes.io/enforce=privileged
helm install localpv ./helm/localpv --namespace localpv \\
  --set image=registry.example.com/storage/localpv:{chart['appVersion']} -f my-values.yaml
kubectl -n localpv get daemonset localpv
kubectl -n localpv exec <agent pod> -- localpv doctor
```

More: [the project README](../../README.md) (configuration reference, migrating from the
upstream charts), [operations](../../docs/operations.md) (disks, stuck volumes, the journal,
upgrades, rollback), [metrics](../../docs/metrics.md), [health probes](../../docs/health.md),
[Kubernetes versions](../../docs/compatibility.md) (what is tested, validated, expected).

## Pod Security Admission

Every pod of a release runs in the release namespace (cleanup Jobs too), so the namespace must
admit the strictest need of the pods the release runs. Pod Security admission enforces the level
of the namespace's `pod-security.kubernetes.io/enforce` label, or the cluster's default
(`privileged` unless the API server's admission configuration says otherwise; some
distributions and hardened clusters default to `baseline` or `restricted`). A pod it rejects
is never created: Helm succeeds, the DaemonSet or Deployment stays without pods, and only its
events say why (`violates PodSecurity "baseline:latest"`).

{_pod_security_table()}

So a release with the node agent needs a `privileged` namespace of its own:

```sh
kubectl label --overwrite namespace localpv pod-security.kubernetes.io/enforce=privileged
```

An NFS-only release (`agent.enabled=false`) may go in a `baseline` namespace. The chart reads the
release namespace's label at install and upgrade and refuses, in one line with the label to
set, a namespace that would reject its pods (`helm template` cannot look, nor see a cluster
default). The chart creates no namespace (`--create-namespace` makes one without labels).

## Values
"""


def render(values_text: str, schema: dict[str, Any], chart: dict[str, Any]) -> str:
    reader = _Reader(values_text, schema)
    missing = reader.undocumented()
    if missing:
        raise ValuesError("values without a description (a comment line directly above the key): "
                          + ", ".join(missing))
    out = [intro(chart)]
    for section in reader.sectioned():
        out.append(f"\n### {section.title}\n")
        if section.intro:
            out.append(f"\n{section.intro}\n")
        out.append("\n| Key | Default | Description |\n|---|---|---|\n")
        for row in section.rows:
            default = _cell(row.default) if row.default else ""
            out.append(f"| `{row.key}` | {default} | {_cell(row.description)} |\n")
    return "".join(out)


def read_inputs() -> tuple[str, dict[str, Any], dict[str, Any]]:
    values = (CHART / "values.yaml").read_text(encoding="utf-8")
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    return values, schema, _chart()


def undocumented(values_text: str, schema: dict[str, Any]) -> list[str]:
    return _Reader(values_text, schema).undocumented()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the README is stale, write nothing")
    args = parser.parse_args(argv)
    try:
        text = render(*read_inputs())
    except ValuesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    current = README.read_text(encoding="utf-8") if README.exists() else ""
    return write_or_check(README, text, current, check=args.check, repo=REPO, command=COMMAND)


if __name__ == "__main__":
    sys.exit(main())

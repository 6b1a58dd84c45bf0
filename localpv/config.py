"""The provisioner configuration: upstream's ConfigMap format, read strictly.

A ConfigMap is mounted as a directory with one file per key (plus Kubernetes'
``..data`` symlink and timestamped dot-directories, which are skipped). Each value is
YAML 1.1, so ``yes``/``on`` are booleans exactly as upstream's ``sigs.k8s.io/yaml``
reads them. A single YAML file works too: either a plain mapping of keys, or a whole
ConfigMap manifest (its ``data`` is used).

Design choices:

* Every load builds fresh, immutable objects; a reload can never keep a removed class
  alive (upstream's reload re-used its maps: research §1.9).
* All problems are collected and reported together, each naming the key path, what was
  expected and what was found. Unknown keys are warnings (typos are the common failure),
  with a "did you mean" hint.
* The keys are declared in one table (:data:`TOP_LEVEL_KEYS`, :data:`CLASS_KEYS`) that
  also generates the configuration reference, so documentation cannot drift.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import posixpath
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import yaml

from localpv.glob import BadPatternError, NamePattern
from localpv.naming import DNS1123_SUBDOMAIN_RE, QUALIFIED_NAME_RE

if TYPE_CHECKING:
    from localpv.csi.config import DynamicClass, PoolConfig

DEFAULT_CONFIG_DIR = "/etc/provisioner/config"
DEFAULT_BLOCK_CLEANER = ("/scripts/quick_reset.sh",)
VOLUME_MODES = ("Filesystem", "Block")
ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


class ConfigError(Exception):
    """The configuration is unusable. ``problems`` lists every finding, one per line."""

    def __init__(self, problems: list[str], warnings: tuple[str, ...] = ()) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
        #: Unknown keys seen while failing; often the cause (``mountdir`` for ``mountDir``).
        self.warnings = warnings


@dataclass(frozen=True)
class ClassConfig:
    """One ``storageClassMap`` entry: where to discover volumes for one StorageClass."""

    name: str
    host_dir: str
    mount_dir: str
    block_cleaner_command: tuple[str, ...] = DEFAULT_BLOCK_CLEANER
    volume_mode: str = "Filesystem"
    access_mode: str = "ReadWriteOnce"
    fs_type: str | None = None
    name_pattern: NamePattern = field(default_factory=lambda: NamePattern("*"))
    selector: tuple[Mapping[str, Any], ...] = ()

    def container_path(self, host_path: str) -> str | None:
        """Map a PV's host path (``hostDir/entry``) to the path inside this container.

        Returns None when the path is not directly inside ``hostDir``: such a PV was
        not made from this class's discovery dir and must not be cleaned through it.
        """
        host_dir = self.host_dir.rstrip("/") or "/"
        parent, _, entry = host_path.rstrip("/").rpartition("/")
        if (parent or "/") != host_dir or not entry or entry in (".", ".."):
            return None
        return os.path.join(self.mount_dir, entry)


@dataclass(frozen=True)
class ProvisionerConfig:
    """The whole agent configuration (ConfigMap keys), immutable."""

    classes: Mapping[str, ClassConfig] = field(default_factory=dict)
    node_labels_for_pv: tuple[str, ...] = ()
    labels_for_pv: Mapping[str, str] = field(default_factory=dict)
    use_alpha_api: bool = False
    use_job_for_cleaning: bool = False
    use_job_for_filesystem_cleaning: bool = False
    job_tolerations: tuple[Mapping[str, Any], ...] = ()
    min_resync_period: float = 300.0
    use_node_name_only: bool = False
    set_pv_owner_ref: bool = False
    remove_node_not_ready_taint: bool = False
    provisioner_not_ready_node_taint_key: str = ""
    clean_before_first_discovery: bool = False
    cleanup_workers: int = 4
    cleanup_timeout: float = 6 * 3600.0
    # Dynamic volumes (issue 18): parsed by localpv.csi.config.
    dynamic_pools: Mapping[str, PoolConfig] = field(default_factory=dict)
    dynamic_classes: Mapping[str, DynamicClass] = field(default_factory=dict)
    csi_driver_name: str = "local.csi.localpv.dev"

    def cleans_by_job(self, block: bool) -> bool:
        """Whether a volume is cleaned by a Job rather than in-process (upstream: block only)."""
        return self.use_job_for_cleaning and (block or self.use_job_for_filesystem_cleaning)


@dataclass(frozen=True)
class LoadedConfig:
    """A parsed configuration plus the warnings found while reading it."""

    config: ProvisionerConfig
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuntimeEnv:
    """Process environment upstream's DaemonSet sets through the downward API."""

    node_name: str | None
    namespace: str
    job_image: str | None
    kubeconfig: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RuntimeEnv:
        return cls(
            node_name=environ.get("MY_NODE_NAME") or None,
            namespace=environ.get("MY_NAMESPACE") or "default",
            job_image=environ.get("JOB_CONTAINER_IMAGE") or None,
            kubeconfig=environ.get("KUBECONFIG") or None,
        )


# --------------------------------------------------------------------------- parsing


class _Problems:
    """Collects errors and warnings with their key paths."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int | float):
        return f"number {value}"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


_SUBDOMAIN_RULE = ('a DNS-1123 subdomain: lowercase letters, digits, "-" and ".", starting and ending with a '
                   "letter or digit, at most 253 characters")
_LABEL_KEY_RULE = ('a label key: an optional DNS-1123 subdomain prefix (at most 253 characters) and "/", then a '
                   'name of at most 63 letters, digits, "-", "_" and ".", starting and ending with a letter or digit')
_LABEL_VALUE_RULE = ('a label value: empty, or at most 63 letters, digits, "-", "_" and ".", starting and ending '
                     "with a letter or digit")


def _subdomain_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a DNS-1123 subdomain (a found-part for a message), or None."""
    if not text:
        return "an empty name"
    if len(text) > 253:
        return f"{len(text)} characters"
    if not DNS1123_SUBDOMAIN_RE.fullmatch(text):
        return _quote(text)
    return None


def label_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a Kubernetes label key (as the API server validates it), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN_RE.fullmatch(prefix)):
        return f"expected {_LABEL_KEY_RULE}; found prefix {_quote(prefix)}"
    if not name or len(name) > 63 or not QUALIFIED_NAME_RE.fullmatch(name):
        found = f"a name of {len(name)} characters" if len(name) > 63 else f"name {_quote(name)}"
        return f"expected {_LABEL_KEY_RULE}; found {found}"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a Kubernetes label value, or None."""
    if value and (len(value) > 63 or not QUALIFIED_NAME_RE.fullmatch(value)):
        found = f"{len(value)} characters" if len(value) > 63 else _quote(value)
        return f"expected {_LABEL_VALUE_RULE}; found {found}"
    return None


_YAML11_BOOLS = {
    "y": True, "yes": True, "true": True, "on": True,
    "n": False, "no": False, "false": False, "off": False,
}


def _as_bool(value: Any, path: str, problems: _Problems) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _YAML11_BOOLS:
        return _YAML11_BOOLS[value.strip().lower()]
    problems.error(path, f"expected a boolean (true/false, yes/no), got {_describe(value)}")
    return None


def _as_str(value: Any, path: str, problems: _Problems, *, allow_empty: bool = False) -> str | None:
    if isinstance(value, str) and (allow_empty or value.strip()):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    expected = "a string" if allow_empty else "a non-empty string"
    problems.error(path, f"expected {expected}, got {_describe(value)}")
    return None


def _as_str_list(value: Any, path: str, problems: _Problems) -> tuple[str, ...] | None:
    if not isinstance(value, list):
        problems.error(path, f"expected a list of strings, got {_describe(value)}")
        return None
    out: list[str] = []
    for i, item in enumerate(value):
        text = _as_str(item, f"{path}[{i}]", problems)
        if text is not None:
            out.append(text)
    return tuple(out) if len(out) == len(value) else None


def _as_str_map(value: Any, path: str, problems: _Problems) -> dict[str, str] | None:
    if not isinstance(value, dict):
        problems.error(path, f"expected a mapping of strings, got {_describe(value)}")
        return None
    out: dict[str, str] = {}
    for key, item in value.items():
        text = _as_str(item, f"{path}.{key}", problems, allow_empty=True)
        if text is not None:
            out[str(key)] = text
    return out if len(out) == len(value) else None


_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Parse a Go ``time.Duration`` string (``5m0s``, ``1h30m``, ``250ms``) into seconds."""
    s = text.strip()
    sign = 1.0
    if s and s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    for match in _DURATION_RE.finditer(s):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not s or pos != len(s):
        raise ValueError(f'invalid duration "{text}" (examples: "5m0s", "1h30m", "90s")')
    return sign * total


def format_go_duration(seconds: float) -> str:
    """Inverse of :func:`parse_go_duration`, spelled as Go's ``Duration.String`` spells it
    (``300`` → ``5m0s``, ``0.5`` → ``500ms``, ``90.25`` → ``1m30.25s``), so that a value read
    from an upstream ConfigMap is printed back the way its author would write it."""
    nanos = round(seconds * 1e9)
    sign, nanos = ("-", -nanos) if nanos < 0 else ("", nanos)
    if nanos == 0:
        return "0s"
    if nanos < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if nanos >= size:
                return sign + _decimal(nanos, size) + unit
    whole, frac = divmod(nanos, 1_000_000_000)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = _decimal(secs * 1_000_000_000 + frac, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _decimal(value: int, unit: int) -> str:
    """``value / unit`` as a decimal without trailing zeros (exact: no float rounding)."""
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}." + f"{frac:0{digits}d}".rstrip("0")


def _as_duration(value: Any, path: str, problems: _Problems) -> float | None:
    text = _as_str(value, path, problems)
    if text is None:
        return None
    try:
        seconds = parse_go_duration(text)
    except ValueError as err:
        problems.error(path, str(err))
        return None
    if seconds <= 0:
        problems.error(path, f'expected a positive duration, got "{text}"')
        return None
    return seconds


def _as_positive_int(value: Any, path: str, problems: _Problems) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    problems.error(path, f"expected a positive integer, got {_describe(value)}")
    return None


def _check_keys(
    mapping: Mapping[str, Any], known: Mapping[str, Any], path: str, problems: _Problems
) -> None:
    for key in mapping:
        if key in known:
            continue
        where = f"{path}.{key}" if path else str(key)
        hint = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
        if not hint:
            lowered = {k.lower(): k for k in known}
            hint = [lowered[str(key).lower()]] if str(key).lower() in lowered else []
        suffix = f' (did you mean "{hint[0]}"?)' if hint else ""
        problems.warnings.append(f"{where}: unknown key, ignored{suffix}")


def _parse_selector(value: Any, path: str, problems: _Problems) -> tuple[Mapping[str, Any], ...] | None:
    """``selector``: a list of NodeSelectorTerms appended (ORed) to the PV's affinity."""
    if not isinstance(value, list):
        problems.error(path, f"expected a list of node selector terms, got {_describe(value)}")
        return None
    before = len(problems.errors)
    for i, term in enumerate(value):
        term_path = f"{path}[{i}]"
        if not isinstance(term, dict):
            problems.error(term_path, f"expected a node selector term, got {_describe(term)}")
            continue
        _check_keys(term, {"matchExpressions": 1, "matchFields": 1}, term_path, problems)
        if not term.get("matchExpressions") and not term.get("matchFields"):
            problems.error(term_path, "expected matchExpressions or matchFields, got neither")
        for part in ("matchExpressions", "matchFields"):
            for j, expr in enumerate(term.get(part) or []):
                _check_requirement(expr, f"{term_path}.{part}[{j}]", problems)
    return tuple(value) if len(problems.errors) == before else None


def _check_requirement(expr: Any, path: str, problems: _Problems) -> None:
    if not isinstance(expr, dict):
        problems.error(path, f"expected a requirement (key, operator, values), got {_describe(expr)}")
        return
    if not isinstance(expr.get("key"), str) or not expr["key"]:
        problems.error(f"{path}.key", f"expected a non-empty string, got {_describe(expr.get('key'))}")
    operator = expr.get("operator")
    if operator not in SELECTOR_OPERATORS:
        problems.error(
            f"{path}.operator",
            f"expected one of {', '.join(SELECTOR_OPERATORS)}, got {_describe(operator)}",
        )
        return
    values = expr.get("values") or []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        problems.error(f"{path}.values", f"expected a list of strings, got {_describe(values)}")
    elif operator in ("In", "NotIn") and not values:
        problems.error(f"{path}.values", f"operator {operator} needs at least one value")
    elif operator in ("Exists", "DoesNotExist") and values:
        problems.error(f"{path}.values", f"operator {operator} takes no values")
    elif operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        problems.error(f"{path}.values", f"operator {operator} needs exactly one integer value")


def _parse_tolerations(value: Any, path: str, problems: _Problems) -> tuple[Mapping[str, Any], ...] | None:
    if not isinstance(value, list):
        problems.error(path, f"expected a list of tolerations, got {_describe(value)}")
        return None
    before = len(problems.errors)
    known = {"key": 1, "operator": 1, "value": 1, "effect": 1, "tolerationSeconds": 1}
    for i, tol in enumerate(value):
        tol_path = f"{path}[{i}]"
        if not isinstance(tol, dict):
            problems.error(tol_path, f"expected a toleration, got {_describe(tol)}")
            continue
        _check_keys(tol, known, tol_path, problems)
        operator = tol.get("operator", "Equal")
        if operator not in TOLERATION_OPERATORS:
            problems.error(f"{tol_path}.operator", f'expected "Exists" or "Equal", got {_describe(operator)}')
        effect = tol.get("effect")
        if effect not in (None, "", *TAINT_EFFECTS):
            problems.error(f"{tol_path}.effect", f"expected one of {', '.join(TAINT_EFFECTS)}, got {_describe(effect)}")
    return tuple(value) if len(problems.errors) == before else None


def _parse_label_keys(value: Any, path: str, problems: _Problems) -> tuple[str, ...] | None:
    """``nodeLabelsForPV``: Node label keys, each a valid label key (it becomes one on the PV)."""
    keys = _as_str_list(value, path, problems)
    if keys is None:
        return None
    bad = [(i, p) for i, key in enumerate(keys) if (p := label_key_problem(key)) is not None]
    for i, problem in bad:
        problems.error(f"{path}[{i}]", problem)
    return None if bad else keys


def _parse_labels(value: Any, path: str, problems: _Problems) -> dict[str, str] | None:
    """``labelsForPV``: label keys and values as the API server accepts them on a PV."""
    labels = _as_str_map(value, path, problems)
    if labels is None:
        return None
    bad = False
    for key, text in labels.items():
        for problem in (label_key_problem(key), label_value_problem(text)):
            if problem is not None:
                problems.error(f"{path}.{key}", problem)
                bad = True
    return None if bad else labels


# One row per ConfigMap key: (dataclass field, parser, documentation). The order is the
# order of the generated reference.
_Parser = Callable[[Any, str, _Problems], Any]


@dataclass(frozen=True)
class KeySpec:
    """How one configuration key is read and documented."""

    field: str
    parse: _Parser
    doc: str
    upstream: bool = True


def _parse_class_map(value: Any, path: str, problems: _Problems) -> dict[str, ClassConfig] | None:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.error(path, f"expected a mapping of storage class name to settings, got {_describe(value)}")
        return None
    classes: dict[str, ClassConfig] = {}
    for name, entry in value.items():
        where = f"{path}.{name}"
        if name is None or isinstance(name, bool) or not isinstance(name, str | int | float):
            problems.error(where, f"expected a StorageClass name ({_SUBDOMAIN_RULE}), got {_describe(name)}")
            continue
        if problem := _subdomain_problem(str(name)):
            problems.error(where, f"expected a StorageClass name ({_SUBDOMAIN_RULE}), got {problem}")
            continue
        parsed = _parse_class(str(name), entry, where, problems)
        if parsed is not None:
            classes[str(name)] = parsed
    return classes if len(classes) == len(value) else None


def _parse_volume_mode(value: Any, path: str, problems: _Problems) -> str | None:
    if value in VOLUME_MODES:
        return str(value)
    problems.error(path, f'expected "Filesystem" or "Block", got {_describe(value)}')
    return None


def _parse_access_mode(value: Any, path: str, problems: _Problems) -> str | None:
    if value in ACCESS_MODES:
        return str(value)
    problems.error(path, f"expected one of {', '.join(ACCESS_MODES)}, got {_describe(value)}")
    return None


def _parse_cleaner(value: Any, path: str, problems: _Problems) -> tuple[str, ...] | None:
    argv = _as_str_list(value, path, problems)
    if argv is not None and not argv:
        problems.error(path, "expected a command (a non-empty list), got an empty list")
        return None
    return argv


def _parse_name_pattern(value: Any, path: str, problems: _Problems) -> NamePattern | None:
    text = _as_str(value, path, problems)
    if text is None:
        return None
    try:
        return NamePattern(text)
    except BadPatternError as err:
        problems.error(path, f"invalid glob: {err}")
        return None


#: Trees of the kernel, the OS and the node's container machinery. Neither they nor any
#: directory inside them is a discovery directory: every mount point in one becomes a volume
#: that a tenant gets and that is wiped on release, and here those are /boot/efi, the kubelet's
#: secret tmpfs mounts, a runtime's image layers, /proc's binfmt_misc...
SYSTEM_TREES = (
    "/proc", "/sys", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
    "/run", "/var/run", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/docker",
    "/var/lib/containers", "/var/lib/etcd",
)
#: Directories whose own entries belong to the system (/dev/shm, /var/log, /home/<user>), though
#: a dedicated directory inside them is fine (/dev/disk/by-id, /var/lib/localpv-disks).
SYSTEM_DIRS = ("/dev", "/home", "/root", "/var", "/var/lib")
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def normalise_dir(path: str) -> str:
    """An absolute path in one spelling: no ``.``, no empty or trailing components.

    ``posixpath.normpath`` alone keeps a leading ``//`` (POSIX leaves its meaning to the
    system), which would let ``//`` pass as "not /".
    """
    return "/" + posixpath.normpath(path).lstrip("/")


def system_directory_refusal(path: str) -> str | None:
    """What is expected instead, when the normalised absolute ``path`` is the root or a system
    directory (see :data:`SYSTEM_TREES`, :data:`SYSTEM_DIRS`); None when it may be discovered.

    Whole components are compared, never string prefixes: ``/var/lib/kubelet-disks`` is fine.
    """
    if path == "/":
        return 'a dedicated discovery directory, not "/"'
    for tree in SYSTEM_TREES:
        if path == tree or path.startswith(tree + "/"):
            return f"a directory outside {tree} (a system directory)"
    if path in SYSTEM_DIRS:
        return f"a dedicated directory inside {path}, not {path} itself (its entries belong to the system)"
    return None


def _quote(text: str) -> str:
    """``"text"`` with control characters escaped, so an error line stays one readable line."""
    return '"' + _CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text) + '"'


def _spelling_refusal(text: str) -> str | None:
    """What is expected instead, when a directory is spelled unusably whatever it names."""
    if _CONTROL_CHARS.search(text):
        return "a path without control characters"
    if not text.startswith("/"):
        return "an absolute path"
    if ".." in text.split("/"):
        # Folding ".." by hand can disagree with the node, where a symlink before it leads elsewhere.
        return 'a path without ".." components'
    return None


def _parse_abs_path(value: Any, path: str, problems: _Problems) -> str | None:
    """A discovery directory (hostDir, mountDir), checked in its normalised form and stored so.

    Checking the text as written let ``/.`` and ``/tmp/..`` through as "not /" (issue 11):
    the agent then offered /proc, /sys and /dev as volumes and wiped /srv on release.
    """
    text = _as_str(value, path, problems)
    if text is None:
        return None
    if expected := _spelling_refusal(text):
        problems.error(path, f"expected {expected}, got {_quote(text)}")
        return None
    normal = normalise_dir(text)
    if expected := system_directory_refusal(normal):
        alias = "" if normal == text else f" (which is {_quote(normal)})"
        problems.error(path, f"expected {expected}, got {_quote(text)}{alias}")
        return None
    return normal


CLASS_KEYS: dict[str, KeySpec] = {
    "hostDir": KeySpec("host_dir", _parse_abs_path,
                       "Discovery directory on the host. Required. PV `local.path` = hostDir/<entry>. "
                       "Normalised first. Refused: `..` components, `/`, `/dev`, `/var`, `/home` "
                       "themselves, and anything in a system tree (`/proc`, `/sys`, `/etc`, `/usr`, "
                       "`/boot`, `/run`, `/var/lib/kubelet`...)."),
    "mountDir": KeySpec("mount_dir", _parse_abs_path,
                        "Where hostDir is mounted inside the agent container. Required (the Helm chart "
                        "defaults it to hostDir). Same rules as hostDir."),
    "blockCleanerCommand": KeySpec("block_cleaner_command", _parse_cleaner,
                                   "Command (argv list) that wipes a block volume; gets LOCAL_PV_BLKDEVICE. "
                                   "Default `[\"/scripts/quick_reset.sh\"]`. An empty list is an error."),
    "volumeMode": KeySpec("volume_mode", _parse_volume_mode,
                          "`Filesystem` (default) or `Block`, exact case."),
    "accessMode": KeySpec("access_mode", _parse_access_mode,
                          "Access mode of created PVs. Default `ReadWriteOnce`."),
    "fsType": KeySpec("fs_type", _as_str,
                      "`local.fsType` of created PVs (for filesystem-on-block volumes)."),
    "namePattern": KeySpec("name_pattern", _parse_name_pattern,
                           "Comma-separated Go globs on entry names. Default `*`."),
    "selector": KeySpec("selector", _parse_selector,
                        "Extra NodeSelectorTerms ORed into PV node affinity (shared disks)."),
}


def _parse_class(name: str, entry: Any, path: str, problems: _Problems) -> ClassConfig | None:
    if not isinstance(entry, dict):
        problems.error(path, f"expected a mapping with hostDir and mountDir, got {_describe(entry)}")
        return None
    _check_keys(entry, CLASS_KEYS, path, problems)
    before = len(problems.errors)
    values: dict[str, Any] = {}
    for key in ("hostDir", "mountDir"):
        if key not in entry:
            problems.error(f"{path}.{key}", "required, got nothing")
    for key, spec in CLASS_KEYS.items():
        if key in entry:
            values[spec.field] = spec.parse(entry[key], f"{path}.{key}", problems)
    if len(problems.errors) != before:
        return None
    cls = ClassConfig(name=name, **values)
    _warn_device_dir(cls, path, problems)
    if "blockCleanerCommand" in entry:
        _warn_missing_cleaner(cls.block_cleaner_command[0], f"{path}.blockCleanerCommand", problems)
    return cls


#: Where the image has the cleaner scripts, and where the package keeps its copy of them.
IMAGE_SCRIPTS_DIR = "/scripts"
PACKAGED_SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"


def _warn_missing_cleaner(command: str, path: str, problems: _Problems) -> None:
    """A cleaner that is not here is a warning, not an error: the check may run off the node,
    and the image may have it. A ``/scripts/`` script the package ships is there either way."""
    import shutil

    if "/" not in command:
        if shutil.which(command) is None:
            problems.warnings.append(f"{path}: {_quote(command)} is not on PATH here; block volumes of this "
                                     "class are not cleaned unless the agent's image has it")
        return
    if os.path.exists(command):
        return
    if command.startswith(IMAGE_SCRIPTS_DIR + "/") and (PACKAGED_SCRIPTS_DIR / command[len(IMAGE_SCRIPTS_DIR) + 1:]
                                                        ).is_file():
        return
    problems.warnings.append(f"{path}: {_quote(command)} does not exist here; block volumes of this class are "
                             "not cleaned unless the agent's image has it")


def _warn_device_dir(cls: ClassConfig, path: str, problems: _Problems) -> None:
    """A directory inside /dev (``/dev/disk/by-id``) lists every disk of the node, the system
    disk and its partitions too. Upstream accepts it and real configurations use it with a
    namePattern, so only a class with nothing narrowing it down is warned about."""
    if cls.host_dir.startswith("/dev/") and cls.name_pattern.spec == "*":
        problems.warnings.append(
            f"{path}.hostDir: {cls.host_dir} lists every disk of the node, the system disk too; "
            "set namePattern to match only the disks meant as volumes"
        )


TOP_LEVEL_KEYS: dict[str, KeySpec] = {
    "storageClassMap": KeySpec("classes", _parse_class_map,
                               "One entry per StorageClass name; see the class keys."),
    "nodeLabelsForPV": KeySpec("node_labels_for_pv", _parse_label_keys,
                               "Node label keys whose values are copied onto created PVs."),
    "labelsForPV": KeySpec("labels_for_pv", _parse_labels,
                           "Static labels added to created PVs (win over node labels)."),
    "useAlphaAPI": KeySpec("use_alpha_api", _as_bool,
                           "Put node affinity in the alpha annotation (pre-1.10 clusters)."),
    "useJobForCleaning": KeySpec("use_job_for_cleaning", _as_bool,
                                 "Clean block volumes with a Kubernetes Job instead of in-process workers."),
    "useJobForFilesystemCleaning": KeySpec("use_job_for_filesystem_cleaning", _as_bool,
                                           "With useJobForCleaning, clean Filesystem volumes by Job too "
                                           "(upstream cleans them in-process only).", upstream=False),
    "jobTolerations": KeySpec("job_tolerations", _parse_tolerations, "Tolerations of cleanup Job pods."),
    "minResyncPeriod": KeySpec("min_resync_period", _as_duration,
                               "Informer relist period, randomised in [min, 2*min). Default `5m0s`."),
    "useNodeNameOnly": KeySpec("use_node_name_only", _as_bool,
                               "provisioned-by without the Node UID (survives Node re-creation)."),
    "setPVOwnerRef": KeySpec("set_pv_owner_ref", _as_bool,
                             "PVs get an ownerReference to the Node (deleted with it, data untouched)."),
    "removeNodeNotReadyTaint": KeySpec("remove_node_not_ready_taint", _as_bool,
                                       "Remove the startup taint once discovery is ready."),
    "provisionerNotReadyNodeTaintKey": KeySpec(
        "provisioner_not_ready_node_taint_key",
        lambda v, p, pr: _as_str(v, p, pr, allow_empty=True),
        "Key of the startup taint to remove."),
    "cleanBeforeFirstDiscovery": KeySpec("clean_before_first_discovery", _as_bool,
                                         "Clean a never-seen volume before its first PV (upstream #143).",
                                         upstream=False),
    "cleanupWorkers": KeySpec("cleanup_workers", _as_positive_int,
                              "Size of the in-process cleaning worker pool. Default 4.", upstream=False),
    "cleanupTimeout": KeySpec("cleanup_timeout", _as_duration,
                              "Per-volume cleaning timeout. Default `6h0m0s`.", upstream=False),
    # Dynamic volumes: the parsers live with the CSI code (imported when a key is present).
    "dynamicPools": KeySpec("dynamic_pools", lambda v, p, pr: _dynamic().parse_pools(v, p, pr),
                            "Pools of dynamic volumes: name to hostDir, mountDir, requireMount, overcommit, "
                            "reserved (see docs/dynamic-volumes.md).", upstream=False),
    "dynamicClassMap": KeySpec("dynamic_classes", lambda v, p, pr: _dynamic().parse_classes(v, p, pr),
                               "StorageClasses provisioned dynamically: name to pool, fsType, provisioning, "
                               "mkfsOptions.", upstream=False),
    "csiDriverName": KeySpec("csi_driver_name", lambda v, p, pr: _dynamic().parse_driver_name(v, p, pr),
                             "Name of the CSI driver (StorageClass provisioner, CSIDriver object).", upstream=False),
}


def _dynamic() -> Any:
    """localpv.csi.config, imported when needed (it imports this module's helpers)."""
    from localpv.csi import config as dynamic

    return dynamic


def parse_config(data: Mapping[str, Any], *, strict: bool = False) -> LoadedConfig:
    """Validate already-decoded key/value data and build a fresh :class:`ProvisionerConfig`.

    ``strict`` (``localpv config check``): what upstream accepts but is almost surely a
    mistake is an error rather than a warning: two classes sharing a hostDir. The agent reads
    non-strictly, so a configuration upstream ran keeps running.
    """
    problems = _Problems()
    _check_keys(data, TOP_LEVEL_KEYS, "", problems)
    values: dict[str, Any] = {}
    for key, spec in TOP_LEVEL_KEYS.items():
        if key in data and data[key] is not None:
            values[spec.field] = spec.parse(data[key], key, problems)
    if not problems.errors:
        _check_shared_dirs(values.get("classes", {}), problems, strict=strict)
    if not problems.errors and (values.get("dynamic_pools") or values.get("dynamic_classes")):
        _dynamic().check(values, problems)
    if problems.errors:
        raise ConfigError(problems.errors, tuple(problems.warnings))
    return LoadedConfig(ProvisionerConfig(**values), tuple(problems.warnings))


def _check_shared_dirs(classes: Mapping[str, ClassConfig], problems: _Problems, *, strict: bool) -> None:
    """Two classes sharing a hostDir is legal upstream, but each volume then gets one PV only,
    from whichever class discovers it first: one class silently wins. A warning (an error when
    ``strict``), naming both classes. One hostDir inside another is seen by the outer class as
    an entry, offered (and wiped) as one volume once it is a mount point: a warning. The
    directories are normalised, so equal means the same directory however it is spelled."""
    first: dict[str, str] = {}
    for name, cls in classes.items():
        if cls.host_dir in first:
            other = first[cls.host_dir]
            where = f"storageClassMap.{name}.hostDir"
            if strict:
                problems.error(where, f"expected a directory no other class uses, found {cls.host_dir}, the "
                                      f"hostDir of class {other} too (classes {other} and {name} would race for "
                                      "each volume in it, and one would silently win)")
            else:
                problems.warnings.append(
                    f"{where}: same directory as class {other}; each volume gets one PV only, from whichever "
                    f"class discovers it first ({other} or {name})"
                )
        else:
            first[cls.host_dir] = name
    for name, cls in classes.items():
        for outer_dir, outer in first.items():
            if cls.host_dir.startswith(outer_dir + "/"):
                entry = cls.host_dir[len(outer_dir) + 1:].split("/")[0]
                problems.warnings.append(
                    f"storageClassMap.{name}.hostDir: inside the hostDir of class {outer} ({outer_dir}); "
                    f"class {outer} offers {outer_dir}/{entry} as one volume once it is a mount point"
                )


#: Deeper values are refused: no key needs more than a few levels, and both PyYAML's composer
#: and anything walking the value recurse once per level (2,000 levels raise RecursionError,
#: which would kill the config reload thread).
MAX_NESTING = 64
#: Values in one document, counting every use of an alias: anchors can expand exponentially.
MAX_VALUES = 100_000


class _TooDeep(yaml.YAMLError):
    def __init__(self, key: str, mark: yaml.Mark | None) -> None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        super().__init__(f"{key + ': ' if key else ''}expected at most {MAX_NESTING} levels of nesting, "
                         f"found more{where}")
        self.key = key
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader that stops composing below :data:`MAX_NESTING` levels, naming the top-level key."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._top_key = ""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self._depth == 1:  # a top-level entry: remember which, for the message
            self._top_key = str(index.value) if isinstance(index, yaml.ScalarNode) else (
                f"[{index}]" if isinstance(index, int) else self._top_key)
        if self._depth > MAX_NESTING:
            raise _TooDeep(self._top_key, self.peek_event().start_mark)  # type: ignore[no-untyped-call]
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _shape_problem(doc: Any) -> tuple[str, str] | None:
    """(top-level key, problem) when ``doc`` nests deeper than :data:`MAX_NESTING` or holds more
    than :data:`MAX_VALUES` values. The composer bounds what is written out; this bounds what
    aliases build (a chain of anchors, a list that contains itself, a billion laughs). Iterative."""
    stack: list[tuple[Any, int, str]] = [(doc, 0, "")]
    count = 0
    while stack:
        value, depth, key = stack.pop()
        count += 1
        if depth > MAX_NESTING:
            return key, f"expected at most {MAX_NESTING} levels of nesting, found more (through aliases)"
        if count > MAX_VALUES:
            return key, f"expected at most {MAX_VALUES} values, found more (through aliases)"
        if isinstance(value, dict):
            stack.extend((item, depth + 1, key or str(name)) for name, item in value.items())
        elif isinstance(value, list):
            stack.extend((item, depth + 1, key or f"[{i}]") for i, item in enumerate(value))
    return None


def _compose_and_construct(text: str) -> Any:
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def safe_load_limited(text: str) -> Any:
    """``yaml.safe_load`` that raises ``yaml.YAMLError`` for values nested too deeply or too
    large (see :data:`MAX_NESTING`, :data:`MAX_VALUES`) instead of recursing without bound."""
    doc = _compose_and_construct(text)
    shape = _shape_problem(doc)
    if shape is not None:
        raise yaml.YAMLError(f"{shape[0]}: {shape[1]}" if shape[0] else shape[1])
    return doc


def _load_yaml(text: str, path: str, *, key: str | None = None) -> Any:
    """Parse one document; ``path`` says where it came from, ``key`` which configuration key it
    holds (a file of a mounted ConfigMap, a ``data`` entry), if it holds just one."""
    try:
        doc = _compose_and_construct(text)
    except _TooDeep as err:
        where = f"line {err.mark.line + 1}, column {err.mark.column + 1}" if err.mark else "somewhere"
        name = key or err.key or path
        source = "" if key else f" of {path}"
        raise ConfigError([f"{name}: expected at most {MAX_NESTING} levels of nesting, "
                           f"found more ({where}{source})"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError([f"{path}: not valid YAML{where}: {problem}"]) from err
    shape = _shape_problem(doc)
    if shape is not None:
        name = key or shape[0] or path
        raise ConfigError([f"{name}: {shape[1]}" + ("" if key else f" (in {path})")])
    return doc


MAX_CONFIG_BYTES = 8 << 20
"""Largest configuration file read: a ConfigMap holds at most 1 MiB, and `helm template`
output with one in it stays well under this. The bound keeps `config check /dev/zero` (or a
log file named by mistake) from reading without end."""


class _NotAConfigFile(Exception):
    """A path that cannot hold a configuration: not a regular file, or far too large."""


def _read_text(path: Path) -> str:
    """A configuration file's text, refusing devices, FIFOs and sockets (reading them blocks
    or never ends) and anything larger than :data:`MAX_CONFIG_BYTES`."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise _NotAConfigFile(f"expected a regular file, found {_file_kind(st.st_mode)}")
    with path.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise _NotAConfigFile(f"expected at most {MAX_CONFIG_BYTES >> 20} MiB, found a larger file")
    return raw.decode("utf-8")


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def read_config_data(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read raw key/value data from a mounted ConfigMap directory or a YAML file."""
    p = Path(path)
    if p.is_dir():
        data: dict[str, Any] = {}
        errors: list[str] = []
        for child in sorted(p.iterdir()):
            # Kubernetes mounts keys as symlinks into a timestamped dot-directory.
            if child.name.startswith(".") or child.is_dir():
                continue
            # Every file is read, so that all the problems of a mounted ConfigMap are said at once.
            try:
                text = _read_text(child)
                data[child.name] = _load_yaml(text, child.name, key=child.name)
            except (OSError, UnicodeDecodeError, _NotAConfigFile) as err:
                errors.append(f"{child.name}: cannot read {child}: {err}")
            except ConfigError as err:
                errors += err.problems
        if errors:
            raise ConfigError(errors)
        return data
    try:
        text = _read_text(p)
    except (OSError, UnicodeDecodeError, _NotAConfigFile) as err:
        raise ConfigError([f"{p}: cannot read configuration: {err}"]) from err
    return _data_from_text(text, p)


def read_config_stream(stream: BinaryIO, name: str = "<stdin>") -> dict[str, Any]:
    """Like :func:`read_config_data` for one file's content on a stream (``config check -``,
    so that ``helm template ... | localpv config check -`` works), read up to the same bound."""
    raw = stream.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{name}: cannot read configuration: expected at most {MAX_CONFIG_BYTES >> 20} MiB, "
                           "found more"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError([f"{name}: cannot read configuration: {err}"]) from err
    return _data_from_text(text, Path(name))


def _data_from_text(text: str, p: Path) -> dict[str, Any]:
    """The configuration keys of one file: a plain mapping of keys, a ConfigMap, or a stream
    of documents with one provisioner ConfigMap among them."""
    doc = _pick_config_map(text, p) if _has_several_documents(text) else _load_yaml(text, str(p))
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError([f"{p}: expected a mapping of configuration keys, got {_describe(doc)}"])
    if doc.get("kind") == "ConfigMap":
        raw = doc.get("data") or {}
        if not isinstance(raw, dict):
            raise ConfigError([f"{p}: data: expected a mapping, got {_describe(raw)}"])
        return {str(k): _load_yaml(str(v), str(k), key=str(k)) for k, v in raw.items()}
    return doc


_DOCUMENT_START = re.compile(r"^---", re.MULTILINE)


def _has_several_documents(text: str) -> bool:
    """Whether ``text`` may hold more than one YAML document (a ``---`` after some content)."""
    starts = [m.start() for m in _DOCUMENT_START.finditer(text)]
    return any(text[:start].strip(" \t\r\n") and not _only_comments(text[:start]) for start in starts)


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith(("#", "%")) for line in text.splitlines())


def _pick_config_map(text: str, p: Path) -> Any:
    """The provisioner's ConfigMap out of a multi-document stream (``helm template`` output):
    the ConfigMap whose data has ``storageClassMap``; an error naming them when several do."""
    docs: list[Any] = []
    try:
        loader = _Loader(text)
        try:
            while loader.check_data():  # type: ignore[no-untyped-call]
                docs.append(loader.get_data())
        finally:
            loader.dispose()
    except _TooDeep as err:
        where = f" (line {err.mark.line + 1}, column {err.mark.column + 1})" if err.mark else ""
        raise ConfigError([f"{p}: expected at most {MAX_NESTING} levels of nesting, found more{where}"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError([f"{p}: not valid YAML{where}: {problem}"]) from err
    for doc in docs:
        if (shape := _shape_problem(doc)) is not None:
            raise ConfigError([f"{shape[0] or p}: {shape[1]} (in {p})"])
    real = [d for d in docs if d is not None]
    if len(real) <= 1:
        return real[0] if real else None
    candidates = [d for d in real if isinstance(d, dict) and d.get("kind") == "ConfigMap"
                  and isinstance(d.get("data"), dict) and "storageClassMap" in d["data"]]
    if len(candidates) == 1:
        return candidates[0]

    def name(doc: dict[str, Any]) -> str:
        meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
        namespace = meta.get("namespace")
        return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))

    if candidates:
        raise ConfigError([f"{p}: expected one ConfigMap with storageClassMap among its {len(real)} documents, "
                           f"found {len(candidates)}: {', '.join(name(d) for d in candidates)}"])
    raise ConfigError([f"{p}: expected a ConfigMap with storageClassMap among its {len(real)} documents, "
                       "found none"])


def load_config(path: str | os.PathLike[str] | BinaryIO, *, strict: bool = False) -> LoadedConfig:
    """Read and validate a configuration directory, file or stream; raise :class:`ConfigError`
    (``strict``: see :func:`parse_config`).

    Never anything else for what the files hold: the agent's reload thread keeps the last
    good configuration on ConfigError, and any other exception would end it.
    """
    name = "<stdin>" if not isinstance(path, str | os.PathLike) else path
    try:
        data = read_config_data(path) if isinstance(path, str | os.PathLike) else read_config_stream(path)
        return parse_config(data, strict=strict)
    except RecursionError:  # a last guard: the readers above bound nesting already
        raise ConfigError([f"{name}: nested too deeply to be read"]) from None


# --------------------------------------------------------------------------- output


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
            value = _dynamic().pools_to_data(value)
        elif key == "dynamicClassMap":
            value = _dynamic().classes_to_data(value)
        out[key] = _plain(value)
    return out


def _class_to_data(cls: ClassConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, spec in CLASS_KEYS.items():
        value = getattr(cls, spec.field)
        if isinstance(value, NamePattern):
            value = value.spec
        if value is None:
            continue
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
        default = "required" if key in ("hostDir", "mountDir") else f"`{sample.get(key, '')}`"
        lines.append(f"| `{key}` | {default} | {spec.doc} |")
    return "\n".join(lines) + "\n"


def replace(config: ProvisionerConfig, **changes: Any) -> ProvisionerConfig:
    """A copy with changes (tests and the CLI's overrides)."""
    return dataclasses.replace(config, **changes)

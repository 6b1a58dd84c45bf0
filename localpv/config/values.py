"""Reading one ConfigMap value strictly: YAML 1.1 booleans as upstream reads them, Go durations,
and problems collected with their key paths (every problem reported, not the first)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


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


_Parser = Callable[[Any, str, _Problems], Any]


@dataclass(frozen=True)
class KeySpec:
    """How one configuration key is read and documented."""

    field: str
    parse: _Parser
    doc: str
    upstream: bool = True

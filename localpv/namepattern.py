"""Go ``filepath.Match`` semantics for ``namePattern``.

Python's :mod:`fnmatch` differs from Go (``[!x]`` vs ``[^x]``, no backslash escapes, no
error on a malformed pattern), and an upstream ConfigMap must select exactly the same
entries here as there. Patterns are compiled once to a regular expression.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class BadPatternError(ValueError):
    """The pattern is malformed (Go: ``filepath.ErrBadPattern``)."""


def _class_to_regex(pattern: str, i: int) -> tuple[str, int]:
    """Translate the character class starting after ``[`` at ``i``; return (regex, next i)."""
    n = len(pattern)
    parts: list[str] = []
    negate = False
    if i < n and pattern[i] == "^":
        negate = True
        i += 1
    first = True
    while True:
        if i >= n:
            raise BadPatternError(f"unterminated character class in {pattern!r}")
        if pattern[i] == "]" and not first:
            i += 1
            break
        first = False
        lo, i = _class_char(pattern, i)
        if i < n and pattern[i] == "-":
            hi, i = _class_char(pattern, i + 1)
            if lo <= hi:  # Go accepts an inverted range; it just never matches
                parts.append(f"{re.escape(lo)}-{re.escape(hi)}")
        else:
            parts.append(re.escape(lo))
    body = "".join(parts)
    if not body:
        return ("[^/]" if negate else "(?!)"), i
    return (f"[^/{body}]" if negate else f"[{body}]"), i


def _class_char(pattern: str, i: int) -> tuple[str, int]:
    n = len(pattern)
    if i >= n or pattern[i] in "-]":
        raise BadPatternError(f"malformed character class in {pattern!r}")
    if pattern[i] == "\\":
        i += 1
        if i >= n:
            raise BadPatternError(f"trailing backslash in {pattern!r}")
    return pattern[i], i + 1


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile one Go glob to an anchored regex; raise :class:`BadPatternError` if malformed."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            cls, i = _class_to_regex(pattern, i + 1)
            out.append(cls)
        elif c == "\\":
            if i + 1 >= n:
                raise BadPatternError(f"trailing backslash in {pattern!r}")
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


class NamePattern:
    """Upstream ``namePattern``: comma-separated globs, any of which may match."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._regexes: Sequence[re.Pattern[str]] = tuple(
            compile_pattern(part) for part in spec.split(",") if part
        )

    def matches(self, name: str) -> bool:
        return any(r.fullmatch(name) for r in self._regexes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NamePattern) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)

    def __repr__(self) -> str:
        return f"NamePattern({self.spec!r})"

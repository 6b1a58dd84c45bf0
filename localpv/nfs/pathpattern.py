"""Where a claim's directory goes on the export: ``pathPattern`` templating and validation.

Pure functions over plain data. The syntax is nfs-subdir's: ``${.PVC.namespace}``,
``${.PVC.name}``, ``${.PVC.labels.<key>}``, ``${.PVC.annotations.<key>}``; an unknown key or
a missing label/annotation renders as the empty string, and a pattern that renders to
nothing (only slashes) falls back to the default ``<ns>-<pvc>-<pv>`` name.

Unlike upstream, the result is *validated* (research A.12 #1): annotation values are free
text a tenant controls, so ``..``, ``.``, absolute paths, empty segments, control
characters and over-long names are refused, and so are names of archives (``archived-...``)
and of the reserved ``.localpv`` directory at the top. Every piece of the rendered path remembers
which field produced it, so a refusal can name the field to fix (say
``annotations.nfs.io/storage-path``) instead of quoting the whole path.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Upstream's placeholder grammar (non-greedy up to the first ``}``).
PLACEHOLDER = re.compile(r"\$\{\.PVC\.((labels|annotations)\.(.*?)|.*?)\}")

#: The field name used when the offending text comes from the pattern itself.
PATTERN_FIELD = "parameters.pathPattern"

#: Linux PATH_MAX and NAME_MAX, in bytes of UTF-8.
MAX_PATH_BYTES = 4096
MAX_SEGMENT_BYTES = 255

_SHOWN_VALUE_CHARS = 80

#: The export's top-level directory for localpv's own bookkeeping (ownership records, see
#: :mod:`localpv.nfs.ownership`). It is never a volume, so no path may start there.
RESERVED_DIRECTORY = ".localpv"

#: What every archive name starts with (upstream's ``archived-<name>``).
ARCHIVE_PREFIX = "archived-"


class PathRejected(ValueError):
    """A rendered path that must not be used; ``field`` names where the bad text came from."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Piece:
    """A run of rendered text and its origin (``None``: literal text of the pattern)."""

    text: str
    source: str | None


@dataclass(frozen=True)
class Segment:
    """One path component and every field that contributed to it (text or delimiting slash)."""

    text: str
    sources: tuple[str, ...]

    def blame(self) -> str:
        """The field(s) to name when this segment is refused."""
        return ", ".join(self.sources) if self.sources else PATTERN_FIELD


@dataclass(frozen=True)
class SubPath:
    """A validated relative path below the export: non-empty, no ``.``/``..``, no escapes."""

    segments: tuple[Segment, ...]

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(s.text for s in self.segments)

    @property
    def relative(self) -> str:
        return "/".join(self.parts)

    @property
    def basename(self) -> str:
        return self.segments[-1].text


def default_directory_name(namespace: str, claim_name: str, pv_name: str) -> list[Piece]:
    """Upstream's ``<ns>-<pvc>-<pv>`` as pieces (names are validated like any other text)."""
    return [Piece(namespace, "namespace"), Piece("-", None), Piece(claim_name, "name"),
            Piece("-", None), Piece(pv_name, "volumeName")]


def render(pattern: str, metadata: Mapping[str, Any]) -> list[Piece]:
    """Expand the placeholders of ``pattern`` against a claim's ``metadata``."""
    pieces: list[Piece] = []
    pos = 0
    for match in PLACEHOLDER.finditer(pattern):
        if match.start() > pos:
            pieces.append(Piece(pattern[pos:match.start()], None))
        pieces.append(Piece(_lookup(match, metadata), match.group(1)))
        pos = match.end()
    if pos < len(pattern):
        pieces.append(Piece(pattern[pos:], None))
    return pieces


def _lookup(match: re.Match[str], metadata: Mapping[str, Any]) -> str:
    key = match.group(1)
    if match.group(2):
        table = metadata.get(match.group(2)) or {}
        value = table.get(match.group(3)) if isinstance(table, Mapping) else None
    elif key in ("namespace", "name"):
        value = metadata.get(key)
    else:
        value = None
    return value if isinstance(value, str) else ""


def is_blank(pieces: Iterable[Piece]) -> bool:
    """True when every placeholder rendered empty and the pattern's own text is at most slashes.

    Upstream then uses the default name. A value that *is* a slash is not blank: it is an
    absolute path, and refused.
    """
    pieces = list(pieces)
    literal = "".join(p.text for p in pieces if p.source is None)
    return all(not p.text for p in pieces if p.source is not None) and not literal.strip("/")


def split(pieces: Iterable[Piece]) -> list[Segment]:
    """Cut rendered pieces at ``/`` into segments that remember their sources."""
    segments: list[Segment] = []
    text: list[str] = []
    sources: list[str] = []
    for piece in pieces:
        for i, part in enumerate(piece.text.split("/")):
            if i > 0:
                if piece.source is not None and piece.source not in sources:
                    sources.append(piece.source)  # it wrote the slash that ends this segment
                segments.append(Segment("".join(text), tuple(sources)))
                text, sources = [], []
            text.append(part)
            if piece.source is not None and piece.source not in sources:
                sources.append(piece.source)
    segments.append(Segment("".join(text), tuple(sources)))
    return segments


def validate(pieces: list[Piece]) -> SubPath:
    """Refuse anything that could leave the export or alias it; return the segments otherwise."""
    for piece in pieces:
        bad = _bad_character(piece.text)
        if bad is not None:
            raise PathRejected(piece.source or PATTERN_FIELD,
                               f"{bad} in {_show(piece.text)} is not allowed in a path")
    rendered = "".join(p.text for p in pieces)
    if rendered.startswith("/"):
        first = next(p for p in pieces if p.text)
        raise PathRejected(first.source or PATTERN_FIELD,
                           f"renders an absolute path {_show(rendered)}; only paths relative to the export are allowed")
    if len(rendered.encode()) > MAX_PATH_BYTES:
        longest = max(pieces, key=lambda p: len(p.text))
        raise PathRejected(longest.source or PATTERN_FIELD,
                           f"renders a path of {len(rendered.encode())} bytes (at most {MAX_PATH_BYTES})")
    segments = split(pieces)
    for seg in segments:
        _check_segment(seg)
    return SubPath(tuple(segments))


def _check_segment(seg: Segment) -> None:
    if seg.text == "":
        raise PathRejected(seg.blame(), "renders an empty path segment (a missing or empty value, or '//')")
    if seg.text in (".", ".."):
        raise PathRejected(seg.blame(), f"{seg.text!r} is not allowed as a path segment")
    size = len(seg.text.encode())
    if size > MAX_SEGMENT_BYTES:
        raise PathRejected(seg.blame(), f"renders a path segment of {size} bytes (at most {MAX_SEGMENT_BYTES})")


def _bad_character(text: str) -> str | None:
    for ch in text:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return f"control character U+{code:04X}"
        if 0xD800 <= code <= 0xDFFF:
            return f"unpaired surrogate U+{code:04X}"
    return None


def _show(text: str) -> str:
    """A value quoted for an event message: escaped and bounded (it is tenant input)."""
    shown = text if len(text) <= _SHOWN_VALUE_CHARS else text[:_SHOWN_VALUE_CHARS] + "..."
    return ascii(shown)


def claim_subpath(pattern: str | None, metadata: Mapping[str, Any], pv_name: str) -> SubPath:
    """The validated directory for a claim: the rendered pattern, else the default name.

    Besides escaping the export, a claim may not name the reserved directory or an archive:
    archives are released claims' data, and a claim naming one would be handed it (and, with
    ``onDelete: delete``, erase it on release).
    """
    pieces = render(pattern, metadata) if pattern else []
    if is_blank(pieces):
        pieces = default_directory_name(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""),
                                        pv_name)
    sub = validate(pieces)
    _refuse_reserved(sub)
    _refuse_archives(sub)
    return sub


def parse_subpath(relative: str, field: str) -> SubPath:
    """Validate a path read back from somewhere (a PV's ``nfs.path``), blaming ``field``.

    Archives stay acceptable here (a PV made before they were refused may point at one; the
    ownership check decides what happens to it), the reserved directory does not.
    """
    sub = validate([Piece(relative, field)])
    _refuse_reserved(sub)
    return sub


def _refuse_reserved(sub: SubPath) -> None:
    first = sub.segments[0]
    if first.text == RESERVED_DIRECTORY:
        raise PathRejected(first.blame(), f"{RESERVED_DIRECTORY!r} at the top of the export is reserved for "
                                          "localpv's ownership records")


def _refuse_archives(sub: SubPath) -> None:
    for seg in sub.segments:
        if seg.text.startswith(ARCHIVE_PREFIX):
            raise PathRejected(seg.blame(), f"{_show(seg.text)} names an archive: path segments starting with "
                                            f"{ARCHIVE_PREFIX!r} are reserved for released claims' data")


def archive_names(basename: str, pv_name: str, attempts: int = 100) -> list[str]:
    """Candidate archive names at the export root, first choice upstream's ``archived-<name>``.

    Later candidates keep a second archive of a reused path (or the same name from two
    namespaces) from failing forever as upstream does; every candidate fits ``NAME_MAX``.
    """
    first = f"{ARCHIVE_PREFIX}{basename}"
    names = [first, f"{first}-{pv_name}"]
    names += [f"{first}-{pv_name}-{n}" for n in range(2, attempts)]
    return [_fit(name, n) for n, name in enumerate(names)]


def _fit(name: str, salt: int) -> str:
    if len(name.encode()) <= MAX_SEGMENT_BYTES:
        return name
    digest = hashlib.sha256(f"{name}\0{salt}".encode()).hexdigest()[:16]
    budget = MAX_SEGMENT_BYTES - len(digest) - 1
    head = name.encode()[:budget].decode("utf-8", "ignore")
    return f"{head}-{digest}"

"""Label syntax, label/field selectors and node selectors, as kube-apiserver understands them.

The emulator must reject what the real server rejects (a typo in a selector is a bug the
product's tests should catch) and match exactly what the real server matches (a watch
filtered by a label is how the node agent scales), so the grammar follows
``k8s.io/apimachinery/pkg/labels`` and ``pkg/fields`` rather than a looser regex.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "LabelRequirement",
    "LabelSelector",
    "SelectorError",
    "label_key_problems",
    "label_value_problems",
    "node_selector_matches",
    "node_selector_problems",
    "qualified_name_problems",
]


class SelectorError(ValueError):
    """A selector the real API server would refuse; the message is what it would say."""


_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
    "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_PREFIX_MSG = (
    "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def qualified_name_problems(key: str) -> list[str]:
    """Why ``key`` is not a qualified name (``[prefix/]name``), used for label/annotation keys."""
    prefix, slash, name = key.rpartition("/")
    if not slash:
        name = key
    problems: list[str] = []
    if slash and "/" in prefix:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must "
            "start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
            "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') "
            "with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if slash:
        if not prefix:
            problems.append("prefix part must be non-empty")
        elif len(prefix) > 253:
            problems.append("prefix part must be no more than 253 bytes")
        elif not DNS1123_SUBDOMAIN.match(prefix):
            problems.append(_PREFIX_MSG)
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 bytes")
    elif not _NAME_PART.match(name):
        problems.append(_NAME_PART_MSG)
    return problems


def label_key_problems(key: str) -> list[str]:
    """Why ``key`` is not a valid label key (same rule as any qualified name)."""
    return qualified_name_problems(key)


def label_value_problems(value: str) -> list[str]:
    """Why ``value`` is not a valid label value (at most 63 characters, may be empty)."""
    if len(value) > 63:
        return ["must be no more than 63 bytes"]
    if value and not _NAME_PART.match(value):
        return [_VALUE_MSG]
    return []


# --------------------------------------------------------------------------- label selectors

_EXISTS, _NOT_EXISTS, _EQUALS, _NOT_EQUALS = "exists", "!", "=", "!="
_IN, _NOT_IN, _GT, _LT = "in", "notin", "gt", "lt"


@dataclass(frozen=True)
class LabelRequirement:
    """One ANDed term of a label selector."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Apply the term with the real semantics (``!=`` and ``notin`` match a missing key)."""
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op == _EXISTS:
            return present
        if self.op == _NOT_EXISTS:
            return not present
        if self.op in (_EQUALS, _IN):
            return present and value in self.values
        if self.op in (_NOT_EQUALS, _NOT_IN):
            return not present or value not in self.values
        if not present:
            return False
        try:
            have, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return have > bound if self.op == _GT else have < bound


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector; the empty selector matches everything."""

    requirements: tuple[LabelRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse the string form used in ``?labelSelector=`` (raises :class:`SelectorError`)."""
        return cls(tuple(_LabelParser(text).parse()))

    @classmethod
    def from_object(cls, selector: Mapping[str, Any]) -> LabelSelector:
        """Build from a ``metav1.LabelSelector`` (``matchLabels`` + ``matchExpressions``)."""
        reqs = [
            LabelRequirement(str(k), _EQUALS, (str(v),))
            for k, v in sorted((selector.get("matchLabels") or {}).items())
        ]
        op_names = {"In": _IN, "NotIn": _NOT_IN, "Exists": _EXISTS, "DoesNotExist": _NOT_EXISTS}
        for expr in selector.get("matchExpressions") or []:
            op = op_names.get(str(expr.get("operator")))
            if op is None:
                raise SelectorError(f"{expr.get('operator')!r} is not a valid label selector operator")
            reqs.append(LabelRequirement(str(expr.get("key", "")), op, tuple(expr.get("values") or ())))
        return cls(tuple(reqs))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """True when every requirement holds for ``labels``."""
        labels = labels or {}
        return all(req.matches(labels) for req in self.requirements)

    @property
    def empty(self) -> bool:
        """An empty selector selects everything."""
        return not self.requirements


_SPECIAL_CHARS = "!=,()<>"


def _label_tokens(text: str) -> Iterator[str]:
    """Split a selector into identifiers and operator tokens (whitespace separates only)."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "!=" and text[i + 1 : i + 2] == "=":
            yield text[i : i + 2]
            i += 2
        elif ch in _SPECIAL_CHARS:
            yield ch
            i += 1
        else:
            start = i
            while i < len(text) and not text[i].isspace() and text[i] not in _SPECIAL_CHARS:
                i += 1
            yield text[start:i]


class _LabelParser:
    """Recursive-descent parser for the label selector grammar of apimachinery."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = list(_label_tokens(text))
        self.pos = 0

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _next(self) -> str | None:
        tok = self._peek()
        self.pos += 1
        return tok

    def _fail(self, why: str) -> SelectorError:
        return SelectorError(f"unable to parse requirement: {why}")

    def _identifier(self, what: str) -> str:
        tok = self._next()
        if tok is None or tok in _SPECIAL_CHARS or tok in ("==", "!="):
            raise self._fail(f"found '{tok or ''}', expected: {what}")
        return tok

    def parse(self) -> list[LabelRequirement]:
        reqs: list[LabelRequirement] = []
        while self._peek() is not None:
            reqs.append(self._requirement())
            tok = self._next()
            if tok is None:
                break
            if tok != ",":
                raise SelectorError(f"found '{tok}', expected: ',' or 'end of string'")
            if self._peek() is None:
                raise self._fail("found '', expected: identifier")
        return reqs

    def _requirement(self) -> LabelRequirement:
        if self._peek() == "!":
            self._next()
            return self._checked(LabelRequirement(self._identifier("identifier"), _NOT_EXISTS))
        key = self._identifier("identifier")
        tok = self._peek()
        if tok in (None, ","):
            return self._checked(LabelRequirement(key, _EXISTS))
        self._next()
        if tok in ("=", "==", "!="):
            value = "" if self._peek() in (None, ",") else self._identifier("identifier")
            return self._checked(LabelRequirement(key, _NOT_EQUALS if tok == "!=" else _EQUALS, (value,)))
        if tok in ("<", ">"):
            value = self._identifier("integer")
            if not re.fullmatch(r"-?[0-9]+", value):
                raise self._fail(f"for 'Gt', 'Lt' operators, the value must be an integer, got {value!r}")
            return self._checked(LabelRequirement(key, _GT if tok == ">" else _LT, (value,)))
        if tok in ("in", "notin"):
            return self._checked(LabelRequirement(key, tok, self._value_set()))
        raise self._fail(
            f"found '{tok}', expected: in, notin, =, ==, !=, gt, lt"
        )

    def _value_set(self) -> tuple[str, ...]:
        if self._next() != "(":
            raise self._fail("found '', expected: '('")
        values: list[str] = []
        while True:
            tok = self._peek()
            if tok == ")":
                self._next()
                break
            if tok == ",":
                values.append("")
                self._next()
                continue
            values.append(self._identifier("identifier"))
            if self._peek() == ",":
                self._next()
                if self._peek() == ")":
                    values.append("")
        if not values:
            raise self._fail("for 'in', 'notin' operators, values set can't be empty")
        return tuple(values)

    def _checked(self, req: LabelRequirement) -> LabelRequirement:
        problems = label_key_problems(req.key)
        if problems:
            raise self._fail(f"key: Invalid value: {req.key!r}: {'; '.join(problems)}")
        for value in req.values:
            if req.op not in (_GT, _LT) and label_value_problems(value):
                raise self._fail(
                    f"values[0][{req.key}]: Invalid value: {value!r}: {label_value_problems(value)[0]}"
                )
        return req


# --------------------------------------------------------------------------- field selectors


@dataclass(frozen=True)
class FieldRequirement:
    """``field=value`` or ``field!=value``; the only operators field selectors have."""

    field: str
    value: str
    negated: bool = False

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Missing fields compare as the empty string, like the real server's field sets."""
        equal = fields.get(self.field, "") == self.value
        return not equal if self.negated else equal


@dataclass(frozen=True)
class FieldSelector:
    """A parsed field selector (comma-ANDed requirements)."""

    requirements: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str) -> FieldSelector:
        """Parse ``?fieldSelector=`` syntax, honouring ``\\,``, ``\\=`` and ``\\\\`` escapes."""
        reqs = []
        for term in _split_unescaped(text, ","):
            if not term.strip():
                continue
            reqs.append(_field_requirement(term.strip()))
        return cls(tuple(reqs))

    @property
    def fields(self) -> tuple[str, ...]:
        """The field names used, so the caller can refuse unsupported ones."""
        return tuple(req.field for req in self.requirements)

    def matches(self, fields: Mapping[str, str]) -> bool:
        """True when every requirement holds for the object's selectable fields."""
        return all(req.matches(fields) for req in self.requirements)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if escaped:
        current.append("\\")
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    out, escaped = [], False
    for ch in text:
        if escaped:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        else:
            out.append(ch)
    if escaped:
        raise SelectorError("invalid field selector: unterminated escape sequence")
    return "".join(out)


def _field_requirement(term: str) -> FieldRequirement:
    i = 0
    while i < len(term):
        if term[i] == "\\":
            i += 2
            continue
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                field, value = term[:i], term[i + len(op) :]
                return FieldRequirement(_unescape(field), _unescape(value), negated=op == "!=")
        i += 1
    raise SelectorError(f"invalid selector: '{term}'; can't understand '{term}'")


# --------------------------------------------------------------------------- node selectors

_NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _node_requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _node_term_matches(term: Mapping[str, Any], labels: Mapping[str, str], node_name: str) -> bool:
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False  # an empty term selects no node (core/v1 NodeSelectorTerm docs)
    for req in exprs:
        if not _node_requirement_matches(req, labels.get(str(req.get("key")))):
            return False
    for req in fields:
        value = node_name if req.get("key") == "metadata.name" else None
        if not _node_requirement_matches(req, value):
            return False
    return True


def node_selector_matches(
    selector: Mapping[str, Any] | None, labels: Mapping[str, str], node_name: str
) -> bool:
    """Whether a ``core/v1 NodeSelector`` (terms ORed, requirements ANDed) selects a node."""
    if selector is None:
        return True
    terms = selector.get("nodeSelectorTerms") or []
    return any(_node_term_matches(term, labels, node_name) for term in terms)


def node_selector_problems(selector: Any, path: str) -> list[tuple[str, str, Any]]:
    """Validation problems as ``(field path, kind, detail)`` triples for the caller to format.

    ``kind`` is one of ``required``, ``invalid``, ``unsupported`` so that the API layer can
    turn each into the matching ``metav1.StatusCause`` reason.
    """
    if not isinstance(selector, Mapping):
        return [(path, "invalid", "must be an object")]
    terms = selector.get("nodeSelectorTerms")
    if not isinstance(terms, Sequence) or isinstance(terms, str) or not terms:
        return [(f"{path}.nodeSelectorTerms", "required", "must have at least one node selector term")]
    problems: list[tuple[str, str, Any]] = []
    for t, term in enumerate(terms):
        for part in ("matchExpressions", "matchFields"):
            for r, req in enumerate((term or {}).get(part) or []):
                problems.extend(_node_requirement_problems(req, f"{path}.nodeSelectorTerms[{t}].{part}[{r}]"))
    return problems


def _node_requirement_problems(req: Mapping[str, Any], path: str) -> list[tuple[str, str, Any]]:
    op, values = req.get("operator"), req.get("values") or []
    if op not in _NODE_OPERATORS:
        return [(f"{path}.operator", "unsupported", op)]
    if op in ("In", "NotIn") and not values:
        return [(f"{path}.values", "required", "must be specified when `operator` is 'In' or 'NotIn'")]
    if op in ("Exists", "DoesNotExist") and values:
        return [(f"{path}.values", "forbidden", "may not be specified when `operator` is 'Exists' or 'DoesNotExist'")]
    if op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]+", str(values[0]))):
        return [(f"{path}.values", "required",
                 "must be specified single integer value when `operator` is 'Lt' or 'Gt'")]
    key_problems = label_key_problems(str(req.get("key", "")))
    return [(f"{path}.key", "invalid", p) for p in key_problems]

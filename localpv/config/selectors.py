"""Kubernetes-shaped values of the ConfigMap: node selectors, tolerations, label keys and labels,
checked as the API server will check them (so a bad one is refused here, not at every create)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from localpv.config.model import SELECTOR_OPERATORS, TAINT_EFFECTS, TOLERATION_OPERATORS
from localpv.config.values import _as_str_list, _as_str_map, _check_keys, _describe, _Problems
from localpv.naming import (
    label_key_problem,
    label_value_problem,
)


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

"""Pure parts of the emulator: selector grammar, node selectors, quantities, patch algebra."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv_emulator.apiserver import ApiError, human_duration, json_patch, merge_patch, strategic_merge
from localpv_emulator.binder import QuantityError, parse_quantity
from localpv_emulator.selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    node_selector_matches,
    node_selector_problems,
)

KEYS = st.sampled_from(["app", "tier", "example.com/role", "x"])
VALUES = st.sampled_from(["a", "b", "c-1", ""])


@st.composite
def requirement(draw: st.DrawFn) -> tuple[str, str, str, list[str]]:
    """(text, key, op, values) of one random requirement."""
    key, op = draw(KEYS), draw(st.sampled_from(["=", "!=", "in", "notin", "exists", "!"]))
    values = draw(st.lists(VALUES.filter(bool), min_size=1, max_size=3))
    if op in ("=", "!="):
        return f"{key}{op}{values[0]}", key, op, values[:1]
    if op in ("in", "notin"):
        return f"{key} {op} ({', '.join(values)})", key, op, values
    return (key if op == "exists" else f"!{key}"), key, op, []


def reference(labels: dict[str, str], key: str, op: str, values: list[str]) -> bool:
    present = key in labels
    return {
        "=": present and labels.get(key) in values, "in": present and labels.get(key) in values,
        "!=": not present or labels.get(key) not in values, "notin": not present or labels.get(key) not in values,
        "exists": present, "!": not present,
    }[op]


@given(st.lists(requirement(), min_size=1, max_size=4), st.dictionaries(KEYS, VALUES, max_size=4))
def test_label_selectors_match_like_the_reference(reqs: list[tuple[str, str, str, list[str]]],
                                                   labels: dict[str, str]) -> None:
    selector = LabelSelector.parse(",".join(text for text, *_ in reqs))
    assert selector.matches(labels) == all(reference(labels, k, op, v) for _, k, op, v in reqs)


@pytest.mark.parametrize("text", ["a in (b", "a notin ()", "a=b,,c", "a b", "!", "a==", "Bad Key=x", "x>y"])
def test_malformed_label_selectors(text: str) -> None:
    if text == "a==":  # an empty value is allowed
        assert LabelSelector.parse(text).matches({"a": ""})
        return
    with pytest.raises(SelectorError):
        LabelSelector.parse(text)


def test_label_selector_from_object_and_numeric_comparisons() -> None:
    selector = LabelSelector.from_object({"matchLabels": {"a": "1"}, "matchExpressions": [
        {"key": "b", "operator": "In", "values": ["x", "y"]}, {"key": "c", "operator": "DoesNotExist"}]})
    assert selector.matches({"a": "1", "b": "y"}) and not selector.matches({"a": "1", "b": "y", "c": ""})
    assert LabelSelector.parse("disks>3").matches({"disks": "4"})
    assert not LabelSelector.parse("disks<3").matches({"disks": "4"})


def test_field_selectors_with_escapes() -> None:
    selector = FieldSelector.parse(r"metadata.name=a\,b,status.phase!=Running")
    assert selector.fields == ("metadata.name", "status.phase")
    assert selector.matches({"metadata.name": "a,b", "status.phase": "Pending"})
    assert not selector.matches({"metadata.name": "a,b", "status.phase": "Running"})
    with pytest.raises(SelectorError):
        FieldSelector.parse("metadata.name")


def test_node_selectors() -> None:
    def term(*exprs: dict[str, object]) -> dict[str, object]:
        return {"nodeSelectorTerms": [{"matchExpressions": list(exprs)}]}

    labels = {"zone": "a", "cpus": "8"}
    assert node_selector_matches(term({"key": "zone", "operator": "In", "values": ["a"]}), labels, "n1")
    assert not node_selector_matches(term({"key": "zone", "operator": "NotIn", "values": ["a"]}), labels, "n1")
    assert node_selector_matches(term({"key": "cpus", "operator": "Gt", "values": ["4"]}), labels, "n1")
    assert not node_selector_matches(term({"key": "cpus", "operator": "Lt", "values": ["4"]}), labels, "n1")
    assert node_selector_matches(term({"key": "gpu", "operator": "DoesNotExist"}), labels, "n1")
    assert not node_selector_matches({"nodeSelectorTerms": [{}]}, labels, "n1")  # an empty term selects nothing
    by_name = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
    assert node_selector_matches(by_name, {}, "n1") and not node_selector_matches(by_name, {}, "n2")
    problems = node_selector_problems(term({"key": "cpus", "operator": "Gt", "values": ["many"]}), "affinity")
    assert [p[0] for p in problems] == ["affinity.nodeSelectorTerms[0].matchExpressions[0].values"]


@pytest.mark.parametrize(("text", "value"), [
    ("1Gi", Fraction(1024**3)), ("500M", Fraction(500 * 10**6)), ("1.5Ki", Fraction(1536)),
    ("100m", Fraction(1, 10)), ("1e3", Fraction(1000)), ("0", Fraction(0)), ("2", Fraction(2)),
    ("1Ei", Fraction(1024**6)), ("2E", Fraction(2 * 10**18)), ("1E2", Fraction(100)),
])
def test_quantities(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["1GB", "Gi", "", "1 Gi", "-"])
def test_bad_quantities(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_patch_algebra() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None}, "l": [2]}) == {"a": {"c": 2}, "l": [2]}
    doc = {"a": [1, 2]}
    assert json_patch(doc, [{"op": "add", "path": "/a/-", "value": 3}, {"op": "copy", "from": "/a/0",
                                                                        "path": "/b"}]) == {"a": [1, 2, 3], "b": 1}
    assert doc == {"a": [1, 2]}  # the input is not modified
    with pytest.raises(ApiError) as exc:
        json_patch(doc, [{"op": "remove", "path": "/nope"}])
    assert exc.value.code == 422
    merged = strategic_merge(
        {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}},
        {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                  "containers": [{"name": "a", "image": "2"}]}})
    assert merged == {"spec": {"containers": [{"name": "b", "image": "1"}, {"name": "a", "image": "2"}]}}
    replaced = strategic_merge({"spec": {"x": {"a": 1}}}, {"spec": {"x": {"$patch": "replace", "b": 2}}})
    assert replaced == {"spec": {"x": {"b": 2}}}
    retained = strategic_merge({"s": {"a": 1, "b": 2}}, {"s": {"$retainKeys": ["b", "c"], "c": 3}})
    assert retained == {"s": {"b": 2, "c": 3}}


@pytest.mark.parametrize(("seconds", "text"), [(5, "5s"), (119, "119s"), (150, "2m30s"), (3600, "60m"),
                                               (4 * 3600, "4h"), (3 * 86400, "3d"), (400 * 86400, "400d")])
def test_ages_read_like_kubectl(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text

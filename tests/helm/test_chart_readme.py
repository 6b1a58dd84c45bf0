"""helm/localpv/README.md is generated from values.yaml, and every value there is described.

The generator is ``tools/chart_readme.py``; its docstring says how values.yaml is read.
No Helm is needed: these tests only read files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tools import chart_readme
from tools.chart_readme import COMMAND, ValuesError, read_inputs, render, undocumented

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_chart_readme_is_the_generated_one() -> None:
    generated = render(*read_inputs())
    committed = chart_readme.README.read_text(encoding="utf-8")
    assert committed == generated, f"helm/localpv/README.md is stale: run {COMMAND}"


def test_every_value_in_values_yaml_has_a_description() -> None:
    values, schema, _ = read_inputs()
    missing = undocumented(values, schema)
    assert not missing, (f"values without a description in helm/localpv/values.yaml: {', '.join(missing)}; put a "
                         f"comment line directly above each (see tools/chart_readme.py), then run {COMMAND}")


def test_the_readme_names_the_charts_minimum_kubernetes_version() -> None:
    _, _, chart = read_inputs()
    text = chart_readme.README.read_text(encoding="utf-8")
    assert f"`kubeVersion: {chart['kubeVersion']}`" in text


def test_the_readme_links_point_at_files_that_exist() -> None:
    text = chart_readme.README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    assert "../../docs/operations.md" in targets
    for target in targets:
        assert (chart_readme.README.parent / target).resolve().is_file(), f"README link to a missing file: {target}"


# ------------------------------------------------------------------ the reading rules, on small files

SCHEMA = {"properties": {
    "plain": {"type": "boolean"},
    "later": {"type": ["string", "null"]},
    "group": {"type": "object", "properties": {"inner": {"type": "integer"}}},
    "free": {"type": ["object", "null"]},
    "items": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "extra": {"type": "string"}}}},
}}
CHART = {"name": "c", "version": "1.0.0", "appVersion": "1.0.0", "kubeVersion": ">=1.20.0-0"}


def rows(values: str, schema: dict[str, object] | None = None) -> dict[str, tuple[str, str]]:
    reader = chart_readme._Reader(values, schema or SCHEMA)
    return {row.key: (row.default, row.description) for _, row in reader.rows()}


def test_a_value_without_a_comment_directly_above_is_undocumented() -> None:
    values = "# Described.\nplain: true\n\n# Separated by a blank line.\n\nlater: x\n"
    assert undocumented(values, SCHEMA) == ["later"]
    with pytest.raises(ValuesError, match="later"):
        render(values, SCHEMA, CHART)


def test_a_new_nested_value_needs_its_own_comment() -> None:
    values = "# The group.\ngroup:\n  # Inner.\n  inner: 1\n  added: 2\n"
    assert undocumented(values, SCHEMA) == ["group.added"]


def test_a_map_without_fixed_keys_is_one_value() -> None:
    values = "# Anything.\nfree:\n  a: 1\n  b: [2]\n"
    assert rows(values) == {"free": ('`{"a": 1, "b": [2]}`', "Anything.")}


def test_a_commented_out_key_the_schema_knows_is_an_unset_value_with_its_example() -> None:
    values = "# Described.\nplain: true\n# Set it to name a thing.\n# later: thing\n"
    assert rows(values)["later"] == ("unset", 'Set it to name a thing. Example: `"thing"`.')
    assert "plain" in rows(values)


def test_a_commented_out_key_without_a_description_is_undocumented() -> None:
    assert undocumented("# later: thing\n", SCHEMA) == ["later"]


def test_a_word_and_colon_the_schema_does_not_know_is_prose() -> None:
    values = "# note: this is prose\nplain: true\n"
    assert rows(values) == {"plain": ("`true`", "note: this is prose")}


def test_deeper_indented_comment_lines_are_code() -> None:
    values = "# Either:\n#   plain: false\n# or true.\nplain: true\n"
    assert rows(values)["plain"][1] == "Either: `plain: false` or true."


def test_a_nested_example_over_several_lines_keeps_its_structure() -> None:
    values = "# Overrides, e.g.\n#   rules:\n#     A: {for: 30m}\n#     B: {enabled: false}\nfree: {}\n"
    assert rows(values)["free"][1] == 'Overrides, e.g. `{"rules": {"A": {"for": "30m"}, "B": {"enabled": false}}}`'


def test_a_list_of_maps_is_documented_through_its_first_entry() -> None:
    values = "# The items.\nitems:\n  # Its name.\n  - name: a\n    # Optional.\n    # extra: b\n"
    assert rows(values) == {
        "items": ("1 entry, see `items[0].*`", "The items."),
        "items[0].name": ('`"a"`', "Its name."),
        "items[0].extra": ("unset", 'Optional. Example: `"b"`.'),
    }


def test_banners_start_sections_whose_introduction_ends_at_a_lone_hash() -> None:
    values = ("# Described.\nplain: true\n\n# ---- second part\n# About it.\n#\n# Later.\nlater: x\n")
    text = render(values, SCHEMA, CHART)
    assert "### General\n" in text
    assert "### Second part\n\nAbout it.\n" in text
    assert '| `later` | `"x"` | Later. |' in text


def test_angle_brackets_and_pipes_survive_in_table_cells() -> None:
    text = render("# Named cleanup-<pv> | or `<kept>`.\nplain: true\n", SCHEMA, CHART)
    assert "| Named cleanup-&lt;pv&gt; \\| or `<kept>`. |" in text


def test_the_schema_file_is_json_the_generator_reads() -> None:
    _, schema, _ = read_inputs()
    assert schema == json.loads((REPO / "helm" / "localpv" / "values.schema.json").read_text())

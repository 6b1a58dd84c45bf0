"""pathPattern templating (upstream syntax) and the validation upstream lacks."""

from __future__ import annotations

import posixpath
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from localpv.nfs.pathpattern import (
    MAX_SEGMENT_BYTES,
    PATTERN_FIELD,
    PathRejected,
    archive_names,
    claim_subpath,
    parse_subpath,
)
from localpv.nfs.provisioner import NfsSource

PV = "pvc-0f7c1b6e-1111-2222-3333-444455556666"


def meta(name: str = "data", namespace: str = "team-a", labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": annotations or {}}


def rendered(pattern: str | None, m: dict[str, Any]) -> str:
    return claim_subpath(pattern, m, PV).relative


# ---------------------------------------------------------------- templating


def test_default_name_is_namespace_claim_volume() -> None:
    assert rendered(None, meta()) == f"team-a-data-{PV}"


@pytest.mark.parametrize("pattern", ["", "${.PVC.labels.absent}", "/", "${.PVC.annotations.x}/${.PVC.labels.y}"])
def test_a_pattern_that_renders_to_nothing_falls_back_to_the_default_name(pattern: str) -> None:
    assert rendered(pattern, meta()) == f"team-a-data-{PV}"


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("${.PVC.namespace}/${.PVC.name}", "team-a/data"),
        ("${.PVC.namespace}-${.PVC.labels.app}", "team-a-web"),
        ("${.PVC.namespace}/${.PVC.annotations.nfs.io/storage-path}", "team-a/shared/logs"),
        ("fixed", "fixed"),
        ("pre-${.PVC.name}-post", "pre-data-post"),
        ("${.PVC.name}}", "data}"),  # non-greedy: the placeholder ends at the first brace
        ("${.PVC.uid}${.PVC.name}", "data"),  # unknown keys render empty, as upstream
        ("$.PVC.name", "$.PVC.name"),  # not a placeholder: literal text
    ],
)
def test_placeholders_expand_like_upstream(pattern: str, expected: str) -> None:
    m = meta(labels={"app": "web"}, annotations={"nfs.io/storage-path": "shared/logs"})
    assert rendered(pattern, m) == expected


def test_segments_remember_their_fields() -> None:
    sub = claim_subpath("${.PVC.namespace}/x-${.PVC.labels.app}", meta(labels={"app": "web"}), PV)
    assert [s.sources for s in sub.segments] == [("namespace",), ("labels.app",)]


# ---------------------------------------------------------------- validation


ANNOTATED = "${.PVC.namespace}/${.PVC.annotations.nfs.io/storage-path}"
FIELD = "annotations.nfs.io/storage-path"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("..", "'..' is not allowed"),
        ("../..", "'..' is not allowed"),
        ("a/../../b", "'..' is not allowed"),
        (".", "'.' is not allowed"),
        ("a/./b", "'.' is not allowed"),
        ("a//b", "empty path segment"),
        ("a/", "empty path segment"),
        ("", "empty path segment"),
        ("a\x00b", "control character U+0000"),
        ("a\nb", "control character U+000A"),
        ("a\x7fb", "control character U+007F"),
        ("a\u0085b", "control character U+0085"),
        ("\ud800", "unpaired surrogate"),
        ("x" * (MAX_SEGMENT_BYTES + 1), "path segment of 256 bytes"),
        ("é" * 128, "path segment of 256 bytes"),
        ("/".join(["y" * 200] * 21), "bytes (at most 4096)"),
    ],
)
def test_hostile_annotation_values_are_refused_naming_the_annotation(value: str, reason: str) -> None:
    with pytest.raises(PathRejected) as exc:
        claim_subpath(ANNOTATED, meta(annotations={"nfs.io/storage-path": value}), PV)
    assert exc.value.field == FIELD
    assert reason in exc.value.reason


@pytest.mark.parametrize("value", ["/etc", "/", "//x", "../x", "..", "."])
def test_a_placeholder_alone_cannot_escape_or_alias_the_export(value: str) -> None:
    with pytest.raises(PathRejected) as exc:
        claim_subpath("${.PVC.annotations.p}", meta(annotations={"p": value}), PV)
    assert exc.value.field == "annotations.p"


def test_labels_are_blamed_by_their_key() -> None:
    with pytest.raises(PathRejected, match=r"^labels\.tier: "):
        claim_subpath("${.PVC.labels.tier}/x", meta(labels={"tier": ".."}), PV)


def test_literal_pattern_faults_blame_the_pattern() -> None:
    for pattern in ("../${.PVC.name}", "/abs/${.PVC.name}", "${.PVC.name}//x", "./${.PVC.name}"):
        with pytest.raises(PathRejected) as exc:
            claim_subpath(pattern, meta(), PV)
        assert exc.value.field == PATTERN_FIELD, pattern


def test_missing_value_inside_a_nested_pattern_is_refused_not_collapsed() -> None:
    """Upstream cleans ``ns/`` to ``ns``, so every claim without the annotation shares (and on
    delete, removes) the namespace directory (research A.12 #2). We refuse instead."""
    with pytest.raises(PathRejected, match="empty path segment") as exc:
        claim_subpath(ANNOTATED, meta(), PV)
    assert exc.value.field == FIELD


def test_the_event_message_escapes_tenant_text() -> None:
    with pytest.raises(PathRejected) as exc:
        claim_subpath("${.PVC.annotations.p}", meta(annotations={"p": "\x1b[31m/x"}), PV)
    assert "\x1b" not in str(exc.value)
    assert "\\x1b" in str(exc.value)


@pytest.mark.parametrize(
    ("pattern", "value"),
    [
        ("${.PVC.annotations.p}", "archived-team-a-data"),
        ("${.PVC.annotations.p}", "archived-"),
        ("${.PVC.annotations.p}", "team/archived-x"),
        ("${.PVC.namespace}/${.PVC.annotations.p}", "archived-db"),
        ("${.PVC.annotations.p}", ".localpv"),
        ("${.PVC.annotations.p}", ".localpv/owners"),
    ],
)
def test_archives_and_the_reserved_directory_cannot_be_named(pattern: str, value: str) -> None:
    """An archive is a released claim's data and ``.localpv`` holds ownership records: no claim
    may render a path into either (issue 11 finding 7)."""
    with pytest.raises(PathRejected) as exc:
        claim_subpath(pattern, meta(annotations={"p": value}), PV)
    assert exc.value.field == "annotations.p"
    assert "reserved" in exc.value.reason or "archive" in exc.value.reason


def test_archived_and_reserved_names_are_fine_where_they_name_nothing_special() -> None:
    assert rendered("${.PVC.annotations.p}", meta(annotations={"p": "x/.localpv"})) == "x/.localpv"
    assert rendered("${.PVC.annotations.p}", meta(annotations={"p": "not-archived-x"})) == "not-archived-x"


def test_the_default_name_is_checked_too() -> None:
    with pytest.raises(PathRejected, match="archive"):
        claim_subpath(None, meta(namespace="archived"), PV)


# ---------------------------------------------------------------- reading paths back


@pytest.mark.parametrize(
    "path",
    ["/etc", "/exports", "/exports/", "/exportsX/a", "/exports/../etc", "/exports/a/../../b", "/exports/./a",
     "/exports//a", "relative", "/exports/a\x00", "/exports/.localpv", "/exports/.localpv/owners"],
)
def test_tampered_pv_paths_are_refused(path: str) -> None:
    with pytest.raises(PathRejected) as exc:
        NfsSource("nfs.example", "/exports").subpath_of(path)
    assert exc.value.field == "spec.nfs.path"


def test_provisioned_paths_read_back_to_the_same_segments() -> None:
    source = NfsSource("nfs.example", "/exports/")
    sub = claim_subpath("${.PVC.namespace}/${.PVC.name}", meta(), PV)
    assert source.server_path(sub) == "/exports/team-a/data"
    assert source.subpath_of(source.server_path(sub)).parts == sub.parts
    root = NfsSource("nfs.example", "/")
    assert root.subpath_of(root.server_path(sub)).parts == ("team-a", "data")


def test_parse_subpath_blames_the_given_field() -> None:
    with pytest.raises(PathRejected, match=r"^spec\.nfs\.path: "):
        parse_subpath("a/..", "spec.nfs.path")


# ---------------------------------------------------------------- archive names


def test_archive_names_start_with_upstreams_and_are_unique_and_short_enough() -> None:
    names = archive_names("team-a-data-" + PV, PV)
    assert names[0] == f"archived-team-a-data-{PV}"
    assert len(set(names)) == len(names)
    long_names = archive_names("x" * MAX_SEGMENT_BYTES, PV)
    assert all(len(n.encode()) <= MAX_SEGMENT_BYTES for n in long_names)
    assert len(set(long_names)) == len(long_names)


# ---------------------------------------------------------------- property


PATTERNS = [
    None,
    "${.PVC.namespace}/${.PVC.name}",
    "${.PVC.annotations.p}",
    "${.PVC.namespace}/${.PVC.annotations.p}",
    "${.PVC.labels.l}-${.PVC.annotations.p}",
    "${.PVC.annotations.p}/${.PVC.labels.l}/${.PVC.name}",
    "a/${.PVC.annotations.p}/b",
]

FIELD_ROOTS = ("name", "namespace", "labels", "annotations", "volumeName")

hostile_text = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(["..", ".", "", "/", "a", "é", "\x00", "\n", "//", "../", "x" * 300, "archived-",
                              ".localpv"]),
             max_size=8).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(
    pattern=st.sampled_from(PATTERNS),
    name=hostile_text,
    namespace=hostile_text,
    labels=st.dictionaries(st.sampled_from(["l", "m"]), hostile_text, max_size=2),
    annotations=st.dictionaries(st.sampled_from(["p", "q"]), hostile_text, max_size=2),
)
@example(pattern="${.PVC.annotations.p}", name="x", namespace="y", labels={}, annotations={"p": "../../etc"})
def test_any_claim_metadata_gives_a_clear_refusal_or_a_path_strictly_inside(
    pattern: str | None, name: str, namespace: str, labels: dict[str, str], annotations: dict[str, str]
) -> None:
    m = meta(name, namespace, labels, annotations)
    try:
        sub = claim_subpath(pattern, m, PV)
    except PathRejected as err:
        assert err.field and err.reason
        for field in err.field.split(", "):
            assert field == PATTERN_FIELD or field.split(".")[0] in FIELD_ROOTS, err
        return
    joined = posixpath.join("/export", sub.relative)
    assert posixpath.normpath(joined) == joined  # nothing for the OS to resolve differently
    assert joined.startswith("/export/") and joined != "/export/"
    assert all(part and "/" not in part and part not in (".", "..") for part in sub.parts)
    assert all(ch >= " " for ch in sub.relative)
    assert not any(part.startswith("archived-") for part in sub.parts)
    assert sub.parts[0] != ".localpv"

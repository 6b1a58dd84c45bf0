"""StorageClass parameters read as nfs-subdir reads them (research A.3)."""

from __future__ import annotations

import pytest

from localpv.nfs.params import (
    OnDelete,
    allow_other_clusters,
    allow_shared_directories,
    on_delete,
    parse_bool,
    path_pattern,
)


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_parse_bool_true_spellings_of_go(text: str) -> None:
    assert parse_bool(text) is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_parse_bool_false_spellings_of_go(text: str) -> None:
    assert parse_bool(text) is False


@pytest.mark.parametrize("text", ["", "yes", "no", "tRuE", " true", "2", "on"])
def test_parse_bool_rejects_what_go_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid boolean"):
        parse_bool(text)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, OnDelete.ARCHIVE),  # absent archiveOnDelete archives, as upstream
        ({"archiveOnDelete": "true"}, OnDelete.ARCHIVE),
        ({"archiveOnDelete": "false"}, OnDelete.DELETE),
        ({"archiveOnDelete": "0"}, OnDelete.DELETE),
        ({"onDelete": "delete", "archiveOnDelete": "true"}, OnDelete.DELETE),  # onDelete wins
        ({"onDelete": "retain", "archiveOnDelete": "false"}, OnDelete.RETAIN),
        ({"onDelete": "Retain", "archiveOnDelete": "false"}, OnDelete.DELETE),  # exact lowercase only
        ({"onDelete": "bogus"}, OnDelete.ARCHIVE),
    ],
)
def test_on_delete_precedence(parameters: dict[str, str], expected: OnDelete) -> None:
    assert on_delete(parameters) is expected


def test_unparsable_archive_on_delete_names_the_parameter() -> None:
    with pytest.raises(ValueError, match=r"^parameters\.archiveOnDelete: invalid boolean 'maybe'"):
        on_delete({"archiveOnDelete": "maybe"})


def test_path_pattern_absent_or_empty_is_none() -> None:
    assert path_pattern({}) is None
    assert path_pattern({"pathPattern": ""}) is None
    assert path_pattern({"pathPattern": "${.PVC.name}"}) == "${.PVC.name}"


OPT_INS = {"allowSharedDirectories": allow_shared_directories, "allowOtherClusters": allow_other_clusters}


@pytest.mark.parametrize("key", OPT_INS)
@pytest.mark.parametrize(("value", "expected"), [(None, False), ("true", True), ("false", False), ("1", True),
                                                 ("F", False)])
def test_an_opt_in_is_off_unless_the_class_says_so(key: str, value: str | None, expected: bool) -> None:
    parameters = {} if value is None else {key: value}
    assert OPT_INS[key](parameters) is expected
    assert OPT_INS[key]({"the-other": "true", **parameters}) is expected


@pytest.mark.parametrize("key", OPT_INS)
def test_a_misspelt_opt_in_is_an_error_not_a_yes(key: str) -> None:
    with pytest.raises(ValueError, match=rf"parameters\.{key}: invalid boolean 'yes'"):
        OPT_INS[key]({key: "yes"})


def test_the_opt_ins_are_independent() -> None:
    assert not allow_other_clusters({"allowSharedDirectories": "true"})
    assert not allow_shared_directories({"allowOtherClusters": "true"})

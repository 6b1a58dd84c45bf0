"""Directory operations on a real directory: links planted anywhere are refused, never followed."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localpv.nfs.export import Export, UnsafeDirectory
from localpv.nfs.pathpattern import PathRejected, claim_subpath
from tests.nfs.conftest import Layout, snapshot


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def export(layout: Layout) -> Export:
    return Export(str(layout.export))


def test_make_directory_sets_the_mode_despite_the_umask_on_the_leaf_only(layout: Layout, export: Export) -> None:
    old = os.umask(0o027)
    try:
        assert export.make_directory(["ns", "vol"], 0o777) is True
    finally:
        os.umask(old)
    assert mode(layout.export / "ns" / "vol") == 0o777
    assert mode(layout.export / "ns") == 0o750  # parents as upstream's MkdirAll: umask applies


def test_make_directory_adopts_an_existing_directory(layout: Layout, export: Export) -> None:
    (layout.export / "vol").mkdir(mode=0o700)
    (layout.export / "vol" / "old-data").write_text("kept")
    assert export.make_directory(["vol"], 0o775) is False
    assert mode(layout.export / "vol") == 0o775
    assert (layout.export / "vol" / "old-data").read_text() == "kept"


def test_mkdir_callback_counts_real_creations_only(layout: Layout) -> None:
    made: list[int] = []
    export = Export(str(layout.export), on_mkdir=lambda: made.append(1))
    export.make_directory(["a", "b"], 0o777)
    export.make_directory(["a", "b"], 0o777)
    export.make_directory(["a", "c"], 0o777)
    assert len(made) == 3


@pytest.mark.parametrize("target", ["/", "outside"])
def test_a_planted_leaf_link_is_refused_and_its_target_untouched(layout: Layout, export: Export,
                                                                 target: str) -> None:
    dest = "/" if target == "/" else str(layout.outside / "victim")
    os.symlink(dest, layout.export / "vol")
    before = layout.outside_snapshot()
    with pytest.raises(UnsafeDirectory, match="is a symbolic link") as exc:
        export.make_directory(["vol"], 0o777)
    assert exc.value.index == 0
    assert mode(layout.outside / "victim") == 0o700
    assert stat.S_IMODE(os.stat("/").st_mode) != 0o777
    assert layout.outside_snapshot() == before


def test_a_planted_intermediate_link_is_refused_and_nothing_is_created_beyond_it(layout: Layout,
                                                                                 export: Export) -> None:
    os.symlink(layout.outside, layout.export / "ns")
    before = layout.outside_snapshot()
    with pytest.raises(UnsafeDirectory) as exc:
        export.make_directory(["ns", "evil"], 0o777)
    assert exc.value.index == 0
    assert layout.outside_snapshot() == before
    for call in (export.exists, export.remove):
        with pytest.raises(UnsafeDirectory):
            call(["ns", "victim"])
    with pytest.raises(UnsafeDirectory):
        export.archive(["ns", "victim"], ["archived-victim"])
    assert layout.outside_snapshot() == before
    assert not (layout.export / "archived-victim").exists()


def test_a_file_in_the_way_is_refused(layout: Layout, export: Export) -> None:
    (layout.export / "f").write_text("x")
    with pytest.raises(UnsafeDirectory, match="is not a directory"):
        export.make_directory(["f", "x"], 0o777)


def test_remove_deletes_the_tree_without_following_links_inside_it(layout: Layout, export: Export) -> None:
    vol = layout.export / "vol"
    (vol / "sub").mkdir(parents=True)
    (vol / "sub" / "file").write_text("x")
    os.symlink(layout.outside / "victim", vol / "sub" / "escape")
    os.symlink("/", vol / "root")
    before = layout.outside_snapshot()
    assert export.remove(["vol"]) is True
    assert not vol.exists()
    assert layout.outside_snapshot() == before


def test_remove_refuses_a_leaf_that_became_a_link(layout: Layout, export: Export) -> None:
    os.symlink(layout.outside / "victim", layout.export / "vol")
    before = layout.outside_snapshot()
    with pytest.raises(UnsafeDirectory):
        export.remove(["vol"])
    assert layout.outside_snapshot() == before
    assert (layout.export / "vol").is_symlink()


def test_remove_and_archive_of_a_missing_directory_report_it_gone(export: Export) -> None:
    assert export.remove(["nope"]) is False
    assert export.remove(["a", "nope"]) is False
    assert export.archive(["nope"], ["archived-nope"]) is None
    assert export.exists(["nope"]) is False


def test_archive_moves_to_the_export_root_and_never_overwrites(layout: Layout, export: Export) -> None:
    for ns in ("a", "b"):
        (layout.export / ns / "data").mkdir(parents=True)
        (layout.export / ns / "data" / "owner").write_text(ns)
    (layout.export / "archived-data-taken").mkdir()  # an empty dir rename(2) would silently replace
    names = ["archived-data", "archived-data-taken", "archived-data-2"]
    assert export.archive(["a", "data"], names) == "archived-data"
    assert export.archive(["b", "data"], names) == "archived-data-2"
    assert (layout.export / "archived-data" / "owner").read_text() == "a"
    assert (layout.export / "archived-data-2" / "owner").read_text() == "b"
    assert list((layout.export / "archived-data-taken").iterdir()) == []
    assert not (layout.export / "a" / "data").exists()


def test_archive_without_a_free_name_fails_and_keeps_the_directory(layout: Layout, export: Export) -> None:
    (layout.export / "vol").mkdir()
    (layout.export / "archived-vol").mkdir()
    with pytest.raises(FileExistsError):
        export.archive(["vol"], ["archived-vol"])
    assert (layout.export / "vol").is_dir()


@pytest.mark.parametrize("parts", [[".."], ["a", ".."], ["."], [""], ["a/b"], ["/"], ["a\0"], ["..", "x"]])
def test_unvalidated_segments_are_refused_even_here(layout: Layout, export: Export, parts: list[str]) -> None:
    (layout.export / "a").mkdir()
    before = layout.outside_snapshot()
    for call in (lambda: export.make_directory(parts, 0o777), lambda: export.exists(parts),
                 lambda: export.remove(parts), lambda: export.archive(parts, ["archived-x"]),
                 lambda: export.archive(["a"], parts)):
        with pytest.raises(UnsafeDirectory, match="is not a plain directory name"):
            call()
    assert layout.outside_snapshot() == before
    assert os.listdir(layout.export) == ["a"]


def test_the_export_root_itself_is_never_a_volume(layout: Layout, export: Export) -> None:
    (layout.export / "keep").mkdir()
    for call in (lambda: export.remove([]), lambda: export.archive([], ["archived-x"])):
        with pytest.raises(UnsafeDirectory, match="export root"):
            call()
    assert os.listdir(layout.export) == ["keep"]


@settings(max_examples=150, deadline=None)
@given(
    pattern=st.sampled_from(["${.PVC.annotations.p}", "${.PVC.namespace}/${.PVC.annotations.p}",
                             "x/${.PVC.labels.l}/${.PVC.annotations.p}"]),
    value=st.lists(st.sampled_from(["..", ".", "", "/", "a", "b", "evil", "é", "\x00"]), max_size=6).map("".join),
    label=st.sampled_from(["a", "evil", ""]),
)
def test_whatever_a_claim_says_the_directory_made_is_inside_the_export(pattern: str, value: str,
                                                                       label: str) -> None:
    """Render, validate and create for real, with links planted to ``/`` and to a neighbour:
    either a refusal, or a new directory whose real path is strictly inside the export."""
    with tempfile.TemporaryDirectory() as tmp:
        export, outside = Path(tmp, "export"), Path(tmp, "outside")
        (export / "x").mkdir(parents=True)
        outside.mkdir()
        os.symlink("/", export / "evil")
        os.symlink(outside, export / "x" / "evil")
        before_root, before_outside = sorted(os.listdir("/")), snapshot(outside)
        meta = {"name": "c", "namespace": "ns", "labels": {"l": label} if label else {},
                "annotations": {"p": value}}
        try:
            sub = claim_subpath(pattern, meta, "pvc-1")
            Export(str(export)).make_directory(sub.parts, 0o777)
        except (PathRejected, UnsafeDirectory):
            pass
        else:
            real = os.path.realpath(export.joinpath(*sub.parts))
            assert real.startswith(str(export) + os.sep)
            assert os.path.isdir(real) and not os.path.islink(export.joinpath(*sub.parts))
        assert sorted(os.listdir("/")) == before_root
        assert snapshot(outside) == before_outside


# ---------------------------------------------------------------- small private files (ownership records)


def test_write_file_creates_a_private_directory_uncounted_and_replaces_atomically(layout: Layout) -> None:
    made: list[int] = []
    export = Export(str(layout.export), on_mkdir=lambda: made.append(1))
    export.write_file([".localpv", "owners"], "rec", b"one")
    export.write_file([".localpv", "owners"], "rec", b"two")
    assert export.read_file([".localpv", "owners"], "rec", 100) == b"two"
    assert mode(layout.export / ".localpv") == 0o700
    assert os.listdir(layout.export / ".localpv" / "owners") == ["rec"]
    assert mode(layout.export / ".localpv" / "owners" / "rec") == 0o600
    assert made == []  # not a volume directory: the directories-created metric is not moved


def test_read_and_remove_of_absent_files_and_directories(export: Export) -> None:
    assert export.read_file(["nope"], "rec", 100) is None
    assert export.remove_file(["nope"], "rec") is False
    assert export.find_files(["nope"], "rec") == []
    assert export.remove_empty_directory(["nope"]) is False
    export.write_file(["d"], "rec", b"x")
    assert export.read_file(["d"], "other", 100) is None
    assert export.remove_file(["d"], "rec") is True
    assert export.remove_file(["d"], "rec") is False


def test_remove_file_also_removes_a_temporary_left_by_an_interrupted_write(layout: Layout, export: Export) -> None:
    export.write_file(["d"], "rec", b"x")
    (layout.export / "d" / "rec.tmp").write_bytes(b"half")
    export.remove_file(["d"], "rec")
    assert os.listdir(layout.export / "d") == []


@pytest.mark.parametrize("plant", ["file-link", "dir-link", "fifo", "directory"])
def test_record_files_refuse_links_fifos_and_directories(layout: Layout, export: Export, plant: str) -> None:
    records = layout.export / "d"
    records.mkdir()
    if plant == "file-link":
        os.symlink(layout.outside / "secrets" / "key", records / "rec")
        os.symlink(layout.outside / "secrets" / "key", records / "rec.tmp")
    elif plant == "dir-link":
        os.rmdir(records)
        os.symlink(layout.outside / "secrets", records)
    elif plant == "fifo":
        os.mkfifo(records / "rec")
        os.mkfifo(records / "rec.tmp")
    else:
        (records / "rec").mkdir()
        (records / "rec.tmp").mkdir()
    before = layout.outside_snapshot()
    with pytest.raises(UnsafeDirectory):
        export.read_file(["d"], "rec", 100)
    with pytest.raises(UnsafeDirectory):
        export.write_file(["d"], "rec", b"forged")
    assert layout.outside_snapshot() == before
    assert (layout.outside / "secrets" / "key").read_text() == "do not touch"


def test_a_file_over_the_limit_is_refused(export: Export) -> None:
    export.write_file(["d"], "rec", b"x" * 101)
    with pytest.raises(OSError, match="larger than 100 bytes"):
        export.read_file(["d"], "rec", 100)
    assert export.read_file(["d"], "rec", 101) == b"x" * 101


def test_find_files_walks_only_the_subtree_asked_for_and_enters_no_link(layout: Layout, export: Export) -> None:
    for where in (["m"], ["m", "a"], ["m", "a", "b"], ["m", "c"], ["other", "x"]):
        export.write_file(where, "rec", b"x")
    (layout.export / "m" / "empty").mkdir()
    (layout.outside / "rec").write_text("decoy")
    os.symlink(layout.outside, layout.export / "m" / "c" / "link")
    assert export.find_files(["m"], "rec") == [("a",), ("a", "b"), ("c",)]
    assert export.find_files(["m", "a"], "rec") == [("b",)]
    assert export.find_files(["m", "a", "b"], "rec") == []


def test_remove_empty_directory_never_removes_contents(layout: Layout, export: Export) -> None:
    export.write_file(["d", "e"], "rec", b"x")
    assert export.remove_empty_directory(["d"]) is False
    assert export.remove_empty_directory(["d", "e"]) is False
    export.remove_file(["d", "e"], "rec")
    assert export.remove_empty_directory(["d", "e"]) is True
    assert export.remove_empty_directory(["d"]) is True
    assert os.listdir(layout.export) == []

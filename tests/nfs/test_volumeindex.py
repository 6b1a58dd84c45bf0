"""The index of PVs by directory answers what a scan of every PV would (property-based)."""

from __future__ import annotations

import posixpath
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from localpv.nfs.ownership import placement
from localpv.nfs.provisioner import NfsSource
from localpv.nfs.volumeindex import VolumeIndex

SERVER = "nfs.example"
SOURCE = NfsSource(SERVER, "/export", "/persistentvolumes")
SEGMENTS = st.sampled_from(["a", "b", "c", "..", "", "."])
PATHS = st.lists(SEGMENTS, min_size=0, max_size=4).map(lambda parts: "/export/" + "/".join(parts))
PVS = st.lists(st.tuples(st.sampled_from([SERVER, "other"]), PATHS), max_size=12)

Obj = dict[str, Any]


def pv(name: str, server: str, path: str) -> Obj:
    return {"metadata": {"name": name}, "spec": {"nfs": {"server": server, "path": path}}}


def scan_around(pvs: list[Obj], parts: tuple[str, ...]) -> list[str]:
    """The old way: every PV's path parsed, then compared."""
    found = []
    for p in pvs:
        nfs = p["spec"]["nfs"]
        if nfs["server"] != SERVER:
            continue
        try:
            other = SOURCE.subpath_of(nfs["path"])
        except ValueError:
            continue
        if placement("/".join(parts), other.relative) is not None:
            found.append(p["metadata"]["name"])
    return sorted(found)


def scan_users(pvs: list[Obj], server_path: str) -> list[str]:
    """Paths compared as written, normalised; everything is inside "/" (the old scan said
    nothing was, which would let the export's root be removed under every PV)."""
    mine = posixpath.normpath(server_path).rstrip("/")
    return sorted(p["metadata"]["name"] for p in pvs if p["spec"]["nfs"]["server"] == SERVER
                  and (posixpath.normpath(p["spec"]["nfs"]["path"]) == (mine or "/")
                       or posixpath.normpath(p["spec"]["nfs"]["path"]).startswith(mine + "/")))


@settings(max_examples=300, deadline=None)
@given(PVS, PVS, st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3), PATHS)
def test_the_index_answers_what_a_scan_would_through_adds_changes_and_deletes(
    first: list[tuple[str, str]], later: list[tuple[str, str]], query: list[str], raw: str
) -> None:
    index = VolumeIndex(SERVER, SOURCE.subpath_of)
    before = [pv(f"pv-{i}", server, path) for i, (server, path) in enumerate(first)]
    index.load(before)
    # Some PVs change path or server, some are deleted, new ones come (a relist's diff).
    after = [pv(f"pv-{i}", server, path) for i, (server, path) in enumerate(later)]
    for old in before:
        new = next((p for p in after if p["metadata"]["name"] == old["metadata"]["name"]), None)
        index.changed("MODIFIED" if new else "DELETED", old, new)
    for new in after[len(before):]:
        index.changed("ADDED", None, new)
    parts = tuple(query)
    assert [name for name, _, _ in index.around(parts)] == scan_around(after, parts)
    assert index.users(raw) == scan_users(after, raw)
    assert [name for name, _, _ in index.at(parts)] == [
        name for name in scan_around(after, parts)
        if SOURCE.subpath_of(next(p for p in after if p["metadata"]["name"] == name)["spec"]["nfs"]["path"]).parts
        == parts]

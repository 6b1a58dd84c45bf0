"""Discovery entries with long and odd names: a correct PV or a clear skip, never a crash."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localpv.agent.model import World
from localpv.agent.planner import plan
from localpv.agent.pvbuilder import NodeInfo, StorageClassInfo
from localpv.config import parse_config
from localpv.host.scan import scan_directory
from localpv.naming import pv_name

# Names a filesystem accepts: any bytes but "/" and NUL, at most 255 bytes.
names = st.one_of(
    st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=60),
    st.binary(min_size=1, max_size=60).map(lambda b: os.fsdecode(b.replace(b"/", b"_").replace(b"\0", b"_"))),
    st.just("x" * 255),
).filter(lambda n: n not in (".", "..") and len(os.fsencode(n)) <= 255)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(names, min_size=1, max_size=5, unique_by=os.fsencode))
def test_odd_entry_names_give_a_valid_pv_or_a_clear_reason(tmp_path: Path, entries: list[str]) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    for name in entries:
        os.mkdir(os.path.join(os.fsencode(root), os.fsencode(name)))
    # Treat every directory as a mount point: this is about names, not mounts.
    mounts = frozenset(os.path.join(str(root), n) for n in entries)
    config = parse_config({"storageClassMap": {"sc": {"hostDir": "/mnt/disks", "mountDir": str(root)}}}).config
    scans = {"sc": [replace(e, capacity=e.capacity or 1 << 20)
                    for e in scan_directory(str(root), mounts, simulated=mounts)]}
    world = World(config=config, node=NodeInfo("n1", "uid", {"kubernetes.io/hostname": "n1"}),
                  provisioner="p", storage_classes={"sc": StorageClassInfo("sc")}, scans=scans,
                  pvs=[], journal={}, cleanups={}, collisions={}, now=1.0)
    result = plan(world)
    assert len(result.creates) + len(result.skipped) == len(entries)
    for create in result.creates:
        json.dumps(create.pv, ensure_ascii=False).encode("utf-8")  # travels as UTF-8 JSON unchanged
        name = create.host_path.removeprefix("/mnt/disks/")
        assert create.pv["metadata"]["name"] == pv_name(name, "n1", "sc")
        assert create.pv["spec"]["local"]["path"] == f"/mnt/disks/{name}"
    for skip in result.skipped:
        assert skip.error and "rename it" in skip.reason

"""CHANGELOG.md has an entry for this version with an Upgrading note that names what the release
writes on disk in the formats the code writes (issue 26): a format bumped without a word to
the people who upgrade fails here. docs/operations.md's table of files on disk says the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localpv import __version__
from localpv.agent import journal as agent_journal
from localpv.csi import journal as image_journal
from localpv.nfs import ownership

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"
OPERATIONS = REPO / "docs" / "operations.md"

#: What the code writes, as the docs name it: (name in the docs, format written, formats read).
ON_DISK = [
    ("`journal.json`", agent_journal.FORMAT_VERSION, agent_journal.READABLE_VERSIONS),
    ("`csi-images.json`", image_journal.FORMAT_VERSION, (image_journal.FORMAT_VERSION,)),
    ("ownership records", ownership.FORMAT_VERSION, (1, ownership.FORMAT_VERSION)),
]


def entries() -> dict[str, str]:
    """Each release's entry, by version."""
    parts = re.split(r"^## (\d+\.\d+\.\d+)\b.*$", CHANGELOG.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_newest_entry_is_this_version() -> None:
    assert next(iter(entries())) == __version__


@pytest.mark.parametrize("version", list(entries()))
def test_every_entry_says_how_to_upgrade_what_it_writes_and_how_far_to_roll_back(version: str) -> None:
    upgrading = entries()[version].split("### Upgrading", 1)
    assert len(upgrading) == 2, f"{version}: no Upgrading note"
    note = upgrading[1]
    assert "On disk" in note and "Rollback" in note, f"{version}: the Upgrading note must say what is on disk " \
                                                      "and how far back a rollback is safe"


@pytest.mark.parametrize(("name", "written", "read"), ON_DISK, ids=[n for n, _, _ in ON_DISK])
def test_the_newest_entry_names_the_formats_the_code_writes(name: str, written: int, read: tuple[int, ...]) -> None:
    note = entries()[__version__].split("### Upgrading", 1)[1]
    assert re.search(rf"{re.escape(name)}\s+format {written}\b", note), f"CHANGELOG {__version__}: {name} format " \
                                                                        f"{written} is not said"


@pytest.mark.parametrize(("name", "written", "read"), ON_DISK, ids=[n for n, _, _ in ON_DISK])
def test_the_operations_table_of_files_on_disk_has_the_formats(name: str, written: int, read: tuple[int, ...]) -> None:
    section = OPERATIONS.read_text().split("### What each release changes on disk", 1)[1].split("\n## ", 1)[0]
    [row] = [line for line in section.splitlines() if line.startswith(f"| {name} |")]
    fmt = row.split("|")[3].strip()
    older = sorted(set(read) - {written})
    assert fmt == f"{written}" + (f"; reads {', '.join(map(str, older))}" if older else ""), row
    assert "CHANGELOG.md" in section

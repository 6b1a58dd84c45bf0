"""docs/operations.md: its sections are where the alerts and other docs point, its internal
links resolve, and every ``localpv`` command line it shows uses options that exist."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import yaml

from localpv.cli import cli

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "operations.md"
ALERTS = REPO / "helm" / "localpv" / "files" / "alerts.yaml"

#: Headings other documents and the alerts link to: renaming one breaks their anchors.
HEADINGS = (
    "Adding and removing a disk",
    "A volume stuck Released or a cleanup failing",
    "The journal",
    "Node re-image and node removal",
    "Changing a class's hostDir or mountDir",
    "Upgrading",
    "Rolling back to upstream",
    "Migrating a cluster node by node",
    "Sharing one NFS export between clusters",
    "Alerts",
)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_sections_others_link_to_exist() -> None:
    headings = re.findall(r"^## (.+)$", DOC.read_text(), re.M)
    missing = [h for h in HEADINGS if h not in headings]
    assert not missing, f"docs/operations.md lost sections others link to: {missing}"


def test_the_anchor_function_matches_githubs() -> None:
    assert anchor("Changing a class's hostDir or mountDir") == "changing-a-classs-hostdir-or-mountdir"
    assert anchor("Discovery errors: an agent not ready") == "discovery-errors-an-agent-not-ready"


def test_internal_links_resolve() -> None:
    text = DOC.read_text()
    broken = sorted(set(re.findall(r"\]\(#([^)]+)\)", text)) - anchors(text))
    assert not broken, f"links to missing sections of docs/operations.md: {broken}"


def test_links_to_other_files_resolve() -> None:
    targets = re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", DOC.read_text())
    missing = [t for t in targets if not (DOC.parent / t).is_file()]
    assert not missing, missing


def _alerts() -> list[dict[str, object]]:
    if not ALERTS.exists():
        pytest.skip("helm/localpv/files/alerts.yaml is not there")
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def test_every_alert_runbook_points_at_a_section_of_this_doc() -> None:
    sections = anchors(DOC.read_text())
    for rule in _alerts():
        url = str((rule.get("annotations") or {}).get("runbook_url", ""))  # type: ignore[union-attr]
        path, _, fragment = url.partition("#")
        if path == "docs/operations.md":
            assert fragment in sections, f"{rule['alert']}: runbook_url {url} names no section of docs/operations.md"


def test_the_alerts_section_names_every_alert() -> None:
    section = DOC.read_text().split("\n## Alerts\n", 1)[1]
    missing = [str(rule["alert"]) for rule in _alerts() if f"`{rule['alert']}`" not in section]
    assert not missing, f"add these alerts to the Alerts section of docs/operations.md: {missing}"


# ------------------------------------------------------------------ the commands shown are real

#: ``localpv <command> ...`` where a command line starts: a line, inline code, after ``--`` (kubectl exec) or ``$ ``.
_COMMAND = re.compile(r"(?:^|`|-- |\$ )localpv ((?:config )?[a-z][a-z-]*)((?: [^\s`|]+)*)", re.M)


def _command_lines(text: str) -> list[tuple[str, list[str]]]:
    found = []
    for match in _COMMAND.finditer(text):
        name, rest = match.group(1), match.group(2)
        options = re.findall(r"(?<!\S)(--[a-z][a-z-]*)", rest)
        found.append((name, options))
    return found


def _click_command(name: str) -> click.Command | None:
    command: click.Command | None = cli
    for part in name.split():
        assert isinstance(command, click.Group)
        command = command.commands.get(part)
        if command is None:
            return None
    return command


def test_every_localpv_command_line_in_the_doc_exists_with_its_options() -> None:
    lines = _command_lines(DOC.read_text())
    assert len(lines) > 10
    for name, options in lines:
        command = _click_command(name)
        assert command is not None, f"docs/operations.md shows `localpv {name}`, which is no command"
        known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        unknown = [o for o in options if o not in known]
        assert not unknown, f"`localpv {name}` has no option {unknown}"


def test_the_command_line_check_can_fail() -> None:
    assert _command_lines("run `localpv status --agent-url X --nope`") == [("status", ["--agent-url", "--nope"])]
    command = _click_command("status")
    assert command is not None
    assert "--nope" not in {opt for param in command.params for opt in param.opts}

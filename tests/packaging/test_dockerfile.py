"""The Dockerfile provides what the chart and the agent rely on.

There is no container engine here to build it, so it is parsed: the base image, the
entrypoint the chart's ``args`` are given to, the cleaner scripts at upstream's /scripts,
the tools those scripts call (each traced to its Debian package on this Debian machine),
and the unprivileged default user that only the node-cleanup Deployment keeps.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from localpv.config import DEFAULT_BLOCK_CLEANER

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
SCRIPTS = REPO / "scripts"

#: Commands the cleaner scripts run (each must really appear in a script, see below).
SCRIPT_TOOLS = ("bash", "mkfs", "wipefs", "blkdiscard", "ionice", "shred", "dd", "find", "findmnt", "readlink",
                "dirname")
#: Programs those commands run in turn (``mkfs -t ext4`` runs mkfs.ext4).
IMPLIED_TOOLS = ("mkfs.ext4",)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (the Dockerfile grammar
    this file uses: no heredocs, no parser directives)."""
    out: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        start = start or number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
        pending, start = "", 0
    assert not pending, "Dockerfile ends inside a continued line"
    return out


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse(DOCKERFILE.read_text())


def _all(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def apt_packages(instructions: list[Instruction]) -> set[str]:
    packages: set[str] = set()
    for run in _all(instructions, "RUN"):
        words = shlex.split(run.args)
        for i, word in enumerate(words[:-1]):
            if word == "apt-get" and "install" in words[i + 1:i + 3]:
                rest = words[words.index("install", i) + 1:]
                for token in rest:
                    if token in ("&&", ";", "||"):
                        break
                    if not token.startswith("-"):
                        packages.add(token)
    return packages


def test_parser_joins_continuations_and_skips_comments() -> None:
    parsed = parse("FROM a\n# note\nRUN one \\\n  # inside\n  two\nUSER 5\n")
    assert [(i.keyword, i.args) for i in parsed] == [("FROM", "a"), ("RUN", "one  two"), ("USER", "5")]


def test_base_is_a_small_python_311_debian_image(instructions: list[Instruction]) -> None:
    [base] = _all(instructions, "FROM")
    assert re.fullmatch(r"python:3\.11-slim-bookworm", base.args)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"


def test_entrypoint_is_the_localpv_command_the_chart_passes_args_to(instructions: list[Instruction]) -> None:
    [entrypoint] = _all(instructions, "ENTRYPOINT")
    assert json.loads(entrypoint.args) == ["localpv"]  # exec form: signals reach the agent
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["localpv"] == "localpv.cli:main"
    from localpv.cli import cli

    templates = (REPO / "helm" / "localpv" / "templates")
    commands = set(re.findall(r"args:\n\s+- ([a-z-]+)\n", "".join(p.read_text() for p in templates.glob("*.yaml"))))
    assert commands == {"agent", "nfs", "node-cleanup"}
    assert commands <= set(cli.commands)


def test_scripts_are_installed_at_upstreams_path(instructions: list[Instruction]) -> None:
    copies = [i.args.split() for i in _all(instructions, "COPY")]
    assert ["scripts", "/scripts"] in copies
    assert any("chmod 0755 /scripts/*.sh" in r.args for r in _all(instructions, "RUN"))
    shipped = {p.name for p in SCRIPTS.glob("*.sh")}
    referenced = {Path(DEFAULT_BLOCK_CLEANER[0]).name}
    values = yaml.safe_load((REPO / "helm" / "localpv" / "values.yaml").read_text())
    for cls in values["classes"]:
        referenced.add(Path(cls["blockCleanerCommand"][0]).name)
    assert referenced <= shipped
    assert {"quick_reset.sh", "shred.sh", "dd_zero.sh", "blkdiscard.sh", "fsclean.sh", "common.sh"} <= shipped


def test_the_package_is_installed_with_its_scripts(instructions: list[Instruction]) -> None:
    copied = {tuple(i.args.split()) for i in _all(instructions, "COPY")}
    assert {("localpv", "/src/localpv"), ("scripts", "/src/scripts")} <= copied  # localpv/scripts links there
    assert any(r.args.startswith("pip install --no-cache-dir /src") for r in _all(instructions, "RUN"))
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert {"*", "!pyproject.toml", "!README.md", "!localpv/", "!scripts/"} <= set(ignored)


def test_every_tool_the_scripts_call_is_installed(instructions: list[Instruction]) -> None:
    scripts = "\n".join(p.read_text() for p in SCRIPTS.glob("*.sh"))
    for tool in SCRIPT_TOOLS:
        assert re.search(rf"(^|[\s(]){re.escape(tool)}(\s|$)", scripts, re.M), f"{tool} is not used any more"
    packages = apt_packages(instructions)
    assert {"util-linux", "e2fsprogs", "coreutils", "bash"} <= packages
    if shutil.which("dpkg") is None:
        pytest.skip("dpkg is not available to trace tools to packages")
    for tool in SCRIPT_TOOLS + IMPLIED_TOOLS:
        path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
        assert path, f"{tool} is not installed on this machine either"
        owner = subprocess.run(["dpkg", "-S", str(Path(path).resolve())], check=False, capture_output=True, text=True)
        if owner.returncode != 0:  # /bin vs /usr/bin after the usrmerge
            owner = subprocess.run(["dpkg", "-S", Path(path).name], check=False, capture_output=True, text=True)
        owning = {line.split(":")[0] for line in owner.stdout.splitlines() if line.endswith("/" + Path(path).name)}
        assert owning & packages, f"{tool} comes from {owning or '?'}, which the Dockerfile does not install"


def test_default_user_is_unprivileged_and_the_chart_knows_which_uid(instructions: list[Instruction]) -> None:
    users = _all(instructions, "USER")
    assert users, "the image would run as root"
    last_run = max(i.line for i in _all(instructions, "RUN"))
    assert users[-1].line > last_run, "install steps after USER would run unprivileged and fail"
    uid = users[-1].args.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert any(f"--uid {uid}" in r.args for r in _all(instructions, "RUN")), "the user is not created"
    values = yaml.safe_load((REPO / "helm" / "localpv" / "values.yaml").read_text())
    assert values["nodeCleanup"]["securityContext"]["runAsUser"] == int(uid)
    assert values["nodeCleanup"]["securityContext"]["runAsNonRoot"] is True

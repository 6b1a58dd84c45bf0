"""The Dockerfile provides what the chart and the agent rely on.

There is no container engine here to build it, so it is parsed: the base image (pinned by
digest, the same for both stages), the build from the lock files into a venv that the final
stage copies, the final stage free of pip and compilers, the entrypoint the chart's ``args``
are given to, the cleaner scripts at upstream's /scripts, the tools those scripts call (each
traced to its Debian package on this Debian machine), and the unprivileged default user that
only the node-cleanup Deployment keeps. (.ci/e2e builds and runs the image for real.)
"""

from __future__ import annotations

import ast
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
                        packages.add(token.rstrip(";"))
                    if token.endswith(";"):
                        break
    return packages


def test_parser_joins_continuations_and_skips_comments() -> None:
    parsed = parse("FROM a\n# note\nRUN one \\\n  # inside\n  two\nUSER 5\n")
    assert [(i.keyword, i.args) for i in parsed] == [("FROM", "a"), ("RUN", "one  two"), ("USER", "5")]


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    """The instructions of the last stage: what the image is made of."""
    last_from = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    return instructions[last_from:]


def test_base_is_a_small_python_311_debian_image_pinned_by_digest(instructions: list[Instruction]) -> None:
    # One ARG before the first FROM names the base; a local build overrides it with
    # --build-arg BASE_IMAGE=python:3.11-slim-bookworm (a stand-in of that name).
    assert instructions[0].keyword == "ARG"
    name, _, default = instructions[0].args.partition("=")
    assert name == "BASE_IMAGE"
    assert re.fullmatch(r"docker\.io/library/python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", default), default
    froms = _all(instructions, "FROM")
    assert len(froms) == 2, "a builder stage and the final stage"
    assert froms[0].args == "${BASE_IMAGE} AS builder"
    assert froms[1].args == "${BASE_IMAGE}", "the venv's python links to the base's: both stages share it"
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
    assert commands == {"agent", "nfs", "node-cleanup", "claim-labeller"}
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


def test_the_package_is_built_and_installed_from_the_lock_files(instructions: list[Instruction]) -> None:
    final = final_stage(instructions)
    builder = instructions[:instructions.index(final[0])]
    copied = {tuple(i.args.split()) for i in _all(builder, "COPY")}
    assert {("localpv", "/src/localpv"), ("scripts", "/src/scripts")} <= copied  # localpv/scripts links there
    assert ("requirements-build.lock", "requirements.lock", "/src/") in copied
    runs = " ".join(r.args for r in _all(builder, "RUN"))
    # Dependencies only from the hash-pinned lock, as wheels; the project alone, no index.
    assert re.search(r"install --require-hashes --no-deps --only-binary :all: -r /src/requirements-build\.lock", runs)
    assert re.search(r"install\s+--require-hashes --no-deps --only-binary :all: -r /src/requirements\.lock", runs)
    assert "pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src" in runs
    assert re.search(r"install --no-deps --no-index /wheels/localpv-\*\.whl", runs)
    assert "venv --without-pip /opt/localpv" in runs, "the runtime venv must never hold pip"
    # The final stage takes the venv and nothing else from the builder.
    assert [c.args for c in _all(final, "COPY") if c.args.startswith("--from")] == [
        "--from=builder /opt/localpv /opt/localpv"]
    [env] = [e for e in _all(final, "ENV") if "PATH=" in e.args]
    assert re.search(r"\bPATH=/opt/localpv/bin:", env.args)
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert {"*", "!pyproject.toml", "!README.md", "!requirements.lock", "!requirements-build.lock", "!localpv/",
            "!scripts/"} <= set(ignored)


def test_the_final_stage_has_no_pip_and_no_compiler(instructions: list[Instruction]) -> None:
    final = final_stage(instructions)
    runs = " ".join(r.args for r in _all(final, "RUN"))
    assert "pip install" not in runs and "pip wheel" not in runs
    assert not apt_packages(final) & {"gcc", "cc", "g++", "clang", "make", "build-essential", "python3-pip",
                                      "python3-dev", "libc6-dev"}
    # pip, setuptools, wheel and ensurepip are removed from the base (its site directories and
    # Debian's packages, for a Debian-built base), and the build fails if one is still importable.
    assert "apt-get purge -y $pipdebs" in runs
    for gone in ('"$d"/pip ', '"$d"/setuptools ', '"$d"/wheel ', '"$d"/pkg_resources ', "/usr/share/python-wheels",
                 "/usr/local/bin/pip3 "):
        assert gone in runs, gone
    assert re.search(r"for m in pip setuptools wheel ensurepip; do .*exit 1", runs)


def test_every_tool_the_scripts_call_is_installed(instructions: list[Instruction]) -> None:
    scripts = "\n".join(p.read_text() for p in SCRIPTS.glob("*.sh"))
    for tool in SCRIPT_TOOLS:
        assert re.search(rf"(^|[\s(]){re.escape(tool)}(\s|$)", scripts, re.M), f"{tool} is not used any more"
    packages = apt_packages(final_stage(instructions))
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


def kubernetes_aio_imports(source: str) -> list[int]:
    """Lines of ``source`` that import kubernetes' asyncio client (kubernetes.aio)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            if any(a.name == "kubernetes.aio" or a.name.startswith("kubernetes.aio.") for a in node.names):
                found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module:
            whole = node.module == "kubernetes.aio" or node.module.startswith("kubernetes.aio.")
            if whole or (node.module == "kubernetes" and any(a.name == "aio" for a in node.names)):
                found.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("kubernetes.aio"):
            found.append(node.lineno)  # importlib.import_module("kubernetes.aio...")
    return found


def test_the_image_can_go_without_kubernetes_asyncio_client(instructions: list[Instruction]) -> None:
    runs = " ".join(r.args for r in _all(instructions, "RUN"))
    assert 'rm -rf "$site/kubernetes/aio"' in runs
    uses = {str(p.relative_to(REPO)): lines for p in (REPO / "localpv").rglob("*.py")
            if (lines := kubernetes_aio_imports(p.read_text()))}
    assert uses == {}, f"localpv imports kubernetes.aio, which the image leaves out: {uses}"
    for bad in ("import kubernetes.aio", "from kubernetes import client, aio", "from kubernetes.aio.client import X",
                "import importlib\nimportlib.import_module('kubernetes.aio')"):
        assert kubernetes_aio_imports(bad), bad
    assert not kubernetes_aio_imports("from kubernetes import client, config\nimport kubernetes.client")

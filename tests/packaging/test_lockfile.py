"""The image's Python dependencies come from lock files that cannot drift from pyproject.toml.

``requirements.lock`` pins, with hashes, the runtime dependencies declared in pyproject.toml
and everything they pull in; ``requirements-build.lock`` does the same for the build system
(setuptools, wheel). Both are made by pip-tools (see their headers); the Dockerfile installs
them with ``--require-hashes --no-deps``, so a dependency added to pyproject.toml but not to
the lock would be missing from the image, and one the lock pins outside pyproject.toml's
range would be a version the tests never allowed.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = REPO / "requirements.lock"
BUILD_LOCK = REPO / "requirements-build.lock"
#: What pip-compile writes in "# via" for a requirement pyproject.toml names itself.
RUNTIME_ORIGIN = "localpv (pyproject.toml)"
BUILD_ORIGIN = "localpv (pyproject.toml::build-system.requires)"
#: The image's interpreter: markers in pyproject.toml are judged for it.
IMAGE_ENVIRONMENT = {"python_version": "3.11", "python_full_version": "3.11.16", "sys_platform": "linux",
                     "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                     "implementation_name": "cpython", "platform_python_implementation": "CPython"}
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass
class Pin:
    name: str
    version: str
    hashes: list[str]
    line: int
    via: set[str] = field(default_factory=set)
    options: list[str] = field(default_factory=list)


def parse_lock(text: str) -> list[Pin]:
    """The pins of a pip-compile output: ``name==version \\`` with ``--hash`` continuation lines,
    then ``# via`` comment lines (one origin, or several indented under a bare ``# via``)."""
    pins: list[Pin] = []
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        logical.append((start, pending + raw))
        pending = ""
    if pending:
        raise ValueError("the lock file ends inside a continued line")
    in_via = False
    for number, line in logical:
        stripped = line.strip()
        if not stripped:
            in_via = False
            continue
        if stripped.startswith("#"):
            comment = stripped.lstrip("#").strip()
            if pins and comment.startswith("via"):
                rest = comment[3:].strip()
                in_via = not rest
                if rest:
                    pins[-1].via.add(rest)
            elif pins and in_via and line.startswith("    #   "):
                pins[-1].via.add(comment)
            else:
                in_via = False
            continue
        in_via = False
        if stripped.startswith("-"):
            continue  # an option line (--index-url, -e ...): lock_problems reports it
        words = stripped.split()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", words[0])
        if not match:
            raise ValueError(f"line {number}: not an exact pin: {words[0]!r}")
        hashes = [w for w in words[1:] if HASH.fullmatch(w)]
        options = [w for w in words[1:] if not HASH.fullmatch(w)]
        pins.append(Pin(canonicalize_name(match.group(1)), match.group(2), hashes, number, options=options))
    return pins


def lock_problems(text: str, declared: list[str], origin: str) -> list[str]:
    """What is wrong with a lock against the requirements it must cover; [] when nothing."""
    problems: list[str] = []
    try:
        pins = parse_lock(text)
    except ValueError as err:
        return [str(err)]
    by_name: dict[str, Pin] = {}
    for pin in pins:
        if pin.name in by_name:
            problems.append(f"{pin.name} is pinned twice (lines {by_name[pin.name].line} and {pin.line})")
        by_name[pin.name] = pin
        if not pin.hashes:
            problems.append(f"{pin.name}=={pin.version} has no sha256 hash")
        if pin.options:
            problems.append(f"{pin.name}=={pin.version} carries more than hashes: {pin.options}")
        try:
            Version(pin.version)
        except InvalidVersion:
            problems.append(f"{pin.name}=={pin.version}: not a valid version")
    for line in text.splitlines():
        if re.match(r"\s*-", line) and not HASH.search(line):
            problems.append(f"an option line: {line.strip()!r} (index URLs and paths stay out of the lock)")
        if "://" in line:
            problems.append(f"a URL in the lock: {line.strip()!r}")

    wanted: dict[str, Requirement] = {}
    for spec in declared:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate(IMAGE_ENVIRONMENT):
            wanted[canonicalize_name(req.name)] = req
    direct = {p.name for p in pins if origin in p.via}
    for name in sorted(wanted.keys() - by_name.keys()):
        problems.append(f"{name} is declared in pyproject.toml but not pinned")
    for name in sorted(wanted.keys() & by_name.keys()):
        if name not in direct:
            problems.append(f"{name} is pinned but not marked as required by pyproject.toml ({origin})")
        if not wanted[name].specifier.contains(by_name[name].version, prereleases=True):
            problems.append(f"{name}=={by_name[name].version} is outside pyproject.toml's "
                            f"{name}{wanted[name].specifier}")
    for name in sorted(direct - wanted.keys()):
        problems.append(f"{name} is marked as required by pyproject.toml, which does not declare it")
    for pin in pins:
        if not pin.via:
            problems.append(f"{pin.name} says nothing of what requires it")
        for parent in pin.via - {origin}:
            if canonicalize_name(parent.split()[0]) not in by_name:
                problems.append(f"{pin.name} is pinned for {parent}, which the lock does not pin")
    return problems


def _project() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_runtime_lock_covers_exactly_the_declared_dependencies() -> None:
    declared = _project()["project"]["dependencies"]  # type: ignore[index]
    assert lock_problems(RUNTIME_LOCK.read_text(), declared, RUNTIME_ORIGIN) == []


def test_runtime_lock_holds_no_test_tools() -> None:
    project = _project()["project"]
    runtime = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}  # type: ignore[index]
    test_only = {canonicalize_name(Requirement(r).name)
                 for r in project["optional-dependencies"]["test"]} - runtime  # type: ignore[index]
    pinned = {p.name for p in parse_lock(RUNTIME_LOCK.read_text())}
    assert "pytest" in test_only
    assert not pinned & test_only, f"test extras in the image's lock: {sorted(pinned & test_only)}"


def test_build_lock_covers_exactly_the_build_system() -> None:
    declared = _project()["build-system"]["requires"]  # type: ignore[index]
    assert lock_problems(BUILD_LOCK.read_text(), declared, BUILD_ORIGIN) == []


@pytest.mark.parametrize("lock", [RUNTIME_LOCK, BUILD_LOCK], ids=lambda p: p.name)
def test_lock_header_says_how_to_regenerate_it(lock: Path) -> None:
    head = lock.read_text().split("\n\n", 1)[0]
    assert "autogenerated by pip-compile with Python 3.11" in head
    assert re.search(rf"piptools compile --generate-hashes .*--output-file={re.escape(lock.name)} pyproject\.toml",
                     head), head


# The checker itself: each kind of drift is caught.
GOOD = """\
click==8.1.7 \\
    --hash=sha256:{h1}
    # via localpv (pyproject.toml)
colorama==0.4.6 \\
    --hash=sha256:{h2}
    # via
    #   click
    #   localpv (pyproject.toml)
""".format(h1="a" * 64, h2="b" * 64)


def test_checker_accepts_a_good_lock() -> None:
    assert lock_problems(GOOD, ["click>=8.1", "colorama"], RUNTIME_ORIGIN) == []
    assert [p.name for p in parse_lock(GOOD)] == ["click", "colorama"]
    assert parse_lock(GOOD)[1].via == {"click", RUNTIME_ORIGIN}


@pytest.mark.parametrize(("declared", "text", "expected"), [
    (["click>=8.1", "colorama", "psutil"], GOOD, "psutil is declared in pyproject.toml but not pinned"),
    (["click>=9", "colorama"], GOOD, "click==8.1.7 is outside pyproject.toml's click>=9"),
    (["click>=8.1"], GOOD, "colorama is marked as required by pyproject.toml, which does not declare it"),
    (["click>=8.1", "colorama"], GOOD.replace("    --hash=sha256:" + "a" * 64 + "\n", "").replace(
        "click==8.1.7 \\\n", "click==8.1.7\n"), "click==8.1.7 has no sha256 hash"),
    (["click>=8.1", "colorama"], GOOD.replace("click==8.1.7", "click>=8.1.7"), "not an exact pin"),
    (["click>=8.1", "colorama"], "--index-url https://example.invalid/simple\n" + GOOD, "an option line"),
    (["click>=8.1", "colorama"], GOOD + "six==1.16.0 \\\n    --hash=sha256:" + "c" * 64 + "\n    # via gone\n",
     "six is pinned for gone, which the lock does not pin"),
])
def test_checker_catches_drift(declared: list[str], text: str, expected: str) -> None:
    problems = lock_problems(text, declared, RUNTIME_ORIGIN)
    assert any(expected in p for p in problems), problems


def test_markers_are_judged_for_the_image_interpreter() -> None:
    # A dependency only for Windows, or only for Python < 3.11, need not be pinned.
    assert lock_problems(GOOD, ["click>=8.1", "colorama", "pywin32; sys_platform == 'win32'",
                                "tomli; python_version < '3.11'"], RUNTIME_ORIGIN) == []

"""Set localpv's version everywhere a user reads it, from the one source, ``localpv.__version__``.

    python3 -m tools.version 0.2.0     # write 0.2.0 in every place below
    python3 -m tools.version --check   # exit 1 naming each place that disagrees with __version__

The places: the package (``localpv/__init__.py``; pyproject.toml reads it, and so do
``localpv --version`` and .ci/e2e), the chart's ``version`` and ``appVersion`` (its default
image is ``localpv:<appVersion>``), and every image tag (``localpv:X.Y.Z``, ``tag: "X.Y.Z"``)
and release link (``/blob/vX.Y.Z/``) in the README, docs/, the chart's values, CI values files
and generated README. CHANGELOG.md is not rewritten: a release adds its own entry
(tests/packaging/test_changelog.py holds its newest entry to the version).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEMVER = r"(\d+\.\d+\.\d+)"


@dataclass(frozen=True)
class Place:
    """Where a version is written: files (globs under the repository) and a pattern whose one
    group is the version; ``required``: the pattern must match in each file at least once."""

    globs: tuple[str, ...]
    pattern: re.Pattern[str]
    required: bool = False


PLACES = (
    Place(("localpv/__init__.py",), re.compile(rf'^__version__ = "{SEMVER}"$', re.M), required=True),
    Place(("helm/localpv/Chart.yaml",), re.compile(rf"^version: {SEMVER}$", re.M), required=True),
    Place(("helm/localpv/Chart.yaml",), re.compile(rf'^appVersion: "{SEMVER}"$', re.M), required=True),
    Place(("helm/localpv/README.md",), re.compile(rf"^Chart `localpv` {SEMVER} \(localpv {SEMVER}\)", re.M),
          required=True),
    *(Place(("README.md", "docs/*.md", "helm/localpv/README.md", "helm/localpv/values.yaml",
             "helm/localpv/ci/*.yaml"), re.compile(pattern))
      for pattern in (rf"\blocalpv:{SEMVER}", rf'\btag: "{SEMVER}"', rf"/blob/v{SEMVER}/")),
)


def version_files(root: Path) -> list[Path]:
    """Every file that may hold a version (what a copy of the repository for the tool needs)."""
    return sorted({path for place in PLACES for glob in place.globs for path in root.glob(glob)})


def check(root: Path, version: str) -> list[str]:
    """One line per place under ``root`` that says another version than ``version``."""
    problems = []
    for place in PLACES:
        for glob in place.globs:
            for path in sorted(root.glob(glob)):
                text = path.read_text(encoding="utf-8")
                matches = list(place.pattern.finditer(text))
                name = path.relative_to(root)
                if place.required and not matches:
                    problems.append(f"{name}: no version where {place.pattern.pattern} expects one")
                for match in matches:
                    found = [g for g in match.groups() if g != version]
                    if found:
                        line = text.count("\n", 0, match.start()) + 1
                        problems.append(f"{name}:{line}: {found[0]} instead of {version}")
    return problems


def set_version(root: Path, version: str) -> None:
    """Write ``version`` in every place under ``root``."""
    if not re.fullmatch(SEMVER, version):
        raise ValueError(f"expected a version X.Y.Z, got {version!r}")
    for place in PLACES:
        for glob in place.globs:
            for path in root.glob(glob):
                text = path.read_text(encoding="utf-8")
                new = place.pattern.sub(lambda m: _replace_groups(m, version), text)
                if new != text:
                    path.write_text(new, encoding="utf-8")


def _replace_groups(match: re.Match[str], version: str) -> str:
    text, start = match.group(0), match.start()
    out, at = [], 0
    for i in range(1, (match.re.groups or 0) + 1):
        out.append(text[at:match.start(i) - start])
        out.append(version)
        at = match.end(i) - start
    return "".join(out) + text[at:]


def current() -> str:
    """The source's version (read, not imported: the tool works on any checkout)."""
    match = PLACES[0].pattern.search((REPO / "localpv" / "__init__.py").read_text(encoding="utf-8"))
    if match is None:
        raise SystemExit("localpv/__init__.py: no __version__ line")
    return match.group(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.version", description=__doc__.split("\n")[0])
    parser.add_argument("version", nargs="?", help="the new version, X.Y.Z")
    parser.add_argument("--check", action="store_true", help="exit 1 if a place disagrees with __version__")
    args = parser.parse_args(argv)
    if args.check == bool(args.version):
        parser.error("give a version or --check")
    if args.version:
        try:
            set_version(REPO, args.version)
        except ValueError as err:
            parser.error(str(err))
        print(f"version {args.version}: python3 -m tools.chart_readme --check, and add a CHANGELOG.md entry")
        return 0
    problems = check(REPO, current())
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Maintainer tools (documentation generators); not part of the installed package."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(path: Path, text: str, current: str, *, check: bool, repo: Path, command: str) -> int:
    """The generators' common ending: with ``check``, exit status 1 when ``path`` is stale
    (naming the command that regenerates it); otherwise write it if it changed."""
    name = path.relative_to(repo)
    if check:
        if text != current:
            print(f"{name} is stale: run {command}", file=sys.stderr)
            return 1
        return 0
    if text != current:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {name}")
    return 0

"""A Python environment with real Helm in it (PyPI ``helm-sdkpy``: the Helm Go library
behind a small C API), for installing the chart into the API emulator.

helm-sdkpy declares Python >= 3.12 while the project runs on 3.11, so it lives in its own
virtual environment and is driven in a subprocess (``helm_runner.py``). A subprocess is
needed anyway: Go reads ``HELM_DRIVER`` once, when the library loads, and only the
in-memory release driver keeps Helm from writing its release Secret in protobuf, which
the JSON-only emulator cannot read.

The interpreter is the first Python >= 3.12 found (PATH, then pyenv). When there is none,
the current interpreter is used with ``--ignore-requires-python``: the package is pure
Python over cffi and works on 3.11 (checked for the pinned version). The environment is
cached per user (``LOCALPV_HELM_VENV`` overrides the place), so only the first test
session pays for it (about 15 s). ``python -m tests.helm.helmenv`` builds it, for CI.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

HELM_SDKPY = "helm-sdkpy==0.1.32"


class HelmUnavailable(Exception):
    """Helm could not be installed here; the message says why."""


def venv_dir() -> Path:
    override = os.environ.get("LOCALPV_HELM_VENV")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "localpv" / HELM_SDKPY.replace("==", "-")


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return (int(out[0]), int(out[1])) if len(out) == 2 else None


def find_python() -> tuple[str, bool]:
    """An interpreter for the environment, and whether it satisfies helm-sdkpy's Requires-Python."""
    candidates = [shutil.which(f"python3.{minor}") for minor in range(12, 16)]
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.1[2-9]*", "bin", "python3")))
    for python in filter(None, candidates):
        version = _version(python)
        if version is not None and version >= (3, 12):
            return python, True
    return sys.executable, False


def _python_in(venv: Path) -> Path:
    return venv / "bin" / "python"


def _works(python: Path) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run([str(python), "-c", "import helm_sdkpy; helm_sdkpy.get_version()"],
                           capture_output=True, text=True, timeout=120, check=False)
    return probe.returncode == 0


def ensure_helm_python() -> Path:
    """The interpreter of a virtual environment where ``import helm_sdkpy`` works; build it if needed."""
    venv = venv_dir()
    python = _python_in(venv)
    if _works(python):
        return python
    base, satisfied = find_python()
    shutil.rmtree(venv, ignore_errors=True)
    steps = [[base, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              *([] if satisfied else ["--ignore-requires-python"]), HELM_SDKPY]]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0:
            raise HelmUnavailable(f"{' '.join(step)} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    if not _works(python):
        raise HelmUnavailable(f"helm_sdkpy does not import in {venv}")
    return python


def main() -> int:
    try:
        python = ensure_helm_python()
    except HelmUnavailable as err:
        print(f"helm: {err}", file=sys.stderr)
        return 1
    print(f"helm-sdkpy ready: {python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

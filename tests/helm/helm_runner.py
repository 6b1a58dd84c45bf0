"""Runs Helm actions for the chart tests, inside the helm-sdkpy environment (see helmenv.py).

Reads a JSON list of actions on stdin and prints a JSON list of outcomes, one per action,
so one process (and one load of the 120 MB Go library) serves several installs. Each
outcome is ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``: a failed
install is an answer the tests look at (schema errors, ``fail`` messages), not a crash.

Must run with HELM_DRIVER=memory in the environment from the start (the emulator), or with
``--real-cluster`` (tests/e2e: a real API server stores Helm's release Secrets). Imports nothing from
localpv: this interpreter may not have the project installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

ACTION_MARKER = "--- localpv helm action "


def _run(action: dict[str, Any]) -> Any:
    import helm_sdkpy

    config = helm_sdkpy.Configuration(namespace=action.get("namespace", "default"),
                                      kubeconfig=action.get("kubeconfig"))
    if action["op"] == "install":
        install = helm_sdkpy.Install(config)
        return asyncio.run(install.run(action["release"], action["chart"], values=action.get("values") or None,
                                       wait=False, timeout=60))
    if action["op"] == "upgrade":
        # wait=False: the e2e tests watch the rollout themselves (pods, PVs, the node's processes).
        upgrade = helm_sdkpy.Upgrade(config)
        return asyncio.run(upgrade.run(action["release"], action["chart"], values=action.get("values") or None,
                                       wait=False, timeout=action.get("timeout", 120)))
    if action["op"] == "lint":
        return asyncio.run(helm_sdkpy.Lint(config).run(action["chart"]))
    if action["op"] == "uninstall":
        return asyncio.run(helm_sdkpy.Uninstall(config).run(action["release"], wait=True,
                                                             timeout=action.get("timeout", 120)))
    raise ValueError(f"unknown op {action['op']!r}")


def main() -> int:
    # --real-cluster (tests/e2e): Helm's default driver, release Secrets in the cluster.
    if os.environ.get("HELM_DRIVER") != "memory" and "--real-cluster" not in sys.argv[1:]:
        print("HELM_DRIVER=memory must be set before start", file=sys.stderr)
        return 2
    outcomes = []
    for i, action in enumerate(json.load(sys.stdin)):
        # Helm's own warnings (e.g. "skipped value for ...") go to stderr from Go; a marker
        # before each action lets the caller tell whose they are.
        print(f"{ACTION_MARKER}{i}", file=sys.stderr, flush=True)
        try:
            outcomes.append({"ok": True, "result": _run(action)})
        except Exception as err:  # any Helm failure is an outcome to report
            outcomes.append({"ok": False, "error": f"{type(err).__name__}: {err}"})
    json.dump(outcomes, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

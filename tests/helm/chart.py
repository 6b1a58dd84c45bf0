"""Installing the chart with real Helm into API emulators, and reading what it created."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localpv_emulator.apiserver import ApiServer

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "localpv"
CI_VALUES = CHART / "ci"
RUNNER = Path(__file__).with_name("helm_runner.py")
NAMESPACE = "storage"
RELEASE = "lp"

Obj = dict[str, Any]


def _newest_schemas() -> str:
    import kubernetes_validate

    return ".".join(kubernetes_validate.latest_version().split(".")[:2])


#: The Kubernetes releases whose API schemas every object the chart renders is validated against
#: (kubernetes-validate's, bundled in its wheel: no network): two that users still run, and the
#: newest the pinned kubernetes-validate has. docs/compatibility.md lists them (a test checks).
SCHEMA_VERSIONS: tuple[str, ...] = ("1.27", "1.30", _newest_schemas())
#: The values file that turns every optional feature on (so its install renders every template).
ALL_FEATURES = "all-features-values.yaml"


@dataclass
class Install:
    """One `helm install` into its own emulator: the values in, the outcome out."""

    values: dict[str, Any]
    server: ApiServer = field(default_factory=lambda: ApiServer(binder=True))
    release: str = RELEASE
    namespace: str = NAMESPACE
    error: str | None = None
    result: dict[str, Any] = field(default_factory=dict)
    #: What Helm printed on stderr during this install (its warnings).
    log: str = ""
    #: Labels of the release namespace, made before the install (Pod Security levels).
    namespace_labels: dict[str, str] = field(default_factory=dict)
    #: Objects in the cluster before the install (what an earlier release left, for lookup).
    existing: list[dict[str, Any]] = field(default_factory=list)

    @property
    def manifests(self) -> list[Obj]:
        """The rendered objects, as Helm sent them (before the server's defaulting)."""
        return [doc for doc in yaml.safe_load_all(self.result.get("manifest", "")) if doc]

    @property
    def notes(self) -> str:
        return str((self.result.get("info") or {}).get("notes") or "")

    def rendered(self, kind: str, name: str | None = None) -> list[Obj]:
        return [o for o in self.manifests if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]

    def one(self, api_version: str, kind: str, name: str | None = None) -> Obj:
        """The single stored object of a kind (or of that name) in the emulator."""
        found = [o for o in self.server.list(api_version, kind)
                 if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
        return found[0]


def load_values(name: str) -> dict[str, Any]:
    with open(CI_VALUES / name, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def run_helm(python: Path, installs: Sequence[Install], workdir: Path) -> None:
    """Run every install in one Helm process (each against its own emulator)."""
    actions = []
    for i, inst in enumerate(installs):
        inst.server.start()
        inst.server.create({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": inst.namespace, "labels": dict(inst.namespace_labels)}})
        for obj in inst.existing:
            inst.server.create(obj)
        kubeconfig = inst.server.write_kubeconfig(workdir / f"kubeconfig-{i}", namespace=inst.namespace)
        actions.append({"op": "install", "kubeconfig": str(kubeconfig), "namespace": inst.namespace,
                        "release": inst.release, "chart": str(CHART), "values": inst.values})
    outcomes, stderr = _run_logged(python, actions, workdir)
    logs = _split_log(stderr, len(installs))
    for inst, outcome, log in zip(installs, outcomes, logs, strict=True):
        inst.log = log
        if outcome["ok"]:
            inst.result = outcome["result"]
        else:
            inst.error = outcome["error"]


def lint(python: Path, workdir: Path) -> dict[str, Any]:
    [outcome] = _run(python, [{"op": "lint", "chart": str(CHART)}], workdir)
    assert outcome["ok"], outcome["error"]
    return dict(outcome["result"])


def _split_log(stderr: str, count: int) -> list[str]:
    """Helm's stderr cut at the runner's per-action markers."""
    from tests.helm.helm_runner import ACTION_MARKER

    logs = [""] * count
    current = None
    for line in stderr.splitlines(keepends=True):
        if line.startswith(ACTION_MARKER):
            current = int(line[len(ACTION_MARKER):])
        elif current is not None:
            logs[current] += line
    return logs


def _run(python: Path, actions: list[dict[str, Any]], workdir: Path) -> list[dict[str, Any]]:
    return _run_logged(python, actions, workdir)[0]


def _run_logged(python: Path, actions: list[dict[str, Any]], workdir: Path) -> tuple[list[dict[str, Any]], str]:
    # HELM_DRIVER must be in the environment when the process starts (Go reads it once);
    # Helm's own config and cache stay out of the user's home.
    env = dict(os.environ, HELM_DRIVER="memory", HELM_CACHE_HOME=str(workdir / "helm-cache"),
               HELM_CONFIG_HOME=str(workdir / "helm-config"), HELM_DATA_HOME=str(workdir / "helm-data"))
    proc = subprocess.run([str(python), str(RUNNER)], input=json.dumps(actions), capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, f"helm runner exited {proc.returncode}: {proc.stderr[-3000:]}"
    outcomes: list[dict[str, Any]] = json.loads(proc.stdout)
    return outcomes, proc.stderr


@contextlib.contextmanager
def helm_runs(python: Path, installs: dict[str, Install], workdir: Path) -> Iterator[dict[str, Install]]:
    """Run every install through real Helm (one helm process for all: its start is the cost);
    their API servers are stopped afterwards, whatever happened."""
    try:
        run_helm(python, list(installs.values()), workdir)
        yield installs
    finally:
        for inst in installs.values():
            inst.server.stop()


def installed(installs: dict[str, Install], name: str) -> Install:
    """The named install, which must have succeeded."""
    inst = installs[name]
    assert inst.error is None, f"{name}: helm install failed: {inst.error}"
    return inst

"""What a real Kubernetes 1.20 cluster showed about the chart (issue 13), checked fast with
real Helm against the API emulator. Each of these failed on the chart before the fix.

- probes: upstream local-static-provisioner 2.9.0's values.yaml (a tcpSocket liveness
  probe, ``readinessProbe: {}``) or ``--set livenessProbe.tcpSocket.port=metrics`` were
  merged by Helm into our httpGet probe: two handlers, which a real API server refuses
  ("may not specify more than 1 handler type"); ``readinessProbe: {}`` could not switch
  ours off.
- kubeVersion: the chart refused Kubernetes 1.20 though nothing in it needs more.
- ``agent.extraArgs: ["-v"]`` (the old example) made the agent exit "No such option '-v'";
  the agent logged nothing at its default level.
- images: upstream's own image strings installed as is (a pod that does not run localpv),
  and an nfs-subdir image map printed "skipped value for localpv.image: Not a table".
- the ConfigMap spelled one boolean "yes" and the others "true".
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localpv import __version__
from localpv.cli import cli
from localpv_emulator.apiserver import ApiServer
from tests.helm.chart import CI_VALUES, Install, helm_runs, installed, load_values

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_VALUES = REPO / "tests" / "e2e" / "data" / "lsp-2.9.0-values.yaml"
HANDLERS = ("httpGet", "tcpSocket", "exec", "grpc")
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
IMAGE = "registry.example.com/storage/localpv:0.1.0"


def _upstream() -> dict[str, Any]:
    with open(UPSTREAM_VALUES, encoding="utf-8") as f:
        return dict(yaml.safe_load(f))


CI_FILES = sorted(p.name for p in CI_VALUES.glob("*-values.yaml") if p.name != "nfs-subdir-values.yaml")

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{name: load_values(name) for name in CI_FILES},
    # `-f upstream/values.yaml --set image=...`: Helm gives --set precedence, as here
    "upstream-2.9.0": {**_upstream(), "image": IMAGE},
    "upstream-2.9.0-unchanged": _upstream(),
    "set-tcp-liveness": {"livenessProbe": {"tcpSocket": {"port": "metrics"}}},
    "timings-only": {"livenessProbe": {"periodSeconds": 30}},
    "readiness-off": {"readinessProbe": {}},
    "two-handlers": {"livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"},
                                       "tcpSocket": {"port": "metrics"}}},
    "nfs-image-map": {"image": {"repository": "registry.example.com/storage/localpv", "tag": "0.1.0",
                                "pullPolicy": "IfNotPresent"}},
    "nfs-subdir-upstream-image": {"nfs": {"server": "nfs.example.com"}, "image": {
        "repository": "registry.k8s.io/sig-storage/nfs-subdir-external-provisioner", "tag": "v4.0.2"}},
    "verbose-extra-arg": {"agent": {"extraArgs": ["-v"]}},
    "log-level-debug": {"agent": {"logLevel": "debug", "extraArgs": ["--discovery-period=30s"]}},
    "jobs": {"useJobForCleaning": True, "useJobForFilesystemCleaning": True, "setPVOwnerRef": True,
             "useNodeNameOnly": True, "cleanBeforeFirstDiscovery": True, "removeNodeNotReadyTaint": True},
}
KUBE_1_20 = ("defaults", "upstream-2.9.0", "jobs")


@pytest.fixture(scope="module")
def installs(helm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Install]]:
    done = {name: Install(values) for name, values in SCENARIOS.items()}
    for name in KUBE_1_20:
        done[f"{name}@1.20"] = Install(SCENARIOS[name], server=ApiServer(binder=True, kube_version="1.20.0"))
    with helm_runs(helm_python, done, tmp_path_factory.mktemp("helm")) as installs:
        yield installs


def agent_container(inst: Install) -> dict[str, Any]:
    [ds] = inst.rendered("DaemonSet")
    [c] = ds["spec"]["template"]["spec"]["containers"]
    return dict(c)


# ---------------------------------------------------------------- probes


@pytest.mark.parametrize("name", ["defaults", *CI_FILES, "upstream-2.9.0", "set-tcp-liveness", "timings-only",
                                  "readiness-off", "log-level-debug", "jobs"])
def test_every_probe_has_exactly_one_handler(installs: dict[str, Install], name: str) -> None:
    c = agent_container(installed(installs, name))
    for probe in PROBES:
        if probe in c:
            given = [h for h in HANDLERS if h in c[probe]]
            assert len(given) == 1, f"{name}: {probe} has handlers {given}: {c[probe]}"


def test_upstream_2_9_values_give_its_tcp_liveness_probe_and_no_readiness_probe(installs: dict[str, Install]) -> None:
    c = agent_container(installed(installs, "upstream-2.9.0"))
    assert c["livenessProbe"] == {"tcpSocket": {"port": "metrics"}, "initialDelaySeconds": 10, "periodSeconds": 60,
                                  "timeoutSeconds": 5, "failureThreshold": 3}
    assert "readinessProbe" not in c and "startupProbe" not in c
    assert c["image"] == IMAGE


def test_a_set_handler_replaces_ours_and_keeps_our_timings(installs: dict[str, Install]) -> None:
    c = agent_container(installed(installs, "set-tcp-liveness"))
    assert c["livenessProbe"] == {"tcpSocket": {"port": "metrics"}, "initialDelaySeconds": 10, "periodSeconds": 60,
                                  "timeoutSeconds": 5, "failureThreshold": 3}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}


def test_timings_alone_keep_our_handler(installs: dict[str, Install]) -> None:
    c = agent_container(installed(installs, "timings-only"))
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["livenessProbe"]["periodSeconds"] == 30


def test_an_empty_probe_switches_it_off(installs: dict[str, Install]) -> None:
    c = agent_container(installed(installs, "readiness-off"))
    assert "readinessProbe" not in c and "livenessProbe" in c


def test_two_handlers_in_one_probe_are_refused_naming_them(installs: dict[str, Install]) -> None:
    error = installs["two-handlers"].error
    assert error is not None and "livenessProbe" in error and "httpGet and tcpSocket" in error, error


# ---------------------------------------------------------------- Kubernetes 1.20


@pytest.mark.parametrize("name", KUBE_1_20)
def test_installs_on_kubernetes_1_20(installs: dict[str, Install], name: str) -> None:
    inst = installed(installs, f"{name}@1.20")
    assert inst.rendered("DaemonSet") and inst.rendered("ConfigMap")


def test_chart_states_the_minimum_the_readme_names() -> None:
    chart = yaml.safe_load((REPO / "helm" / "localpv" / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.20.0-0"
    assert "Kubernetes 1.20" in (REPO / "README.md").read_text()


# ---------------------------------------------------------------- log level and extraArgs


def test_agent_logs_at_info_by_default(installs: dict[str, Install]) -> None:
    env = {e["name"]: e.get("value") for e in agent_container(installed(installs, "defaults"))["env"]}
    assert env["LOCALPV_LOG_LEVEL"] == "info"
    debug = agent_container(installed(installs, "log-level-debug"))
    assert {"name": "LOCALPV_LOG_LEVEL", "value": "debug"} in debug["env"]
    assert debug["args"][-1] == "--discovery-period=30s"


def test_verbose_flag_in_extra_args_is_refused_pointing_at_log_level(installs: dict[str, Install]) -> None:
    error = installs["verbose-extra-arg"].error
    assert error is not None and "agent.extraArgs" in error and "agent.logLevel" in error, error


@pytest.mark.parametrize("level,expected", [("info", 20), ("DEBUG", 10), ("warning", 30)])
def test_cli_reads_the_log_level_from_the_environment(level: str, expected: int) -> None:
    code = ("import logging; from localpv.cli import cli; cli(['version'], standalone_mode=False); "
            "print(logging.getLogger().level)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                          env={"LOCALPV_LOG_LEVEL": level, "PATH": "/usr/bin:/bin"}, cwd=REPO)
    assert proc.stdout.split()[-1] == str(expected)


def test_agent_command_line_with_extra_args_and_log_level_parses(
        installs: dict[str, Install], monkeypatch: pytest.MonkeyPatch) -> None:
    c = agent_container(installed(installs, "log-level-debug"))
    for var in c["env"]:
        monkeypatch.setenv(var["name"], var.get("value") or "from-downward-api")
    assert c["args"][0] == "agent"
    sub = cli.commands["agent"].make_context("agent", list(c["args"][1:]))
    assert sub.params["discovery_period"] == 30


# ---------------------------------------------------------------- images


def test_upstream_images_are_refused_saying_what_to_set(installs: dict[str, Install]) -> None:
    for name, upstream in (("upstream-2.9.0-unchanged", "local-volume-provisioner"),
                           ("nfs-subdir-upstream-image", "nfs-subdir-external-provisioner")):
        error = installs[name].error
        assert error is not None and upstream in error and "set image" in error, f"{name}: {error}"


def test_an_image_map_merges_without_helm_warnings(installs: dict[str, Install]) -> None:
    inst = installed(installs, "nfs-image-map")
    assert "Not a table" not in inst.log and "warning" not in inst.log.lower(), inst.log
    assert agent_container(inst)["image"] == "registry.example.com/storage/localpv:0.1.0"
    assert agent_container(inst)["imagePullPolicy"] == "IfNotPresent"


def test_the_default_image_is_the_chart_app_version(installs: dict[str, Install]) -> None:
    c = agent_container(installed(installs, "defaults"))
    assert c["image"] == f"localpv:{__version__}"
    assert {"name": "JOB_CONTAINER_IMAGE", "value": f"localpv:{__version__}"} in c["env"]


# ---------------------------------------------------------------- the ConfigMap


def test_configmap_booleans_have_one_spelling(installs: dict[str, Install]) -> None:
    [cm] = installed(installs, "jobs").rendered("ConfigMap")
    flags = {k: v for k, v in cm["data"].items() if v in ("yes", "no", "true", "false", "True", "on")}
    assert flags == {k: "true" for k in ("useJobForCleaning", "useJobForFilesystemCleaning", "setPVOwnerRef",
                                         "useNodeNameOnly", "cleanBeforeFirstDiscovery", "removeNodeNotReadyTaint")}

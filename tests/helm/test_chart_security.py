"""What the chart's pods need from the cluster's security settings (issue 26): image pull
secrets reach the cleanup Jobs, and each pod meets the Pod Security Standards level the chart
README and NOTES.txt say its namespace needs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import CHART, REPO, Install, helm_runs, installed, load_values
from tests.helm.podsecurity import strictest_level, violations

Obj = dict[str, Any]

NFS_SUBDIR = load_values("nfs-subdir-values.yaml")
#: What the chart README says makes the NFS provisioner pass `restricted`: a non-root user and the
#: export through a PersistentVolumeClaim (nfs.mountOptions), since an nfs volume is not allowed.
NFS_RESTRICTED = {**NFS_SUBDIR, "securityContext": {
    "runAsUser": 65534, "runAsGroup": 65534, "runAsNonRoot": True, "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}
ENFORCE = "pod-security.kubernetes.io/enforce"

SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    # name: (values, labels of the release namespace)
    "defaults": ({}, {}),
    "everything": (load_values("everything-values.yaml"), {}),
    "dynamic": (load_values("dynamic-values.yaml"), {}),
    "nfs-subdir": (NFS_SUBDIR, {}),
    "nfs-restricted": (NFS_RESTRICTED, {}),
    "pull-secrets": ({"imagePullSecrets": ["regcred", {"name": "mirror-cred"}], "useJobForCleaning": True}, {}),
    # the namespace's Pod Security level, as the chart can see it (lookup)
    "agent-in-privileged": ({}, {ENFORCE: "privileged"}),
    "agent-in-baseline": ({}, {ENFORCE: "baseline"}),
    "agent-in-restricted": (load_values("everything-values.yaml"), {ENFORCE: "restricted"}),
    "nfs-in-baseline": (NFS_SUBDIR, {ENFORCE: "baseline"}),
    "nfs-in-restricted": (NFS_SUBDIR, {ENFORCE: "restricted"}),
    "nonroot-nfs-in-restricted": (NFS_RESTRICTED, {ENFORCE: "restricted"}),
}


@pytest.fixture(scope="module")
def installs(helm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Install]]:
    done = {name: Install(values, namespace_labels=labels) for name, (values, labels) in SCENARIOS.items()}
    with helm_runs(helm_python, done, tmp_path_factory.mktemp("helm")) as installs:
        yield installs


def agent_env(inst: Install) -> dict[str, Any]:
    [ds] = inst.rendered("DaemonSet")
    [container] = ds["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


# ---------------------------------------------------------------- image pull secrets


def test_the_agent_is_given_the_pull_secrets_for_its_cleanup_jobs(installs: dict[str, Install]) -> None:
    """values.yaml says imagePullSecrets are those "of every pod and cleanup Job"; the agent makes
    the Jobs, so it is told their names (tests/agent/test_job_pull_secrets.py: it uses them)."""
    inst = installed(installs, "pull-secrets")
    assert agent_env(inst)["LOCALPV_JOB_IMAGE_PULL_SECRETS"] == "regcred,mirror-cred"
    [ds] = inst.rendered("DaemonSet")
    assert ds["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]
    assert "LOCALPV_JOB_IMAGE_PULL_SECRETS" not in agent_env(installed(installs, "defaults"))


# ---------------------------------------------------------------- Pod Security Admission


def template(inst: Install, kind: str, suffix: str) -> Obj:
    """The pod template of the rendered workload of that kind whose name ends with ``suffix``."""
    [obj] = [o for o in inst.rendered(kind) if o["metadata"]["name"].endswith(suffix)]
    return dict(obj["spec"]["template"])


def cleanup_job_templates() -> list[Obj]:
    """The pods of cleanup Jobs as the agent makes them, for a block and a filesystem volume."""
    from localpv.agent.jobs import build_cleanup_job
    from localpv.agent.model import StartCleanup
    from localpv.config import ClassConfig, ProvisionerConfig

    out = []
    for block in (True, False):
        cls = ClassConfig(name="c", host_dir="/mnt/c", mount_dir="/mnt/c",
                          volume_mode="Block" if block else "Filesystem")
        cleanup = StartCleanup(pv_name="local-pv-1", host_path="/mnt/c/d", container_path="/mnt/c/d", cls=cls,
                               block=block, reason="released", identity="fs:uuid=1")
        job = build_cleanup_job(cleanup, node_name="n", namespace="storage", image="localpv:t",
                                config=ProvisionerConfig(), now=0.0, image_pull_secrets=("regcred",))
        out.append(job["spec"]["template"])
    return out


def readme_levels() -> dict[str, str]:
    """The chart README's Pod Security table: the pods of each row, and the level it says they need."""
    text = (CHART / "README.md").read_text()
    section = text.split("## Pod Security Admission", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    levels = {}
    for pods, level, *_ in rows[1:]:
        match = re.search(r"`(privileged|baseline|restricted)`", level)
        assert match, f"README Pod Security row {pods.strip()!r}: no level in {level.strip()!r}"
        levels[pods.strip()] = match.group(1)
    return levels


def test_each_pod_meets_the_level_the_chart_readme_says_it_needs(installs: dict[str, Install]) -> None:
    everything = installed(installs, "everything")
    rendered: dict[str, list[Obj]] = {
        "node agent (DaemonSet)": [template(installed(installs, n), "DaemonSet", "localpv")
                                   for n in ("defaults", "everything", "dynamic")],
        "cleanup Jobs": cleanup_job_templates(),
        "node cleanup (Deployment)": [template(everything, "Deployment", "-node-cleanup")],
        "NFS provisioner (Deployment)": [template(everything, "Deployment", "-nfs"),
                                         template(installed(installs, "nfs-subdir"), "Deployment", "-nfs")],
    }
    levels = readme_levels()
    assert sorted(levels) == sorted(rendered), "the README's Pod Security table names other pods than these"
    for pods, templates in rendered.items():
        for t in templates:
            assert strictest_level(t) == levels[pods], (pods, levels[pods], violations(t, "restricted"))


def test_the_nfs_provisioner_passes_restricted_as_the_readme_says(installs: dict[str, Install]) -> None:
    nfs = template(installed(installs, "nfs-restricted"), "Deployment", "-nfs")
    assert violations(nfs, "restricted") == []
    assert "restricted" in (CHART / "README.md").read_text().split("## Pod Security Admission", 1)[1]


@pytest.mark.parametrize(("name", "level", "pods"), [
    ("agent-in-baseline", "baseline", "the node agent and its cleanup Jobs"),
    ("agent-in-restricted", "restricted", "the node agent and its cleanup Jobs"),
    ("nfs-in-restricted", "restricted", "the NFS provisioner"),
])
def test_a_namespace_that_would_reject_the_pods_fails_the_install_with_the_label_to_set(
        installs: dict[str, Install], name: str, level: str, pods: str) -> None:
    """Before: Helm succeeded, and the DaemonSet or Deployment made no pod (rejected by
    admission), with nothing telling the user what to do."""
    inst = installs[name]
    assert inst.error is not None, f"{name}: installed into a namespace enforcing {level}"
    assert f'namespace storage enforces Pod Security "{level}"' in inst.error, inst.error
    assert pods in inst.error, inst.error
    needed = "privileged" if "agent" in name else "baseline"
    assert f"kubectl label --overwrite namespace storage {ENFORCE}={needed}" in inst.error, inst.error
    assert not inst.server.list("apps/v1", "DaemonSet", "storage")


@pytest.mark.parametrize("name", ["agent-in-privileged", "nfs-in-baseline", "nonroot-nfs-in-restricted"])
def test_a_namespace_that_admits_the_pods_installs(installs: dict[str, Install], name: str) -> None:
    installed(installs, name)


def test_notes_say_the_level_and_the_label(installs: dict[str, Install]) -> None:
    agent = installed(installs, "defaults").notes
    assert "privileged" in agent and f"kubectl label --overwrite namespace storage {ENFORCE}=privileged" in agent
    nfs = installed(installs, "nfs-subdir").notes
    assert f"{ENFORCE}=baseline" in nfs and "privileged" not in nfs


def _tenants_claim(export: Path) -> None:
    """A released claim's directory as tenants leave it: a private directory of one user, and a
    sticky one where another user's file sits."""
    private, sticky = export / "claim" / "private", export / "claim" / "sticky"
    private.mkdir(parents=True)
    sticky.mkdir()
    (private / "data").write_text("tenant")
    (sticky / "other").write_text("another tenant")
    for path, uid, mode in ((private / "data", 1234, 0o600), (private, 1234, 0o700), (sticky, 1234, 0o1777),
                            (sticky / "other", 5678, 0o644)):
        os.chown(path, uid, uid)
        path.chmod(mode)


def _delete_with(capabilities: list[str], export: Path) -> subprocess.CompletedProcess[str]:
    """Delete the claim's directory as the NFS provisioner does, as root holding only these capabilities."""
    caps = ",".join(["-all", *(f"+{c.lower()}" for c in capabilities)])
    code = f"from localpv.nfs.export import Export; Export({str(export)!r}).remove(['claim'])"
    return subprocess.run(["setpriv", f"--bounding-set={caps}", "--inh-caps=-all", sys.executable, "-c", code],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60,
                          check=False)


@pytest.mark.root
def test_the_nfs_provisioners_capabilities_are_what_deleting_tenants_files_takes(
        installs: dict[str, Install], tmp_path: Path) -> None:
    """Its default drops every capability but DAC_OVERRIDE and FOWNER (baseline allows both):
    with them, root deletes a released claim's files whatever their owners and modes; without
    either, it cannot (so neither is to spare)."""
    [container] = template(installed(installs, "everything"), "Deployment", "-nfs")["spec"]["containers"]
    caps = container["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"]
    for given in (caps["add"], *([c for c in caps["add"] if c != left] for left in caps["add"])):
        export = tmp_path / "-".join(["export", *given])
        _tenants_claim(export)
        proc = _delete_with(given, export)
        if given == caps["add"]:
            assert proc.returncode == 0 and not (export / "claim").exists(), proc.stderr
        else:
            assert proc.returncode != 0 and "Error" in proc.stderr, f"deleted without all of {caps['add']}: {given}"

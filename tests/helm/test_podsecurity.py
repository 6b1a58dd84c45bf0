"""The Pod Security Standards check (tests/helm/podsecurity.py) itself: each control is broken by
a pod that breaks it, and only by that, so the chart's pods are held to real rules."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helm.podsecurity import LEVELS, strictest_level, violations

Obj = dict[str, Any]

#: The least a pod must say to pass restricted.
RESTRICTED_POD: Obj = {
    "metadata": {"annotations": {}},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "i", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "config", "configMap": {"name": "x"}}],
    },
}


def _container(pod: Obj) -> Obj:
    return dict(pod["spec"]["containers"][0]["securityContext"])


def _set_container(**fields: Any) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["spec"]["containers"][0]["securityContext"].update(fields)
    return change


def _set_pod(**fields: Any) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["spec"].update(fields)
    return change


def _set_pod_context(**fields: Any) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["spec"]["securityContext"].update(fields)
    return change


def _add_volume(volume: Obj) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["spec"]["volumes"].append(volume)
    return change


def _annotate(key: str, value: str) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["metadata"]["annotations"][key] = value
    return change


def _container_field(**fields: Any) -> Callable[[Obj], None]:
    def change(pod: Obj) -> None:
        pod["spec"]["containers"][0].update(fields)
    return change


#: (what breaks it, the control it breaks, the strictest level still admitting the pod)
BREAKS: list[tuple[str, Callable[[Obj], None], str, str]] = [
    ("hostProcess", _set_pod_context(windowsOptions={"hostProcess": True}), "host_process", "privileged"),
    ("hostNetwork", _set_pod(hostNetwork=True), "host_namespaces", "privileged"),
    ("hostPID", _set_pod(hostPID=True), "host_namespaces", "privileged"),
    ("privileged", _set_container(privileged=True), "privileged_containers", "privileged"),
    ("SYS_ADMIN", _set_container(capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}), "capabilities",
     "privileged"),
    ("hostPath", _add_volume({"name": "h", "hostPath": {"path": "/"}}), "host_path_volumes", "privileged"),
    ("hostPort", _container_field(ports=[{"containerPort": 80, "hostPort": 80}]), "host_ports", "privileged"),
    ("probe host", _container_field(livenessProbe={"httpGet": {"port": 80, "host": "10.0.0.1"}}), "host_probes",
     "privileged"),
    ("apparmor unconfined", _annotate("container.apparmor.security.beta.kubernetes.io/c", "unconfined"),
     "apparmor", "privileged"),
    ("apparmor field", _set_container(appArmorProfile={"type": "Unconfined"}), "apparmor", "privileged"),
    ("selinux user", _set_pod_context(seLinuxOptions={"user": "system_u"}), "selinux", "privileged"),
    ("selinux type", _set_container(seLinuxOptions={"type": "spc_t"}), "selinux", "privileged"),
    ("procMount", _set_container(procMount="Unmasked"), "proc_mount", "privileged"),
    ("seccomp Unconfined", _set_container(seccompProfile={"type": "Unconfined"}), "seccomp", "privileged"),
    ("unsafe sysctl", _set_pod_context(sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "sysctls",
     "privileged"),
    # restricted only: baseline still admits these
    ("nfs volume", _add_volume({"name": "n", "nfs": {"server": "s", "path": "/"}}), "volume_types", "baseline"),
    ("escalation unset", lambda pod: pod["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
     "privilege_escalation", "baseline"),
    ("root allowed", lambda pod: pod["spec"]["securityContext"].pop("runAsNonRoot"), "running_as_non_root",
     "baseline"),
    ("uid 0", _set_container(runAsUser=0), "running_as_non_root_user", "baseline"),
    ("no seccomp", lambda pod: pod["spec"]["securityContext"].pop("seccompProfile"), "seccomp_required",
     "baseline"),
    ("ALL not dropped", _set_container(capabilities={"drop": ["NET_RAW"]}), "capabilities_restricted", "baseline"),
    ("CHOWN added", _set_container(capabilities={"drop": ["ALL"], "add": ["CHOWN"]}), "capabilities_restricted",
     "baseline"),
]


def test_the_least_restricted_pod_passes_every_level() -> None:
    for level in LEVELS:
        assert violations(RESTRICTED_POD, level) == []
    assert strictest_level(RESTRICTED_POD) == "restricted"


@pytest.mark.parametrize(("what", "change", "control", "level"), BREAKS, ids=[b[0] for b in BREAKS])
def test_each_control_catches_what_breaks_it(what: str, change: Callable[[Obj], None], control: str,
                                             level: str) -> None:
    pod = copy.deepcopy(RESTRICTED_POD)
    change(pod)
    # Checked at the level just above the one that still admits the pod: a baseline control
    # broken may break its restricted twin too (hostPath is also a forbidden volume type).
    above = LEVELS[LEVELS.index(level) + 1]
    broken = {line.split(":", 1)[0] for line in violations(pod, above)}
    assert broken == {control}, f"{what}: {violations(pod, above)}"
    assert strictest_level(pod) == level


def test_container_fields_may_stand_in_for_the_pods() -> None:
    """runAsNonRoot and seccompProfile may be set on every container instead of the pod."""
    pod = copy.deepcopy(RESTRICTED_POD)
    pod["spec"]["securityContext"] = {}
    pod["spec"]["containers"][0]["securityContext"].update(
        runAsNonRoot=True, seccompProfile={"type": "Localhost", "localhostProfile": "p"})
    assert strictest_level(pod) == "restricted"


def _field(i: int) -> str:
    """What a break writes: breaks that write the same field (the capabilities) replace each other."""
    return "capabilities" if "capabilities" in BREAKS[i][2] else BREAKS[i][0]


@given(st.lists(st.sampled_from(range(len(BREAKS))), max_size=5, unique_by=_field))
def test_a_pod_with_several_breaks_passes_only_what_admits_each(picks: list[int]) -> None:
    pod = copy.deepcopy(RESTRICTED_POD)
    rank = LEVELS.index("restricted")
    for i in picks:
        _, change, _, level = BREAKS[i]
        change(pod)
        rank = min(rank, LEVELS.index(level))
        assert LEVELS.index(strictest_level(pod)) == rank

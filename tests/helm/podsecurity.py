"""The Pod Security Standards' checks, as data rules over a pod template (issue 26).

Written from the documented controls (kubernetes.io/docs/concepts/security/pod-security-standards,
the "latest" version Pod Security Admission enforces by default): each function below is one
control, named as the page names it, and returns what in the pod breaks it. Pure functions over
plain dicts, so a test can hold each control to a pod that breaks it, and the chart's rendered
pods to the level its README and NOTES.txt state.

``privileged`` has no controls; ``baseline`` has the first list; ``restricted`` is baseline plus
the second list. Pods with ``spec.os.name: windows`` are relaxed for three restricted controls by
the page; the chart runs Linux pods only, so that relaxation is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Obj = dict[str, Any]

LEVELS = ("privileged", "baseline", "restricted")

#: Capabilities baseline lets a container add.
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
#: SELinux types baseline allows (container_engine_t since 1.31).
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
#: The "safe" sysctls baseline allows (the newest list: some since 1.27 and 1.29).
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes"})
#: The volume types restricted allows.
RESTRICTED_VOLUMES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(spec: Obj) -> Iterator[tuple[str, Obj]]:
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(kind) or []:
            yield f"{kind}[{c.get('name')}]", c


def _contexts(spec: Obj) -> Iterator[tuple[str, Obj]]:
    """The pod's securityContext and each container's, with where they are."""
    yield "spec.securityContext", spec.get("securityContext") or {}
    for where, c in _containers(spec):
        yield f"{where}.securityContext", c.get("securityContext") or {}


# ---------------------------------------------------------------- baseline


def host_process(meta: Obj, spec: Obj) -> list[str]:
    return [f"{w}.windowsOptions.hostProcess: true" for w, ctx in _contexts(spec)
            if (ctx.get("windowsOptions") or {}).get("hostProcess")]


def host_namespaces(meta: Obj, spec: Obj) -> list[str]:
    return [f"spec.{f}: true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]


def privileged_containers(meta: Obj, spec: Obj) -> list[str]:
    return [f"{w}.securityContext.privileged: true" for w, c in _containers(spec)
            if (c.get("securityContext") or {}).get("privileged")]


def capabilities(meta: Obj, spec: Obj) -> list[str]:
    out = []
    for w, c in _containers(spec):
        added = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        beyond = [cap for cap in added if cap not in BASELINE_CAPABILITIES]
        if beyond:
            out.append(f"{w}.securityContext.capabilities.add: {', '.join(beyond)}")
    return out


def host_path_volumes(meta: Obj, spec: Obj) -> list[str]:
    return [f"spec.volumes[{v.get('name')}].hostPath" for v in spec.get("volumes") or [] if v.get("hostPath")]


def host_ports(meta: Obj, spec: Obj) -> list[str]:
    return [f"{w}.ports[{p.get('name', p.get('containerPort'))}].hostPort: {p['hostPort']}"
            for w, c in _containers(spec) for p in c.get("ports") or [] if p.get("hostPort")]


def host_probes(meta: Obj, spec: Obj) -> list[str]:
    """The host field of probes and lifecycle hooks (1.34+)."""
    out = []
    for w, c in _containers(spec):
        handlers = [(p, c.get(p) or {}) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [(f"lifecycle.{h}", (c.get("lifecycle") or {}).get(h) or {}) for h in ("postStart", "preStop")]
        for name, handler in handlers:
            for kind in ("httpGet", "tcpSocket"):
                if (handler.get(kind) or {}).get("host"):
                    out.append(f"{w}.{name}.{kind}.host")
    return out


def apparmor(meta: Obj, spec: Obj) -> list[str]:
    out = [f"{w}.appArmorProfile.type: {t}" for w, ctx in _contexts(spec)
           if (t := (ctx.get("appArmorProfile") or {}).get("type")) not in (None, "RuntimeDefault", "Localhost")]
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith(APPARMOR_ANNOTATION) and value != "runtime/default" and not value.startswith("localhost/"):
            out.append(f"metadata.annotations[{key}]: {value}")
    return out


def selinux(meta: Obj, spec: Obj) -> list[str]:
    out = []
    for w, ctx in _contexts(spec):
        options = ctx.get("seLinuxOptions") or {}
        if (options.get("type") or "") not in SELINUX_TYPES:
            out.append(f"{w}.seLinuxOptions.type: {options['type']}")
        out += [f"{w}.seLinuxOptions.{f}: {options[f]}" for f in ("user", "role") if options.get(f)]
    return out


def proc_mount(meta: Obj, spec: Obj) -> list[str]:
    return [f"{w}.securityContext.procMount: {m}" for w, c in _containers(spec)
            if (m := (c.get("securityContext") or {}).get("procMount")) not in (None, "Default")]


def seccomp(meta: Obj, spec: Obj) -> list[str]:
    return [f"{w}.seccompProfile.type: Unconfined" for w, ctx in _contexts(spec)
            if (ctx.get("seccompProfile") or {}).get("type") == "Unconfined"]


def sysctls(meta: Obj, spec: Obj) -> list[str]:
    return [f"spec.securityContext.sysctls: {s.get('name')}"
            for s in (spec.get("securityContext") or {}).get("sysctls") or [] if s.get("name") not in SAFE_SYSCTLS]


# ---------------------------------------------------------------- restricted


def volume_types(meta: Obj, spec: Obj) -> list[str]:
    out = []
    for v in spec.get("volumes") or []:
        types = [k for k, value in v.items() if k != "name" and value is not None]
        if not any(t in RESTRICTED_VOLUMES for t in types):
            out.append(f"spec.volumes[{v.get('name')}]: {', '.join(types) or 'no type'}")
    return out


def privilege_escalation(meta: Obj, spec: Obj) -> list[str]:
    return [f"{w}.securityContext.allowPrivilegeEscalation: {ape} (must be false)" for w, c in _containers(spec)
            if (ape := (c.get("securityContext") or {}).get("allowPrivilegeEscalation")) is not False]


def running_as_non_root(meta: Obj, spec: Obj) -> list[str]:
    pod = (spec.get("securityContext") or {}).get("runAsNonRoot")
    out = []
    if pod is False:
        out.append("spec.securityContext.runAsNonRoot: false")
    for w, c in _containers(spec):
        own = (c.get("securityContext") or {}).get("runAsNonRoot")
        if own is False or (own is None and pod is not True):
            out.append(f"{w}.securityContext.runAsNonRoot: {own} (must be true, here or in the pod's)")
    return out


def running_as_non_root_user(meta: Obj, spec: Obj) -> list[str]:
    return [f"{w}.runAsUser: 0" for w, ctx in _contexts(spec) if ctx.get("runAsUser") == 0]


def seccomp_required(meta: Obj, spec: Obj) -> list[str]:
    allowed = ("RuntimeDefault", "Localhost")
    pod = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    out = []
    if pod is not None and pod not in allowed:
        out.append(f"spec.securityContext.seccompProfile.type: {pod}")
    for w, c in _containers(spec):
        own = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if (own is not None and own not in allowed) or (own is None and pod not in allowed):
            out.append(f"{w}.securityContext.seccompProfile.type: {own} (must be RuntimeDefault or Localhost, "
                       "here or in the pod's)")
    return out


def capabilities_restricted(meta: Obj, spec: Obj) -> list[str]:
    out = []
    for w, c in _containers(spec):
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{w}.securityContext.capabilities.drop: must include ALL")
        beyond = [cap for cap in caps.get("add") or [] if cap != "NET_BIND_SERVICE"]
        if beyond:
            out.append(f"{w}.securityContext.capabilities.add: {', '.join(beyond)} (only NET_BIND_SERVICE)")
    return out


Control = Callable[[Obj, Obj], list[str]]

BASELINE: tuple[Control, ...] = (host_process, host_namespaces, privileged_containers, capabilities,
                                 host_path_volumes, host_ports, host_probes, apparmor, selinux, proc_mount, seccomp,
                                 sysctls)
RESTRICTED: tuple[Control, ...] = (*BASELINE, volume_types, privilege_escalation, running_as_non_root,
                                   running_as_non_root_user, seccomp_required, capabilities_restricted)
CONTROLS: dict[str, tuple[Control, ...]] = {"privileged": (), "baseline": BASELINE, "restricted": RESTRICTED}


def violations(template: Obj, level: str) -> list[str]:
    """What in a pod template (``metadata`` and ``spec``) the level forbids, one line each."""
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    return [f"{control.__name__}: {line}" for control in CONTROLS[level] for line in control(meta, spec)]


def strictest_level(template: Obj) -> str:
    """The strictest level whose namespace admits this pod."""
    return [level for level in LEVELS if not violations(template, level)][-1]

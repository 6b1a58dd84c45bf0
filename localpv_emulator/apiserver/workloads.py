"""Strategies of the kinds that carry a pod spec: Pods, Jobs, Deployments, DaemonSets and StatefulSets."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from localpv_emulator.apiserver.resources import Obj
from localpv_emulator.apiserver.strategies import Strategy, spec_of
from localpv_emulator.apiserver.validation import FieldErrors, check_enum, name_problems
from localpv_emulator.selectors import LabelSelector, SelectorError

if TYPE_CHECKING:
    from localpv_emulator.apiserver.store import Store


_RESTART_POLICIES = ("Always", "OnFailure", "Never")


def _default_pod_spec(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if not isinstance(container, dict):
            continue
        image = str(container.get("image") or "")
        latest = image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1]
        container.setdefault("imagePullPolicy", "Always" if latest and "@" not in image else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})


def _validate_pod_spec(spec: Any, path: str, errs: FieldErrors) -> None:
    if not isinstance(spec, dict):
        errs.required(path)
        return
    containers = spec.get("containers") or []
    if not containers:
        errs.required(f"{path}.containers")
    names: set[str] = set()
    for part in ("containers", "initContainers"):
        for i, container in enumerate(spec.get(part) or []):
            cpath, name = f"{path}.{part}[{i}]", str((container or {}).get("name") or "")
            if not name:
                errs.required(f"{cpath}.name")
            elif name in names:
                errs.duplicate(f"{cpath}.name", name)
            else:
                for problem in name_problems(name, "label"):
                    errs.invalid(f"{cpath}.name", name, problem)
            names.add(name)
            if not (container or {}).get("image"):
                errs.required(f"{cpath}.image")
    check_enum(errs, f"{path}.restartPolicy", spec.get("restartPolicy"), _RESTART_POLICIES)
    volume_names: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        name = str((volume or {}).get("name") or "")
        if not name:
            errs.required(f"{path}.volumes[{i}].name")
        elif name in volume_names:
            errs.duplicate(f"{path}.volumes[{i}].name", name)
        volume_names.add(name)
        claim = (volume or {}).get("persistentVolumeClaim")
        if claim is not None and not claim.get("claimName"):
            errs.required(f"{path}.volumes[{i}].persistentVolumeClaim.claimName")


_POD_MUTABLE_MSG = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)


class PodStrategy(Strategy):
    """Pods: defaulted spec, and a spec that is immutable but for images and a few fields."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending", "qosClass": "BestEffort"}

    def default(self, obj: Obj) -> None:
        _default_pod_spec(spec_of(obj))

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        _validate_pod_spec(obj.get("spec"), "spec", errs)

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        mutable = copy.deepcopy(spec_of(old))
        nspec = spec_of(new)
        for part in ("containers", "initContainers"):
            for mine, theirs in zip(mutable.get(part) or [], nspec.get(part) or [], strict=False):
                mine["image"] = theirs.get("image")
        for name in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
            if name in nspec:
                mutable[name] = nspec[name]
        if mutable != nspec:
            errs.forbidden("spec", _POD_MUTABLE_MSG)


def _template_spec(obj: Obj) -> Obj:
    template = spec_of(obj).get("template")
    if not isinstance(template, dict):
        return {}
    tspec = template.get("spec")
    return tspec if isinstance(tspec, dict) else {}


class JobStrategy(Strategy):
    """Jobs: generated selector and labels, restartPolicy rules, immutable template."""

    def default(self, obj: Obj) -> None:
        spec = spec_of(obj)
        for key, value in (("parallelism", 1), ("completions", 1), ("backoffLimit", 6),
                           ("completionMode", "NonIndexed"), ("suspend", False),
                           ("podReplacementPolicy", "TerminatingOrFailed"), ("manualSelector", None)):
            if value is not None:
                spec.setdefault(key, value)
        if isinstance(spec.get("template"), dict):
            _default_pod_spec(spec["template"].setdefault("spec", {}))

    def prepare_create(self, obj: Obj, store: Store) -> None:
        spec, meta = spec_of(obj), obj["metadata"]
        if spec.get("manualSelector") or not isinstance(spec.get("template"), dict):
            return
        uid, name = meta["uid"], meta["name"]
        generated = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                     "controller-uid": uid, "job-name": name}
        spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(generated)
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = spec_of(obj)
        if not isinstance(spec.get("template"), dict):
            errs.required("spec.template")
            return
        tspec = _template_spec(obj)
        _validate_pod_spec(tspec, "spec.template.spec", errs)
        if tspec.get("restartPolicy") not in ("OnFailure", "Never"):
            errs.unsupported("spec.template.spec.restartPolicy", tspec.get("restartPolicy"), ("OnFailure", "Never"))

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        for name in ("template", "selector", "completions", "completionMode"):
            if spec_of(new).get(name) != spec_of(old).get(name):
                errs.immutable(f"spec.{name}", spec_of(new).get(name))


class WorkloadStrategy(Strategy):
    """Deployments, DaemonSets and StatefulSets: a selector that matches the template, and is immutable."""

    def __init__(self, defaults: Obj, status: Obj | None = None) -> None:
        self.defaults = defaults
        self.status = status or {}

    def initial_status(self, obj: Obj) -> Obj:
        return copy.deepcopy(self.status)

    def default(self, obj: Obj) -> None:
        spec = spec_of(obj)
        for key, value in self.defaults.items():
            spec.setdefault(key, copy.deepcopy(value))
        if isinstance(spec.get("template"), dict):
            _default_pod_spec(spec["template"].setdefault("spec", {}))

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = spec_of(obj)
        selector = spec.get("selector")
        if not selector:
            errs.required("spec.selector")
        template = spec.get("template")
        if not isinstance(template, dict):
            errs.required("spec.template")
            return
        labels = (template.get("metadata") or {}).get("labels") or {}
        try:
            if selector and not LabelSelector.from_object(selector).matches(labels):
                errs.invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`")
        except SelectorError as exc:
            errs.invalid("spec.selector", selector, str(exc))
        _validate_pod_spec(template.get("spec"), "spec.template.spec", errs)
        if _template_spec(obj).get("restartPolicy") != "Always":
            errs.unsupported("spec.template.spec.restartPolicy", _template_spec(obj).get("restartPolicy"), ("Always",))

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        if spec_of(new).get("selector") != spec_of(old).get("selector"):
            errs.immutable("spec.selector", spec_of(new).get("selector"))

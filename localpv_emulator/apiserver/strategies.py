"""Per-kind rules after kube-apiserver's registry strategies: the base class and the
storage, configuration, service, event and RBAC kinds (workloads are in
:mod:`~localpv_emulator.apiserver.workloads`, the lookup in
:mod:`~localpv_emulator.apiserver.registry`)."""

from __future__ import annotations

import base64
import binascii
import copy
from typing import TYPE_CHECKING, Any, ClassVar

from localpv_emulator.apiserver.resources import Obj, resource_for
from localpv_emulator.apiserver.validation import (
    CONFIG_KEY,
    FieldErrors,
    check_enum,
    check_quantity,
    name_problems,
)
from localpv_emulator.binder import QuantityError, parse_quantity
from localpv_emulator.selectors import (
    LabelSelector,
    SelectorError,
    label_value_problems,
    node_selector_problems,
    qualified_name_problems,
)

if TYPE_CHECKING:
    from localpv_emulator.apiserver.store import Store


class Strategy:
    """Per-kind rules, after the registry strategies of kube-apiserver.

    ``default`` runs on every write (the real server defaults on decode), ``prepare_create``
    only on create (status reset, generated fields), ``prepare_update`` may restore fields a
    client may not change through this endpoint.
    """

    #: Nodes are the exception: kubelets create them with status in one request.
    keep_status_on_create: ClassVar[bool] = False

    def initial_status(self, obj: Obj) -> Obj:
        """What a create stores as status (clients cannot set status on create)."""
        return {}

    def default(self, obj: Obj) -> None:
        """Fill defaulted fields, in place."""

    def prepare_create(self, obj: Obj, store: Store) -> None:
        """Set server-generated fields on create, in place."""

    def prepare_update(self, new: Obj, old: Obj) -> None:
        """Undo changes that this endpoint ignores, in place."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        """Kind-specific validation of the whole object."""

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        """Kind-specific rules about what an update may change."""

    def finalizers(self, obj: Obj) -> list[str]:
        """What still blocks the removal of an object marked for deletion."""
        return list(obj.get("metadata", {}).get("finalizers") or [])


def spec_of(obj: Obj) -> Obj:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = obj["spec"] = {}
    return spec


class NamespaceStrategy(Strategy):
    """Namespaces carry the ``kubernetes`` spec finalizer until their content is gone."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Active"}

    def default(self, obj: Obj) -> None:
        name = obj.get("metadata", {}).get("name")
        if name:
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name

    def prepare_create(self, obj: Obj, store: Store) -> None:
        spec_of(obj)["finalizers"] = ["kubernetes"]

    def prepare_update(self, new: Obj, old: Obj) -> None:
        spec_of(new)["finalizers"] = list(old.get("spec", {}).get("finalizers") or [])

    def finalizers(self, obj: Obj) -> list[str]:
        return super().finalizers(obj) + list(obj.get("spec", {}).get("finalizers") or [])


class NodeStrategy(Strategy):
    """Kubelets register nodes with their status in the create request."""

    keep_status_on_create = True


ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
PV_SOURCES = (
    "hostPath", "local", "nfs", "csi", "iscsi", "fc", "awsElasticBlockStore", "gcePersistentDisk", "rbd",
    "cephfs", "cinder", "flexVolume", "azureFile", "azureDisk", "photonPersistentDisk", "portworxVolume",
    "scaleIO", "storageos", "vsphereVolume", "quobyte", "glusterfs", "flocker",
)


def _check_access_modes(errs: FieldErrors, path: str, modes: Any) -> None:
    if not modes:
        errs.required(path)
        return
    for mode in modes:
        check_enum(errs, path, mode, ACCESS_MODES)
    if "ReadWriteOncePod" in modes and len(modes) > 1:
        errs.forbidden(path, "may not use ReadWriteOncePod with other access modes")


def _check_class_name(errs: FieldErrors, path: str, name: Any) -> None:
    if name:
        for problem in name_problems(str(name), "subdomain"):
            errs.invalid(path, name, problem)


class PersistentVolumeStrategy(Strategy):
    """``ValidatePersistentVolume``: capacity, one volume source, immutable source."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending"}

    def default(self, obj: Obj) -> None:
        spec = spec_of(obj)
        spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
        spec.setdefault("volumeMode", "Filesystem")

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = spec_of(obj)
        _check_access_modes(errs, "spec.accessModes", spec.get("accessModes"))
        capacity = spec.get("capacity")
        if not capacity:
            errs.required("spec.capacity")
        elif set(capacity) != {"storage"}:
            errs.unsupported("spec.capacity", sorted(set(capacity) - {"storage"}), ("storage",))
        else:
            check_quantity(errs, "spec.capacity[storage]", capacity["storage"], positive=True)
        sources = [s for s in PV_SOURCES if spec.get(s) is not None]
        if not sources:
            errs.required("spec", "must specify a volume type")
        for extra in sources[1:]:
            errs.forbidden(f"spec.{extra}", "may not specify more than 1 volume type")
        check_enum(errs, "spec.persistentVolumeReclaimPolicy", spec.get("persistentVolumeReclaimPolicy"),
                    ("Delete", "Recycle", "Retain"))
        check_enum(errs, "spec.volumeMode", spec.get("volumeMode"), ("Block", "Filesystem"))
        _check_class_name(errs, "spec.storageClassName", spec.get("storageClassName"))
        self._validate_sources(spec, errs)
        affinity = (spec.get("nodeAffinity") or {}).get("required")
        if affinity is not None:
            for path, kind, detail in node_selector_problems(affinity, "spec.nodeAffinity.required"):
                errs.add(path, kind, detail)

    @staticmethod
    def _validate_sources(spec: Obj, errs: FieldErrors) -> None:
        required = {"local": ("path",), "hostPath": ("path",), "nfs": ("server", "path"),
                    "csi": ("driver", "volumeHandle")}
        for source, fields in required.items():
            if isinstance(spec.get(source), dict):
                for name in fields:
                    if not spec[source].get(name):
                        errs.required(f"spec.{source}.{name}")
        nfs_path = (spec.get("nfs") or {}).get("path")
        if nfs_path and not str(nfs_path).startswith("/"):
            errs.invalid("spec.nfs.path", nfs_path, "must be an absolute path")
        if spec.get("local") is not None and not (spec.get("nodeAffinity") or {}).get("required"):
            errs.required("spec.nodeAffinity", "Local volume requires node affinity")

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        nspec, ospec = spec_of(new), spec_of(old)
        if any(nspec.get(s) != ospec.get(s) for s in PV_SOURCES):
            errs.forbidden("spec.persistentvolumesource",
                           "spec.persistentvolumesource is immutable after creation")
        if nspec.get("volumeMode") != ospec.get("volumeMode"):
            errs.immutable("volumeMode", nspec.get("volumeMode"))
        if ospec.get("nodeAffinity") and nspec.get("nodeAffinity") != ospec.get("nodeAffinity"):
            errs.immutable("nodeAffinity", nspec.get("nodeAffinity"))


DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


class PersistentVolumeClaimStrategy(Strategy):
    """Claims are immutable but for a size increase and the binder's volumeName."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"phase": "Pending"}

    def default(self, obj: Obj) -> None:
        spec_of(obj).setdefault("volumeMode", "Filesystem")

    def prepare_create(self, obj: Obj, store: Store) -> None:
        """The DefaultStorageClass admission plugin: an unset class gets the default one."""
        spec = spec_of(obj)
        if spec.get("storageClassName") is not None:
            return
        classes = [
            sc for sc in store.items(resource_for("storage.k8s.io/v1", "StorageClass"))
            if any((sc["metadata"].get("annotations") or {}).get(a) == "true" for a in DEFAULT_CLASS_ANNOTATIONS)
        ]
        if classes:
            newest = max(classes, key=lambda sc: (sc["metadata"]["creationTimestamp"], sc["metadata"]["name"]))
            spec["storageClassName"] = newest["metadata"]["name"]

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = spec_of(obj)
        _check_access_modes(errs, "spec.accessModes", spec.get("accessModes"))
        requests = (spec.get("resources") or {}).get("requests") or {}
        if "storage" not in requests:
            errs.required("spec.resources[storage]")
        else:
            check_quantity(errs, "spec.resources[storage]", requests["storage"], positive=True)
        check_enum(errs, "spec.volumeMode", spec.get("volumeMode"), ("Block", "Filesystem"))
        _check_class_name(errs, "spec.storageClassName", spec.get("storageClassName"))
        if spec.get("selector") is not None:
            try:
                LabelSelector.from_object(spec["selector"])
            except SelectorError as exc:
                errs.invalid("spec.selector", spec["selector"], str(exc))

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        nspec, ospec = copy.deepcopy(spec_of(new)), copy.deepcopy(spec_of(old))
        if not ospec.get("volumeName"):  # binding sets it once
            ospec.pop("volumeName", None)
            nspec.pop("volumeName", None)
        for spec in (nspec, ospec):
            spec.pop("volumeAttributesClassName", None)
        new_size = (nspec.get("resources") or {}).get("requests", {}).get("storage")
        old_size = (ospec.get("resources") or {}).get("requests", {}).get("storage")
        if (old.get("status") or {}).get("phase") == "Bound" and new_size is not None:
            nspec.setdefault("resources", {}).setdefault("requests", {})["storage"] = old_size
            try:
                if parse_quantity(new_size) < parse_quantity(old_size):
                    errs.forbidden("spec.resources.requests.storage", "field can not be less than previous value")
            except QuantityError:
                pass  # already reported by validate()
        if nspec != ospec:
            errs.forbidden("spec", "spec is immutable after creation except resources.requests and "
                                   "volumeAttributesClassName for bound claims")


class StorageClassStrategy(Strategy):
    """Storage classes are immutable but for metadata and allowVolumeExpansion."""

    def default(self, obj: Obj) -> None:
        obj.setdefault("reclaimPolicy", "Delete")
        obj.setdefault("volumeBindingMode", "Immediate")

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        provisioner = obj.get("provisioner")
        if not provisioner:
            errs.required("provisioner")
        else:
            for problem in qualified_name_problems(str(provisioner)):
                errs.invalid("provisioner", provisioner, problem)
        check_enum(errs, "reclaimPolicy", obj.get("reclaimPolicy"), ("Delete", "Retain"))
        check_enum(errs, "volumeBindingMode", obj.get("volumeBindingMode"), ("Immediate", "WaitForFirstConsumer"))

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        for name in ("parameters", "provisioner", "reclaimPolicy"):
            if new.get(name) != old.get(name):
                errs.forbidden(name, f"updates to {name} are forbidden.")
        if new.get("volumeBindingMode") != old.get("volumeBindingMode"):
            errs.immutable("volumeBindingMode", new.get("volumeBindingMode"))


class CSIStorageCapacityStrategy(Strategy):
    """``ValidateCSIStorageCapacity`` (the same at v1alpha1, v1beta1 and v1): a class name is
    required, quantities are valid and not negative, the topology is a valid label selector;
    the class and the topology cannot be changed."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        name = obj.get("storageClassName")
        if not name:
            errs.required("storageClassName")
        else:
            _check_class_name(errs, "storageClassName", name)
        for field in ("capacity", "maximumVolumeSize"):
            if obj.get(field) is not None:
                check_quantity(errs, field, obj[field])
        topology = obj.get("nodeTopology")
        if topology is not None:
            try:
                selector = LabelSelector.from_object(topology)
            except SelectorError as exc:
                errs.invalid("nodeTopology", topology, str(exc))
            else:
                for requirement in selector.requirements:
                    for problem in qualified_name_problems(requirement.key):
                        errs.invalid("nodeTopology", requirement.key, problem)
                    for value in requirement.values:
                        for problem in label_value_problems(value):
                            errs.invalid("nodeTopology", value, problem)

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        for name in ("storageClassName", "nodeTopology"):
            if new.get(name) != old.get(name):
                errs.immutable(name, new.get(name))


class DataStrategy(Strategy):
    """ConfigMaps and Secrets: key syntax, base64 for secrets, the ``immutable`` flag."""

    def __init__(self, secret: bool) -> None:
        self.secret = secret

    def default(self, obj: Obj) -> None:
        if not self.secret:
            return
        obj.setdefault("type", "Opaque")
        string_data = obj.pop("stringData", None) or {}
        if string_data:
            data = obj.setdefault("data", {}) or {}
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            obj["data"] = data

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        seen: set[str] = set()
        for part in ("data", "binaryData"):
            for key, value in (obj.get(part) or {}).items():
                if not CONFIG_KEY.match(key) or key in (".", ".."):
                    errs.invalid(f"{part}[{key}]", key, "a valid config key must consist of alphanumeric "
                                 "characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', "
                                 "regex used for validation is '[-._a-zA-Z0-9]+')")
                if key in seen:
                    errs.invalid(f"{part}[{key}]", key, "duplicate of key present in data")
                seen.add(key)
                if (self.secret or part == "binaryData") and not self._is_base64(value):
                    errs.invalid(f"{part}[{key}]", "<value omitted>", "illegal base64 data")

    @staticmethod
    def _is_base64(value: Any) -> bool:
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            return False
        return True

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        if self.secret and new.get("type") != old.get("type"):
            errs.immutable("type", new.get("type"))
        if old.get("immutable"):
            if not new.get("immutable"):
                errs.forbidden("immutable", "field is immutable when `immutable` is set")
            for part in ("data", "binaryData"):
                if new.get(part) != old.get(part):
                    errs.forbidden(part, "field is immutable when `immutable` is set")


class ServiceStrategy(Strategy):
    """Services get a cluster IP allocated; it is immutable afterwards."""

    def initial_status(self, obj: Obj) -> Obj:
        return {"loadBalancer": {}}

    def default(self, obj: Obj) -> None:
        spec = spec_of(obj)
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))

    def prepare_create(self, obj: Obj, store: Store) -> None:
        spec = spec_of(obj)
        if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
            spec["clusterIP"] = store.allocate_cluster_ip()
        if spec.get("clusterIP"):
            spec.setdefault("clusterIPs", [spec["clusterIP"]])

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        spec = spec_of(obj)
        check_enum(errs, "spec.type", spec.get("type"), ("ClusterIP", "ExternalName", "LoadBalancer", "NodePort"))
        ports = spec.get("ports") or []
        for i, port in enumerate(ports):
            number = (port or {}).get("port")
            if not isinstance(number, int) or not 0 < number < 65536:
                errs.invalid(f"spec.ports[{i}].port", number, "must be between 1 and 65535, inclusive")
            if len(ports) > 1 and not (port or {}).get("name"):
                errs.required(f"spec.ports[{i}].name")

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        old_ip, new_ip = spec_of(old).get("clusterIP"), spec_of(new).get("clusterIP")
        if old_ip and new_ip != old_ip and "ExternalName" not in (spec_of(new).get("type"), spec_of(old).get("type")):
            errs.immutable("spec.clusterIPs[0]", new_ip)


class CoreEventStrategy(Strategy):
    """core/v1 Events as client-go's recorders write them."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        involved = obj.get("involvedObject") or {}
        namespace = obj.get("metadata", {}).get("namespace")
        if involved.get("namespace") and involved["namespace"] != namespace:
            errs.invalid("involvedObject.namespace", involved["namespace"], "does not match event.namespace")


class EventsV1Strategy(Strategy):
    """events.k8s.io/v1 Events are validated strictly (``ValidateEventCreate``, new style)."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        for name in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
            if not obj.get(name):
                errs.required(name)
        check_enum(errs, "type", obj.get("type"), ("Normal", "Warning"))
        if len(str(obj.get("note") or "")) > 1024:
            errs.invalid("note", "<value omitted>", "can have at most 1024 characters")


class RbacStrategy(Strategy):
    """Roles need verbs on every rule; bindings cannot change their roleRef."""

    def validate(self, obj: Obj, errs: FieldErrors) -> None:
        for i, rule in enumerate(obj.get("rules") or []):
            if not (rule or {}).get("verbs"):
                errs.required(f"rules[{i}].verbs", "verbs must contain at least one value")
        if obj.get("kind", "").endswith("Binding") and not obj.get("roleRef"):
            errs.required("roleRef.name")

    def validate_update(self, new: Obj, old: Obj, errs: FieldErrors) -> None:
        if old.get("roleRef") and new.get("roleRef") != old.get("roleRef"):
            errs.invalid("roleRef", new.get("roleRef"), "cannot change roleRef")

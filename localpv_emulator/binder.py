"""The controllers the emulator runs next to its store, chiefly the PV binder.

A storage provisioner is only half of a volume's life: kube-controller-manager's PV
controller (and, under ``WaitForFirstConsumer``, kube-scheduler's volume binder) turn a
PersistentVolume and a claim into a bound pair, mark volumes Released when their claim goes,
and ask external provisioners to act. Without that half the product's lifecycle tests could
not run, so :class:`PVBinder` does the part storage needs, with the real rules for picking a
volume. All controllers here react to store changes at once (no slow polling) and run each
pass under the store lock, so a pass is atomic and the outcome deterministic.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import re
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, Protocol

from localpv_emulator.selectors import LabelSelector, SelectorError, node_selector_matches

__all__ = [
    "ANN_BIND_COMPLETED",
    "ANN_BOUND_BY_CONTROLLER",
    "ANN_SELECTED_NODE",
    "ANN_STORAGE_PROVISIONER",
    "ANN_STORAGE_PROVISIONER_BETA",
    "EXTERNAL_PROVISIONER_FINALIZER",
    "NO_PROVISIONER",
    "PV_CONTROLLER_FINALIZER",
    "Cluster",
    "PVBinder",
    "QuantityError",
    "Reconciler",
    "parse_quantity",
]

log = logging.getLogger(__name__)

Obj = dict[str, Any]

ANN_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
ANN_BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
#: KEP-2644's finalizers: the PV controller's, on in-tree volumes it provisioned, and
#: external-provisioner's, on the volumes a CSI provisioner made.
PV_CONTROLLER_FINALIZER = "kubernetes.io/pv-controller"
EXTERNAL_PROVISIONER_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_STORAGE_PROVISIONER_BETA = "volume.beta.kubernetes.io/storage-provisioner"
NO_PROVISIONER = "kubernetes.io/no-provisioner"


# --------------------------------------------------------------------------- quantities


class QuantityError(ValueError):
    """Not a Kubernetes ``resource.Quantity``."""


_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s + "i": Fraction(1024 ** (i + 1)) for i, s in enumerate("KMGTPE")},
}


def parse_quantity(text: Any) -> Fraction:
    """Exact value of a quantity such as ``10Gi``, ``500M``, ``1e3`` or ``100m``.

    Capacities decide which volume a claim gets, so they are compared exactly (a Fraction),
    never as floats.
    """
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise QuantityError(f"quantities must be strings, got {text!r}")
    return _parse_quantity(str(text))


@functools.lru_cache(maxsize=4096)  # the binder compares the same few sizes over and over
def _parse_quantity(text: str) -> Fraction:
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError("quantities must match the regular expression "
                            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix not in _SUFFIX:  # an exponent (1e3, 1E2); E alone and Ei are suffixes
        return Fraction(number) * Fraction(10) ** int(suffix[1:])
    return Fraction(number) * _SUFFIX[suffix]


def _storage(resources: Mapping[str, Any] | None) -> int:
    """A storage size in nano-units, rounded up: exact integer comparisons, and fast ones."""
    value = (resources or {}).get("storage", "0")
    return _nano_units(value) if isinstance(value, str) else 0


@functools.lru_cache(maxsize=4096)
def _nano_units(text: str) -> int:
    try:
        return math.ceil(parse_quantity(text) * 10**9)
    except QuantityError:
        return 0


# --------------------------------------------------------------------------- controller base


class Cluster(Protocol):
    """What a controller needs from the store: consistent reads and validated writes.

    ``view`` returns the stored dicts themselves (read-only by contract) so a pass over
    thousands of volumes costs no copies; writes go through the same validation and watch
    bookkeeping as HTTP requests.
    """

    changed: threading.Condition

    @property
    def resource_version(self) -> int: ...

    def changed_since(self, kinds: Iterable[tuple[str, str]], rv: int) -> bool: ...

    def changes_since(self, rv: int) -> list[tuple[str, str, str, str]] | None:
        """(apiVersion, kind, namespace, name) of each write after ``rv``; None if forgotten."""

    def view(self, api_version: str, kind: str) -> list[Obj]: ...

    def peek(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None: ...

    def update(self, obj: Obj, subresource: str | None = None) -> Obj: ...


class Reconciler:
    """A controller thread that re-runs :meth:`reconcile` whenever the store changes.

    The pass runs with the store's lock held, so it sees one consistent state and its writes
    interleave with no client request. Its own writes wake it once more; a pass that changes
    nothing leaves the store's resourceVersion unchanged, which is how the loop settles.
    """

    name = "reconciler"
    #: (apiVersion, kind) pairs whose changes trigger a pass; empty means any change.
    kinds: tuple[tuple[str, str], ...] = ()

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._seen = -1
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failures: list[str] = []

    def start(self) -> None:
        """Start the controller thread (a daemon: it never keeps a test process alive)."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name=f"emulator-{self.name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        with self.cluster.changed:
            self._stopping = True
            self.cluster.changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def idle(self) -> bool:
        """True when the last pass saw the store's current state (called with the lock held)."""
        return self._thread is None or self._seen == self.cluster.resource_version

    def _run(self) -> None:
        changed = self.cluster.changed
        with changed:
            while not self._stopping:
                rv = self.cluster.resource_version
                if rv == self._seen:
                    changed.wait(timeout=1.0)
                    continue
                if self._seen < 0 or not self.kinds or self.cluster.changed_since(self.kinds, self._seen):
                    self._pass()
                self._seen = rv
                changed.notify_all()

    def _pass(self) -> None:
        try:
            self.reconcile()
        except Exception as exc:  # a bug in a pass must not kill the controller silently
            log.exception("%s pass failed", self.name)
            self.failures.append(f"{type(exc).__name__}: {exc}")

    def reconcile(self) -> None:
        """One pass over the current state; must be idempotent."""
        raise NotImplementedError


# --------------------------------------------------------------------------- the PV binder


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.setdefault("metadata", {})
    return meta


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return obj.get("metadata", {}).get("annotations") or {}


def _phase(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("phase") or "")


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _ref_key(pv: Mapping[str, Any]) -> tuple[str, str] | None:
    ref = pv.get("spec", {}).get("claimRef")
    return (str(ref.get("namespace", "")), str(ref.get("name", ""))) if ref else None


def _bound_to(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """``IsVolumeBoundToClaim``: claimRef names the claim and its uid is empty or equal."""
    ref = pv.get("spec", {}).get("claimRef")
    if not ref:
        return False
    ns, name = _key(claim)
    if ref.get("namespace") != ns or ref.get("name") != name:
        return False
    uid = ref.get("uid")
    return not uid or uid == claim["metadata"].get("uid")


class PVBinder(Reconciler):
    """The binding part of kube-controller-manager's PV controller (plus the scheduler's
    delayed binding, since the emulator has no scheduler).

    Real behaviour kept: phases Pending→Available→Bound→Released, claim phases
    Pending→Bound→Lost; best match = pre-bound volume first, then the volumes with the
    fewest access modes that cover the request, then the smallest sufficient capacity;
    class, volumeMode, selector and (for delayed binding) node affinity must fit; writes
    happen in the real order (PV claimRef, PV phase, claim volumeName, claim phase), each a
    separate watch event. Not emulated: recycling, deleting released volumes (external
    provisioners do that), the Failed phase, volume expansion.

    With ``honor_pv_reclaim_policy`` (the feature gate ``HonorPVReclaimPolicy``: alpha 1.23,
    beta and on by default 1.31, GA 1.33; KEP-2644), the controller's finalizer bookkeeping
    too: a dynamically provisioned *in-tree* volume (``pv.kubernetes.io/provisioned-by``
    ``kubernetes.io/...``) carries ``kubernetes.io/pv-controller`` while its policy is
    ``Delete`` (removed with ``Retain`` or ``Recycle``, and external-provisioner's finalizer
    removed from it), so a Bound one deleted first stays Terminating until its claim is gone;
    having no in-tree plugins, the emulator takes a released volume's delete as done and
    removes the finalizer of one being deleted. Volumes of other provisioners (CSI drivers,
    static ones) are never touched: their provisioner keeps its own finalizer. CSI migration
    is not emulated.
    """

    name = "pv-binder"
    kinds = (
        ("v1", "PersistentVolume"),
        ("v1", "PersistentVolumeClaim"),
        ("v1", "Node"),
        ("storage.k8s.io/v1", "StorageClass"),
    )

    def __init__(self, cluster: Cluster, *, honor_pv_reclaim_policy: bool = True) -> None:
        super().__init__(cluster)
        self.honor_pv_reclaim_policy = honor_pv_reclaim_policy

    def reconcile(self) -> None:
        claims, volumes = self._dirty()
        self._index_volumes()
        for claim in sorted(claims, key=lambda c: (c["metadata"].get("creationTimestamp", ""), _key(c))):
            self._sync_claim(claim)  # a claim's sync writes only that claim and volumes
        claims_now = {_key(c): c for c in self.cluster.view("v1", "PersistentVolumeClaim")}
        for name in volumes:
            volume = self._volume(name)
            if volume is not None:
                self._sync_volume(volume, claims_now)

    def _dirty(self) -> tuple[list[Obj], list[str]]:
        """What this pass must look at: everything at first (or after history loss), otherwise
        the changed objects, their counterparts, and every claim not yet Bound (a new volume,
        class or node may be what it waits for). Keeps a pass cheap with thousands of PVs."""
        all_claims = self.cluster.view("v1", "PersistentVolumeClaim")
        changes = self.cluster.changes_since(self._seen) if self._seen >= 0 else None
        if changes is None:
            return all_claims, [v["metadata"]["name"] for v in self.cluster.view("v1", "PersistentVolume")]
        changed_claims = {(ns, name) for _, kind, ns, name in changes if kind == "PersistentVolumeClaim"}
        changed_volumes = {name for _, kind, _, name in changes if kind == "PersistentVolume"}
        claims = [c for c in all_claims if _key(c) in changed_claims or _phase(c) != "Bound"
                  or c["spec"].get("volumeName") in changed_volumes]
        volumes = changed_volumes | {str(c["spec"]["volumeName"]) for c in claims if c["spec"].get("volumeName")}
        if changed_claims:  # a deleted claim releases the volume that names it
            volumes.update(v["metadata"]["name"] for v in self.cluster.view("v1", "PersistentVolume")
                           if _ref_key(v) in changed_claims)
        return claims, sorted(volumes)

    # -- reads that see this pass's own earlier writes (volumes may change while claims sync)

    def _volume(self, name: str) -> Obj | None:
        return self.cluster.peek("v1", "PersistentVolume", name) if name else None

    def _class(self, name: str) -> Obj | None:
        return self.cluster.peek("storage.k8s.io/v1", "StorageClass", name) if name else None

    # -- claims

    def _sync_claim(self, claim: Obj) -> None:
        if _deleting(claim):
            return
        spec = claim.get("spec", {})
        volume_name = str(spec.get("volumeName") or "")
        if not volume_name:
            self._sync_unbound_claim(claim)
        elif _annotations(claim).get(ANN_BIND_COMPLETED) != "yes":
            self._sync_prebound_claim(claim, volume_name)
        else:
            self._sync_bound_claim(claim, volume_name)

    def _sync_unbound_claim(self, claim: Obj) -> None:
        storage_class = self._class(str(claim["spec"].get("storageClassName") or ""))
        delayed = (storage_class or {}).get("volumeBindingMode") == "WaitForFirstConsumer"
        selected = _annotations(claim).get(ANN_SELECTED_NODE)
        node = self._node_labels(selected) if selected else None
        volume = self._best_match(claim, node, delayed)
        if volume is not None:
            self._bind(volume, claim)
            return
        provisioner = str((storage_class or {}).get("provisioner") or "")
        if provisioner and provisioner != NO_PROVISIONER and (not delayed or selected):
            claim = self._ask_provisioner(claim, provisioner)
        self._set_claim_phase(claim, "Pending")

    def _sync_prebound_claim(self, claim: Obj, volume_name: str) -> None:
        volume = self._volume(volume_name)
        if volume is None or _deleting(volume):
            self._set_claim_phase(claim, "Pending")
        elif not volume["spec"].get("claimRef"):
            if self._satisfies(volume, claim):
                self._bind(volume, claim)
            else:
                self._set_claim_phase(claim, "Pending")
        elif _bound_to(volume, claim):
            self._bind(volume, claim)
        else:
            self._set_claim_phase(claim, "Pending")

    def _sync_bound_claim(self, claim: Obj, volume_name: str) -> None:
        volume = self._volume(volume_name)
        if volume is None:
            self._set_claim_phase(claim, "Lost")
        elif not volume["spec"].get("claimRef") or _bound_to(volume, claim):
            self._bind(volume, claim)
        else:
            self._set_claim_phase(claim, "Lost")

    def _node_labels(self, node_name: str) -> tuple[str, Mapping[str, str]]:
        node = self.cluster.peek("v1", "Node", node_name)
        if node is None:  # no Node object: assume the labels every kubelet sets
            return node_name, {"kubernetes.io/hostname": node_name}
        return node_name, node["metadata"].get("labels") or {}

    def _satisfies(self, volume: Obj, claim: Obj) -> bool:
        """``checkVolumeSatisfyClaim``: capacity, class and volume mode (for claims that name a PV)."""
        vspec, cspec = volume.get("spec", {}), claim.get("spec", {})
        return (
            _storage(vspec.get("capacity")) >= _storage(cspec.get("resources", {}).get("requests"))
            and str(vspec.get("storageClassName") or "") == str(cspec.get("storageClassName") or "")
            and vspec.get("volumeMode", "Filesystem") == cspec.get("volumeMode", "Filesystem")
        )

    def _best_match(
        self, claim: Obj, node: tuple[str, Mapping[str, str]] | None, delayed: bool
    ) -> Obj | None:
        """``findMatchingVolume`` + ``findByClaimAccessModes`` of the real controller."""
        cspec = claim.get("spec", {})
        wanted_modes = set(cspec.get("accessModes") or [])
        request = _storage(cspec.get("resources", {}).get("requests"))
        try:
            selector = LabelSelector.from_object(cspec["selector"]) if cspec.get("selector") else None
        except SelectorError:
            return None
        waiting = delayed and node is None  # then only a volume pre-bound to the claim will do
        wanted_class = str(cspec.get("storageClassName") or "")
        candidates: list[tuple[int, int, str, Obj]] = []
        for volume in self._candidates(claim, wanted_class):
            vspec = volume.get("spec", {})
            if vspec.get("claimRef"):
                if _bound_to(volume, claim) and self._fits(volume, cspec, request):
                    return volume if self._fits_node(vspec, node) else None
                continue
            if waiting or _phase(volume) != "Available" or str(vspec.get("storageClassName") or "") != wanted_class:
                continue
            modes = vspec.get("accessModes") or ()
            if not wanted_modes.issubset(modes) or not self._fits(volume, cspec, request):
                continue
            if selector is not None and not selector.matches(volume["metadata"].get("labels")):
                continue
            if self._fits_node(vspec, node):
                candidates.append((len(modes), _storage(vspec.get("capacity")), volume["metadata"]["name"], volume))
        return min(candidates, key=lambda c: c[:3])[3] if candidates else None

    def _index_volumes(self) -> None:
        """Index volumes once per pass by the claim they name and by class, so matching a
        claim looks at its own candidates, not at every volume (1,000 pending claims
        against 1,000 volumes would otherwise hold the store lock for seconds)."""
        self._by_ref: dict[tuple[str, str], list[str]] = {}
        self._by_class: dict[str, list[str]] = {}
        for volume in self.cluster.view("v1", "PersistentVolume"):
            name = volume["metadata"]["name"]
            ref = _ref_key(volume)
            if ref is not None:
                self._by_ref.setdefault(ref, []).append(name)
            else:
                self._by_class.setdefault(str(volume.get("spec", {}).get("storageClassName") or ""), []).append(name)

    def _candidates(self, claim: Obj, wanted_class: str) -> list[Obj]:
        """The current versions of the volumes that could match ``claim``, in name order.

        Read through :meth:`_volume`, so binds made earlier in this pass are seen (a volume
        indexed as free may have been claimed since; the caller's checks drop it)."""
        names = self._by_ref.get(_key(claim), []) + self._by_class.get(wanted_class, [])
        found = (self._volume(name) for name in sorted(set(names)))
        return [v for v in found if v is not None]

    @staticmethod
    def _fits(volume: Obj, cspec: Obj, request: int) -> bool:
        """Capacity, volume mode and not being deleted: checked for pre-bound volumes too."""
        vspec = volume.get("spec", {})
        return (
            vspec.get("volumeMode", "Filesystem") == cspec.get("volumeMode", "Filesystem")
            and _storage(vspec.get("capacity")) >= request
            and not _deleting(volume)
        )

    @staticmethod
    def _fits_node(vspec: Obj, node: tuple[str, Mapping[str, str]] | None) -> bool:
        """Node affinity counts only when a node was selected (delayed binding)."""
        required = (vspec.get("nodeAffinity") or {}).get("required")
        return node is None or node_selector_matches(required, node[1], node[0])

    def _ask_provisioner(self, claim: Obj, provisioner: str) -> Obj:
        annotations = _annotations(claim)
        if annotations.get(ANN_STORAGE_PROVISIONER) == provisioner and (
            annotations.get(ANN_STORAGE_PROVISIONER_BETA) == provisioner
        ):
            return claim
        new = copy.deepcopy(claim)
        ann = _meta(new).setdefault("annotations", {})
        ann[ANN_STORAGE_PROVISIONER] = provisioner
        ann[ANN_STORAGE_PROVISIONER_BETA] = provisioner
        return self.cluster.update(new)

    # -- binding

    def _bind(self, volume: Obj, claim: Obj) -> None:
        """Four writes in the real controller's order; each is skipped when already done."""
        volume = self._bind_volume_to_claim(volume, claim)
        self._set_volume_phase(volume, "Bound")
        claim = self._bind_claim_to_volume(claim, volume)
        self._set_claim_bound(claim, volume)

    def _bind_volume_to_claim(self, volume: Obj, claim: Obj) -> Obj:
        meta = claim["metadata"]
        ref = volume["spec"].get("claimRef") or {}
        wanted = {
            "kind": "PersistentVolumeClaim",
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "apiVersion": "v1",
            "resourceVersion": meta.get("resourceVersion"),
        }
        if all(ref.get(k) == wanted[k] for k in ("namespace", "name", "uid")):
            return volume
        new = copy.deepcopy(volume)
        if not ref:
            _meta(new).setdefault("annotations", {})[ANN_BOUND_BY_CONTROLLER] = "yes"
        new["spec"]["claimRef"] = {**ref, **wanted}
        return self.cluster.update(new)

    def _bind_claim_to_volume(self, claim: Obj, volume: Obj) -> Obj:
        name = volume["metadata"]["name"]
        annotations = _annotations(claim)
        if claim["spec"].get("volumeName") == name and annotations.get(ANN_BIND_COMPLETED) == "yes":
            return claim
        new = copy.deepcopy(claim)
        ann = _meta(new).setdefault("annotations", {})
        if not new["spec"].get("volumeName"):
            new["spec"]["volumeName"] = name
            ann[ANN_BOUND_BY_CONTROLLER] = "yes"
        ann[ANN_BIND_COMPLETED] = "yes"
        return self.cluster.update(new)

    def _set_claim_bound(self, claim: Obj, volume: Obj) -> None:
        vspec = volume["spec"]
        status = dict(claim.get("status") or {})
        status.update(
            phase="Bound",
            capacity=dict(vspec.get("capacity") or {}),
            accessModes=list(vspec.get("accessModes") or []),
        )
        self._write_status(claim, status)

    def _set_claim_phase(self, claim: Obj, phase: str) -> None:
        if _phase(claim) != phase:
            self._write_status(claim, {**(claim.get("status") or {}), "phase": phase})

    # -- volumes

    def _sync_volume(self, volume: Obj, claims: Mapping[tuple[str, str], Obj]) -> None:
        if self.honor_pv_reclaim_policy:
            volume = self._deletion_finalizers(volume)
        name = volume["metadata"]["name"]
        ref = volume.get("spec", {}).get("claimRef")
        if not ref or not ref.get("uid"):
            self._set_volume_phase(volume, "Available")
            return
        claim = claims.get((str(ref.get("namespace", "")), str(ref.get("name", ""))))
        if claim is None or claim["metadata"].get("uid") != ref.get("uid"):
            if _phase(volume) != "Failed":
                self._set_volume_phase(volume, "Released")
            return
        claimed = claim.get("spec", {}).get("volumeName")
        if claimed == name:
            self._set_volume_phase(volume, "Bound")
        elif claimed and _annotations(volume).get(ANN_BOUND_BY_CONTROLLER) == "yes":
            self._unbind(volume)

    def _deletion_finalizers(self, volume: Obj) -> Obj:
        """``modifyDeletionFinalizers`` for in-tree dynamic volumes, plus the end of their
        deletion (the emulator has no plugin whose delete could fail)."""
        provisioner = str(_annotations(volume).get(ANN_PROVISIONED_BY) or "")
        if not provisioner.startswith("kubernetes.io/"):
            return volume
        current = list(volume["metadata"].get("finalizers") or [])
        wanted = [f for f in current if f != EXTERNAL_PROVISIONER_FINALIZER]
        delete = volume.get("spec", {}).get("persistentVolumeReclaimPolicy") == "Delete"
        released = _deleting(volume) and _phase(volume) == "Released"
        if not delete or released:
            wanted = [f for f in wanted if f != PV_CONTROLLER_FINALIZER]
        elif PV_CONTROLLER_FINALIZER not in wanted and not _deleting(volume):
            wanted.append(PV_CONTROLLER_FINALIZER)
        if wanted == current:
            return volume
        new = copy.deepcopy(volume)
        new["metadata"]["finalizers"] = wanted
        return self.cluster.update(new)

    def _unbind(self, volume: Obj) -> None:
        """The claim went to another volume: give this one back (controller-made binds only)."""
        new = copy.deepcopy(volume)
        new["spec"].pop("claimRef", None)
        _meta(new).get("annotations", {}).pop(ANN_BOUND_BY_CONTROLLER, None)
        self._set_volume_phase(self.cluster.update(new), "Available")

    def _set_volume_phase(self, volume: Obj, phase: str) -> None:
        if _phase(volume) != phase:
            self._write_status(volume, {**(volume.get("status") or {}), "phase": phase})

    def _write_status(self, obj: Obj, status: Obj) -> None:
        if obj.get("status") == status:
            return
        if obj.get("kind") == "PersistentVolume" and status.get("phase") != _phase(obj):
            status["lastPhaseTransitionTime"] = _now()  # PVs only (GA in 1.31); claims have no such field
        new = copy.deepcopy(obj)
        new["status"] = status
        self.cluster.update(new, subresource="status")

"""``localpv node-cleanup``: free the claims and volumes that pin workloads to deleted Nodes.

A local PV can only ever be used on its node. When that Node object is deleted for good
(a VM replaced, a machine retired), a StatefulSet pod whose PVC is bound to such a PV can
never be scheduled again until someone deletes the PVC. This controller does that, opt-in
per StorageClass, and never touches data on any disk (research/local-static.md §1.11):

* **claim path** - on start, on every Node deletion (and, here, every ``resync``): each
  local PV of an opted-in class that has a claim and whose affinity names only nodes that
  no longer exist gets a ``ReferencedNodeDeleted`` warning on its PVC and is scheduled for
  ``pvc_deletion_delay`` later, giving the node time to come back. When due, everything is
  checked again and the PVC is deleted with a UID precondition.
* **stale PV path** - every ``stale_pv_discovery_interval``: such PVs that are
  ``Available`` (any reclaim policy) or ``Released`` with ``Delete`` are deleted.

Where this is deliberately safer than upstream:

* the cache only proposes; a deletion is decided on fresh reads from the API server (the
  PV, its claim, and each node checked by name and by hostname label). A node the cache
  knows is trusted to exist without asking, since believing in a node can only spare objects;
* PVs are deleted with UID *and* resourceVersion preconditions, so a PV that was bound (or
  changed in any way) after it was judged is left for the next pass instead of deleted;
* a PV whose claim still exists is never deleted here: freeing the claim is the claim
  path's job, and the PV follows once the claim is gone (the window in which the binder has
  written a PV's claimRef but not yet its Bound phase is covered by this);
* a PV whose affinity names no hostname is never a candidate (no node to be "gone");
* objects already being deleted are left alone, and Released PVs are not scheduled on the
  claim path (their claim is gone), so periodic rescans stay quiet.

The decision functions at the top are pure (objects and lookups in, verdicts out); the
controller below them only gathers inputs and carries out the verdicts.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from localpv.clock import Clock, SystemClock
from localpv.config import format_go_duration
from localpv.kube import objects as k8s
from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, Conflict, NotFound
from localpv.kube.events import WARNING, EventRecorder
from localpv.kube.informer import Informer
from localpv.kube.objects import Obj
from localpv.kube.resources import NODES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from localpv.kube.workqueue import ItemBackoff, WorkQueue
from localpv.naming import HOSTNAME_LABEL_KEY, node_label_value
from localpv.nodecleanup.lostnode import pv_node_names
from localpv.nodecleanup.metrics import NodeCleanupMetrics
from localpv.supervise import Supervisor

log = logging.getLogger(__name__)

EVENT_COMPONENT = "cleanup-controller"
REFERENCED_NODE_DELETED = "ReferencedNodeDeleted"

#: Answers "does a Node of this name exist?"; a lookup that cannot tell must say True.
NodeExists = Callable[[str], bool]
#: Answers "does the claim this claimRef names (same UID) still exist?".
ClaimExists = Callable[[Obj], bool]


# ---------------------------------------------------------------------------- pure decisions


def parse_class_names(text: str) -> frozenset[str]:
    """``--storageclass-names``: a comma list; blanks are dropped (empty → nothing is cleaned)."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def is_opted_in_local_pv(pv: Obj, class_names: Iterable[str]) -> bool:
    """A ``spec.local`` PV whose StorageClass was opted in."""
    spec = pv.get("spec") or {}
    return spec.get("local") is not None and spec.get("storageClassName") in set(class_names)


def nodes_all_gone(pv: Obj, node_exists: NodeExists) -> bool:
    """True when the affinity names at least one node and none of them exists.

    A PV naming no node is never "gone": nothing proves its node was deleted.
    """
    names = pv_node_names(pv)
    return bool(names) and not any(node_exists(name) for name in sorted(names))


def claim_cleanup_blocker(pv: Obj, class_names: Iterable[str], node_exists: NodeExists) -> str | None:
    """Why the claim of ``pv`` must not be scheduled for deletion; None when it must.

    Cheap checks come first so that ``node_exists`` (possibly an API call) is asked last.
    """
    if not is_opted_in_local_pv(pv, class_names):
        return "not a local volume of an opted-in StorageClass"
    if k8s.pv_claim_ref(pv) is None:
        return "volume has no claim"
    if k8s.pv_phase(pv) == "Released":
        return "volume is released: its claim is gone already"
    if not nodes_all_gone(pv, node_exists):
        return "a node of the volume's affinity exists (or no node is named)"
    return None


def claim_deletion_blocker(
    pv: Obj, pvc: Obj | None, class_names: Iterable[str], node_exists: NodeExists
) -> str | None:
    """At the due time: everything :func:`claim_cleanup_blocker` checks, and that ``pvc``
    (the object the PV's claimRef names, None if absent) is still that very claim."""
    reason = claim_cleanup_blocker(pv, class_names, node_exists)
    if reason is not None:
        return reason
    if pvc is None:
        return "claim no longer exists"
    if (pvc.get("spec") or {}).get("volumeName") != k8s.name(pv):
        return "claim is bound to another volume"
    if k8s.uid(pvc) != str((k8s.pv_claim_ref(pv) or {}).get("uid") or ""):
        return "claim was replaced (UID differs from the volume's claimRef)"
    if k8s.deleting(pvc):
        return "claim is being deleted already"
    return None


def stale_pv_blocker(
    pv: Obj, class_names: Iterable[str], node_exists: NodeExists, claim_exists: ClaimExists
) -> str | None:
    """Why ``pv`` must not be deleted as stale; None when it must.

    Upstream's rule (Available with any reclaim policy, or Released with Delete, on nodes
    that are all gone) plus: not while its claim exists, not when already being deleted.
    """
    if not is_opted_in_local_pv(pv, class_names):
        return "not a local volume of an opted-in StorageClass"
    if k8s.deleting(pv):
        return "volume is being deleted already"
    phase = k8s.pv_phase(pv)
    policy = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy")
    if not (phase == "Available" or (phase == "Released" and policy == "Delete")):
        return f"volume is {phase or 'without phase'} with reclaim policy {policy}"
    if not nodes_all_gone(pv, node_exists):
        return "a node of the volume's affinity exists (or no node is named)"
    ref = k8s.pv_claim_ref(pv)
    if ref is not None and claim_exists(ref):
        return "its claim still exists (the claim is freed first)"
    return None


def _no_claim_cache(ref: Obj) -> bool:
    """The first look has no claim cache: it assumes absent, the fresh check asks the API."""
    return False


# ---------------------------------------------------------------------------- cluster reads


class NodeCleanupLookups:
    """Node, PV and claim lookups: the informer cache first, the API server to confirm.

    Lookups raise :class:`ApiError` when the server cannot answer; :meth:`assume_node`
    turns that into "exists", the conservative answer for passes that must not stall.
    """

    def __init__(self, api: KubeApi, nodes: Informer) -> None:
        self.api = api
        self.nodes = nodes

    def node_in_cache(self, name: str) -> bool:
        if self.nodes.get(name) is not None:
            return True
        return any(((n.get("metadata") or {}).get("labels") or {}).get(HOSTNAME_LABEL_KEY) == name
                   for n in self.nodes.list())

    def node_exists(self, name: str) -> bool:
        """By name, else any Node labelled ``kubernetes.io/hostname=<name>``; asks the API
        unless the cache already knows the node."""
        if self.node_in_cache(name):
            return True
        try:
            self.api.get(NODES, name)
            return True
        except NotFound:
            pass
        if node_label_value(name) != name:
            return False  # not a valid label value: no Node can carry it as its hostname label
        items, _ = self.api.list(NODES, label_selector=f"{HOSTNAME_LABEL_KEY}={name}", page_size=1)
        return bool(items)

    def assume_node(self, name: str) -> bool:
        try:
            return self.node_exists(name)
        except ApiError as err:
            log.warning("cannot tell whether node %s exists (%s): assuming it does", name, err)
            return True

    def pv(self, name: str) -> Obj | None:
        try:
            return self.api.get(PERSISTENT_VOLUMES, name)
        except NotFound:
            return None

    def claim(self, ref: Obj) -> Obj | None:
        """The claim ``ref`` names, by namespace and name (the caller compares UIDs)."""
        try:
            return self.api.get(PERSISTENT_VOLUME_CLAIMS, str(ref["name"]), str(ref.get("namespace") or ""))
        except NotFound:
            return None

    def claim_exists(self, ref: Obj) -> bool:
        pvc = self.claim(ref)
        return pvc is not None and (not ref.get("uid") or k8s.uid(pvc) == ref.get("uid"))


# ---------------------------------------------------------------------------- controller


#: client-go's controller queues back off from milliseconds to 1000 s; a claim check that
#: failed is retried after 1 s, doubling up to 5 min (its PVC stays until then: safe side).
CLAIM_RETRY = ItemBackoff(initial=1.0, maximum=300.0)


@dataclass(frozen=True)
class NodeCleanupOptions:
    """The flags of ``localpv node-cleanup`` (upstream's defaults)."""

    storage_class_names: frozenset[str]
    pvc_deletion_delay: float = 60.0
    stale_pv_discovery_interval: float = 10.0
    resync: float = 600.0
    worker_threads: int = 10
    #: Requeue delays of a claim whose check or deletion failed.
    retry: ItemBackoff = CLAIM_RETRY
    sync_timeout: float = 120.0


class NodeCleanupError(Exception):
    """The controller could not start (caches never synced)."""


class NodeCleanupController:
    """Informers for Nodes and PVs, a delayed work queue of PV names, and three loops:
    workers (claim deletions), the scheduler (claim path scans) and the stale PV deleter."""

    def __init__(
        self,
        api: KubeApi,
        options: NodeCleanupOptions,
        *,
        metrics: NodeCleanupMetrics | None = None,
        recorder: EventRecorder | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.api = api
        self.options = options
        self.metrics = metrics or NodeCleanupMetrics()
        self.clock = clock or SystemClock()
        self.recorder = recorder or EventRecorder(api.for_events(), component=EVENT_COMPONENT, clock=self.clock)
        # The informers back off from network trouble in real time, whatever clock drives the
        # controller's own delays and periods.
        self.nodes = Informer(api, NODES, on_change=self._on_node_change, name="node-cleanup-nodes")
        self.pvs = Informer(api, PERSISTENT_VOLUMES, name="node-cleanup-pvs")
        self.view = NodeCleanupLookups(api, self.nodes)
        self.queue = WorkQueue("node-cleanup", backoff=options.retry, clock=self.clock)
        #: Recent (PV name, what the claim path concluded), newest last: logs, tests, debugging.
        self.history: deque[tuple[str, str]] = deque(maxlen=1000)
        self.scans = 0
        self.stale_passes = 0
        self._scheduled: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rescan = threading.Event()
        self._stale_wake = threading.Event()
        self._last_stale_pass = self.clock.monotonic()
        self.supervisor = Supervisor(clock=self.clock, stopping=self._stop)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if not self.options.storage_class_names:
            log.warning("no StorageClass opted in (--storageclass-names): nothing will be cleaned")
        self.recorder.start()
        for informer in (self.nodes, self.pvs):
            informer.start()
        for informer in (self.nodes, self.pvs):
            if not informer.wait_synced(self.options.sync_timeout):
                raise NodeCleanupError(f"{informer.name}: cache not synced after {self.options.sync_timeout:.0f}s")
        for i in range(self.options.worker_threads):
            self._spawn(f"node-cleanup-worker-{i}", self._work)
        self._spawn("node-cleanup-scheduler", lambda: self._every(self.options.resync, self._rescan,
                                                                   self.schedule_claim_cleanups))
        self._spawn("node-cleanup-stale-pvs", lambda: self._every(self.options.stale_pv_discovery_interval,
                                                                   self._stale_wake, self.delete_stale_pvs))

    def stop(self) -> None:
        self._stop.set()
        self._rescan.set()
        self._stale_wake.set()
        self.queue.shutdown()
        self.supervisor.stop(5)
        for informer in (self.nodes, self.pvs):
            informer.stop()
        self.recorder.stop()

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        self.supervisor.spawn(name, target)

    def _every(self, period: float, wake: threading.Event, body: Callable[[], None]) -> None:
        """Run ``body`` now, then after each ``period`` or as soon as ``wake`` is set."""
        while not self._stop.is_set():
            wake.clear()
            try:
                body()
            except Exception:  # a bug in one pass must not end the loop
                log.exception("node-cleanup pass failed")
            self.clock.wait(wake, period)

    def ready(self) -> tuple[bool, str]:
        synced = self.nodes.has_synced() and self.pvs.has_synced()
        return synced, "ok" if synced else "caches not synced"

    def healthy(self) -> tuple[bool, str]:
        """Alive unless the stale PV loop has not finished a pass in several periods (a pass
        waiting out API retries during an outage is slow, not dead: hence the 5 min floor)."""
        stale = self.clock.monotonic() - self._last_stale_pass
        limit = max(300.0, 6 * self.options.stale_pv_discovery_interval)
        problems = self.supervisor.problems()
        problems += [f"{i.name} is not running" for i in (self.nodes, self.pvs) if i.has_synced() and not i.alive()]
        if stale >= limit:
            problems.append(f"last stale-PV pass {stale:.0f}s ago")
        if problems:
            return False, "; ".join(problems)
        return True, f"last stale-PV pass {stale:.0f}s ago"

    def scheduled(self) -> dict[str, float]:
        """PV names whose claim deletion is pending, with the (clock) time it is due."""
        with self._lock:
            return dict(self._scheduled)

    # ------------------------------------------------------------------ claim path

    def _on_node_change(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if kind == "DELETED":
            log.info("node %s deleted: looking for volumes left behind", k8s.name(old or {}))
            self._rescan.set()

    def schedule_claim_cleanups(self) -> None:
        """Schedule the claim of every PV that the cache proposes and the API confirms."""
        classes, pending = self.options.storage_class_names, self.scheduled()
        for pv in self.pvs.list():
            if k8s.name(pv) in pending:
                continue
            if claim_cleanup_blocker(pv, classes, self.view.node_in_cache) is not None:
                continue
            if claim_cleanup_blocker(pv, classes, self.view.assume_node) is None:
                self._schedule(pv)
        self.scans += 1

    def _schedule(self, pv: Obj) -> None:
        name, ref, delay = k8s.name(pv), k8s.pv_claim_ref(pv) or {}, self.options.pvc_deletion_delay
        with self._lock:
            self._scheduled[name] = self.clock.monotonic() + delay
        self.queue.add_after(name, delay)
        log.info("volume %s: nodes %s are gone; claim %s/%s will be deleted in %s unless one comes back",
                 name, sorted(pv_node_names(pv)), ref.get("namespace"), ref.get("name"), format_go_duration(delay))
        self.recorder.event(_claim_object(ref), WARNING, REFERENCED_NODE_DELETED,
                            f"PVC is tied to a deleted Node. PVC will be cleaned up in {format_go_duration(delay)} "
                            "if the Node doesn't come back")

    def _work(self) -> None:
        while (name := self.queue.get()) is not None:
            try:
                outcome = self.sync_claim(name)
            except Exception as err:  # API errors and bugs alike: retry later, with backoff
                delay = self.queue.add_rate_limited(name)
                log.warning("volume %s: claim check failed (%s); retrying in %.1fs", name, err, delay)
                self.history.append((name, f"retry: {err}"))
            else:
                self.queue.forget(name)
                with self._lock:
                    self._scheduled.pop(name, None)
                log.info("volume %s: %s", name, outcome)
                self.history.append((name, outcome))
            finally:
                self.queue.done(name)

    def sync_claim(self, pv_name: str) -> str:
        """Re-check a due PV from fresh reads and delete its claim if still warranted.

        Returns what happened; raises :class:`ApiError` when it should be retried.
        """
        pv = self.view.pv(pv_name)
        if pv is None:
            return "volume no longer exists"
        ref = k8s.pv_claim_ref(pv)
        pvc = self.view.claim(ref) if ref is not None else None
        reason = claim_deletion_blocker(pv, pvc, self.options.storage_class_names, self.view.node_exists)
        if reason is not None or pvc is None:
            return f"claim kept: {reason}"
        return self._delete_claim(pvc)

    def _delete_claim(self, pvc: Obj) -> str:
        meta = pvc["metadata"]
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        try:
            self.api.delete(PERSISTENT_VOLUME_CLAIMS, meta["name"], meta.get("namespace"), uid=meta.get("uid"))
        except NotFound:
            pass  # someone else deleted it: the goal is reached
        except Conflict:
            return f"claim kept: {where} was replaced just before deletion (UID precondition)"
        except ApiError:
            self.metrics.pvc_delete_failed.inc()
            raise
        self.metrics.pvc_deleted.inc()
        return f"claim {where} deleted"

    # ------------------------------------------------------------------ stale PV path

    def delete_stale_pvs(self) -> None:
        """One pass: PVs the cache proposes are re-read, re-judged and deleted."""
        classes = self.options.storage_class_names
        for pv in self.pvs.list():
            if stale_pv_blocker(pv, classes, self.view.node_in_cache, _no_claim_cache) is None:
                self._delete_stale_pv(k8s.name(pv))
        self.stale_passes += 1
        self._last_stale_pass = self.clock.monotonic()

    def _delete_stale_pv(self, name: str) -> None:
        try:
            pv = self.view.pv(name)
            reason = "volume no longer exists" if pv is None else stale_pv_blocker(
                pv, self.options.storage_class_names, self.view.node_exists, self.view.claim_exists)
        except ApiError as err:
            log.warning("volume %s: cannot confirm it is stale (%s); next pass will retry", name, err)
            return
        if reason is not None or pv is None:
            log.info("volume %s kept: %s", name, reason)
            return
        phase = k8s.pv_phase(pv)
        meta = pv["metadata"]
        try:
            self.api.delete(PERSISTENT_VOLUMES, name, uid=meta.get("uid"), resource_version=meta.get("resourceVersion"))
        except NotFound:
            pass
        except Conflict:
            log.info("volume %s changed since it was judged stale; next pass decides again", name)
            return
        except ApiError as err:
            self.metrics.pv_delete_failed.labels(phase).inc()
            log.warning("volume %s of a deleted node: delete failed: %s", name, err)
            return
        self.metrics.pv_deleted.labels(phase).inc()
        log.info("volume %s (%s) of deleted nodes %s deleted", name, phase, sorted(pv_node_names(pv)))


def _claim_object(ref: Obj) -> dict[str, Any]:
    """A claimRef shaped as an object, so the event names the claim (as upstream does)."""
    meta = {k: ref[k] for k in ("name", "namespace", "uid", "resourceVersion") if ref.get(k)}
    return {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "metadata": meta}

"""``localpv node-cleanup``: free the claims and volumes that pin workloads to lost Nodes.

A local PV can only ever be used on its node. When that Node object is deleted for good
(a VM replaced, a machine retired) - or, opt-in, carries the ``node.kubernetes.io/out-of-service``
taint of a non-graceful shutdown - a StatefulSet pod whose PVC is bound to such a PV can
never be scheduled again until someone deletes the PVC. This controller does that, opt-in
per StorageClass (static classes, and dynamic classes of localpv's own CSI driver), and never
touches data on any disk (research/local-static.md §1.11). The rules of a lost node and of
the release are in :mod:`localpv.nodecleanup.lostnode`.

* **claim path** - on start, on every Node deletion or out-of-service taint (and, here, every
  ``resync``): each volume of an opted-in class that has a claim and whose affinity names only
  lost nodes gets a ``ReferencedNodeDeleted`` (or ``ReferencedNodeOutOfService``) warning on
  its PVC and is scheduled for ``pvc_deletion_delay`` (``out_of_service_delay``) later, giving
  the node time to come back. When due, everything is checked again and the PVC is deleted
  with a UID precondition; then (``delete_pods``) the pods still waiting on it are deleted with
  a ``PodDeletedForLostNode`` event, so that their StatefulSet re-creates them with a new claim.
* **stale PV path** - every ``stale_pv_discovery_interval``: such PVs of *deleted* nodes that
  are ``Available`` (any reclaim policy) or ``Released`` with ``Delete`` are deleted. A PV of
  an out-of-service node that still exists is left: the node may come back, and its agent
  then removes a Released volume the usual way. A dynamic PV it deletes also loses its
  agent's deletion protection finalizer (that agent went with the node; the PV would stay
  Terminating), as does one found Terminating already.

Where this is deliberately safer than upstream:

* the cache only proposes; a deletion is decided on fresh reads from the API server (the
  PV, its claim, its pods, and each node checked by name and by hostname label). A live node
  the cache knows is trusted without asking, since believing in a node can only spare objects;
* PVs are deleted with UID *and* resourceVersion preconditions, so a PV that was bound (or
  changed in any way) after it was judged is left for the next pass instead of deleted;
  claims and pods with a UID precondition, so a namesake created meanwhile is never hit;
* a PV whose claim still exists, or on whose claim pods still wait, is never deleted here:
  freeing the claim is the claim path's job, and the PV follows once it is done (the window
  in which the binder has written a PV's claimRef but not yet its Bound phase is covered by this);
* a PV whose affinity names no hostname is never a candidate (no node to be "gone"), and a
  node that is merely NotReady or unreachable is live;
* objects already being deleted are left alone, and Released PVs are only looked at again
  for the pods that may still wait on their claim, so periodic rescans stay quiet.

The decision functions at the top and in :mod:`.lostnode` are pure (objects and lookups in,
verdicts out); the controller below them only gathers inputs and carries out the verdicts.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localpv.clock import Clock, SystemClock
from localpv.config import format_go_duration
from localpv.config.dynamic import DEFAULT_DRIVER_NAME
from localpv.kube import objects as k8s
from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, Conflict, NotFound
from localpv.kube.events import WARNING, EventRecorder
from localpv.kube.finalizers import EXTERNAL_PROVISIONER_FINALIZER, patch_finalizers
from localpv.kube.informer import Informer
from localpv.kube.objects import Obj
from localpv.kube.resources import NODES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS
from localpv.kube.workqueue import ItemBackoff, WorkQueue
from localpv.nodecleanup.lookups import NodeCleanupLookups
from localpv.nodecleanup.lostnode import (
    Action,
    NodeState,
    Scope,
    Step,
    held_by_its_agent,
    is_opted_in_volume,
    out_of_service,
    pv_node_names,
    release_step,
    scan_candidate,
    stranded_pods,
)
from localpv.nodecleanup.metrics import NodeCleanupMetrics
from localpv.supervise import Supervisor

log = logging.getLogger(__name__)

EVENT_COMPONENT = "cleanup-controller"
REFERENCED_NODE_DELETED = "ReferencedNodeDeleted"
REFERENCED_NODE_OUT_OF_SERVICE = "ReferencedNodeOutOfService"
POD_DELETED_FOR_LOST_NODE = "PodDeletedForLostNode"

#: Answers "does a Node of this name exist?"; a lookup that cannot tell must say True.
NodeExists = Callable[[str], bool]
#: Answers "does the claim this claimRef names (same UID) still exist?".
ClaimExists = Callable[[Obj], bool]
#: Answers "do pods still wait on this (Released) volume's claim?".
ClaimWaiters = Callable[[Obj], bool]


# ---------------------------------------------------------------------------- pure decisions


def parse_class_names(text: str) -> frozenset[str]:
    """``--storageclass-names``: a comma list; blanks are dropped (empty → nothing is cleaned)."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def nodes_all_gone(pv: Obj, node_exists: NodeExists) -> bool:
    """True when the affinity names at least one node and none of them exists.

    A PV naming no node is never "gone": nothing proves its node was deleted.
    """
    names = pv_node_names(pv)
    return bool(names) and not any(node_exists(name) for name in sorted(names))


def stale_pv_blocker(
    pv: Obj, scope: Scope, node_exists: NodeExists, claim_exists: ClaimExists,
    claim_waiters: ClaimWaiters | None = None,
) -> str | None:
    """Why ``pv`` must not be deleted as stale; None when it must.

    Upstream's rule (Available with any reclaim policy, or Released with Delete, on nodes
    that are all deleted) plus: not while its claim exists or pods still wait on it (the
    claim path deletes those first), not when already being deleted. A node that is only
    out of service exists: its PVs stay for its agent, should it come back.
    """
    if not is_opted_in_volume(pv, scope):
        return "not a local volume of an opted-in StorageClass"
    if k8s.deleting(pv) and not held_by_its_agent(pv):
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
    if ref is not None and claim_waiters is not None and claim_waiters(pv):
        return "pods still wait on its claim (they are deleted first)"
    return None


def _no_claim_cache(ref: Obj) -> bool:
    """The first look has no claim cache: it assumes absent, the fresh check asks the API."""
    return False


# ---------------------------------------------------------------------------- controller


#: client-go's controller queues back off from milliseconds to 1000 s; a claim check that
#: failed is retried after 1 s, doubling up to 5 min (its PVC stays until then: safe side).
#: A release under way (a claim terminating, pods deleted) is looked at again the same way.
CLAIM_RETRY = ItemBackoff(initial=1.0, maximum=300.0)


@dataclass(frozen=True)
class NodeCleanupOptions:
    """The flags of ``localpv node-cleanup`` (upstream's defaults where upstream has the flag)."""

    storage_class_names: frozenset[str]
    pvc_deletion_delay: float = 60.0
    stale_pv_discovery_interval: float = 10.0
    resync: float = 600.0
    worker_threads: int = 10
    #: Requeue delays of a claim whose check or deletion failed.
    retry: ItemBackoff = CLAIM_RETRY
    sync_timeout: float = 120.0
    #: The CSI driver whose PVs are localpv's dynamic volumes (the ConfigMap's ``csiDriverName``).
    driver: str = DEFAULT_DRIVER_NAME
    #: Treat a Node with the out-of-service taint as lost (off: only deleted Nodes are).
    out_of_service: bool = False
    #: How long the taint must stay before a claim goes: longer than a deleted Node's delay,
    #: since the taint is also set on a machine that is stopped to be started again (a cloud
    #: provider may set it on any stopped instance), and a claim released is its data lost.
    out_of_service_delay: float = 300.0
    #: Delete the pods that still wait on a released claim, so their controller re-creates them.
    delete_pods: bool = True

    @property
    def scope(self) -> Scope:
        return Scope(self.storage_class_names, self.driver, self.out_of_service, self.delete_pods)


class NodeCleanupError(Exception):
    """The controller could not start (caches never synced)."""


class NodeCleanupController:
    """Informers for Nodes and PVs, a delayed work queue of PV names, and three loops:
    workers (claim releases), the scheduler (claim path scans) and the stale PV deleter."""

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
        self.scope = options.scope
        self.metrics = metrics or NodeCleanupMetrics()
        self.clock = clock or SystemClock()
        self.recorder = recorder or EventRecorder(api.for_events(), component=EVENT_COMPONENT, clock=self.clock)
        # The informers back off from network trouble in real time, whatever clock drives the
        # controller's own delays and periods.
        self.nodes = Informer(api, NODES, on_change=self._on_node_change, name="node-cleanup-nodes")
        self.pvs = Informer(api, PERSISTENT_VOLUMES, name="node-cleanup-pvs")
        self.view = NodeCleanupLookups(api, self.nodes, honour_taint=options.out_of_service)
        self.queue = WorkQueue("node-cleanup", backoff=options.retry, clock=self.clock)
        #: Recent (PV name, what the claim path concluded), newest last: logs, tests, debugging.
        self.history: deque[tuple[str, str]] = deque(maxlen=1000)
        self.scans = 0
        self.stale_passes = 0
        self._scheduled: dict[str, float] = {}
        #: What each scheduled claim's grace was counted for (a deleted or an out-of-service node).
        self._causes: dict[str, NodeState] = {}
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
        elif self.options.out_of_service and new is not None and out_of_service(new) \
                and not (old is not None and out_of_service(old)):
            log.info("node %s is out of service: looking for volumes left behind", k8s.name(new))
            self._rescan.set()

    def schedule_claim_cleanups(self) -> None:
        """Schedule the claim of every PV that the cache proposes and the API confirms."""
        pending = self.scheduled()
        for pv in self.pvs.list():
            if k8s.name(pv) in pending:
                continue
            if scan_candidate(pv, self.scope, self.view.cached_state) is None:
                continue
            state = scan_candidate(pv, self.scope, self.view.assume_state)
            if state is not None:
                self._schedule(pv, state)
        self.scans += 1

    def _schedule(self, pv: Obj, state: NodeState) -> None:
        name, ref = k8s.name(pv), k8s.pv_claim_ref(pv) or {}
        if k8s.pv_phase(pv) == "Released":
            # The claim is gone already (released earlier, perhaps before a restart): only
            # pods that may still wait on it are left to look at, which needs no grace.
            self._enqueue(name, 0.0)
            return
        deleted = state is NodeState.DELETED
        delay = self.options.pvc_deletion_delay if deleted else self.options.out_of_service_delay
        with self._lock:
            self._causes[name] = state
        self._enqueue(name, delay)
        nodes, wait = sorted(pv_node_names(pv)), format_go_duration(delay)
        log.info("volume %s: nodes %s are %s; claim %s/%s will be deleted in %s unless one comes back", name, nodes,
                 "gone" if deleted else "lost (deleted or out of service)", ref.get("namespace"), ref.get("name"),
                 wait)
        if deleted:
            self.recorder.event(_claim_object(ref), WARNING, REFERENCED_NODE_DELETED,
                                f"PVC is tied to a deleted Node. PVC will be cleaned up in {wait} "
                                "if the Node doesn't come back")
        else:
            self.recorder.event(_claim_object(ref), WARNING, REFERENCED_NODE_OUT_OF_SERVICE,
                                f"PVC is tied to Node(s) {', '.join(nodes)} marked out of service (taint "
                                f"node.kubernetes.io/out-of-service). PVC will be cleaned up in {wait} unless the "
                                "taint is removed; its data stays on that node and is not moved")

    def _enqueue(self, name: str, delay: float) -> None:
        with self._lock:
            self._scheduled[name] = self.clock.monotonic() + delay
        self.queue.add_after(name, delay)

    def _work(self) -> None:
        while (name := self.queue.get()) is not None:
            try:
                outcome, again = self.sync_claim(name)
            except Exception as err:  # API errors and bugs alike: retry later, with backoff
                delay = self.queue.add_rate_limited(name)
                log.warning("volume %s: claim check failed (%s); retrying in %.1fs", name, err, delay)
                self.history.append((name, f"retry: {err}"))
            else:
                if again:  # a release under way: look again (backing off) until it is done
                    delay = self.queue.add_rate_limited(name)
                    with self._lock:
                        self._scheduled[name] = self.clock.monotonic() + delay
                else:
                    self.queue.forget(name)
                    with self._lock:  # unless it was just scheduled again, for later
                        if self._scheduled.get(name, 0.0) <= self.clock.monotonic():
                            self._scheduled.pop(name, None)
                log.info("volume %s: %s", name, outcome)
                self.history.append((name, outcome))
            finally:
                self.queue.done(name)

    def sync_claim(self, pv_name: str) -> tuple[str, bool]:
        """Take the next step of a due PV's release, decided from fresh reads.

        Returns what happened and whether to look again (a release under way); raises
        :class:`ApiError` when it should be retried.
        """
        pv = self.view.pv(pv_name)
        if pv is None:
            return "volume no longer exists", False
        ref = k8s.pv_claim_ref(pv)
        pvc = self.view.claim(ref) if ref is not None else None
        pods: list[Obj] = []
        if ref is not None and self.scope.delete_pods and (pvc is None or k8s.deleting(pvc)):
            pods = self.view.pods(str(ref.get("namespace") or ""))
        step = release_step(pv, pvc, pods, self.scope, self.view.node_state)
        with self._lock:
            cause = self._causes.pop(pv_name, None)
        if step.action is Action.DELETE_CLAIM and cause is NodeState.DELETED and step.state is not cause \
                and self.options.out_of_service_delay > self.options.pvc_deletion_delay:
            # The Node came back, tainted: its grace is the longer one, counted from now.
            self._schedule(pv, NodeState.OUT_OF_SERVICE)
            return "claim kept: its node is back, out of service; scheduled again with that delay", False
        if step.action is Action.DELETE_CLAIM and pvc is not None:
            outcome = self._delete_claim(pvc)
            return outcome, self.scope.delete_pods and outcome.endswith(" deleted")
        if step.action is Action.DELETE_PODS:
            return self._delete_pods(pv, step), True
        if step.action is Action.WAIT:
            return f"waiting: {step.reason}", True
        return f"claim kept: {step.reason}" if pvc is not None or not self.scope.delete_pods \
            else f"done: {step.reason}", False

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

    def _delete_pods(self, pv: Obj, step: Step) -> str:
        """Delete the pods of ``step`` (UID precondition; force for a pod on a lost node, as the
        pod garbage collector does: no kubelet will ever confirm its end), each with an event."""
        lost = pv_node_names(pv)
        cause = (step.state or NodeState.DELETED).value
        claim = (k8s.pv_claim_ref(pv) or {}).get("name")
        done: list[str] = []
        for pod in step.pods:
            meta = pod["metadata"]
            node = (pod.get("spec") or {}).get("nodeName") or ""
            try:
                self.api.delete(PODS, meta["name"], meta.get("namespace"), uid=meta.get("uid"),
                                grace_period=0 if node in lost else None)
            except NotFound:
                continue
            except Conflict:
                done.append(f"{meta['name']} kept (replaced meanwhile: UID precondition)")
                continue
            except ApiError:
                self.metrics.pod_delete_failed.labels(cause).inc()
                raise
            self.metrics.pod_deleted.labels(cause).inc()
            where = f"on node {node}, which is {cause}" if node else "Pending"
            self.recorder.event(pod, WARNING, POD_DELETED_FOR_LOST_NODE,
                                f"Pod deleted ({where}): its PVC {claim} is released because the node of its "
                                f"PersistentVolume {k8s.name(pv)} is {cause}; its controller re-creates it with a "
                                "new, empty volume elsewhere")
            done.append(f"{meta['name']} deleted")
        return f"pods of claim {claim} ({step.reason}): {', '.join(done) or 'none left'}"

    # ------------------------------------------------------------------ stale PV path

    def delete_stale_pvs(self) -> None:
        """One pass: PVs the cache proposes are re-read, re-judged and deleted."""
        for pv in self.pvs.list():
            if stale_pv_blocker(pv, self.scope, self.view.node_in_cache, _no_claim_cache) is None:
                self._delete_stale_pv(k8s.name(pv))
        self.stale_passes += 1
        self._last_stale_pass = self.clock.monotonic()

    def _claim_waiters(self, pv: Obj) -> bool:
        """Pods still wait on the (gone) claim of ``pv``: its release is unfinished."""
        ref = k8s.pv_claim_ref(pv)
        if not self.scope.delete_pods or ref is None:
            return False
        pods = self.view.pods(str(ref.get("namespace") or ""))
        return bool(stranded_pods(pods, str(ref["name"]), pv_node_names(pv)))

    def _delete_stale_pv(self, name: str) -> None:
        try:
            pv = self.view.pv(name)
            reason = "volume no longer exists" if pv is None else stale_pv_blocker(
                pv, self.scope, self.view.node_exists, self.view.claim_exists, self._claim_waiters)
        except ApiError as err:
            log.warning("volume %s: cannot confirm it is stale (%s); next pass will retry", name, err)
            return
        if reason is not None or pv is None:
            log.info("volume %s kept: %s", name, reason)
            return
        phase = k8s.pv_phase(pv)
        meta = pv["metadata"]
        try:
            if not k8s.deleting(pv):
                self.api.delete(PERSISTENT_VOLUMES, name, uid=meta.get("uid"),
                                resource_version=meta.get("resourceVersion"))
            if held_by_its_agent(pv):
                self._release_finalizer(name, str(meta.get("uid") or ""))
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
        nodes = sorted(pv_node_names(pv))
        log.info("volume %s (%s) of deleted nodes %s deleted", name, phase, nodes)
        what = ("its disk image is on that node and is not removed" if k8s.pv_is_csi(pv)
                else "the data on that node's disk is not touched")
        if held_by_its_agent(pv):
            what += f"; its finalizer {EXTERNAL_PROVISIONER_FINALIZER} is removed, as its agent went with the node"
        self.recorder.event(pv, WARNING, REFERENCED_NODE_DELETED,
                            f"PersistentVolume ({phase}) deleted: its Node(s) {', '.join(nodes)} are deleted; {what}")

    def _release_finalizer(self, name: str, uid: str) -> None:
        """Take the agent's deletion protection finalizer off the PV with this uid (only that
        one: other controllers' finalizers stay)."""
        def wanted(current: Obj) -> list[str] | None:
            finalizers = current["metadata"].get("finalizers") or []
            if current["metadata"].get("uid") != uid or EXTERNAL_PROVISIONER_FINALIZER not in finalizers:
                return None
            return [f for f in finalizers if f != EXTERNAL_PROVISIONER_FINALIZER]

        patch_finalizers(self.api, PERSISTENT_VOLUMES, name, wanted)


def _claim_object(ref: Obj) -> dict[str, Any]:
    """A claimRef shaped as an object, so the event names the claim (as upstream does)."""
    meta = {k: ref[k] for k in ("name", "namespace", "uid", "resourceVersion") if ref.get(k)}
    return {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "metadata": meta}


"""The claim labeller: every claim of a dynamic class carries its selected node as a label.

Why it exists: an agent watches the claims labelled with its node (server-side
``labelSelector``) instead of every claim of the cluster; the scheduler names a claim's node
only in the ``volume.kubernetes.io/selected-node`` annotation, which no selector can match.
This controller is the one place that reads every claim, so that no node has to.

What it touches: claims whose StorageClass names the driver (or that the PV controller handed
to the driver, ``volume.kubernetes.io/storage-provisioner``). Claims of other classes are left
as they are, whatever they carry. The label follows the annotation (:func:`label_patch`): set,
changed, removed; each write is conditional on the resourceVersion it was computed from.

What it says: a claim whose label has not followed its annotation for ``report_after`` (a
write refused: RBAC, a webhook, a quota of requests) gets one Warning event
``NodeLabelPending`` and counts in ``localpv_claim_labels_pending`` with the age of the
oldest; the agents cannot see it, so this is the only process that can say it waits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from localpv.claimlabeller.metrics import LabellerMetrics
from localpv.clock import Clock, SystemClock
from localpv.csi.claimlabels import CLAIM_NODE_LABEL, claim_class_name, label_patch, names_driver, wanted_label
from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, Conflict, NotFound
from localpv.kube.events import WARNING, EventRecorder
from localpv.kube.informer import Informer, jittered_period, object_key
from localpv.kube.objects import Obj
from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, STORAGE_CLASSES
from localpv.kube.workqueue import ItemBackoff, WorkQueue
from localpv.supervise import Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LabellerSettings:
    driver: str
    workers: int = 2
    #: A claim still unlabelled this long after it needed its label is reported (event, metric).
    report_after: float = 60.0
    #: How often the pending figures are computed and overdue claims reported.
    report_period: float = 10.0
    #: Periodic relist of the claims (a safety net; jittered).
    resync_period: float = 600.0
    backoff: ItemBackoff = field(default_factory=lambda: ItemBackoff(initial=0.5, maximum=60.0))


@dataclass
class _Pending:
    since: float
    why: str = ""
    reported: bool = False


class ClaimLabeller:
    """Keeps the node label of every claim of a dynamic class equal to its selected node."""

    def __init__(self, api: KubeApi, settings: LabellerSettings, *, recorder: EventRecorder,
                 metrics: LabellerMetrics | None = None, clock: Clock | None = None,
                 may_act: Callable[[], bool] = lambda: True) -> None:
        self.api = api
        self.settings = settings
        self.recorder = recorder
        self.metrics = metrics or LabellerMetrics()
        self.clock = clock or SystemClock()
        self.may_act = may_act
        self.claims = Informer(api, PERSISTENT_VOLUME_CLAIMS, clock=self.clock, name="labeller-claims",
                               on_change=self._on_claim, resync_period=jittered_period(settings.resync_period))
        self.classes = Informer(api, STORAGE_CLASSES, clock=self.clock, name="labeller-classes",
                                on_change=self._on_class)
        self.queue = WorkQueue("claim-labels", backoff=settings.backoff, clock=self.clock)
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.synced = threading.Event()
        self.supervisor = Supervisor(clock=self.clock, stopping=self._stop)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.classes.start()
        self.claims.start()
        self.supervisor.spawn("claim-labeller", self._run)

    def stop(self) -> None:
        self._stop.set()
        self.queue.shutdown()
        self.claims.stop()
        self.classes.stop()
        self.supervisor.stop()

    def problems(self) -> list[str]:
        return self.supervisor.problems() + [f"{i.name} is not running" for i in (self.claims, self.classes)
                                             if not i.alive()]

    def _run(self) -> None:
        while not all(i.wait_synced(1.0) for i in (self.classes, self.claims)):
            if self._stop.is_set():
                return
        for claim in self.claims.list():  # claims from before the classes were known, or an upgrade
            self.queue.add(object_key(claim))
        self.synced.set()
        for i in range(self.settings.workers):
            self.supervisor.spawn(f"claim-labeller-worker-{i}", self._work)
        while not self.clock.wait(self._stop, self.settings.report_period):
            self.report()

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            try:
                retry = self.sync(key)
            except Exception:  # a bug costs one claim a retry, not the worker
                log.exception("claim %s: labelling failed", key)
                retry = True
            finally:
                self.queue.done(key)
            if retry:
                self.queue.add_rate_limited(key)
            else:
                self.queue.forget(key)

    def _on_claim(self, _kind: str, old: Obj | None, new: Obj | None) -> None:
        obj = new if new is not None else old
        if obj is not None:
            self.queue.add(object_key(obj))

    def _on_class(self, _kind: str, old: Obj | None, new: Obj | None) -> None:
        """A class that appears (or starts naming the driver) brings its claims in; they were
        left alone while it was unknown."""
        obj = new if new is not None else old
        name = str(((obj or {}).get("metadata") or {}).get("name") or "")
        if not self.synced.is_set() or not name:
            return
        for claim in self.claims.list():
            if claim_class_name(claim) == name:
                self.queue.add(object_key(claim))

    # ------------------------------------------------------------------ one claim

    def dynamic(self, claim: Obj) -> bool:
        """A claim of one of the driver's classes (or one the PV controller handed to the driver)."""
        if names_driver(claim, self.settings.driver):
            return True
        storage_class = self.classes.get(claim_class_name(claim))
        return storage_class is not None and storage_class.get("provisioner") == self.settings.driver

    def sync(self, key: str) -> bool:
        """Make the claim's label follow its annotation; True means retry later."""
        namespace, _, name = key.partition("/")
        claim = self.claims.get(name, namespace)
        patch = label_patch(claim) if claim is not None and self.dynamic(claim) else None
        if claim is None or patch is None:
            self._settled(key)
            return False
        if not self.may_act():
            return True
        wanted = wanted_label(claim)
        had = ((claim.get("metadata") or {}).get("labels") or {}).get(CLAIM_NODE_LABEL)
        action = "remove" if wanted is None else ("set" if had is None else "change")
        try:
            self.api.patch(PERSISTENT_VOLUME_CLAIMS, name, patch, namespace)
        except NotFound:
            self._settled(key)
            return False
        except Conflict:
            # Written since the cache's copy (its selected node may have changed): its watch
            # event brings the new version, labelled then.
            self.metrics.labelled.labels(action, "conflict").inc()
            self._waiting(key, "its claim changed while it was labelled")
            return True
        except ApiError as err:
            self.metrics.labelled.labels(action, "failed").inc()
            log.warning("claim %s: cannot %s label %s: %s", key, action, CLAIM_NODE_LABEL, err)
            self._waiting(key, str(err))
            return True
        self.metrics.labelled.labels(action, "ok").inc()
        log.info("claim %s: label %s %s (%s)", key, CLAIM_NODE_LABEL,
                 "removed" if wanted is None else f"= {wanted}", action)
        self._settled(key)
        return False

    def _waiting(self, key: str, why: str) -> None:
        with self._lock:
            self._pending.setdefault(key, _Pending(self.clock.monotonic())).why = why

    def _settled(self, key: str) -> None:
        with self._lock:
            self._pending.pop(key, None)

    # ------------------------------------------------------------------ saying what waits

    def report(self) -> None:
        """Figures for the metrics, and one Warning event on each claim waiting past ``report_after``."""
        now = self.clock.monotonic()
        with self._lock:
            pending = dict(self._pending)
        self.metrics.pending.set(len(pending))
        self.metrics.oldest.set(max((now - p.since for p in pending.values()), default=0.0))
        for key, item in pending.items():
            if item.reported or now - item.since < self.settings.report_after:
                continue
            namespace, _, name = key.partition("/")
            claim = self.claims.get(name, namespace)
            if claim is None:
                continue
            item.reported = True
            self.recorder.event(claim, WARNING, "NodeLabelPending",
                                f"label {CLAIM_NODE_LABEL} not yet set to follow annotation "
                                f"volume.kubernetes.io/selected-node for {now - item.since:.0f}s ({item.why}); the "
                                "node's agent sees the claim only once it is labelled")

"""This node's CSIStorageCapacity objects, kept saying what its pools' accounts say.

One thread (``csi-capacity``) does every write, so changes coalesce: whatever pokes it - a
journal write (a provision, a deletion, an expansion, an image made or removed), a reloaded
configuration (a pool or class appearing or going), the poll of the pools' figures (thin
tenants' writes change the free space) - only marks that a pass is due, and a pass computes
the objects from the state as it is then (:mod:`localpv.csi.capacity`) and writes what
differs, at most once per object per ``min_interval`` (a burst of claims is one write with the
final figure).

What the objects are compared with is this node's objects as last listed (label-selected)
and as written since; every ``resync_period`` they are listed again, so an object someone
deleted or edited is put right; a failed write lists them again at the next pass.

The API version is the one the cluster serves (:func:`localpv.kube.discovery.served_resource`),
asked again when a list at it is 404 (a cluster upgraded past it);
a cluster that serves none gets nothing written: one log line, the gauge
``localpv_dynamic_capacity_served`` at 0, and discovery asked again at each resync (a cluster
upgraded under the agent), silently.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from localpv.clock import Clock, SystemClock
from localpv.config import ProvisionerConfig
from localpv.csi import capacity
from localpv.csi.capacity import Action, NodeRef, Publication, Room
from localpv.kube.api import KubeApi
from localpv.kube.discovery import served_resource
from localpv.kube.errors import ApiError, Conflict, NotFound
from localpv.kube.objects import Obj
from localpv.kube.resources import CSI_STORAGE_CAPACITIES, NODES, Resource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapacitySettings:
    #: At most one write per object per this many seconds.
    min_interval: float = 10.0
    #: The pools' figures are read again this often, poked or not (external-provisioner's
    #: default poll of GetCapacity is a minute too).
    poll_period: float = 60.0
    #: The objects are listed again this often: drift (an object deleted or edited) repaired.
    resync_period: float = 300.0
    #: How often a reloaded configuration is looked for (comparing one reference: cheap).
    check_period: float = 5.0


class CapacityPublisher:
    """Writes this node's CSIStorageCapacity objects; :meth:`poke` when a figure may change."""

    def __init__(self, api: KubeApi, *, node_name: str, namespace: str, config: Callable[[], ProvisionerConfig],
                 rooms: Callable[[], Mapping[str, Room | None]], settings: CapacitySettings | None = None,
                 clock: Clock | None = None, on_failure: Callable[[], None] = lambda: None) -> None:
        self.api = api
        self.node_name = node_name
        self.namespace = namespace
        self.config = config
        self.rooms = rooms
        self.settings = settings or CapacitySettings()
        self.clock = clock or SystemClock()
        self.on_failure = on_failure
        self.resource: Resource | None = None
        #: None until discovery has answered; then whether some version is served.
        self.served: bool | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._known: dict[str, Obj] | None = None
        self._last_write: dict[str, float] = {}
        self._published: dict[str, int] = {}
        self._node_uid = ""
        self._next_resync = 0.0
        self._next_poll = 0.0
        self._deferred: float | None = None
        self._config_seen: object = None
        self._said_unserved = False
        self._failures = 0
        self._retry_at = 0.0
        self.passes = 0

    # ------------------------------------------------------------------ outside

    def poke(self) -> None:
        """Something that may change a figure happened: a pass is due (coalesced)."""
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def published(self) -> dict[str, int]:
        """Each class's figure as this node's objects say it now (what was last written or listed)."""
        with self._lock:
            return dict(self._published)

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            self.run_pass()
            self._sleep()

    def _sleep(self) -> None:
        """Until a poke, the next poll, resync or deferred write, or a reloaded configuration
        (looked for every ``check_period``: comparing one reference, nothing read from disk)."""
        due = min(t for t in (self._next_poll, self._next_resync, self._deferred) if t is not None)
        while not self._stopping.is_set():
            now = self.clock.monotonic()
            if now >= due or self.clock.wait(self._wake, min(due, now + self.settings.check_period) - now):
                return
            if self.config() is not self._config_seen:
                return

    def run_pass(self) -> None:
        """One pass: discovery if not answered, the objects listed if due, the writes due."""
        self.passes += 1
        now = self.clock.monotonic()
        self._next_poll = now + self.settings.poll_period
        self._config_seen = self.config()
        if now < self._retry_at:  # after a failure: pokes wait for the backoff too
            self._deferred = self._retry_at
            return
        if self.resource is None:
            if self.served is False and now < self._next_resync:
                return
            if not self._discover(now):
                return
        assert self.resource is not None
        try:
            if self._known is None or now >= self._next_resync:
                self._relist(self.resource, now)
            config = self._config_seen
            assert isinstance(config, ProvisionerConfig)
            rooms = self.rooms()
        except ApiError as err:
            if isinstance(err, NotFound):  # the version is no longer served (an upgraded cluster)
                log.info("capacity tracking: %s is no longer served; asking discovery again",
                         self.resource.api_version)
                self.resource = None
            self._failed(f"cannot list this node's capacity objects: {err}")
            return
        except OSError as err:
            log.debug("capacity: the pools' figures cannot be read now (%s); tried again at the next pass", err)
            return
        pub = Publication(NodeRef(self.node_name, self._node_uid), self.namespace, config.csi_driver_name,
                          self.resource.api_version)
        figures = capacity.figures(config.dynamic_classes, rooms)
        assert self._known is not None
        actions = capacity.plan(capacity.wanted(pub, figures), self._known.values())
        ready, self._deferred = capacity.due(actions, self._last_write, now, self.settings.min_interval)
        for action in ready:
            try:
                self._carry_out(self.resource, action)
            except ApiError as err:
                self._failed(f"capacity object {action.name}: {action.verb} failed: {err}")
                return
            self._last_write[action.name] = now
        self._failures = 0
        with self._lock:
            self._published = {str(o.get("storageClassName")): capacity.quantity_bytes(o.get("capacity")) or 0
                               for o in self._known.values()}

    def _discover(self, now: float) -> bool:
        try:
            found = served_resource(self.api, CSI_STORAGE_CAPACITIES)
        except ApiError as err:
            self._failed(f"cannot ask the API server which CSIStorageCapacity version it serves: {err}")
            return False
        self.served = found is not None
        if found is None:
            self._next_resync = now + self.settings.resync_period
            if not self._said_unserved:
                self._said_unserved = True
                log.warning("capacity tracking: the API server serves CSIStorageCapacity at none of storage.k8s.io "
                            "v1, v1beta1, v1alpha1; no capacity is published (on 1.19-1.20 it needs the "
                            "CSIStorageCapacity feature gate and --runtime-config=storage.k8s.io/v1alpha1=true)")
            return False
        self.resource = found
        log.info("capacity tracking: publishing CSIStorageCapacity objects at %s", found.api_version)
        return True

    def _relist(self, res: Resource, now: float) -> None:
        node = self.api.get(NODES, self.node_name)
        self._node_uid = str(node["metadata"].get("uid") or "")
        config = self.config()
        pub = Publication(NodeRef(self.node_name, self._node_uid), self.namespace, config.csi_driver_name,
                          res.api_version)
        items, _ = self.api.list(res, self.namespace, label_selector=capacity.selector(pub))
        self._known = {str(o["metadata"]["name"]): o for o in items}
        self._next_resync = now + self.settings.resync_period

    def _carry_out(self, res: Resource, action: Action) -> None:
        assert self._known is not None
        if action.verb in ("delete", "recreate"):
            # NotFound, Conflict: gone already, or another object now; the next list says which.
            with contextlib.suppress(NotFound, Conflict):
                self.api.delete(res, action.name, self.namespace, uid=action.uid or None)
            self._known.pop(action.name, None)
        if action.obj is None:
            return
        if action.verb == "update":
            self._known[action.name] = self.api.replace(res, action.obj)
            return
        # AlreadyExists (made by an attempt whose answer was lost) fails the pass: the next one
        # lists the objects again and updates it.
        self._known[action.name] = self.api.create(res, action.obj, self.namespace)

    def _failed(self, message: str) -> None:
        """A failed request: counted, said, and tried again after a backoff that doubles up to
        the resync period (a missing RBAC rule is not a warning every few seconds)."""
        log.warning("%s", message)
        self.on_failure()
        self._known = None  # decide the next pass on what the cluster has, not on what was believed
        delay = min(self.settings.resync_period, self.settings.min_interval * 2 ** self._failures)
        self._failures += 1
        self._retry_at = self._deferred = self.clock.monotonic() + delay
        self._next_resync = max(self._next_resync, self._retry_at)  # the objects are listed again anyway


"""The node agent: wires the informers, host events, cleaners and the reconcile loop.

One thread runs reconcile passes. A pass is triggered by a mount-table change, a block
device uevent, a change in this node's PVs or StorageClasses, a finished cleanup, a
configuration reload - or, as a safety net, ``discovery_period`` after the previous
pass. Each pass snapshots the host, asks :func:`localpv.agent.reconcile.plan` what to do,
writes the journal changes durably, then executes the API actions. All decisions live in
the planner; this module only gathers inputs and carries out outputs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from localpv.agent.cleaning import block_cleaner, filesystem_cleaner
from localpv.agent.jobs import JobCleaner
from localpv.agent.journal import CLEANING, Journal
from localpv.agent.proctable import DEFAULT_RETRY_BACKOFF, ProcTable
from localpv.agent.pvbuilder import NodeInfo, StorageClassInfo
from localpv.agent.reconcile import (
    CleanupStatus,
    ConfirmOrphan,
    CreatePV,
    DeletePV,
    Plan,
    StartCleanup,
    World,
    plan,
    pv_host_path,
)
from localpv.clock import Clock, SystemClock
from localpv.config import ConfigError, ProvisionerConfig, load_config
from localpv.host.cleaner import ProcessRecords
from localpv.host.mounts import mount_points
from localpv.host.scan import Entry, ScanError, scan_directory
from localpv.kube.api import KubeApi, Obj
from localpv.kube.errors import AlreadyExists, ApiError, Backoff, Conflict, NotFound, call_with_retries
from localpv.kube.events import WARNING, EventRecorder
from localpv.kube.informer import Informer
from localpv.kube.resources import NODES, PERSISTENT_VOLUMES, STORAGE_CLASSES
from localpv.metrics import AgentMetrics
from localpv.naming import (
    HOSTNAME_LABEL_KEY,
    NODE_LABEL_KEY,
    PROVISIONED_BY_ANNOTATION,
    capacity_bucket,
    cleanup_job_name,
    node_label_value,
    provisioner_name,
)

log = logging.getLogger(__name__)


class AgentError(Exception):
    """The agent cannot start (no Node, Node without hostname label, ...)."""


@dataclass(frozen=True)
class AgentOptions:
    node_name: str
    namespace: str = "default"
    job_image: str | None = None
    config_path: str | None = None
    discovery_period: float = 10.0
    config_sync_period: float = 5.0
    watch_host: bool = True
    adopt_upstream_pvs: bool = True
    retry_backoff: Backoff = DEFAULT_RETRY_BACKOFF
    #: Host directory for state that must survive restarts (cleaner process records).
    state_dir: str | None = None


class ConfigHolder:
    """The configuration in use, reloaded from disk; a broken file keeps the last good one."""

    def __init__(self, path: str | None, initial: ProvisionerConfig) -> None:
        self.path = path
        self.current = initial
        self.last_error: str | None = None

    def reload(self) -> bool | None:
        """True if a new configuration was applied, False if unchanged, None if rejected."""
        if self.path is None:
            return False
        try:
            loaded = load_config(self.path)
        except ConfigError as err:
            message = "; ".join(err.problems)
            if message != self.last_error:
                log.error("configuration rejected, keeping the previous one: %s", message)
            self.last_error = message
            return None
        self.last_error = None
        if loaded.config == self.current:
            return False
        for warning in loaded.warnings:
            log.warning("configuration: %s", warning)
        self.current = loaded.config
        return True


class NodeAgent:
    """Discovers local volumes on one node, publishes them as PVs, cleans released ones."""

    def __init__(
        self,
        api: KubeApi,
        options: AgentOptions,
        config: ProvisionerConfig,
        journal: Journal,
        *,
        metrics: AgentMetrics | None = None,
        clock: Clock | None = None,
        recorder: EventRecorder | None = None,
        mount_table: Callable[[], frozenset[str]] = mount_points,
        scanner: Callable[[str, frozenset[str]], list[Entry]] = scan_directory,
    ) -> None:
        self.api = api
        self.options = options
        self.config = ConfigHolder(options.config_path, config)
        self.journal = journal
        self.metrics = metrics or AgentMetrics()
        self.clock = clock or SystemClock()
        self.mount_table = mount_table
        self.scanner = scanner
        self._recorder = recorder
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._triggers: set[str] = set()
        self._trigger_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._host_events: Any = None
        self._first_seen: dict[str, float] = {}
        self.collisions: dict[str, str] = {}
        self._taint_removed = False
        self._pass_lock = threading.Lock()
        self.node: NodeInfo | None = None
        self.provisioner = ""
        self.last_plan: Plan | None = None
        self.passes = 0
        self.last_pass_at = 0.0
        self.ready = False
        self.procs = ProcTable(config.cleanup_workers, clock=self.clock, retry_backoff=options.retry_backoff,
                               on_done=lambda _n: self.trigger("cleanup"))
        self.metrics.watch_proctable(self.procs.stats)
        self.cleaner_records = ProcessRecords(os.path.join(options.state_dir, "cleaners") if options.state_dir
                                              else None)
        self.pvs: Informer | None = None
        self.classes: Informer | None = None
        self.jobs: JobCleaner | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def recorder(self) -> EventRecorder:
        assert self._recorder is not None, "start() first"
        return self._recorder

    def start(self, *, run_loop: bool = True) -> None:
        """Fetch the Node, adopt upstream PVs, start caches, watchers and the loop.

        ``run_loop=False`` starts everything but the reconcile thread; the caller then
        drives :meth:`reconcile_once` itself (benchmarks, tests of single passes).
        """
        for pid in self.cleaner_records.kill_leftovers():
            log.warning("killed cleaner process group %d left over by a previous agent", pid)
        node_obj = call_with_retries(
            lambda: self.api.get(NODES, self.options.node_name),
            Backoff(initial=1.0, maximum=5.0, attempts=5), clock=self.clock, stop=self._stop,
        )
        self.node = NodeInfo.from_object(node_obj)
        if not self.node.uid or HOSTNAME_LABEL_KEY not in self.node.labels:
            raise AgentError(f"Node {self.node.name} has no uid or no {HOSTNAME_LABEL_KEY} label")
        config = self.config.current
        self.provisioner = provisioner_name(self.node.name, self.node.uid,
                                            use_node_name_only=config.use_node_name_only)
        if self._recorder is None:
            self._recorder = EventRecorder(self.api, component=self.provisioner, clock=self.clock)
        self.recorder.start()
        if self.options.adopt_upstream_pvs:
            self.adopt_upstream_pvs()
        selector = f"{NODE_LABEL_KEY}={node_label_value(self.node.name)}"
        self.pvs = Informer(self.api, PERSISTENT_VOLUMES, label_selector=selector, clock=self.clock,
                            on_change=lambda *_: self.trigger("pv"), name="pv-informer")
        self.classes = Informer(self.api, STORAGE_CLASSES, clock=self.clock,
                                on_change=lambda *_: self.trigger("storageclass"), name="sc-informer")
        # The Job informer runs whenever Job cleaning is on at start; turning it on later
        # needs a restart (the DaemonSet rolls on config changes anyway).
        if config.use_job_for_cleaning:
            self.jobs = JobCleaner(self.api, node_name=self.node.name, namespace=self.options.namespace,
                                   image=self.options.job_image, clock=self.clock,
                                   backoff=self.options.retry_backoff)
            self.jobs.informer.handlers.append(lambda *_: self.trigger("job"))
        for informer in self._informers():
            informer.start()
        for informer in self._informers():
            if not informer.wait_synced(60):
                raise AgentError(f"{informer.name} did not sync within 60s")
        if self.options.watch_host:
            from localpv.agent.triggers import HostEventWatcher

            self._host_events = HostEventWatcher(self.trigger)
            self._host_events.start()
        if run_loop:
            self._spawn(self._loop, "reconcile")
        if self.options.config_path:
            self._spawn(self._watch_config, "config-watch")
        self.trigger("start")

    def _informers(self) -> list[Informer]:
        found = [self.pvs, self.classes, self.jobs.informer if self.jobs else None]
        return [i for i in found if i is not None]

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._host_events is not None:
            self._host_events.stop()
        for informer in self._informers():
            informer.stop()
        for thread in self._threads:
            thread.join(10)
        self.procs.shutdown()
        if self._recorder is not None:
            self._recorder.flush(2)
            self._recorder.stop()

    def trigger(self, reason: str) -> None:
        """Ask for a reconcile pass as soon as possible."""
        with self._trigger_lock:
            self._triggers.add(reason)
        self._wake.set()

    def healthy(self) -> tuple[bool, str]:
        """Alive unless the loop has not completed a pass in several periods."""
        if self.passes == 0:
            return True, "starting"
        stale = self.clock.monotonic() - self.last_pass_at
        limit = max(60.0, 6 * self.options.discovery_period)
        return (stale < limit, f"last pass {stale:.0f}s ago")

    def readiness(self) -> tuple[bool, str]:
        plan_ = self.last_plan
        if plan_ is None:
            return False, "discovererNotReady: no discovery pass yet"
        if plan_.ready:
            return True, "ok"
        problems = [f"{k}: {v}" for k, v in plan_.class_errors.items()]
        problems += [f"{s.path}: {s.reason}" for s in plan_.skipped if s.error]
        return False, "discovererNotReady: " + "; ".join(problems[:5])

    def status(self) -> dict[str, Any]:
        """What ``localpv status`` shows: every volume this agent knows, and why it is where it is."""
        pvs = {path: pv for pv in (self.pvs.list() if self.pvs else []) if (path := pv_host_path(pv))}
        journal = self.journal.snapshot()
        cleanups = self._cleanup_statuses()
        now = self.clock.now()
        volumes = []
        for path in sorted(set(pvs) | set(journal)):
            pv = pvs.get(path) or {}
            entry = journal.get(path)
            name = (pv.get("metadata") or {}).get("name") or (entry.pv if entry else "")
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            cleanup = cleanups.get(str(name))
            volumes.append({
                "path": path, "pv": name, "phase": (pv.get("status") or {}).get("phase", "(no PV)" if not pv else ""),
                "claim": f"{ref.get('namespace')}/{ref.get('name')}" if ref else "",
                "journal": entry.state if entry else "", "cleanup": cleanup.state if cleanup else "",
                "attempts": cleanup.attempts if cleanup else 0,
                "elapsed": round(((cleanup.finished or now) - cleanup.started) if cleanup else 0.0, 1),
                "message": cleanup.message if cleanup else "",
                "progress": self.procs.progress(str(name)),
            })
        plan_ = self.last_plan
        skipped = [{"path": s.path, "class": s.cls, "reason": s.reason, "error": s.error}
                   for s in (plan_.skipped if plan_ else [])]
        ready, why = self.readiness()
        return {"node": self.options.node_name, "ready": ready, "readiness": why, "passes": self.passes,
                "volumes": volumes, "skipped": skipped,
                "class_errors": dict(plan_.class_errors) if plan_ else {}}

    # ------------------------------------------------------------------ loops

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.clock.wait(self._wake, self.options.discovery_period)
            if self._stop.is_set():
                return
            self._wake.clear()
            with self._trigger_lock:
                triggers, self._triggers = self._triggers or {"periodic"}, set()
            for trigger in triggers:
                self.metrics.reconcile_triggers.labels(trigger).inc()
            try:
                self.reconcile_once()
            except Exception:  # a bug in one pass must not stop the agent; the next pass retries
                log.exception("reconcile pass failed")

    def _watch_config(self) -> None:
        while not self.clock.wait(self._stop, self.options.config_sync_period):
            self.reload_config()

    def reload_config(self) -> bool | None:
        result = self.config.reload()
        if result is None:
            self.metrics.config_reload_failures.inc()
            self.metrics.config_last_reload_ok.set(0)
            if self.node is not None and self._recorder is not None:
                self.recorder.event(self._node_obj(), WARNING, "ConfigRejected",
                                    f"new configuration rejected, previous one kept: {self.config.last_error}")
        else:
            self.metrics.config_last_reload_ok.set(1)
            if result:
                log.info("configuration reloaded")
                self.trigger("config")
        return result

    def _node_obj(self) -> Obj:
        assert self.node is not None
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node.name, "uid": self.node.uid}}

    # ------------------------------------------------------------------ one pass

    def gather(self) -> World:
        """Snapshot every input of a pass."""
        assert self.node is not None and self.pvs is not None and self.classes is not None
        config = self.config.current
        mounts = self.mount_table()
        scans: dict[str, list[Entry] | str] = {}
        for name, cls in config.classes.items():
            try:
                scans[name] = self.scanner(cls.mount_dir, mounts)
            except ScanError as err:
                scans[name] = str(err)
        storage_classes: dict[str, StorageClassInfo | None] = {}
        for name in config.classes:
            sc = self.classes.get(name)
            storage_classes[name] = StorageClassInfo.from_object(sc) if sc is not None else None
        return World(
            config=config, node=self.node, provisioner=self.provisioner, storage_classes=storage_classes,
            scans=scans, pvs=self.pvs.list(), journal=self.journal.snapshot(), cleanups=self._cleanup_statuses(),
            collisions=dict(self.collisions), now=self.clock.now(),
        )

    def _cleanup_statuses(self) -> dict[str, CleanupStatus]:
        statuses = self.procs.statuses()
        if self.jobs is not None:
            statuses.update(self.jobs.statuses())
        return statuses

    def reconcile_once(self) -> Plan:
        """One pass; passes never overlap (the loop thread and direct callers share a lock)."""
        with self._pass_lock:
            return self._reconcile()

    def _reconcile(self) -> Plan:
        started = time.monotonic()
        world = self.gather()
        result = plan(world)
        self.journal.apply(result.journal)
        self.execute(result, world.config)
        self.last_plan = result
        self.ready = result.ready
        if result.ready and world.config.remove_node_not_ready_taint and not self._taint_removed:
            self._taint_removed = self.remove_startup_taint(world.config.provisioner_not_ready_node_taint_key)
        self.passes += 1
        self.last_pass_at = self.clock.monotonic()
        for mode, total in result.capacity.items():
            self.metrics.capacity.labels(mode).set(total)
        self.metrics.discovery_errors.set(result.errors)
        self.metrics.reconcile_duration.observe(time.monotonic() - started)
        return result

    def execute(self, result: Plan, config: ProvisionerConfig) -> None:
        for name in result.forget_cleanups:
            self._forget(name)
        for orphan in result.orphans:
            self._confirm_orphan(orphan)
        for cleanup in result.cleanups:
            self._start_cleanup(cleanup, config)
        for delete in result.deletes:
            self._delete(delete)
        for create in result.creates:
            self._create(create)
        for event in result.events:
            self.recorder.event(event.obj, event.type, event.reason, event.message)
        for skip in result.skipped:
            log.log(logging.WARNING if skip.error else logging.DEBUG, "skipped %s (class %s): %s",
                    skip.path, skip.cls, skip.reason)

    def _confirm_orphan(self, orphan: ConfirmOrphan) -> None:
        try:
            pv = self.api.get(PERSISTENT_VOLUMES, orphan.pv_name)
        except NotFound:
            log.warning("PV %s of %s disappeared before its volume was cleaned; cleaning it now",
                        orphan.pv_name, orphan.host_path)
            self.journal.apply({orphan.host_path: orphan.entry.with_state(CLEANING, self.clock.now())})
            self.trigger("orphan")
            return
        except ApiError as err:
            log.warning("cannot check PV %s: %s", orphan.pv_name, err)
            return
        if pv_host_path(pv) == orphan.host_path:
            self._ensure_label(pv)  # ours but invisible to the label-filtered cache

    def _forget(self, name: str) -> None:
        self.procs.forget(name)
        if self.jobs is not None and self.jobs.informer.get(cleanup_job_name(name), self.options.namespace):
            self.jobs.remove(name)

    def _start_cleanup(self, cleanup: StartCleanup, config: ProvisionerConfig) -> None:
        mode = "Block" if cleanup.block else "Filesystem"
        if self.jobs is not None and config.cleans_by_job(cleanup.block):
            error = self.jobs.start_cleanup(cleanup, config)
            if error is not None:
                self.metrics.delete_failed.labels(mode, "job").inc()
                self.recorder.event(cleanup.pv or self._node_obj(), WARNING, "VolumeFailedDelete", error)
            elif cleanup.retry:
                self.metrics.cleanup_retries.labels(mode, "job").inc()
            return
        uid = str(((cleanup.pv or {}).get("metadata") or {}).get("uid") or "") or None
        if cleanup.block:
            fn = block_cleaner(cleanup.container_path, cleanup.cls.block_cleaner_command,
                               timeout=config.cleanup_timeout,
                               on_line=lambda line: self.procs.set_progress(cleanup.pv_name, line),
                               records=self.cleaner_records, key=cleanup.pv_name)
        else:
            fn = filesystem_cleaner(cleanup.container_path, cleanup.cls.mount_dir)
        if self.procs.start(cleanup.pv_name, fn, pv_uid=uid):
            log.info("cleaning %s (%s, %s)", cleanup.host_path, "block" if cleanup.block else "filesystem",
                     cleanup.reason)
            if cleanup.retry:
                self.metrics.cleanup_retries.labels(mode, "process").inc()

    def _delete(self, delete: DeletePV) -> None:
        meta = delete.pv.get("metadata") or {}
        name, uid = str(meta.get("name")), str(meta.get("uid") or "") or None
        mode = "Block" if delete.block else "Filesystem"
        kind = "job" if self.jobs is not None and self.jobs.informer.get(
            cleanup_job_name(name), self.options.namespace) else "process"
        if kind == "job":
            self._forget(name)  # upstream order: the Job first, then the PV
        try:
            self.api.delete(PERSISTENT_VOLUMES, name, uid=uid)
        except (NotFound, Conflict):
            pass  # already gone, or a different PV now has this name: nothing of ours to delete
        except ApiError as err:
            self.metrics.delete_failed.labels(mode, kind).inc()
            self.recorder.event(delete.pv, WARNING, "VolumeFailedDelete", f"Error deleting PV: {err}")
            return
        self.procs.forget(name)
        cls = self.config.current.classes.get(str((delete.pv.get("spec") or {}).get("storageClassName")))
        command = cls.block_cleaner_command[0] if cls else ""
        capacity = self._pv_capacity(delete.pv)
        self.metrics.delete.labels(mode, kind).inc()
        self.metrics.delete_duration.labels(mode, kind, capacity_bucket(capacity), command).observe(
            max(0.0, self.clock.now() - delete.cleanup.started))
        log.info("deleted PV %s after cleaning %s", name, delete.host_path)

    @staticmethod
    def _pv_capacity(pv: Obj) -> int:
        from localpv.naming import parse_quantity

        try:
            return parse_quantity(str(((pv.get("spec") or {}).get("capacity") or {}).get("storage")))
        except ValueError:
            return 0

    def _create(self, create: CreatePV) -> None:
        name = create.pv["metadata"]["name"]
        first = self._first_seen.setdefault(create.host_path, self.clock.monotonic())
        try:
            self.api.create(PERSISTENT_VOLUMES, create.pv)
        except AlreadyExists:
            self._on_name_taken(create)
            return
        except ApiError as err:
            log.warning("creating PV %s for %s failed: %s", name, create.host_path, err)
            self._forget_failed_create(create)
            return
        self._first_seen.pop(create.host_path, None)
        self.metrics.discovery.labels(create.mode).inc()
        self.metrics.discovery_duration.labels(create.mode).observe(self.clock.monotonic() - first)
        log.info("created PV %s for %s (%s, %d bytes)", name, create.host_path, create.mode, create.capacity)

    def _forget_failed_create(self, create: CreatePV) -> None:
        """Drop the journal's "offered" record only if the PV surely does not exist.

        A create that timed out or got a 5xx may still have succeeded on the server; such a
        PV could be bound, used and deleted before our cache shows it. Keeping the record
        then makes the orphan check clean the volume before it is offered again.
        """
        try:
            self.api.get(PERSISTENT_VOLUMES, create.pv["metadata"]["name"])
        except NotFound:
            self.journal.apply({create.host_path: None})
        except ApiError:
            pass  # unknown: keep the record; the orphan check settles it later

    def _on_name_taken(self, create: CreatePV) -> None:
        """Our deterministic name exists: it is our own PV (cache lag, missing label) or a collision."""
        name = create.pv["metadata"]["name"]
        try:
            other = self.api.get(PERSISTENT_VOLUMES, name)
        except ApiError as err:
            log.warning("PV %s exists but cannot be read: %s", name, err)
            return
        if pv_host_path(other) == create.host_path and self._same_node(other):
            self._ensure_label(other)
            return
        where = f"{pv_host_path(other) or 'not a local volume'}"
        labels = (other.get("metadata") or {}).get("labels") or {}
        node = labels.get(NODE_LABEL_KEY) or labels.get(HOSTNAME_LABEL_KEY) or "another node"
        description = f"{where} on {node}"
        self.journal.apply({create.host_path: None})
        if self.collisions.get(name) != description:
            self.collisions[name] = description
            self.recorder.event(self._node_obj(), WARNING, "PVNameCollision",
                                f"PV name {name} for {create.host_path} is already used by PV {name} "
                                f"({description}); volume skipped")

    def _same_node(self, pv: Obj) -> bool:
        assert self.node is not None
        annotations = (pv.get("metadata") or {}).get("annotations") or {}
        owner = str(annotations.get(PROVISIONED_BY_ANNOTATION) or "")
        return owner == self.provisioner or owner.startswith(f"local-volume-provisioner-{self.node.name}-") or \
            owner == f"local-volume-provisioner-{self.node.name}"

    def _ensure_label(self, pv: Obj) -> None:
        assert self.node is not None
        value = node_label_value(self.node.name)
        labels = (pv.get("metadata") or {}).get("labels") or {}
        if labels.get(NODE_LABEL_KEY) == value:
            return
        name = str(pv["metadata"]["name"])
        try:
            self.api.patch(PERSISTENT_VOLUMES, name, {"metadata": {"labels": {NODE_LABEL_KEY: value}}})
            log.info("adopted PV %s (added label %s=%s)", name, NODE_LABEL_KEY, value)
        except ApiError as err:
            log.warning("cannot label PV %s: %s", name, err)

    def remove_startup_taint(self, key: str) -> bool:
        """Drop the node's "agent not ready" taint once discovery is ready (upstream #501,
        whose loop condition never lets it run). True when the taint is gone."""
        assert self.node is not None
        if not key:
            return True
        for _ in range(5):
            try:
                node = self.api.get(NODES, self.node.name)
                taints = (node.get("spec") or {}).get("taints") or []
                kept = [t for t in taints if t.get("key") != key]
                if len(kept) == len(taints):
                    return True
                node["spec"]["taints"] = kept
                self.api.replace(NODES, node)
                log.info("removed taint %s from node %s", key, self.node.name)
                return True
            except Conflict:
                continue  # the node changed under us: read it again
            except ApiError as err:
                log.warning("cannot remove taint %s: %s", key, err)
                return False
        return False

    # ------------------------------------------------------------------ adoption

    def adopt_upstream_pvs(self) -> int:
        """Label this node's PVs made by upstream (or by us before a label change), once.

        Needs one unfiltered scan of all PVs, page by page; a marker in the state dir
        makes later restarts skip it (after the first start no upstream agent creates
        PVs for this node any more). Everything else goes through the label-filtered cache.
        """
        assert self.node is not None
        marker = (os.path.join(self.options.state_dir, f"adopted-{self.provisioner}")
                  if self.options.state_dir else None)
        if marker is not None and os.path.exists(marker):
            return 0
        adopted = 0
        value = node_label_value(self.node.name)
        try:
            for page, _ in self.api.list_pages(PERSISTENT_VOLUMES):
                for pv in page:
                    labels = (pv.get("metadata") or {}).get("labels") or {}
                    if labels.get(NODE_LABEL_KEY) != value and (pv.get("spec") or {}).get("local") \
                            and self._same_node(pv):
                        self._ensure_label(pv)
                        adopted += 1
        except ApiError as err:
            log.warning("cannot list PVs for adoption (will retry at next start): %s", err)
            return adopted
        if marker is not None:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w", encoding="utf-8") as f:
                f.write(f"{adopted}\n")
        return adopted

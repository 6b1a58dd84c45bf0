"""The node agent: wires the informers, host events, cleaners and the reconcile loop.

One thread runs reconcile passes. A pass is triggered by a mount-table change, a block
device uevent, a change in this node's PVs or StorageClasses, a finished cleanup, a
configuration reload - or, as a safety net, ``discovery_period`` after the previous
pass. Each pass snapshots the host, asks :func:`localpv.agent.planner.plan` what to do,
writes the journal changes durably, then hands the plan to the
:class:`~localpv.agent.executor.Executor`. All decisions live in the planner, all side
effects in the executor; this module wires them up and keeps the loop going.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from localpv.agent.cleaning import cleaner_processes, volume_is_empty
from localpv.agent.executor import Executor
from localpv.agent.health import assess
from localpv.agent.jobs import JobCleaner
from localpv.agent.journal import Journal
from localpv.agent.metrics import AgentMetrics
from localpv.agent.model import CleanupStatus, Plan, World
from localpv.agent.pacing import PassPacing
from localpv.agent.phases import ReleasedTracker
from localpv.agent.planner import plan
from localpv.agent.planner.volatile import emptiness_wanted
from localpv.agent.proctable import DEFAULT_RETRY_BACKOFF, ProcTable
from localpv.agent.pvbuilder import NodeInfo, StorageClassInfo
from localpv.clock import Clock, SystemClock
from localpv.config import ConfigError, ProvisionerConfig, for_node, load_config
from localpv.host.cleaner import ProcessRecords
from localpv.host.identity import boot_id
from localpv.host.mounts import mount_points, read_mountinfo
from localpv.host.probes import default_probes
from localpv.host.scan import HUNG_STORAGE, Entry, ScanError, scan_directory
from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, Backoff
from localpv.kube.events import WARNING, EventRecorder
from localpv.kube.informer import Informer, jittered_period
from localpv.kube.objects import Obj, pv_host_path, pv_is_csi
from localpv.kube.resources import NODES, PERSISTENT_VOLUMES, STORAGE_CLASSES
from localpv.kube.volumehealth import HealthReporter
from localpv.naming import (
    HOSTNAME_LABEL_KEY,
    NODE_LABEL_KEY,
    node_label_value,
    provisioner_name,
)
from localpv.supervise import Supervisor

log = logging.getLogger(__name__)


class AgentError(Exception):
    """The agent cannot start (no Node, Node without hostname label, ...)."""


@dataclass(frozen=True)
class AgentOptions:
    node_name: str
    namespace: str = "default"
    job_image: str | None = None
    #: Secrets the cleanup Jobs pull their image with (the chart's imagePullSecrets).
    job_image_pull_secrets: tuple[str, ...] = ()
    config_path: str | None = None
    discovery_period: float = 10.0
    config_sync_period: float = 5.0
    watch_host: bool = True
    adopt_upstream_pvs: bool = True
    retry_backoff: Backoff = DEFAULT_RETRY_BACKOFF
    #: Host directory for state that must survive restarts (cleaner process records).
    state_dir: str | None = None
    #: Filesystem volumes are mount points; only the demo's simulated volumes are not.
    require_mount_point: bool = True
    #: Volume health is assessed at every pass (mount-table and udev events start one); this
    #: is how long it may go without one, should discovery passes be rarer.
    volume_health_period: float = 60.0


class ConfigHolder:
    """The configuration in use on this node, reloaded from disk; a broken file keeps the last good one.

    ``raw`` is the ConfigMap as read; ``current`` is what this node gets from it (its ``nodes``
    overrides applied, :func:`localpv.config.for_node`), and is what every part of the agent
    reads. Both a new ConfigMap and new labels on the Node resolve it again: a label that
    selects another directory takes effect without a restart.
    """

    def __init__(self, path: str | None, initial: ProvisionerConfig, node_name: str = "") -> None:
        self.path = path
        self.node_name = node_name
        self.raw = initial
        #: The Node's labels; none known until the Node is read (overrides by name apply already).
        self.labels: Mapping[str, str] = {}
        self.current = for_node(initial, node_name, {}).config if node_name else initial
        self.last_error: str | None = None

    def _resolve(self, raw: ProvisionerConfig, labels: Mapping[str, str]) -> ProvisionerConfig:
        return for_node(raw, self.node_name, labels).config if self.node_name else raw

    def relabel(self, labels: Mapping[str, str]) -> bool | None:
        """The Node's labels are now ``labels``: True if this node's configuration changed,
        False if not, None if the overrides they select clash (the previous one is kept)."""
        try:
            resolved = self._resolve(self.raw, labels)
        except ConfigError as err:
            message = "; ".join(err.problems)
            if message != self.last_error:
                log.error("configuration for the Node's new labels rejected, keeping the previous one: %s", message)
            self.last_error = message
            return None
        self.labels = dict(labels)
        self.last_error = None
        changed = resolved != self.current
        self.current = resolved
        return changed

    def reload(self) -> bool | None:
        """True if a new configuration was applied, False if unchanged, None if rejected."""
        if self.path is None:
            return False
        try:
            loaded = load_config(self.path)
            resolved = self._resolve(loaded.config, self.labels)
        except ConfigError as err:
            message = "; ".join(err.problems)
        except Exception as err:  # a parser bug must not kill reloading for good
            message = f"{self.path}: cannot be loaded ({type(err).__name__}: {str(err)[:200]})"
        else:
            message = ""
        if message:
            if message != self.last_error:
                log.error("configuration rejected, keeping the previous one: %s", message)
            self.last_error = message
            return None
        self.last_error = None
        if loaded.config == self.raw:
            return False
        for warning in loaded.warnings:
            log.warning("configuration: %s", warning)
        self.raw = loaded.config
        changed = resolved != self.current
        self.current = resolved
        return changed


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
        boot: str | None = None,
    ) -> None:
        """``boot``: this boot's id (read from the kernel by default; tests play reboots with it)."""
        self.api = api
        self.options = options
        self.config = ConfigHolder(options.config_path, config, options.node_name)
        self.journal = journal
        self.metrics = metrics or AgentMetrics()
        self.clock = clock or SystemClock()
        self.mount_table = mount_table
        self.scanner = scanner
        self.boot = boot_id() if boot is None else boot
        if not self.boot:
            log.warning("this boot's id cannot be read (is /proc mounted?): device and inode numbers recorded "
                        "by earlier agents are taken as this boot's")
        self._recorder = recorder
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._triggers: set[str] = set()
        self._trigger_lock = threading.Lock()
        self.supervisor = Supervisor(clock=self.clock, stopping=self._stop,
                                     on_crash=lambda name: self.metrics.thread_crashes.labels(name).inc())
        self._started_at: float | None = self.clock.monotonic()
        self._failed_passes = 0
        self._last_pass_error = ""
        self._last_mounts: frozenset[object] | None = None
        self.pacing = PassPacing()
        self._host_events: Any = None
        self._taint_removed = False
        self._pass_lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self.node: NodeInfo | None = None
        #: The Node object is gone (the node is being removed). The agent then does nothing:
        #: PVs it created would be deleted by node-cleanup, cleaned and created again, in a loop.
        self.node_deleted = False
        self.provisioner = ""
        self.last_plan: Plan | None = None
        self.passes = 0
        self.last_pass_at = 0.0
        self.ready = False
        self.procs = ProcTable(config.cleanup_workers, clock=self.clock, retry_backoff=options.retry_backoff,
                               on_done=self._cleanup_done)
        self.metrics.watch_proctable(self.procs.stats)
        self.metrics.watch_stuck(lambda: float(default_probes().stuck()), lambda: float(len(cleaner_processes())))
        self._released = ReleasedTracker()
        self.metrics.watch_volumes(self._volume_figures)
        self.health = HealthReporter()
        #: More ``localpv_volume_condition`` samples (dynamic volumes' watch, when it runs).
        self.condition_sources: list[Callable[[], dict[tuple[str, str], float]]] = []
        self.metrics.watch_volume_conditions(self._condition_samples)
        self.cleaner_records = ProcessRecords(os.path.join(options.state_dir, "cleaners") if options.state_dir
                                              else None)
        self.pvs: Informer | None = None
        self.nodes: Informer | None = None
        self.classes: Informer | None = None
        self.jobs: JobCleaner | None = None
        self.executor: Executor | None = None

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
        config = self.config.current
        # minResyncPeriod, as upstream uses it: each cache relists after a period drawn in [min, 2·min).
        resync = jittered_period(config.min_resync_period)
        # The Node comes from the cache that follows it, not from a GET of its own: at start the
        # agent's requests queue behind its rate limit (5/s after a burst of 10) before its own
        # volumes are offered, so each one saved is a fifth of a second. The Node's identity must
        # follow the Node: a Node deleted and created again (same name, new uid) would otherwise
        # get PVs owned by the old uid, which the garbage collector deletes as fast as they are
        # made (with setPVOwnerRef).
        self.nodes = Informer(self.api, NODES, field_selector=f"metadata.name={self.options.node_name}",
                              clock=self.clock, on_change=self._on_node_change, name="node-informer")
        self.nodes.resync_period = resync
        self.nodes.start()
        if not self.nodes.wait_synced(60):
            raise AgentError(f"{self.nodes.name} did not sync within 60s (can the agent list Nodes?)")
        node_obj = self.nodes.get(self.options.node_name)
        if node_obj is None:
            raise AgentError(f"Node {self.options.node_name} not found: --node (MY_NODE_NAME) must name this "
                             "node's Node object")
        self.node = NodeInfo.from_object(node_obj)
        if not self.node.uid or HOSTNAME_LABEL_KEY not in self.node.labels:
            raise AgentError(f"Node {self.node.name} has no uid or no {HOSTNAME_LABEL_KEY} label")
        if self.config.relabel(self.node.labels) is None:
            raise AgentError(f"the configuration for Node {self.node.name} and its labels is refused: "
                             f"{self.config.last_error}")
        self.provisioner = provisioner_name(self.node.name, self.node.uid,
                                            use_node_name_only=config.use_node_name_only)
        if self._recorder is None:
            # Events have a rate budget of their own: they must not delay volume actions.
            self._recorder = EventRecorder(self.api.for_events(), component=self.provisioner, clock=self.clock)
        self.recorder.start()
        # The Job informer runs whenever Job cleaning is on at start; turning it on later
        # needs a restart (the DaemonSet rolls on config changes anyway).
        if config.use_job_for_cleaning:
            self.jobs = JobCleaner(self.api, node_name=self.node.name, namespace=self.options.namespace,
                                   image=self.options.job_image,
                                   image_pull_secrets=self.options.job_image_pull_secrets, clock=self.clock,
                                   backoff=self.options.retry_backoff)
            self.jobs.informer.handlers.append(lambda *_: self.trigger("job"))
        self.executor = Executor(
            self.api, node=self.node, provisioner=self.provisioner, journal=self.journal, procs=self.procs,
            jobs=self.jobs, recorder=self.recorder, metrics=self.metrics, clock=self.clock,
            records=self.cleaner_records, namespace=self.options.namespace, state_dir=self.options.state_dir,
            config=lambda: self.config.current, trigger=self.trigger,
            require_mount_point=self.options.require_mount_point,
        )
        if self.journal.recovering:
            message = (f"no cleanup journal at {self.journal.path} (first start on this node, or the state dir "
                       "was lost): every volume without a PV is cleaned before it is offered")
            log.warning("%s", message)
            self.recorder.event(self._node_obj(), WARNING, "JournalRecovering", message)
        if self.options.adopt_upstream_pvs:
            try:
                self.executor.adopt_upstream_pvs()
            except ApiError as err:
                raise AgentError(f"cannot finish the scan for upstream PVs of this node ({err}); nothing is "
                                 "offered or cleaned before it has, as a volume whose PV it did not see "
                                 "looks free") from err
        selector = f"{NODE_LABEL_KEY}={node_label_value(self.node.name)}"
        self.pvs = Informer(self.api, PERSISTENT_VOLUMES, label_selector=selector, clock=self.clock,
                            on_change=self._on_pv_change, name="pv-informer")
        self.classes = Informer(self.api, STORAGE_CLASSES, clock=self.clock,
                                on_change=lambda *_: self.trigger("storageclass"), name="sc-informer")
        for informer in self._informers():
            if informer is not self.nodes:
                informer.resync_period = resync
                informer.start()
        for informer in self._informers():
            if not informer.wait_synced(60):
                raise AgentError(f"{informer.name} did not sync within 60s")
        if self.options.watch_host:
            from localpv.agent.triggers import HostEventWatcher

            self._host_events = HostEventWatcher(self._on_host_event)
            self._host_events.start()
        if run_loop:
            self._spawn(self._loop, "reconcile")
        if self.options.config_path:
            self._spawn(self._watch_config, "config-watch")
        self.trigger("start")

    def _informers(self) -> list[Informer]:
        found = [self.pvs, self.classes, self.nodes, self.jobs.informer if self.jobs else None]
        return [i for i in found if i is not None]

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        self.supervisor.spawn(name, target)

    def _relevant_mounts(self) -> frozenset[object]:
        """The mounts at or below a discovery directory: the only ones that matter. Each is
        taken whole (device, root, options), so that a volume remounted read-only, or another
        disk mounted in its place, starts a pass as a new mount does (volume health)."""
        dirs = set()
        for cls in self.config.current.classes.values():
            dirs.add(cls.mount_dir.rstrip("/") or "/")
            dirs.add(os.path.realpath(cls.mount_dir))
        try:
            mounts = read_mountinfo()
        except (OSError, ValueError):
            return frozenset({"<unreadable>"})
        return frozenset(m for m in mounts
                         if any(m.mount_point == d or m.mount_point.startswith(d + "/") for d in dirs))

    def _on_pv_change(self, _kind: str, old: Obj | None, new: Obj | None) -> None:
        if self.executor is not None:
            self.executor.seen_by_cache(new or old)  # its own create, shown: the cache has it now
        self.trigger("pv")

    def _on_host_event(self, kind: str) -> None:
        """A mount-table change wakes the loop only if it changed what is mounted under a
        discovery directory: a busy node mounts and unmounts pod volumes all the time."""
        if kind == "mount":
            relevant = self._relevant_mounts()
            if relevant == self._last_mounts:
                self.metrics.reconcile_triggers.labels("mount-elsewhere").inc()
                return
            self._last_mounts = relevant
        self.trigger(kind)

    def _on_node_change(self, kind: str, _old: Obj | None, new: Obj | None) -> None:
        """Follow the Node object: a new uid (re-created Node) or new labels change the PVs."""
        if kind == "DELETED":
            log.warning("Node %s was deleted: no volume is published or cleaned until it is back "
                        "(node-cleanup removes the PVs of a deleted node)", self.options.node_name)
            self.node_deleted = True
            self.trigger("node")
            return
        if new is None or self.node is None:
            return
        if self.node_deleted:
            log.warning("Node %s is back", self.options.node_name)
            self.node_deleted = False
            self.trigger("node")
        info = NodeInfo.from_object(new)
        if not info.uid or info == self.node:
            return
        if info.uid != self.node.uid:
            log.warning("Node %s was re-created (uid %s, was %s): new PVs are built for the new Node",
                        info.name, info.uid, self.node.uid)
        if info.labels != self.node.labels:
            self._relabel(info.labels)
        self.node = info
        self.provisioner = provisioner_name(info.name, info.uid,
                                            use_node_name_only=self.config.current.use_node_name_only)
        if self.executor is not None:
            self.executor.node = info
            self.executor.provisioner = self.provisioner
        self.trigger("node")

    def _cleanup_done(self, name: str) -> None:
        if self.executor is not None:
            self.executor.cleanup_finished(name, self.procs.status(name))
        self.trigger("cleanup")

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._host_events is not None:
            self._host_events.stop()
        for informer in self._informers():
            informer.stop()
        self.supervisor.stop()
        self.procs.shutdown()
        if self._recorder is not None:
            self._recorder.flush(2)
            self._recorder.stop()

    def trigger(self, reason: str) -> None:
        """Ask for a reconcile pass as soon as possible."""
        with self._trigger_lock:
            self._triggers.add(reason)
        self._wake.set()

    #: Consecutive failed passes after which the agent says it is not alive.
    FAILED_PASS_LIMIT = 3

    def healthy(self) -> tuple[bool, str]:
        """Alive only while it is doing its job (the liveness probe: failing restarts the pod).

        Every supervised loop runs and is not crash-looping; every cache's thread runs; a
        reconcile pass completed recently (counted from the start, so an agent wedged
        before its first pass is not "starting" forever); passes do not keep failing (a
        journal that cannot be written fails every pass); the state dir is writable.
        """
        problems = list(self.supervisor.problems())
        problems += [f"{i.name} is not running" for i in self._informers() if not i.alive()]
        now = self.clock.monotonic()
        limit = max(60.0, 6 * self.options.discovery_period)
        since = self.last_pass_at if self.passes else self._started_at
        if since is not None and now - since >= limit:
            what = f"last pass {now - since:.0f}s ago" if self.passes else f"no pass completed in {now - since:.0f}s"
            problems.append(what + (f" (last error: {self._last_pass_error})" if self._last_pass_error else ""))
        if self._failed_passes >= self.FAILED_PASS_LIMIT:
            problems.append(f"the last {self._failed_passes} passes failed: {self._last_pass_error}")
        state_dir = self.options.state_dir
        if state_dir and os.path.isdir(state_dir) and not os.access(state_dir, os.W_OK):
            problems.append(f"state dir {state_dir} is not writable")
        if problems:
            return False, "; ".join(problems)
        return True, f"last pass {now - self.last_pass_at:.0f}s ago" if self.passes else "starting"

    def readiness(self) -> tuple[bool, str]:
        plan_ = self.last_plan
        if plan_ is None:
            return False, "discovererNotReady: no discovery pass yet"
        if plan_.ready:
            return True, "ok"
        problems = [f"{k}: {v}" for k, v in plan_.class_errors.items()]
        problems += [f"{s.path}: {s.reason}" for s in plan_.skipped if s.error]
        return False, "discovererNotReady: " + "; ".join(problems[:5])

    def _condition_samples(self) -> dict[tuple[str, str], float]:
        samples = self.health.gauge()
        for source in self.condition_sources:
            samples.update(source())
        return samples

    def _static_pvs(self) -> list[Obj]:
        """This node's PVs of static volumes. Dynamic (CSI) PVs carry the same node label, so
        the cache holds them too, but they are the CSI controller's to provision, watch and
        reclaim: the planner must not take a Released one for a local volume it cannot clean."""
        cached = self.pvs.list() if self.pvs else []
        if self.executor is not None:
            cached = self.executor.with_own_creates(cached)  # the cache may not show them yet
        return [pv for pv in cached if not pv_is_csi(pv)]

    def _volume_figures(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """PV counts and Released ages for the metrics; also called by every pass, so that a
        PV's Released time is noted even when nothing scrapes."""
        figures = self._released.figures(self._static_pvs(), self.config.current.classes, self.clock.monotonic())
        return figures.counts, figures.released_for

    def status(self) -> dict[str, Any]:
        """What ``localpv status`` shows: every volume this agent knows, and why it is where it is."""
        pvs = {path: pv for pv in (self.pvs.list() if self.pvs else []) if (path := pv_host_path(pv))}
        journal = self.journal.snapshot()
        cleanups = self._cleanup_statuses()
        now = self.clock.now()
        plan_ = self.last_plan
        volumes = []
        for path in sorted(set(pvs) | set(journal)):
            pv = pvs.get(path) or {}
            entry = journal.get(path)
            name = (pv.get("metadata") or {}).get("name") or (entry.pv if entry else "")
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            cleanup = cleanups.get(str(name))
            held = plan_.held.get(path) if plan_ else None
            volumes.append({
                "path": path, "pv": name, "phase": (pv.get("status") or {}).get("phase", "(no PV)" if not pv else ""),
                "identity": entry.identity if entry else "", "held": held.reason if held else "",
                "numbers": entry.ident if entry else "", "boot": entry.boot if entry else "",
                "health": self.health.of(str(name)) if pv else [],
                "claim": f"{ref.get('namespace')}/{ref.get('name')}" if ref else "",
                "journal": entry.state if entry else "", "cleanup": cleanup.state if cleanup else "",
                "attempts": cleanup.attempts if cleanup else 0,
                "elapsed": round(((cleanup.finished or now) - cleanup.started) if cleanup else 0.0, 1),
                "message": cleanup.message if cleanup else "",
                "progress": self.procs.progress(str(name)),
            })
        skipped = [{"path": s.path, "class": s.cls, "reason": s.reason, "error": s.error}
                   for s in (plan_.skipped if plan_ else [])]
        ready, why = self.readiness()
        healthy, health = self.healthy()
        return {"node": self.options.node_name, "ready": ready, "readiness": why, "healthy": healthy,
                "health": health, "passes": self.passes,
                "journal_recovering": self.journal.recovering, "volumes": volumes, "skipped": skipped,
                "class_errors": dict(plan_.class_errors) if plan_ else {}}

    # ------------------------------------------------------------------ loops

    def _next_wait(self) -> float:
        """Until the next periodic pass, or the earliest failed cleanup's retry if sooner:
        a retry must not wait for the safety-net period (or for an unrelated event)."""
        wait = min(self.options.discovery_period, self.options.volume_health_period)
        now = self.clock.now()
        for status in self._cleanup_statuses().values():
            if status.retry_at is not None and status.retry_at > now:  # a past one was handled by a pass
                wait = min(wait, status.retry_at - now + 0.01)
        return wait

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.clock.wait(self._wake, self._next_wait())
            if self._stop.is_set():
                return
            pause = self.pacing.pause_before_pass(self.clock.monotonic())
            if pause > 0 and self.clock.wait(self._stop, pause):
                return
            self._wake.clear()
            with self._trigger_lock:
                triggers, self._triggers = self._triggers or {"periodic"}, set()
            for trigger in triggers:
                self.metrics.reconcile_triggers.labels(trigger).inc()
            try:
                self.reconcile_once()
            except Exception as err:  # a bug in one pass must not stop the agent; the next pass retries
                self._failed_passes += 1
                self._last_pass_error = f"{type(err).__name__}: {err}"[:300]
                self.metrics.reconcile_failures.inc()
                log.exception("reconcile pass failed")
            self.pacing.pass_ended(self.clock.monotonic())

    def _watch_config(self) -> None:
        while not self.clock.wait(self._stop, self.options.config_sync_period):
            self.reload_config()

    def reload_config(self) -> bool | None:
        """Apply the configuration on disk if it changed. A rejected one is counted and
        reported once per distinct problem, not at every check while it stays on disk."""
        with self._reload_lock:  # the watcher thread and direct callers: one reload at a time
            previous_error = self.config.last_error
            result = self.config.reload()
            rejected_anew = result is None and self.config.last_error != previous_error
        if result is None:
            self.metrics.config_last_reload_ok.set(0)
            if not rejected_anew:
                return result
            self.metrics.config_reload_failures.inc()
            if self.node is not None and self._recorder is not None:
                self.recorder.event(self._node_obj(), WARNING, "ConfigRejected",
                                    f"new configuration rejected, previous one kept: {self.config.last_error}")
        else:
            self.metrics.config_last_reload_ok.set(1)
            if result:
                log.info("configuration reloaded")
                self.trigger("config")
        return result

    def _relabel(self, labels: Mapping[str, str]) -> None:
        """The Node's labels changed: the overrides they select may give this node other
        directories (or take a pool or class off it). Applied like a new ConfigMap, refused
        like a bad one (an event on the Node, the previous configuration kept)."""
        with self._reload_lock:
            previous_error = self.config.last_error
            result = self.config.relabel(labels)
        if result is None:
            if self.config.last_error != previous_error and self._recorder is not None and self.node is not None:
                self.metrics.config_reload_failures.inc()
                self.recorder.event(self._node_obj(), WARNING, "ConfigRejected",
                                    f"configuration for the Node's new labels rejected, previous one kept: "
                                    f"{self.config.last_error}")
        elif result:
            log.info("the Node's labels changed what this node gets from the configuration: applied")
            self.trigger("config")

    def _node_obj(self) -> Obj:
        assert self.node is not None
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node.name, "uid": self.node.uid}}

    @property
    def collisions(self) -> dict[str, str]:
        """PV names found to belong to another volume (kept by the executor)."""
        return self.executor.collisions if self.executor is not None else {}

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
        world = World(
            config=config, node=self.node, provisioner=self.provisioner, storage_classes=storage_classes,
            scans=scans, pvs=self._static_pvs(), journal=self.journal.snapshot(), cleanups=self._cleanup_statuses(),
            collisions=dict(self.collisions), now=self.clock.now(), recovering=self.journal.recovering,
            boot=self.boot,
        )
        wanted = emptiness_wanted(world)
        if not wanted:
            return world
        empty = frozenset(path for path, (container, mount_dir) in wanted.items()
                          if volume_is_empty(container, mount_dir,
                                             require_mount_point=self.options.require_mount_point))
        return replace(world, empty=empty)

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
        if self.node_deleted:
            return self._idle_pass(f"Node {self.options.node_name} was deleted: no volume is published or "
                                   "cleaned until it is back")
        world = self.gather()
        result = plan(world)
        self.journal.apply(result.journal)
        if world.recovering and result.ready:
            # Every discovery directory was read and every volume in it now has a record.
            self.journal.end_recovery()
            log.info("cleanup journal complete: every volume on this node is recorded")
        self.execute(result, world.config)
        self._report_health(world)
        self.last_plan = result
        self.ready = result.ready
        if result.ready and world.config.remove_node_not_ready_taint and not self._taint_removed:
            assert self.executor is not None
            key = world.config.provisioner_not_ready_node_taint_key
            self._taint_removed = self.executor.remove_startup_taint(key)
        self.passes += 1
        self.last_pass_at = self.clock.monotonic()
        self._failed_passes = 0
        self._last_pass_error = ""
        for mode, total in result.capacity.items():
            self.metrics.capacity.labels(mode).set(total)
        self.metrics.discovery_errors.set(result.errors)
        for cls_name in world.config.classes:
            hung = sum(1 for s in result.skipped if s.cls == cls_name and HUNG_STORAGE in s.reason)
            hung += HUNG_STORAGE in result.class_errors.get(cls_name, "")
            self.metrics.hung_storage.labels(cls_name).set(hung)
            self.metrics.identity_mismatches.labels(cls_name).set(
                sum(1 for held in result.held.values() if held.cls == cls_name))
        self._volume_figures()
        self.metrics.reconcile_duration.observe(time.monotonic() - started)
        return result

    def _report_health(self, world: World) -> None:
        """Assess every handed-out volume from this pass's look at the host, and say what changed
        (events on the claim and the PV). Reporting only: it never acts on a volume."""
        assessment = assess(world.config, world.scans, world.pvs, self.journal.snapshot(), self.health.baselines,
                            world.boot)
        for obj, type_, reason, message in self.health.update(assessment):
            self.recorder.event(obj, type_, reason, message)

    def _idle_pass(self, why: str) -> Plan:
        """A pass that only says why it did nothing: not ready, but alive (waiting is its job)."""
        result = Plan(class_errors={"node": why})
        self.last_plan = result
        self.ready = False
        self.passes += 1
        self.last_pass_at = self.clock.monotonic()
        self._failed_passes = 0
        return result

    def execute(self, result: Plan, config: ProvisionerConfig) -> None:
        assert self.executor is not None, "start() first"
        self.executor.execute(result, config)

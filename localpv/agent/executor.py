"""Carrying out a reconcile plan: the API calls, cleanups and journal updates it asks for.

The planner (:mod:`localpv.agent.planner`) decides; this module acts, and turns what
the world answers back into journal records, events and metrics: a create that finds the
name taken (cache lag, an unlabelled PV of ours, or a hash collision), a PV that vanished
before its volume was cleaned, a delete racing someone else's. It also holds the few
node-wide operations that need the same identity (adopting upstream PVs, removing the
startup taint). The node agent (:mod:`localpv.agent.node`) owns one executor.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import replace

from localpv.agent.cleaning import block_cleaner, filesystem_cleaner
from localpv.agent.jobs import JobCleaner
from localpv.agent.journal import CLEANING, OFFERED, Journal
from localpv.agent.metrics import AgentMetrics
from localpv.agent.model import (
    FAILED,
    CleanupStatus,
    ConfirmOrphan,
    CreatePV,
    DeletePV,
    EventSpec,
    Plan,
    RestoreClaim,
    RetractPV,
    Skipped,
    StartCleanup,
)
from localpv.agent.proctable import ProcTable
from localpv.agent.pvbuilder import NodeInfo
from localpv.clock import Clock
from localpv.config import ProvisionerConfig
from localpv.host.cleaner import ProcessRecords
from localpv.host.mounts import FilesystemTypes
from localpv.host.scan import HUNG_STORAGE, Entry, look_again, same_volume
from localpv.kube.api import KubeApi
from localpv.kube.errors import AlreadyExists, ApiError, Conflict, Gone, NotFound
from localpv.kube.events import WARNING, EventRecorder
from localpv.kube.objects import Obj, pv_host_path
from localpv.kube.resources import NODES, PERSISTENT_VOLUMES
from localpv.naming import (
    HOSTNAME_LABEL_KEY,
    NODE_LABEL_KEY,
    PROVISIONED_BY_ANNOTATION,
    capacity_bucket,
    cleanup_job_name,
    node_label_value,
    parse_quantity,
)

log = logging.getLogger(__name__)

#: How long a PV this executor deleted is not deleted again, in seconds: long enough for the
#: PV informer to see the deletion. A PV still shown Released after that (e.g. brought back
#: by an etcd restore, with its old uid) is deleted again.
_REDELETE_AFTER = 30.0
#: How long a PV this executor created counts as existing while the PV informer does not show
#: it, in seconds (see :meth:`Executor.with_own_creates`).
OWN_CREATES_VISIBLE_FOR = 60.0


class Executor:
    """Acts on plans for one node."""

    def __init__(
        self,
        api: KubeApi,
        *,
        node: NodeInfo,
        provisioner: str,
        journal: Journal,
        procs: ProcTable,
        jobs: JobCleaner | None,
        recorder: EventRecorder,
        metrics: AgentMetrics,
        clock: Clock,
        records: ProcessRecords,
        namespace: str,
        state_dir: str | None,
        config: Callable[[], ProvisionerConfig],
        trigger: Callable[[str], None],
        require_mount_point: bool = True,
    ) -> None:
        self.api = api
        self.node = node
        self.provisioner = provisioner
        self.journal = journal
        self.procs = procs
        self.jobs = jobs
        self.recorder = recorder
        self.metrics = metrics
        self.clock = clock
        self.cleaner_records = records
        self.namespace = namespace
        self.state_dir = state_dir
        self.config = config
        self.trigger = trigger
        self.require_mount_point = require_mount_point
        #: PV names that belong to another volume (hash collisions), with a description.
        self.collisions: dict[str, str] = {}
        #: Volume mode of each in-process cleanup started, for its metrics when it ends.
        self._cleanup_modes: dict[str, str] = {}
        #: (entry path, class) -> (skip reason, when last logged): see _log_conditions.
        self._conditions: dict[tuple[str, str], tuple[str, float]] = {}
        self._first_seen: dict[str, float] = {}
        #: uid -> when this executor deleted that PV after its clean: the PV informer may
        #: still show it Released for a moment after the DELETE (the watch event has not
        #: arrived), and the next pass must not DELETE it again.
        self._deleted_uids: dict[str, float] = {}
        #: name -> (the PV as this executor created it, when): see :meth:`with_own_creates`.
        self._created: dict[str, tuple[Obj, float]] = {}
        #: name -> uids the PV informer showed under that name while its create was in flight
        #: (the watch event can come before the create's answer).
        self._in_flight: dict[str, set[str]] = {}
        #: Events marked ``once`` that the last pass planned: not emitted again while they last.
        self._standing: set[tuple[str, str, str, str]] = set()

    def _node_obj(self) -> Obj:
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node.name, "uid": self.node.uid}}

    def with_own_creates(self, cached: list[Obj]) -> list[Obj]:
        """The cache's PVs, plus those this executor created that the cache does not show yet.

        The cache follows a watch, which can lag behind the agent's own writes (a dropped
        watch, a relist under API trouble). A pass that takes such a PV for "no PV" decides
        about its path as if nothing were on offer there: a record follows its disk away and
        the PV stays on offer over whatever disk takes the path. So a created PV counts from
        its create until the cache shows that object (same uid), it is deleted here, or
        :data:`OWN_CREATES_VISIBLE_FOR` passed (the cache is the truth again; the orphan check's
        GET settles a record whose PV it never showed). Until then it stands for an older
        object of the same name the cache still shows (that one was deleted: the create
        succeeded). The informer tells :meth:`seen_by_cache` of every object it shows, so a
        create the cache showed and then lost to a deletion between two passes is not counted
        again here.
        """
        now = self.clock.monotonic()
        by_name = {str((pv.get("metadata") or {}).get("name")): pv for pv in cached}
        merged = dict(by_name)
        for name, (pv, when) in list(self._created.items()):
            seen = by_name.get(name)
            if now - when > OWN_CREATES_VISIBLE_FOR or (
                    seen is not None and (seen.get("metadata") or {}).get("uid") == pv["metadata"].get("uid")):
                self._created.pop(name, None)  # (a metrics scrape asks from another thread too)
                continue
            merged[name] = pv
        return list(merged.values())

    def seen_by_cache(self, pv: Obj | None) -> None:
        """The PV informer showed ``pv`` (added, changed or deleted): if it is one this
        executor created, the cache knows it from now on and speaks for it - including its
        deletion, which a pass that came later must not undo by counting the create again."""
        meta = (pv or {}).get("metadata") or {}
        name = str(meta.get("name"))
        shown = self._in_flight.get(name)
        if shown is not None:
            shown.add(str(meta.get("uid") or ""))
        created = self._created.get(name)
        if created is not None and created[0]["metadata"].get("uid") == meta.get("uid"):
            self._created.pop(name, None)

    def execute(self, result: Plan, config: ProvisionerConfig) -> None:
        for name in result.forget_cleanups:
            self._forget(name)
        for orphan in result.orphans:
            self.confirm_orphan(orphan)
        for retract in result.retracts:
            self.retract(retract)
        for restore in result.restores:
            self.restore_claim(restore)
        for cleanup in result.cleanups:
            self.start_cleanup(cleanup, config)
        for delete in result.deletes:
            self.delete(delete)
        fs_types = FilesystemTypes()  # one read of the mount table for the creates of this pass
        made: dict[str, tuple[str, str]] = {}
        for create in result.creates:
            self.create(create, fs_types, made)
        self._remember_uids(made)
        self._emit(result.events)
        self._log_conditions(result)

    def _emit(self, events: list[EventSpec]) -> None:
        """Emit the plan's events; one marked ``once`` only when it was not in the last pass."""
        standing = set()
        for event in events:
            if event.once:
                meta = event.obj.get("metadata") or {}
                key = (str(meta.get("uid") or meta.get("name")), event.type, event.reason, event.message)
                standing.add(key)
                if key in self._standing:
                    continue
            self.recorder.event(event.obj, event.type, event.reason, event.message)
        self._standing = standing

    #: A condition that persists is logged again this often (a reminder, not every pass).
    REMINDER_INTERVAL = 600.0

    def _log_conditions(self, result: Plan) -> None:
        """Log why entries are skipped when that starts, changes and ends - with a periodic
        reminder - instead of on every pass (a stray directory made ~70 lines a minute)."""
        now = self.clock.monotonic()
        current = {(s.path, s.cls): s for s in result.skipped}
        for cls, error in result.class_errors.items():
            where = f"discovery directory of class {cls}"
            current[(where, cls)] = Skipped(where, cls, error, True)
        for key, skip in current.items():
            seen = self._conditions.get(key)
            if HUNG_STORAGE in skip.reason and (seen is None or seen[0] != skip.reason):
                self.recorder.event(self._node_obj(), WARNING, "StorageHung",
                                    f"{skip.path} (class {skip.cls}): {skip.reason}")
            if seen is None or seen[0] != skip.reason or now - seen[1] >= self.REMINDER_INTERVAL:
                again = seen is not None and seen[0] == skip.reason
                log.log(logging.WARNING if skip.error else logging.INFO, "%s %s (class %s): %s",
                        "still skipping" if again else "skipping", skip.path, skip.cls, skip.reason)
                self._conditions[key] = (skip.reason, now)
        for key in [k for k in self._conditions if k not in current]:
            log.info("no longer skipping %s (class %s)", *key)
            del self._conditions[key]

    def confirm_orphan(self, orphan: ConfirmOrphan) -> None:
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

    def retract(self, retract: RetractPV) -> None:
        """Delete a PV on offer for a volume that is not known clean, unless it changed since
        the plan saw it (bound meanwhile: the next pass tracks it as used instead)."""
        meta = retract.pv.get("metadata") or {}
        name = str(meta.get("name"))
        try:
            self.api.delete(PERSISTENT_VOLUMES, name, uid=str(meta.get("uid") or "") or None,
                            resource_version=str(meta.get("resourceVersion") or "") or None)
        except NotFound:
            self._created.pop(name, None)
            return
        except Conflict:
            return
        except ApiError as err:
            log.warning("cannot delete PV %s offered for a volume not known clean: %s", name, err)
            return
        self._created.pop(name, None)
        log.warning("deleted PV %s: %s", name, retract.reason)
        self.recorder.event(retract.pv, WARNING, "VolumeRetracted", retract.reason)

    def restore_claim(self, restore: RestoreClaim) -> None:
        """Put back the claimRef of a PV unclaimed by hand while its volume holds that claim's
        data. The uid and resourceVersion in the patch are preconditions: a PV that changed
        since the plan saw it (bound by another claim, already given back) is not touched,
        and the next pass decides again."""
        meta = restore.pv.get("metadata") or {}
        name = str(meta.get("name"))
        guard = {k: str(meta[k]) for k in ("uid", "resourceVersion") if meta.get(k)}
        try:
            updated = self.api.patch(PERSISTENT_VOLUMES, name,
                                     {"metadata": guard, "spec": {"claimRef": restore.claim_ref}})
        except (NotFound, Conflict):
            return
        except ApiError as err:
            log.warning("cannot put back the claimRef of PV %s: %s", name, err)
            return
        log.warning("PV %s: %s", name, restore.reason)
        self.recorder.event(updated, WARNING, "VolumeClaimRestored", restore.reason)

    def _forget(self, name: str) -> None:
        self.procs.forget(name)
        if self.jobs is not None and self.jobs.informer.get(cleanup_job_name(name), self.namespace):
            self.jobs.remove(name)

    def start_cleanup(self, cleanup: StartCleanup, config: ProvisionerConfig) -> None:
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
                               records=self.cleaner_records, key=cleanup.pv_name,
                               expect_identity=cleanup.identity, expect_numbers=cleanup.numbers)
        else:
            fn = filesystem_cleaner(cleanup.container_path, cleanup.cls.mount_dir, timeout=config.cleanup_timeout,
                                    require_mount_point=self.require_mount_point,
                                    records=self.cleaner_records, key=cleanup.pv_name,
                                    expect_identity=cleanup.identity, expect_numbers=cleanup.numbers)
        self._cleanup_modes[cleanup.pv_name] = mode
        if self.procs.start(cleanup.pv_name, fn, pv_uid=uid):
            log.info("cleaning %s (%s, %s)", cleanup.host_path, "block" if cleanup.block else "filesystem",
                     cleanup.reason)
            if cleanup.retry:
                self.metrics.cleanup_retries.labels(mode, "process").inc()

    def cleanup_finished(self, name: str, status: CleanupStatus | None) -> None:
        """Count a failed in-process cleanup, as upstream counts each failed delete."""
        if status is not None and status.state == FAILED:
            self.metrics.delete_failed.labels(self._cleanup_modes.get(name, "Filesystem"), "process").inc()

    def delete(self, delete: DeletePV) -> None:
        meta = delete.pv.get("metadata") or {}
        name, uid = str(meta.get("name")), str(meta.get("uid") or "") or None
        now = self.clock.now()
        self._deleted_uids = {u: t for u, t in self._deleted_uids.items() if now - t < _REDELETE_AFTER}
        if uid is not None and uid in self._deleted_uids:
            return  # deleted by us a moment ago: the cache has not caught up yet
        mode = "Block" if delete.block else "Filesystem"
        kind = "job" if self.jobs is not None and self.jobs.informer.get(
            cleanup_job_name(name), self.namespace) else "process"
        if kind == "job":
            self._forget(name)  # upstream order: the Job first, then the PV
        try:
            # The resourceVersion too: delete the PV as the plan saw it (Released, cleaned). One
            # whose claimRef was cleared since and that another claim bound meanwhile holds that
            # tenant's data now, and must not vanish while the journal says clean.
            self.api.delete(PERSISTENT_VOLUMES, name, uid=uid,
                            resource_version=str(meta.get("resourceVersion") or "") or None)
        except NotFound:
            self._created.pop(name, None)  # already gone: nothing of ours to delete
        except Conflict:
            log.info("PV %s changed since it was planned for deletion (or is another object now); "
                     "the next pass decides again", name)
            return
        except ApiError as err:
            self.metrics.delete_failed.labels(mode, kind).inc()
            self.recorder.event(delete.pv, WARNING, "VolumeFailedDelete", f"Error deleting PV: {err}")
            return
        if uid is not None:
            self._deleted_uids[uid] = now
        self._created.pop(name, None)
        self.procs.forget(name)
        cls = self.config().classes.get(str((delete.pv.get("spec") or {}).get("storageClassName")))
        command = cls.block_cleaner_command[0] if cls else ""
        capacity = self._pv_capacity(delete.pv)
        self.metrics.delete.labels(mode, kind).inc()
        self.metrics.delete_duration.labels(mode, kind, capacity_bucket(capacity), command).observe(
            max(0.0, self.clock.now() - delete.cleanup.started))
        log.info("deleted PV %s after cleaning %s", name, delete.host_path)

    @staticmethod
    def _pv_capacity(pv: Obj) -> int:
        try:
            return parse_quantity(str(((pv.get("spec") or {}).get("capacity") or {}).get("storage")))
        except ValueError:
            return 0

    def create(self, create: CreatePV, fs_types: FilesystemTypes | None = None,
               made: dict[str, tuple[str, str]] | None = None) -> None:
        """Create the PV; its uid goes into ``made`` (host path -> name, uid) for the journal,
        written once for all the creates of a pass (see :meth:`_remember_uids`), or at once
        without ``made``."""
        name = create.pv["metadata"]["name"]
        first = self._first_seen.setdefault(create.host_path, self.clock.monotonic())
        if create.entry is not None and not self._still_there(name, create, create.entry, fs_types):
            return
        self._in_flight[name] = set()
        try:
            created = self.api.create(PERSISTENT_VOLUMES, create.pv)
        except AlreadyExists:
            self._on_name_taken(create)
            return
        except ApiError as err:
            log.warning("creating PV %s for %s failed: %s", name, create.host_path, err)
            self._forget_failed_create(create)
            return
        finally:
            shown = self._in_flight.pop(name, set())
        self._first_seen.pop(create.host_path, None)
        uid = str((created.get("metadata") or {}).get("uid") or "")
        if uid not in shown:  # else the cache had it before the answer came: it speaks for it
            self._created[name] = (created, self.clock.monotonic())
        if made is None:
            self._remember_uids({create.host_path: (name, uid)})
        else:
            made[create.host_path] = (name, uid)
        self.metrics.discovery.labels(create.mode).inc()
        self.metrics.discovery_duration.labels(create.mode).observe(self.clock.monotonic() - first)
        log.info("created PV %s for %s (%s, %d bytes)", name, create.host_path, create.mode, create.capacity)

    def _still_there(self, name: str, create: CreatePV, planned: Entry, fs_types: FilesystemTypes | None) -> bool:
        """The path still shows the volume the PV was planned for (:func:`look_again`).

        If not (a disk swapped or unmounted since the pass looked), the PV is not created and
        the record the plan wrote for it is dropped, so the next pass - started at once -
        decides from what is there now. Otherwise a PV named and sized for one disk would be
        offered over another, which may hold a previous tenant's data.
        """
        now = look_again(planned, fs_types=fs_types)
        if same_volume(planned, now):
            return True
        shows = now.identity.value or now.reason or now.kind.value
        log.warning("not creating PV %s: %s changed since this pass looked at it (it was %s, it shows %s); the "
                    "next pass decides again", name, create.host_path, planned.identity.value or planned.ident, shows)
        record = self.journal.get(create.host_path)
        if record is not None and record.state == OFFERED and record.pv == name and not record.pv_uid:
            self.journal.apply({create.host_path: None})
        self.trigger("mount")
        return False

    def _remember_uids(self, made: Mapping[str, tuple[str, str]]) -> None:
        """Record which PV object each volume is offered as (a PV of that name with another
        uid later is someone else's re-creation, not ours), in one journal write: a write per
        create rewrote the whole journal each time, quadratic in a first start's volumes. A
        crash before the write leaves records without a uid, as a crash right after a create
        always could; such a record takes the uid of the PV of its name when it sees it."""
        changes = {}
        for host_path, (name, uid) in made.items():
            entry = self.journal.get(host_path)
            if uid and entry is not None and entry.pv == name and not entry.pv_uid:
                changes[host_path] = replace(entry, pv_uid=uid)
        self.journal.apply(changes)

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
            self._first_seen.pop(create.host_path, None)  # its PV exists: the wait is over
            self._ensure_label(other)
            return
        where = f"{pv_host_path(other) or 'not a local volume'}"
        labels = (other.get("metadata") or {}).get("labels") or {}
        theirs = labels.get(NODE_LABEL_KEY)
        hostname = labels.get(HOSTNAME_LABEL_KEY)
        if (self._same_node(other) or theirs == node_label_value(self.node.name)
                or (theirs is None and hostname is not None and hostname == self.node.hostname)):
            node = "this node"
        elif theirs or hostname:
            node = f"node {theirs or hostname}"
        else:
            node = "a node it does not name"
        description = f"{where} on {node}"
        self.journal.apply({create.host_path: None})
        if self.collisions.get(name) != description:
            self.collisions[name] = description
            self.recorder.event(self._node_obj(), WARNING, "PVNameCollision",
                                f"PV name {name} for {create.host_path} is already used by PV {name} "
                                f"({description}); volume skipped")

    def _same_node(self, pv: Obj) -> bool:
        annotations = (pv.get("metadata") or {}).get("annotations") or {}
        owner = str(annotations.get(PROVISIONED_BY_ANNOTATION) or "")
        return owner == self.provisioner or owner.startswith(f"local-volume-provisioner-{self.node.name}-") or \
            owner == f"local-volume-provisioner-{self.node.name}"

    def _ensure_label(self, pv: Obj, *, required: bool = False) -> None:
        """Put our node label on a PV of this node; ``required``: a failure (other than the PV
        being gone) raises instead of waiting for the next chance to come round."""
        value = node_label_value(self.node.name)
        labels = (pv.get("metadata") or {}).get("labels") or {}
        if labels.get(NODE_LABEL_KEY) == value:
            return
        name = str(pv["metadata"]["name"])
        try:
            self.api.patch(PERSISTENT_VOLUMES, name, {"metadata": {"labels": {NODE_LABEL_KEY: value}}})
            log.info("adopted PV %s (added label %s=%s)", name, NODE_LABEL_KEY, value)
        except NotFound:
            log.info("PV %s was deleted before it could be adopted", name)
        except ApiError as err:
            if required:
                raise
            log.warning("cannot label PV %s: %s", name, err)

    def remove_startup_taint(self, key: str) -> bool:
        """Drop the node's "agent not ready" taint once discovery is ready (upstream #501,
        whose loop condition never lets it run). True when the taint is gone."""
        if not key:
            return True

        def without_taint(node: Obj) -> Obj | None:
            taints = (node.get("spec") or {}).get("taints") or []
            kept = [t for t in taints if t.get("key") != key]
            if len(kept) == len(taints):
                return None
            node["spec"]["taints"] = kept
            return node

        try:  # a Node changed under us is read again by the API layer
            if self.api.update(NODES, self.node.name, without_taint) is not None:
                log.info("removed taint %s from node %s", key, self.node.name)
        except ApiError as err:
            log.warning("cannot remove taint %s: %s", key, err)
            return False
        return True

    # ------------------------------------------------------------------ node-wide operations

    #: Scans started over after their continue token expired (410) before giving up.
    ADOPTION_SCAN_ATTEMPTS = 3

    def adopt_upstream_pvs(self) -> int:
        """Label this node's PVs made by upstream (or by us before a label existed), once.

        Scans the PVs that carry no node label of ours at all (``!key``), page by page:
        upstream's, and any made before the label existed. Every PV a localpv agent makes
        is labelled from birth, and one labelled for another node is that node's agent's
        (a PV names its node by the label only if an agent put it there), so on a cluster
        of localpv nodes the scan is one short page instead of every PV of every node, and
        the first start does not wait for its pages behind the rate limit. A marker in the
        state dir makes later restarts skip it (after the first start no upstream agent
        creates PVs for this node any more). Everything else goes through the
        label-filtered cache.

        The scan must be whole before the first pass: a PV it missed is invisible to the
        label-filtered cache, so its volume - perhaps bound to a tenant - would look free,
        and on a first start (no journal) a free volume is cleaned. A scan whose continue
        token expired (410, etcd compacted between two pages) starts over; any other
        failure raises :class:`ApiError` and the agent does not start.
        """
        marker = (os.path.join(self.state_dir, f"adopted-{self.provisioner}")
                  if self.state_dir else None)
        if marker is not None and os.path.exists(marker):
            return 0
        value = node_label_value(self.node.name)
        for attempt in range(1, self.ADOPTION_SCAN_ATTEMPTS + 1):
            adopted = 0
            try:
                for page, _ in self.api.list_pages(PERSISTENT_VOLUMES, label_selector=f"!{NODE_LABEL_KEY}"):
                    for pv in page:
                        labels = (pv.get("metadata") or {}).get("labels") or {}
                        if labels.get(NODE_LABEL_KEY) != value and (pv.get("spec") or {}).get("local") \
                                and self._same_node(pv):
                            self._ensure_label(pv, required=True)
                            adopted += 1
                break
            except Gone as err:
                if attempt == self.ADOPTION_SCAN_ATTEMPTS:
                    raise
                log.warning("scan for upstream PVs to adopt: %s; starting it over", err)
        if marker is not None:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w", encoding="utf-8") as f:
                f.write(f"{adopted}\n")
        return adopted
        if marker is not None:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w", encoding="utf-8") as f:
                f.write(f"{adopted}\n")
        return adopted

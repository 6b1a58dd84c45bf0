"""The controllers of kube-controller-manager the emulator runs itself: the garbage
collector (with the namespace controller) and a stand-in for the Job controller. The PV
binder lives in :mod:`localpv_emulator.binder` and sees the store through :class:`ClusterView`."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

from localpv_emulator.apiserver.errors import ApiError
from localpv_emulator.apiserver.resources import NAMESPACES, RESOURCES, Obj, ResourceType, now_rfc3339, resource_for
from localpv_emulator.apiserver.store import DeleteOptions, Store
from localpv_emulator.binder import Reconciler


class ClusterView:
    """The :class:`~localpv_emulator.binder.Cluster` protocol over a :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.changed = store.changed

    @property
    def resource_version(self) -> int:
        return self.store.rv

    def changed_since(self, kinds: Iterable[tuple[str, str]], rv: int) -> bool:
        return self.store.changed_since([resource_for(*k) for k in kinds], rv)

    def changes_since(self, rv: int) -> list[tuple[str, str, str, str]] | None:
        changes = self.store.history_after(rv)
        if changes is None:
            return None
        return [(c.rt.api_version, c.rt.kind, c.obj["metadata"].get("namespace", ""), c.obj["metadata"]["name"])
                for c in changes]

    def view(self, api_version: str, kind: str) -> list[Obj]:
        return self.store.items(resource_for(api_version, kind))

    def peek(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        return self.store.peek(resource_for(api_version, kind), namespace, name)

    def update(self, obj: Obj, subresource: str | None = None) -> Obj:
        rt = resource_for(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        return self.store.update(rt, meta.get("namespace"), meta["name"], obj, subresource)


def _identity(obj: Obj) -> tuple[ResourceType, str | None, str]:
    meta = obj["metadata"]
    return resource_for(obj["apiVersion"], obj["kind"]), meta.get("namespace"), meta["name"]


class GarbageCollector(Reconciler):
    """kube-controller-manager's garbage collector and namespace controller, in one pass.

    Dependents whose owners are all gone are deleted in the background; dangling references
    next to a live owner are removed; ``foregroundDeletion`` waits for the dependents to go,
    ``orphan`` strips the references; a terminating namespace is emptied, then finalized.
    """

    name = "garbage-collector"

    def __init__(self, store: Store) -> None:
        super().__init__(ClusterView(store))
        self.store = store

    def reconcile(self) -> None:
        for owner_uid, dependents in self.store.owners_and_dependents():
            if self.store.by_uid(owner_uid) is None:
                for dependent in dependents:
                    self._drop_dangling(dependent)
        for rt, obj in self.store.deleting():
            self._finish(rt, obj)

    def _delete(self, obj: Obj) -> None:
        if not obj["metadata"].get("deletionTimestamp"):
            rt, namespace, name = _identity(obj)
            self.store.delete(rt, namespace, name, DeleteOptions(propagation="Background"))

    def _drop_dangling(self, obj: Obj) -> None:
        refs = obj["metadata"].get("ownerReferences") or []
        alive = [ref for ref in refs if self.store.by_uid(ref.get("uid", "")) is not None]
        if not alive:
            self._delete(obj)
        elif len(alive) != len(refs):
            self._set_owner_refs(obj, alive)

    def _set_owner_refs(self, obj: Obj, refs: list[Obj]) -> None:
        new = copy.deepcopy(obj)
        new["metadata"]["ownerReferences"] = refs
        rt, namespace, name = _identity(obj)
        self.store.update(rt, namespace, name, new)

    def _dependents(self, uid: str) -> list[Obj]:
        return next((deps for owner, deps in self.store.owners_and_dependents() if owner == uid), [])

    def _finish(self, rt: ResourceType, obj: Obj) -> None:
        finalizers = obj["metadata"].get("finalizers") or []
        uid = obj["metadata"]["uid"]
        if "foregroundDeletion" in finalizers:
            dependents = self._dependents(uid)
            for dependent in dependents:
                self._delete(dependent)
            if not dependents:
                self._remove_finalizer(rt, obj, "foregroundDeletion")
        elif "orphan" in finalizers:
            for dependent in self._dependents(uid):
                refs = [r for r in dependent["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                self._set_owner_refs(dependent, refs)
            self._remove_finalizer(rt, obj, "orphan")
        if rt is NAMESPACES:
            self._empty_namespace(obj["metadata"]["name"])

    def _remove_finalizer(self, rt: ResourceType, obj: Obj, finalizer: str) -> None:
        fresh = self.store.peek(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if fresh is None:
            return
        new = copy.deepcopy(fresh)
        new["metadata"]["finalizers"] = [f for f in new["metadata"].get("finalizers") or [] if f != finalizer]
        self.store.update(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"], new)

    def _empty_namespace(self, namespace: str) -> None:
        content = [obj for rt in RESOURCES if rt.namespaced for obj in self.store.items(rt, namespace)]
        for obj in content:
            self._delete(obj)
        if not content:
            self.store.finalize_namespace(namespace)


JOBS = resource_for("batch/v1", "Job")


def _job_finished(job: Obj) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def finish_job(store: Store, namespace: str, name: str, succeeded: bool) -> Obj:
    """Write the status the Job controller writes when a Job completes or fails."""
    with store.lock:
        job = store.peek(JOBS, namespace, name)
        if job is None:
            raise ApiError.not_found(JOBS, name)
        now = now_rfc3339()
        spec, status = job.get("spec") or {}, copy.deepcopy(job.get("status") or {})
        status.setdefault("startTime", now)
        status.update(active=0, ready=0, terminating=0, uncountedTerminatedPods={})
        kept = [c for c in status.get("conditions") or []
                if c.get("type") not in ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")]
        if succeeded:
            status.update(succeeded=int(spec.get("completions") or 1), completionTime=now)
            reason, message, types = "CompletionsReached", "Reached expected number of succeeded pods", (
                "SuccessCriteriaMet", "Complete")
        else:
            status.update(failed=int(spec.get("backoffLimit") or 0) + 1)
            status.pop("completionTime", None)
            reason, message, types = "BackoffLimitExceeded", "Job has reached the specified backoff limit", (
                "FailureTarget", "Failed")
        status["conditions"] = kept + [
            {"type": t, "status": "True", "lastProbeTime": now, "lastTransitionTime": now,
             "reason": reason, "message": message}
            for t in types
        ]
        return store.update(JOBS, namespace, name, {**job, "status": status}, subresource="status")


class JobCompleter(Reconciler):
    """Stands in for the Job controller and its pods: decides each new Job's outcome.

    ``outcome(job)`` returns True (succeed), False (fail) or None (leave it running).
    """

    name = "job-completer"
    kinds = (("batch/v1", "Job"),)

    def __init__(self, store: Store, outcome: Callable[[Obj], bool | None]) -> None:
        super().__init__(ClusterView(store))
        self.store = store
        self.outcome = outcome

    def reconcile(self) -> None:
        for job in self.store.items(JOBS):
            if _job_finished(job) or job["metadata"].get("deletionTimestamp"):
                continue
            result = self.outcome(job)
            if result is not None:
                finish_job(self.store, job["metadata"]["namespace"], job["metadata"]["name"], result)

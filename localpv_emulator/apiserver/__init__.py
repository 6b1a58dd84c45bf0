"""A strict, in-process emulator of kube-apiserver for tests and ``localpv demo``.

Kubernetes cannot run where this project is built and tested, so the product's tests talk
to this server instead, over real HTTP, with the real ``kubernetes`` client and ``kubectl``.
A lenient fake would let bugs through that a cluster catches at once, so this one copies
the server's contract where clients can observe it: one global resourceVersion, 409/410/422
semantics and their ``metav1.Status`` bodies, list/watch with selectors, paging and resume,
the status subresource, finalizers, preconditions, owner-reference garbage collection,
unknown fields dropped on every write (see :mod:`.pruning`), and a PV binder standing in for
kube-controller-manager (see :mod:`localpv_emulator.binder`).

For kubectl it also serves server-side tables (the columns of ``kubectl get``) and minimal
OpenAPI documents: v3 for kubectl >= 1.29 and a protobuf v2 for older ones, carrying only
what kubectl reads to let the server validate fields, which ``kubectl apply`` requires.

Known simplifications (each documented where it is implemented):

* storage is in memory; a list page past the first is served from a snapshot rebuilt from
  the watch history (as etcd would serve it) and expires with that history, which keeps at
  least ``history_limit`` of the most recent changes;
* every kind gets ``metadata.generation`` (the real server sets it only for some);
* server-side apply creates the object or strategically merges the applied configuration
  into it; there is no field ownership, no removal of fields dropped from the configuration
  and no apply conflicts;
* strategic merge knows the merge keys of the fields this project touches (containers,
  volumes, env, ports, conditions, finalizers, ownerReferences, ...); other lists replace;
* pods are deleted at once (no kubelet to confirm graceful termination), deletecollection
  deletes one by one, the two Event APIs are separate stores;
* there is no authentication; authorization answers "allowed" unless a denial was added
  with :meth:`ApiServer.deny`;
* CSIStorageCapacity is served at the versions its switch names (``capacity_versions``,
  ``--capacity-versions`` or ``LOCALPV_EMULATOR_CAPACITY_VERSIONS``: any of v1, v1beta1,
  v1alpha1; v1 by default), discovery answering accordingly; each version is its own store,
  where the real server serves one object at every version;
* ``fieldValidation`` is accepted and ignored: unknown fields are always dropped silently
  (``Ignore``, the only behaviour of a 1.20 server), never refused (``Strict``, what kubectl
  asks for) nor warned about.

The package has one module per concern: :mod:`.resources` (the table of served kinds),
:mod:`.errors`, :mod:`.validation`, :mod:`.strategies` / :mod:`.workloads` /
:mod:`.registry` (per-kind defaults and validation), :mod:`.pruning`, :mod:`.patch`, :mod:`.store`
(objects, resourceVersions, history), :mod:`.controllers` (garbage collector, Job
completer), :mod:`.routing`, :mod:`.selection`, :mod:`.tables`, :mod:`.watch`,
:mod:`.faults`, :mod:`.requestlog`, :mod:`.discovery`, :mod:`.dispatcher`,
:mod:`.httpserver`, :mod:`.server` (the :class:`ApiServer` facade) and :mod:`.standalone`.
Everything callers use is imported from the package itself.

Usage: ``ApiServer().start()`` in tests, or
``python -m localpv_emulator.apiserver --port N --kubeconfig-out FILE [--binder] [--job-completer]
[--honor-pv-reclaim-policy true|false]``.
"""

from __future__ import annotations

from localpv_emulator.apiserver.controllers import ClusterView, GarbageCollector, JobCompleter, finish_job
from localpv_emulator.apiserver.dispatcher import Dispatcher
from localpv_emulator.apiserver.errors import ApiError
from localpv_emulator.apiserver.faults import FAULT_VERBS, WRITE_VERBS, Faults, LostResponse
from localpv_emulator.apiserver.patch import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    PATCH_TYPES,
    STRATEGIC_PATCH,
    decode_apply_body,
    json_patch,
    merge_patch,
    strategic_merge,
)
from localpv_emulator.apiserver.registry import STRATEGIES, strategy_for
from localpv_emulator.apiserver.requestlog import RequestInfo, RequestLog, RequestRecord
from localpv_emulator.apiserver.resources import (
    ALL_VERBS,
    KUBE_VERSION,
    NAMESPACES,
    RESOURCES,
    STATUS_VERBS,
    Obj,
    ResourceType,
    now_rfc3339,
    resource_for,
)
from localpv_emulator.apiserver.routing import HttpRequest, HttpResponse, Route, parse_route
from localpv_emulator.apiserver.selection import Selection, field_value, selectable_fields
from localpv_emulator.apiserver.server import ApiServer
from localpv_emulator.apiserver.standalone import main
from localpv_emulator.apiserver.store import Change, DeleteOptions, Store, encode_event
from localpv_emulator.apiserver.strategies import Strategy
from localpv_emulator.apiserver.tables import PRINTERS, human_duration, to_table
from localpv_emulator.apiserver.validation import FieldErrors, name_problems, validate_metadata
from localpv_emulator.apiserver.watch import WatchStream

__all__ = [
    "ALL_VERBS",
    "APPLY_PATCH",
    "FAULT_VERBS",
    "JSON_PATCH",
    "KUBE_VERSION",
    "MERGE_PATCH",
    "NAMESPACES",
    "PATCH_TYPES",
    "PRINTERS",
    "RESOURCES",
    "STATUS_VERBS",
    "STRATEGIC_PATCH",
    "STRATEGIES",
    "WRITE_VERBS",
    "ApiError",
    "ApiServer",
    "Change",
    "ClusterView",
    "DeleteOptions",
    "Dispatcher",
    "Faults",
    "FieldErrors",
    "GarbageCollector",
    "HttpRequest",
    "HttpResponse",
    "JobCompleter",
    "LostResponse",
    "Obj",
    "RequestInfo",
    "RequestLog",
    "RequestRecord",
    "ResourceType",
    "Route",
    "Selection",
    "Store",
    "Strategy",
    "WatchStream",
    "decode_apply_body",
    "encode_event",
    "field_value",
    "finish_job",
    "human_duration",
    "json_patch",
    "main",
    "merge_patch",
    "name_problems",
    "now_rfc3339",
    "parse_route",
    "resource_for",
    "selectable_fields",
    "strategic_merge",
    "strategy_for",
    "to_table",
    "validate_metadata",
]

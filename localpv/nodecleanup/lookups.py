"""What node-cleanup reads of the cluster: the informer cache proposes, the API server decides.

A node the cache knows to be live is trusted without asking (believing in a node can only
spare objects); anything that would make a node lost, a claim gone or a pod waiting is read
fresh.
"""

from __future__ import annotations

import contextlib
import logging

from localpv.kube import objects as k8s
from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, NotFound
from localpv.kube.informer import Informer
from localpv.kube.objects import Obj
from localpv.kube.resources import NODES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS
from localpv.naming import HOSTNAME_LABEL_KEY, node_label_value
from localpv.nodecleanup.lostnode import NodeState, node_state_of

log = logging.getLogger(__name__)


class NodeCleanupLookups:
    """Node, PV, claim and pod lookups: the informer cache first, the API server to confirm.

    Lookups raise :class:`ApiError` when the server cannot answer; :meth:`assume_node` and
    :meth:`assume_state` turn that into "exists, live", the conservative answer for passes
    that must not stall.
    """

    def __init__(self, api: KubeApi, nodes: Informer, *, honour_taint: bool = False) -> None:
        self.api = api
        self.nodes = nodes
        self.honour_taint = honour_taint

    def _cached(self, name: str) -> list[Obj]:
        """The cached Nodes answering to ``name``: by name, or by hostname label."""
        return [n for n in self.nodes.list()
                if k8s.name(n) == name or k8s.labels_of(n).get(HOSTNAME_LABEL_KEY) == name]

    def node_in_cache(self, name: str) -> bool:
        if self.nodes.get(name) is not None:
            return True
        return bool(self._cached(name))

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
        return bool(self._labelled(name, page_size=1))

    def _labelled(self, name: str, page_size: int = 500) -> list[Obj]:
        if node_label_value(name) != name:
            return []  # not a valid label value: no Node can carry it as its hostname label
        items, _ = self.api.list(NODES, label_selector=f"{HOSTNAME_LABEL_KEY}={name}", page_size=page_size)
        return items

    def cached_state(self, name: str) -> NodeState:
        """What the cache says (a first look: it only proposes)."""
        return node_state_of(self._cached(name), honour_taint=self.honour_taint)

    def node_state(self, name: str) -> NodeState:
        """Live when the cache knows a live node of that name; else from fresh reads (by name
        and by hostname label), so that a stale cache can never make a node lost."""
        if self.cached_state(name) is NodeState.LIVE:
            return NodeState.LIVE
        found: list[Obj] = []
        with contextlib.suppress(NotFound):
            found.append(self.api.get(NODES, name))
        found += [n for n in self._labelled(name) if k8s.name(n) != name]
        return node_state_of(found, honour_taint=self.honour_taint)

    def assume_node(self, name: str) -> bool:
        try:
            return self.node_exists(name)
        except ApiError as err:
            log.warning("cannot tell whether node %s exists (%s): assuming it does", name, err)
            return True

    def assume_state(self, name: str) -> NodeState:
        try:
            return self.node_state(name)
        except ApiError as err:
            log.warning("cannot tell whether node %s is lost (%s): assuming it is live", name, err)
            return NodeState.LIVE

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

    def pods(self, namespace: str) -> list[Obj]:
        """The pods of a namespace, fresh: pods are read only for volumes of lost nodes, so
        node-cleanup keeps no cache of every pod in the cluster."""
        items, _ = self.api.list(PODS, namespace)
        return items

"""This cluster's id: what every ownership record names, so that clusters can share one export.

Why the ``kube-system`` namespace's uid by default: every cluster has that namespace and it
cannot be deleted; its uid is made with the cluster, so two clusters built from the same
manifests (prod and staging) differ, and it stays the same for the cluster's whole life
(restarts, upgrades, new control-plane nodes). A rebuilt cluster gets a new one: its operator
sets the old id explicitly (``--cluster-id``) to take the cluster's directories back.

It is read once, at start, and a provisioner that cannot read it does not start: a record
written without the cluster, or with a guessed one, would hand the directory to the wrong
cluster later.
"""

from __future__ import annotations

from localpv.kube.api import KubeApi
from localpv.kube.errors import ApiError, NotFound, Retryable
from localpv.kube.resources import NAMESPACES

#: The namespace whose uid is the default cluster id.
CLUSTER_NAMESPACE = "kube-system"


class ClusterIdUnavailable(Exception):
    """The default cluster id cannot be read. ``settable``: setting the id explicitly (or
    granting the read) is the fix; otherwise the API server did not answer, and a restart may do."""

    def __init__(self, message: str, *, settable: bool) -> None:
        super().__init__(message)
        self.settable = settable


def read_cluster_id(api: KubeApi) -> str:
    """The uid of namespace ``kube-system``, or :class:`ClusterIdUnavailable` saying why not."""
    try:
        namespace = api.get(NAMESPACES, CLUSTER_NAMESPACE)
    except NotFound as err:
        raise ClusterIdUnavailable(f"namespace {CLUSTER_NAMESPACE} does not exist ({err})", settable=True) from err
    except Retryable as err:
        raise ClusterIdUnavailable(f"reading namespace {CLUSTER_NAMESPACE}: {err}", settable=False) from err
    except ApiError as err:
        raise ClusterIdUnavailable(f"reading namespace {CLUSTER_NAMESPACE}: {err}", settable=True) from err
    uid = (namespace.get("metadata") or {}).get("uid")
    if not isinstance(uid, str) or not uid:
        raise ClusterIdUnavailable(f"namespace {CLUSTER_NAMESPACE} has no uid", settable=True)
    return uid

"""Which version of a resource the cluster serves, asked through API discovery.

A kind that moved between API versions (CSIStorageCapacity: v1alpha1, v1beta1, v1) is used at
the version the cluster serves, found the way kubectl finds it: the group's versions
(``/apis/<group>``), then each candidate version's resource list. The server's version number
says nothing reliable here: alpha versions are served only where ``--runtime-config`` turned
them on, and a distribution may serve less than its upstream.
"""

from __future__ import annotations

from collections.abc import Sequence

from localpv.kube.api import KubeApi
from localpv.kube.errors import NotFound
from localpv.kube.resources import Resource


def served_resource(api: KubeApi, candidates: Sequence[Resource]) -> Resource | None:
    """The first of ``candidates`` (one kind of one group, most preferred first) the cluster
    serves; None when it serves none. API errors other than NotFound are raised."""
    if not candidates:
        return None
    first = candidates[0]
    try:
        group = api.discover(first.group)
    except NotFound:
        return None
    versions = {str(v.get("version") or "") for v in group.get("versions") or [] if isinstance(v, dict)}
    for res in candidates:
        if res.version not in versions:
            continue
        try:
            listed = api.discover(res.group, res.version)
        except NotFound:
            continue
        names = {str(r.get("name") or "") for r in listed.get("resources") or [] if isinstance(r, dict)}
        if res.plural in names:
            return res
    return None

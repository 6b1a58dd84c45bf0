"""ServiceMonitor (monitoring.coreos.com/v1) is served as if the prometheus-operator CRD
were installed, so a chart that creates one installs; discovery must advertise it, since
Helm maps kinds to resources through discovery before creating anything."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from kubernetes import client

from localpv_emulator.apiserver import ApiServer


def _get(srv: ApiServer, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(srv.url + path, timeout=5) as resp:
        return json.loads(resp.read())


def test_discovery_lists_servicemonitors(srv: ApiServer) -> None:
    groups = {g["name"]: g for g in _get(srv, "/apis")["groups"]}
    assert groups["monitoring.coreos.com"]["preferredVersion"]["groupVersion"] == "monitoring.coreos.com/v1"
    resources = {r["name"]: r for r in _get(srv, "/apis/monitoring.coreos.com/v1")["resources"]}
    assert resources["servicemonitors"]["kind"] == "ServiceMonitor"
    assert resources["servicemonitors"]["namespaced"] is True


def test_servicemonitor_crud_through_the_client(srv: ApiServer, api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    body = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "agent", "labels": {"release": "prom"}},
            "spec": {"endpoints": [{"port": "metrics", "interval": "10s"}],
                     "selector": {"matchLabels": {"app": "agent"}}}}
    created = custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", "default", "servicemonitors", body)
    assert created["metadata"]["uid"]
    listed = custom.list_namespaced_custom_object("monitoring.coreos.com", "v1", "default", "servicemonitors",
                                                  label_selector="release=prom")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["agent"]
    custom.delete_namespaced_custom_object("monitoring.coreos.com", "v1", "default", "servicemonitors", "agent")
    assert srv.get("monitoring.coreos.com/v1", "ServiceMonitor", "agent", "default") is None

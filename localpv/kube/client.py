"""Building an authenticated ``kubernetes`` ApiClient (the only module that loads config).

Order, as upstream: an explicit kubeconfig (flag or ``KUBECONFIG``), else the in-cluster
service account, else ``~/.kube/config``. The ``kubernetes`` package is imported here,
lazily, so commands that never talk to a cluster do not pay for it.
"""

from __future__ import annotations

import os
from typing import Any


class ClientConfigError(Exception):
    """No usable cluster credentials were found."""


def make_api_client(kubeconfig: str | None = None, *, pool_size: int = 16) -> Any:
    """Return a ``kubernetes.client.ApiClient`` for the configured cluster."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                    persist_config=False)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(client_configuration=configuration, persist_config=False)
    except (ConfigException, OSError, TypeError) as err:
        where = kubeconfig or "in-cluster service account or ~/.kube/config"
        raise ClientConfigError(f"cannot load cluster credentials from {where}: {err}") from err
    # Watches, workers and the informer share the pool; the default of 10 would make
    # them queue behind each other.
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)

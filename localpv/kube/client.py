"""Building an authenticated ``kubernetes`` ApiClient (the only module that loads config).

Order, as upstream: an explicit kubeconfig (flag or ``KUBECONFIG``), else the in-cluster
service account, else ``~/.kube/config``. The ``kubernetes`` package is imported here,
lazily, so commands that never talk to a cluster do not pay for it.

An explicit kubeconfig is checked first (:func:`kubeconfig_problem`): the client's own
loader answers a directory, a binary or invalid YAML with whatever exception its input
provokes, and a 2,000-deep value with RecursionError.
"""

from __future__ import annotations

import os
import stat
from typing import Any

#: A kubeconfig larger than this is not one (embedded certificates take a few KiB).
MAX_KUBECONFIG_BYTES = 16 * 1024 * 1024


class ClientConfigError(Exception):
    """No usable cluster credentials were found.

    ``kubeconfig`` is the explicit path when that was the problem, and ``problem`` then
    says what was expected and what was found, for the caller to name its flag.
    """

    def __init__(self, problem: str, *, kubeconfig: str | None = None) -> None:
        super().__init__(f"{kubeconfig}: {problem}" if kubeconfig is not None else problem)
        self.problem = problem
        self.kubeconfig = kubeconfig


def _file_problem(path: str) -> str | None:
    from localpv.config import safe_load_limited

    try:
        st = os.stat(path)
    except OSError as err:
        return f"expected a readable kubeconfig file, found {err.strerror or err}"
    if stat.S_ISDIR(st.st_mode):
        return "expected a kubeconfig file, found a directory"
    if not stat.S_ISREG(st.st_mode):
        return "expected a kubeconfig file, found a special file"
    if st.st_size > MAX_KUBECONFIG_BYTES:
        return f"expected a kubeconfig file (at most {MAX_KUBECONFIG_BYTES} bytes), found {st.st_size} bytes"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KUBECONFIG_BYTES + 1)
    except OSError as err:
        return f"expected a readable kubeconfig file, found it unreadable ({err.strerror or err})"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "expected a kubeconfig (YAML text), found binary data, not text"
    try:
        doc = safe_load_limited(text)
    except Exception as err:  # yaml raises YAMLError and, for some inputs, others
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        return "expected a kubeconfig (YAML), found invalid YAML" + where + ": " + " ".join(str(problem).split())
    if doc is None:
        return "expected a kubeconfig (a YAML mapping), found an empty file"
    if not isinstance(doc, dict):
        return f"expected a kubeconfig (a YAML mapping), found a YAML {type(doc).__name__}"
    return None


def kubeconfig_problem(kubeconfig: str) -> str | None:
    """Why the kubeconfig at ``kubeconfig`` cannot be used ("expected ..., found ..."), or None.

    As kubectl, ``KUBECONFIG`` may list files separated by ``:`` and those that do not
    exist are skipped; one must exist, and every one that does must be a kubeconfig.
    """
    paths = [p for p in kubeconfig.split(os.pathsep) if p]
    if not paths:
        return "expected a kubeconfig file, found an empty path"
    existing = [p for p in paths if os.path.lexists(p)]
    if not existing:
        return "expected a kubeconfig file, found no such file" if len(paths) == 1 else \
            "expected at least one of these kubeconfig files, found no such file"
    for path in existing:
        problem = _file_problem(path)
        if problem is not None:
            return problem if len(paths) == 1 else f"{path}: {problem}"
    return None


def make_api_client(kubeconfig: str | None = None, *, pool_size: int = 16, retries: int | None = None) -> Any:
    """Return a ``kubernetes.client.ApiClient`` for the configured cluster.

    ``retries`` sets urllib3's own retries per request (None: its default of 3); a command
    that must give up within a bound passes 0 and retries, if at all, itself.
    """
    if kubeconfig:
        problem = kubeconfig_problem(kubeconfig)
        if problem is not None:
            raise ClientConfigError(problem, kubeconfig=kubeconfig)
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
        raise _config_error(kubeconfig, err) from err
    except Exception as err:  # the loader raises what its input provokes: KeyError, ValueError, ...
        raise _config_error(kubeconfig, err) from err
    # Watches, workers and the informer share the pool; the default of 10 would make
    # them queue behind each other.
    configuration.connection_pool_maxsize = pool_size
    if retries is not None:
        configuration.retries = retries
    return client.ApiClient(configuration)


def _config_error(kubeconfig: str | None, err: BaseException) -> ClientConfigError:
    reason = " ".join(str(err).split()) or type(err).__name__
    if kubeconfig:
        return ClientConfigError(f"expected a usable kubeconfig, found: {reason}", kubeconfig=kubeconfig)
    return ClientConfigError(f"cannot load cluster credentials from the in-cluster service account or "
                             f"~/.kube/config: {reason}")

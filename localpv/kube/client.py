"""Choosing and building the :class:`~localpv.kube.transport.Transport` a process talks through.

Where the credentials come from, as upstream: an explicit kubeconfig (flag or
``KUBECONFIG``), else the in-cluster service account, else ``~/.kube/config``.

Two paths, one interface. localpv reads the common credentials itself
(:mod:`localpv.kube.credentials`: the service account, a kubeconfig user with a token, a
token file or a client certificate) and connects over its own urllib3 pool, without
importing the ``kubernetes`` package (23 MiB and 0.3 s that a DaemonSet would pay on every
node). What only that package knows (exec plugins, auth-providers, basic auth, proxies) is
handed to it: its loader fills a ``Configuration``, and :class:`LibraryCredentials` and its
urllib3 pool make a transport of the same class. ``LOCALPV_KUBE_TRANSPORT=kubernetes``
takes that path for every kubeconfig: an operator's way back should localpv's own reading
of some cluster's credentials prove wrong.

An explicit kubeconfig is checked first (:func:`kubeconfig_problem`): a loader answers a
directory, a binary or invalid YAML with whatever exception its input provokes, and a
2,000-deep value with RecursionError.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any

from localpv.clock import Clock
from localpv.kube.credentials import (
    Access,
    CredentialsError,
    NeedsLibrary,
    from_kubeconfig,
    in_cluster,
    service_account_dir,
)
from localpv.kube.transport import Transport, connect

log = logging.getLogger(__name__)

#: ``kubernetes``: build every client through the kubernetes package (see the module doc).
TRANSPORT_ENV = "LOCALPV_KUBE_TRANSPORT"
TRANSPORTS = ("auto", "kubernetes")

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


def make_api_client(kubeconfig: str | None = None, *, pool_size: int = 16, transport: str | None = None,
                    clock: Clock | None = None) -> Transport:
    """The transport to the configured cluster (never retrying: :class:`KubeApi` decides).

    ``transport`` is ``auto`` (localpv's own where the credentials allow, the default) or
    ``kubernetes``; None reads ``LOCALPV_KUBE_TRANSPORT``. ``clock`` times the re-reading
    of token files (tests). Raises :class:`ClientConfigError` with one line.
    """
    if kubeconfig:
        problem = kubeconfig_problem(kubeconfig)
        if problem is not None:
            raise ClientConfigError(problem, kubeconfig=kubeconfig)
    choice = transport if transport is not None else (os.environ.get(TRANSPORT_ENV) or "auto")
    if choice not in TRANSPORTS:
        raise ClientConfigError(f"{TRANSPORT_ENV}: expected one of {', '.join(TRANSPORTS)}, found {choice!r}")
    why = f"{TRANSPORT_ENV}={choice}"
    if choice == "auto":
        try:
            access = _own_access(kubeconfig, clock)
        except NeedsLibrary as need:
            why = str(need)
        except CredentialsError as err:
            raise _config_error(kubeconfig, err) from err
        else:
            built = connect(access.server, access.credentials, tls=access.tls, tls_server_name=access.tls_server_name,
                            pool_size=pool_size, description=access.description)
            log.debug("%s", built.about())
            return built
    built = _library_transport(kubeconfig, pool_size, why)
    log.debug("%s", built.about())
    return built


def _own_access(kubeconfig: str | None, clock: Clock | None) -> Access:
    if kubeconfig:
        return from_kubeconfig([p for p in kubeconfig.split(os.pathsep) if p], clock=clock)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(clock=clock)
    return from_kubeconfig([os.path.expanduser("~/.kube/config")], clock=clock)


class LibraryCredentials:
    """The ``kubernetes`` package's configuration as :class:`~localpv.kube.transport.Credentials`:
    its auth settings, which its own hooks keep fresh (an exec plugin run again when its
    credential expires, the in-cluster token read again every minute)."""

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration

    def headers(self) -> dict[str, str]:
        return {str(s["key"]): str(s["value"]) for s in self.configuration.auth_settings().values()
                if s.get("in") == "header" and s.get("value")}

    def refresh(self) -> bool:
        return False  # the package decides itself when to run a plugin again


def _library_transport(kubeconfig: str | None, pool_size: int, why: str) -> Transport:
    """A transport over the ``kubernetes`` package: its loader, its auth, its urllib3 pool."""
    from kubernetes import client, config
    from kubernetes.client.rest import RESTClientObject
    from kubernetes.config.incluster_config import InClusterConfigLoader

    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration,
                                    persist_config=False)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            directory = service_account_dir()
            InClusterConfigLoader(token_filename=os.path.join(directory, "token"),
                                  cert_filename=os.path.join(directory, "ca.crt")).load_and_set(configuration)
        else:
            config.load_kube_config(client_configuration=configuration, persist_config=False)
    except Exception as err:  # the loader raises what its input provokes: ConfigException, KeyError, ...
        raise _config_error(kubeconfig, err) from err
    # Watches, workers and the informer share the pool; the default would make them queue.
    configuration.connection_pool_maxsize = pool_size
    configuration.retries = False
    pool = RESTClientObject(configuration).pool_manager
    return Transport(str(configuration.host), LibraryCredentials(configuration), pool,
                     description=f"credentials through the kubernetes package ({why})")


def _config_error(kubeconfig: str | None, err: BaseException) -> ClientConfigError:
    reason = " ".join(str(err).split()) or type(err).__name__
    if kubeconfig:
        return ClientConfigError(f"expected a usable kubeconfig, found: {reason}", kubeconfig=kubeconfig)
    return ClientConfigError(f"cannot load cluster credentials from the in-cluster service account or "
                             f"~/.kube/config: {reason}")

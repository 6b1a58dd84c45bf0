"""The ``localpv`` command line.

Every command imports what it needs inside its body: ``localpv --help`` must stay fast
and must not pay for the ``kubernetes`` client (about 47 MB and 0.3 s).
Options read environment variables too: each option names its variable explicitly
(upstream's names where one exists, e.g. ``MY_NODE_NAME``), else ``LOCALPV_<OPTION>``.
"""

from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click
from click.core import ParameterSource

from localpv import __version__
from localpv.kube.ratelimit import AGENT_RATE, CONTROLLER_RATE, rate_limiter
from localpv.naming import DNS1123_LABEL_RE, DNS1123_SUBDOMAIN_RE, QUALIFIED_NAME_RE

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

    from click.decorators import FC

    from localpv.config import LoadedConfig
    from localpv.kube.ratelimit import RateLimit

CONFIG_ERROR_EXIT = 2

#: Options several commands share, declared once.
CONFIG_OPTION = click.option("--config", "config_path", default="/etc/provisioner/config", show_default=True,
                             envvar="LOCALPV_CONFIG", type=click.Path(),
                             help="Mounted ConfigMap directory or YAML file.")
KUBECONFIG_OPTION = click.option("--kubeconfig", envvar="KUBECONFIG", default=None,
                                 help="Out-of-cluster kubeconfig (env KUBECONFIG).")


def _kube_api_rate_options(default: RateLimit) -> Callable[[FC], FC]:
    """``--kube-api-qps`` / ``--kube-api-burst``: the process's one client-side rate limit."""
    def decorate(f: FC) -> FC:
        f = click.option("--kube-api-burst", default=default.burst, show_default=True, type=click.IntRange(min=1),
                         envvar="LOCALPV_KUBE_API_BURST",
                         help="Requests the API server may get at once above the QPS rate.")(f)
        return click.option("--kube-api-qps", default=default.qps, show_default=True, type=click.FloatRange(min=0),
                            envvar="LOCALPV_KUBE_API_QPS",
                            help="Requests per second to the API server, all threads together (0: no limit).")(f)
    return decorate


# --------------------------------------------------------------------------- errors: one line, exit 2
#
# Whatever a user can type ends in one line on stderr naming the flag (or the variable it
# came from, or the configuration key), what was expected and what was found, and exit 2:
# click's usage errors included (normally four lines: usage, hint, blank, error).


def _one_line(text: str) -> str:
    return " ".join(text.split())


class _OneLineUsageError(click.ClickException):
    exit_code = CONFIG_ERROR_EXIT

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {_one_line(self.format_message())}", err=True)


def _as_one_line(err: click.UsageError) -> click.ClickException:
    message = err.format_message()
    param = getattr(err, "param", None)
    if isinstance(err, click.MissingParameter) and param is not None and isinstance(param.envvar, str):
        state = "set but empty" if os.environ.get(param.envvar) == "" else "not set"
        message = f"{message.rstrip('.')} (or {param.envvar}, which is {state})"
    return _OneLineUsageError(message)


class _Cli(click.Group):
    """The root group: usage errors of any command become one line."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as err:
            raise _as_one_line(err) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as err:
            raise _as_one_line(err) from None


def _named(name: str, flag: str, envvar: str, value: str) -> str:
    """How to name a value in a message: ``--flag value``, or ``VAR=value`` when it came from there."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT:
        return f"{envvar}={value}"
    return f"{flag} {value}"


def _refuse(named: str, problem: str) -> NoReturn:
    """Exit 2 with one line: the flag and its value, what was expected, what was found."""
    click.echo(f"error: {_one_line(f'{named}: {problem}')}", err=True)
    sys.exit(CONFIG_ERROR_EXIT)


def _bad_parameter(ctx: click.Context, param: click.Parameter, value: object, problem: str) -> click.BadParameter:
    """A callback's error; it names the variable too when the value came from one.

    (Callbacks run before click records where a value came from: a variable that is set
    to the very value is taken as its source.)
    """
    hint = None
    envvar = param.envvar if isinstance(param.envvar, str) else None
    if envvar and isinstance(value, str) and value and os.environ.get(envvar) == value:
        hint = f"{param.get_error_hint(ctx)} (from {envvar})"
    return click.BadParameter(problem, ctx=ctx, param=param, param_hint=hint)


# --------------------------------------------------------------------------- Kubernetes names

_SUBDOMAIN_RULE = 'a DNS-1123 subdomain: lowercase letters, digits, "-" and ".", starting and ending with a ' \
                  "letter or digit, at most 253 characters"
_LABEL_RULE = 'a DNS-1123 label: lowercase letters, digits and "-", starting and ending with a letter or ' \
              "digit, at most 63 characters"


def _quote(value: str) -> str:
    return '"' + value.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'


def _subdomain_problem(value: str, what: str) -> str | None:
    if not value:
        return f"expected {what}, found an empty value"
    if len(value) > 253:
        return f"expected {what} of at most 253 characters, found {len(value)} characters"
    if not DNS1123_SUBDOMAIN_RE.fullmatch(value):
        return f"expected {what} ({_SUBDOMAIN_RULE}), found {_quote(value)}"
    return None


def node_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a Node (Kubernetes validates Node names as DNS-1123 subdomains)."""
    return _subdomain_problem(name, "a Node name")


def namespace_problem(name: str) -> str | None:
    """Why ``name`` cannot name a namespace (a DNS-1123 label)."""
    if not name:
        return "expected a namespace, found an empty value"
    if len(name) > 63:
        return f"expected a namespace of at most 63 characters, found {len(name)} characters"
    if not DNS1123_LABEL_RE.fullmatch(name):
        return f"expected a namespace ({_LABEL_RULE}), found {_quote(name)}"
    return None


def provisioner_name_problem(name: str, *, leader_election: bool) -> str | None:
    """Why ``name`` cannot be the NFS provisioner's name, as Kubernetes would say it.

    A StorageClass's ``provisioner`` must be a qualified name once lowercased (an optional
    DNS-1123 subdomain prefix and ``/``, then at most 63 letters, digits, ``-``, ``_`` or ``.``,
    starting and ending with a letter or digit): no class could name anything else. With
    leader election the Lease is named after it (``/`` replaced by ``-``) and a Lease name
    must be a DNS-1123 subdomain: no uppercase, no ``_``. The API server refuses anything
    else with 422, and the elector would retry that forever.
    """
    expected = 'expected a qualified name such as "example.com/nfs" (what StorageClass.provisioner accepts)'
    parts = name.lower().split("/")
    if len(parts) > 2:
        return f'{expected}, found {len(parts) - 1} "/"'
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            return f'{expected}, found an empty prefix before "/"'
        if len(prefix) > 253 or not DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
            return f"{expected}, whose prefix is {_SUBDOMAIN_RULE}; found prefix {_quote(prefix)}"
    last = parts[-1]
    if not last:
        return f"{expected}, found an empty name part"
    if len(last) > 63:
        return f"{expected}, whose name part has at most 63 characters; found {len(last)} characters"
    if not QUALIFIED_NAME_RE.fullmatch(last):
        return f'{expected}, whose name part has letters, digits, "-", "_" and ".", starting and ending with a ' \
               f"letter or digit; found {_quote(name.rsplit('/', maxsplit=1)[-1])}"
    if leader_election:
        from localpv.kube.leader import lock_name

        lease = lock_name(name)
        if len(lease) > 253 or not DNS1123_SUBDOMAIN_RE.fullmatch(lease):
            found = ("uppercase letters" if lease != lease.lower() else '"_"' if "_" in lease
                     else f"{len(lease)} characters" if len(lease) > 253 else _quote(lease))
            return (f"expected a name that can also name the leader election Lease {_quote(lease)}, which must be "
                    f"{_SUBDOMAIN_RULE}; found {found} (rename it, or disable leader election with "
                    "ENABLE_LEADER_ELECTION=false)")
    return None


def _node_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--node``: a Node name; doctor's optional one may be left out (None or empty)."""
    if value is None or (value == "" and not param.required):
        return None
    problem = node_name_problem(value)
    if problem is not None:
        raise _bad_parameter(ctx, param, value, problem)
    return value


def _namespace(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    problem = namespace_problem(value)
    if problem is not None:
        raise _bad_parameter(ctx, param, value, problem)
    return value


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """A Go duration ("10s", "1h30m"): positive, and short enough for a thread to wait on."""
    import threading

    from localpv.config import format_go_duration, parse_go_duration

    try:
        seconds = parse_go_duration(value)
    except ValueError as err:
        raise _bad_parameter(ctx, param, value, str(err)) from err
    if not seconds > 0:
        raise _bad_parameter(ctx, param, value, f'expected a positive duration such as "10s", found {_quote(value)}')
    if not seconds <= threading.TIMEOUT_MAX:
        longest = format_go_duration(threading.TIMEOUT_MAX)
        raise _bad_parameter(ctx, param, value, f"expected a duration of at most {longest}, found {_quote(value)}")
    return seconds


def _url_path(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An HTTP path: without its leading "/" no request would ever match it, and the metrics
    would silently be served nowhere."""
    if not value.startswith("/") or any(c.isspace() or c in "?#" for c in value):
        raise _bad_parameter(ctx, param, value, f'expected a URL path starting with "/", such as /metrics, '
                                                f"found {_quote(value)}")
    return value


METRICS_PATH_OPTION = click.option(
    "--metrics-path", default="/metrics", show_default=True, callback=_url_path,
    help="URL path of the Prometheus metrics.")


# --------------------------------------------------------------------------- what commands check early


def state_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot hold the agent's journal: it must be (or become) a writable directory.

    A missing directory is created; writability is proven by creating and removing a file.
    """
    import stat
    import tempfile

    if not path:
        return "expected a directory, found an empty path"
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        pass  # something else is there: said below
    except OSError as err:
        return f"expected a directory that exists or can be created, found that it cannot be created " \
               f"({err.strerror})"
    try:
        st = os.stat(path)
    except OSError as err:
        return f"expected a directory, found {err.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else "something that is not a directory"
        return f"expected a directory, found {kind}"
    try:
        fd, probe = tempfile.mkstemp(prefix=".localpv-write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        return f"expected a writable directory, found it not writable ({err.strerror})"
    return None


def _api_client_or_exit(kubeconfig: str | None, **kwargs: Any) -> Any:
    """The ``kubernetes`` ApiClient, or exit 2 with one line naming --kubeconfig (or KUBECONFIG)."""
    from localpv.kube.client import ClientConfigError, make_api_client

    try:
        return make_api_client(kubeconfig, **kwargs)
    except ClientConfigError as err:
        if err.kubeconfig is not None:
            _refuse(_named("kubeconfig", "--kubeconfig", "KUBECONFIG", err.kubeconfig), err.problem)
        click.echo(f"error: {_one_line(str(err))}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)


def _listen_or_exit(address: str) -> socket.socket:
    """Listen on ``--listen-address`` now: a bad address or a port in use is one line, exit 2."""
    from localpv.httpserver import ListenError, bind_listener

    try:
        return bind_listener(address)
    except ListenError as err:
        _refuse(_named("listen_address", "--listen-address", "LOCALPV_LISTEN_ADDRESS", _quote(address)), str(err))


def _load_config_or_exit(path: str, *, strict: bool = False, dash_is_stdin: bool = False) -> LoadedConfig:
    """Load the configuration; on problems print each (with typo hints), one line each, and exit 2.

    Warnings of a valid configuration go to stderr too: they are usually typos. With
    ``dash_is_stdin``, ``-`` reads one file's content from standard input.
    """
    from localpv.config import ConfigError, load_config

    try:
        loaded = load_config(sys.stdin.buffer if dash_is_stdin and path == "-" else path, strict=strict)
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"error: {_one_line(problem)}", err=True)
        for warning in err.warnings:
            click.echo(f"warning: {_one_line(warning)}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    for warning in loaded.warnings:
        click.echo(f"warning: {warning}", err=True)
    return loaded


def _package_version() -> str:
    """The installed distribution's version (importlib.metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("localpv")
    except PackageNotFoundError:
        return __version__


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--version``: looked up only when asked, so that ``--help`` stays fast."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"localpv {_package_version()}")
    ctx.exit()


_DAEMONS = frozenset({"agent", "nfs", "node-cleanup"})
"""Subcommands that run until stopped (the chart's containers)."""


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "LOCALPV"})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              allow_from_autoenv=False, help="Print the version and exit.")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--log-level", type=click.Choice(["warning", "info", "debug"], case_sensitive=False), default=None,
              envvar="LOCALPV_LOG_LEVEL", help="Log level (env LOCALPV_LOG_LEVEL); with -v, the more verbose wins.")
@click.pass_context
def cli(ctx: click.Context, verbose: int, log_level: str | None) -> None:
    """Kubernetes storage provisioner for node-local volumes and NFS subdirectories."""
    from localpv.logs import setup_logging

    if log_level:
        level = ("warning", "info", "debug").index(log_level.lower())
    else:
        # A healthy daemon that prints nothing leaves `kubectl logs` empty: the long-running
        # commands log at info unless told otherwise; one-shot commands stay quiet.
        level = 1 if ctx.invoked_subcommand in _DAEMONS else 0
    setup_logging(max(verbose, level))
    ctx.ensure_object(dict)


@cli.command()
def version() -> None:
    """Print the version."""
    click.echo(f"localpv {_package_version()}")


@cli.group()
def config() -> None:
    """Inspect provisioner configuration."""


@config.command("check")
@click.argument("path", type=click.Path(exists=True, dir_okay=True, file_okay=True, allow_dash=True))
@click.option("--output", "-o", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="Output format of the effective configuration.")
def config_check(path: str, output: str) -> None:
    """Validate a ConfigMap directory or YAML file and print the effective configuration.

    Exits 0 when valid, 2 with one line per problem otherwise. Stricter than the agent:
    two classes sharing a hostDir are an error here (the agent warns). A multi-document
    file (helm template output) is searched for the ConfigMap with storageClassMap; PATH
    "-" reads it from standard input (helm template ... | localpv config check -).
    """
    import json

    import yaml

    from localpv.config import config_to_data

    data = config_to_data(_load_config_or_exit(path, strict=True, dash_is_stdin=True).config)
    if output == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True), nl=False)


@config.command("reference")
def config_reference() -> None:
    """Print the configuration reference (Markdown), generated from the parser's tables."""
    from localpv.config import reference_markdown

    click.echo(reference_markdown(), nl=False)


@cli.command()
@click.option("--dry-run", is_flag=True, help="Only show what would be done: the only mode, so optional (kept for "
                                             "compatibility).")
@click.option("--config", "config_path", default="/etc/provisioner/config", show_default=True,
              envvar="LOCALPV_CONFIG", type=click.Path(exists=True), help="ConfigMap directory or YAML file.")
@click.option("--node", "node_name", envvar="MY_NODE_NAME", required=True, callback=_node_name,
              help="Node name (env MY_NODE_NAME).")
@click.option("--output", "-o", type=click.Choice(["table", "yaml", "json"]), default="table", show_default=True,
              help="Output format.")
@click.option("--kubeconfig", envvar="KUBECONFIG", default=None,
              help="Read the real Node, StorageClasses and PVs (read-only; env KUBECONFIG, so a set "
                   "KUBECONFIG makes discover read the cluster).")
@click.option("--request-timeout", default="5s", show_default=True, callback=_duration,
              help="With --kubeconfig: give up on the API server after this long (one attempt per request).")
def discover(dry_run: bool, config_path: str, node_name: str, output: str, kubeconfig: str | None,
             request_timeout: float) -> None:
    """Show the PVs the agent would create on this node, and why entries are skipped.

    With --kubeconfig, an API server that cannot be reached (or answers with an error) is
    one line and exit 1: the command line was fine, the cluster was not there (as
    ``localpv status`` when the agent is not). A Node the cluster does not have is exit 2.
    """
    import json

    import yaml

    from localpv.agent.dryrun import dry_run as run_dry
    from localpv.agent.dryrun import render_table
    from localpv.kube.errors import ApiError

    config = _load_config_or_exit(config_path).config
    api = None
    host = ""
    if kubeconfig:
        from localpv.kube.api import KubeApi
        from localpv.kube.errors import NO_RETRY

        # One attempt, bounded: a person is waiting, and the dry run is read-only and repeatable.
        api_client = _api_client_or_exit(kubeconfig, retries=0)
        host = str(api_client.configuration.host)
        api = KubeApi(api_client, backoff=NO_RETRY, timeout=request_timeout, user_agent="localpv-discover")
    try:
        result = run_dry(config, node_name, api=api)
    except ApiError as err:
        if err.status == 404 and err.reason == "NotFound" and f'nodes "{node_name}"' in err.message:
            _refuse(_named("node_name", "--node", "MY_NODE_NAME", node_name),
                    f"expected a Node of the cluster at {host}, found none")
        if err.status == 0:
            click.echo(f"error: cannot reach the API server at {host}: {_unreachable_reason(err, request_timeout)}",
                       err=True)
        else:
            click.echo(f"error: the API server at {host} answered {_one_line(str(err))[:300]}", err=True)
        sys.exit(1)
    if output == "json":
        click.echo(json.dumps(result.as_json(), indent=2))
    elif output == "yaml":
        click.echo(yaml.safe_dump(result.as_json(), sort_keys=False, allow_unicode=True), nl=False)
    else:
        click.echo(render_table(result), nl=False)
    for assumption in result.assumptions if output != "table" else ():
        click.echo(f"note: {assumption}", err=True)


def _unreachable_reason(err: BaseException, timeout: float) -> str:
    """Why a request never got an answer, in a few words (the transport's exceptions nest deeply)."""
    import socket
    import ssl

    chain: list[BaseException] = []
    todo: list[BaseException] = [err]
    while todo and len(chain) < 20:
        exc = todo.pop(0)
        if exc in chain:
            continue
        chain.append(exc)
        todo += [e for e in (exc.__cause__, exc.__context__, getattr(exc, "reason", None))
                 if isinstance(e, BaseException)]
    names = {type(e).__name__ for e in chain}
    for exc in chain:
        if isinstance(exc, socket.gaierror):
            return f"the host name does not resolve ({exc.strerror})"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, ssl.SSLError):
            return f"TLS failed ({exc.reason or exc})"
    if names & {"ReadTimeoutError", "ConnectTimeoutError", "TimeoutError", "timeout"} or any(
            isinstance(e, TimeoutError) for e in chain):
        return f"no answer within {timeout:g}s"
    for exc in chain:
        if isinstance(exc, OSError) and exc.strerror:
            return exc.strerror
    return _one_line(str(chain[-1]))[:200]


def _wait_for_signal() -> None:
    """Block until SIGTERM or SIGINT (the kubelet stops pods with SIGTERM)."""
    import signal
    import threading

    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


@cli.command()
@CONFIG_OPTION
@click.option("--node", "node_name", envvar="MY_NODE_NAME", required=True, callback=_node_name,
              help="This node (env MY_NODE_NAME).")
@click.option("--namespace", envvar="MY_NAMESPACE", default="default", show_default=True, callback=_namespace,
              help="Namespace for cleanup Jobs (env MY_NAMESPACE).")
@click.option("--job-image", envvar="JOB_CONTAINER_IMAGE", default=None,
              help="Cleanup Job image (env JOB_CONTAINER_IMAGE).")
@KUBECONFIG_OPTION
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz.")
@METRICS_PATH_OPTION
@click.option("--discovery-period", default="10s", show_default=True, callback=_duration,
              help="Safety-net period between passes (events trigger passes at once).")
@click.option("--config-sync-period", default="5s", show_default=True, callback=_duration,
              help="How often the configuration is re-read.")
@click.option("--state-dir", default="/var/lib/localpv", show_default=True, envvar="LOCALPV_STATE_DIR",
              help="Host directory for the cleanup journal (must survive pod restarts).")
@click.option("--host-events/--no-host-events", default=True, show_default=True,
              help="React to mount and block-device events at once.")
@click.option("--volume-health-period", default="60s", show_default=True, callback=_duration,
              envvar="LOCALPV_VOLUME_HEALTH_PERIOD",
              help="Longest time between two looks at the health of the volumes in use (every pass looks; mount "
                   "and block-device events start one).")
@click.option("--kubelet-dir", default="/var/lib/kubelet", show_default=True, envvar="LOCALPV_KUBELET_DIR",
              help="The kubelet's root directory (dynamic volumes: where the CSI and registration sockets go).")
@_kube_api_rate_options(AGENT_RATE)
def agent(config_path: str, node_name: str, namespace: str, job_image: str | None, kubeconfig: str | None,
          listen_address: str, metrics_path: str, discovery_period: float, config_sync_period: float,
          state_dir: str, host_events: bool, volume_health_period: float, kubelet_dir: str, kube_api_qps: float,
          kube_api_burst: int) -> None:
    """Run the node agent (the DaemonSet entrypoint).

    Everything a user can get wrong is checked before any thread starts, each as one line
    and exit 2: the configuration, the state dir (created if missing, must be writable),
    the kubeconfig, and the listen address, which is bound here so that a port in use is
    reported before anything else runs.
    """
    import logging
    import os

    from localpv.agent.journal import Journal, JournalError
    from localpv.agent.node import AgentError, AgentOptions, NodeAgent
    from localpv.httpserver import StatusServer
    from localpv.kube.api import KubeApi
    from localpv.kube.errors import ApiError
    from localpv.metrics import AgentMetrics

    log = logging.getLogger("localpv.agent")
    loaded = _load_config_or_exit(config_path)
    problem = state_dir_problem(state_dir)
    if problem is not None:
        _refuse(_named("state_dir", "--state-dir", "LOCALPV_STATE_DIR", state_dir), problem)
    api_client = _api_client_or_exit(kubeconfig)
    listener = _listen_or_exit(listen_address)
    try:
        journal = Journal(os.path.join(state_dir, "journal.json"))
    except JournalError as err:
        click.echo(f"error: {_one_line(str(err))}", err=True)
        sys.exit(1)
    metrics = AgentMetrics()
    api = KubeApi(api_client, observer=metrics.api.observe, limiter=rate_limiter(kube_api_qps, kube_api_burst))
    options = AgentOptions(node_name=node_name, namespace=namespace, job_image=job_image, config_path=config_path,
                           discovery_period=discovery_period, config_sync_period=config_sync_period,
                           watch_host=host_events, state_dir=state_dir, volume_health_period=volume_health_period)
    node_agent = NodeAgent(api, options, loaded.config, journal, metrics=metrics)
    dynamic: Any = None  # localpv.csi.app.DynamicVolumes, when the ConfigMap has dynamic classes

    def healthy() -> tuple[bool, str]:
        ok, why = node_agent.healthy()
        problems = dynamic.problems() if dynamic is not None else []
        return (ok and not problems), "; ".join([why, *problems]) if problems else why

    server = StatusServer(listener, metrics.registry, ready=node_agent.readiness, healthy=healthy,
                          metrics_path=metrics_path, documents={"/status": node_agent.status},
                          loopback_only=("/status",))
    server.start()
    try:
        node_agent.start()
        if loaded.config.dynamic_classes:  # grpcio is imported only then
            from localpv.csi.app import DynamicStartError, start_dynamic

            try:
                dynamic = start_dynamic(api, node_name=node_name, config=lambda: node_agent.config.current,
                                        state_dir=state_dir, kubelet_dir=kubelet_dir, registry=metrics.registry)
            except DynamicStartError as err:
                raise AgentError(str(err)) from err
    except (AgentError, ApiError) as err:
        click.echo(f"error: {_one_line(str(err))}", err=True)
        node_agent.stop()
        server.stop()
        sys.exit(1)
    log.info("agent running on node %s", node_name)
    try:
        _wait_for_signal()
    finally:
        if dynamic is not None:
            dynamic.stop()
        node_agent.stop()
        server.stop()


def _shell_words(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A command line split like a shell would: it must split (quotes closed)."""
    import shlex

    if value is not None:
        try:
            shlex.split(value)
        except ValueError as err:
            raise _bad_parameter(ctx, param, value, f"expected a command line with its quotes closed, "
                                                    f"found {_quote(value)} ({err})") from err
    return value


@cli.command()
@click.option("--device", type=click.Path(), default=None, envvar="LOCAL_PV_BLKDEVICE",
              help="Block device to wipe (env LOCAL_PV_BLKDEVICE); refused if not a block device or in use.")
@click.option("--dir", "directory", type=click.Path(), default=None, envvar="LOCAL_PV_FILESYSTEM",
              help="Mounted volume whose contents to remove (env LOCAL_PV_FILESYSTEM); must be a mount point "
                   "directly inside a discovery dir (--discovery-dir, --config).")
@click.option("--discovery-dir", "discovery_dirs", multiple=True, type=click.Path(), envvar="LOCALPV_DISCOVERY_DIR",
              help="A class's mountDir; --dir must be one of its entries (repeatable).")
@click.option("--config", "config_path", default=None, type=click.Path(), envvar="LOCALPV_CONFIG",
              help="ConfigMap directory or YAML file: its Filesystem classes' mountDirs are discovery dirs.")
@click.option("--unsafe-any-directory", is_flag=True, allow_from_autoenv=False,
              help="DANGEROUS: empty --dir even if it is not a mounted volume inside a discovery dir.")
@click.option("--command", "command", default=None, callback=_shell_words,
              help="Cleaner command for --device, split like a shell would (default: quick_reset.sh).")
@click.option("--timeout", default="6h", show_default=True, callback=_duration,
              help="Give up (and kill the cleaner) after this long, a Go duration such as 30m.")
@click.option("--expect-identity", default="", envvar="LOCALPV_EXPECT_IDENTITY",
              help="Refuse unless the volume is this one (its filesystem UUID, WWN...: the identity `localpv "
                   "status` shows; env LOCALPV_EXPECT_IDENTITY). The agent passes it to its cleanup Jobs.")
def cleanup(device: str | None, directory: str | None, discovery_dirs: tuple[str, ...], config_path: str | None,
            unsafe_any_directory: bool, command: str | None, timeout: float, expect_identity: str) -> None:
    """Wipe one volume; exit 0 only when it is verified clean (the cleanup Job entrypoint).

    What is not a volume is refused (exit 2, one line: the flag, what was expected, what
    was found) before anything is touched: a path that is not a mount point (an unmounted
    disk leaves the host's own directory there), outside the discovery dirs, or a block
    device that is not one or is in use (mounted, holding a mounted partition, claimed).
    """
    import shlex
    import threading

    from localpv.agent.cleaning import (
        block_cleaner,
        discovery_dir_problem,
        filesystem_cleaner,
        home_discovery_dir,
        not_an_entry_problem,
    )
    from localpv.config import DEFAULT_BLOCK_CLEANER
    from localpv.host.cleaner import block_device_problem
    from localpv.host.fsclean import mount_point_problem

    def refuse(flag: str, value: str, problem: str | None) -> None:
        """Exit 2 with one line when there is a problem: the flag, what was expected, what was found."""
        if problem is not None:
            click.echo(f"error: {flag} {value}: {problem}", err=True)
            sys.exit(CONFIG_ERROR_EXIT)

    if (device is None) == (directory is None):
        raise click.UsageError("give exactly one of --device or --dir")
    if device is not None:
        refuse("--device", device, block_device_problem(device, expect_identity))
        argv = shlex.split(command) if command else list(DEFAULT_BLOCK_CLEANER)
        fn = block_cleaner(device, argv, timeout=timeout, on_line=click.echo, expect_identity=expect_identity)
    elif unsafe_any_directory:
        assert directory is not None
        click.echo(f"warning: --unsafe-any-directory: emptying {directory} without checking it is a volume",
                   err=True)
        fn = filesystem_cleaner(directory, None, require_mount_point=False, timeout=timeout,
                                expect_identity=expect_identity)
    else:
        assert directory is not None
        for given in discovery_dirs:
            refuse("--discovery-dir", given, discovery_dir_problem(given))
        classes = _load_config_or_exit(config_path).config.classes.values() if config_path else ()
        dirs = [*discovery_dirs, *(c.mount_dir for c in classes if c.volume_mode == "Filesystem")]
        refuse("--dir", directory, mount_point_problem(directory))
        if not dirs:
            refuse("--dir", directory, "expected --discovery-dir or --config to say which discovery dir it must "
                   "be an entry of (or --unsafe-any-directory), found neither")
        home = home_discovery_dir(directory, dirs)
        if home is None:
            refuse("--dir", directory, not_an_entry_problem(directory, dirs))
        assert home is not None  # refuse() exited otherwise; None would skip the cleaner's own check
        fn = filesystem_cleaner(directory, home, timeout=timeout, expect_identity=expect_identity)
    outcome = fn(threading.Event())
    click.echo(("clean: " if outcome.ok else "NOT clean: ") + outcome.message, err=not outcome.ok)
    sys.exit(0 if outcome.ok else 1)


def _agent_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--agent-url``: an http(s) URL with a host (and a valid port, if any)."""
    from urllib.parse import urlsplit

    example = "a URL such as http://127.0.0.1:8080"
    try:
        parts = urlsplit(value)
        _ = parts.port  # parsing it is the check
    except ValueError as err:
        raise _bad_parameter(ctx, param, value,
                             f"expected {example} (a port 0-65535), found {_quote(value)}: {err}") from err
    if parts.scheme not in ("http", "https"):
        found = f"scheme {_quote(parts.scheme)}" if parts.scheme else f"{_quote(value)}, which has no scheme"
        raise _bad_parameter(ctx, param, value, f"expected {example} (http:// or https://), found {found}")
    if not parts.hostname:
        raise _bad_parameter(ctx, param, value, f"expected {example} (with a host), found {_quote(value)}, with none")
    return value


@cli.command()
@click.option("--agent-url", default="http://127.0.0.1:8080", show_default=True, envvar="LOCALPV_AGENT_URL",
              callback=_agent_url,
              help="The agent's --listen-address (run this in the agent pod: kubectl exec).")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output format.")
def status(agent_url: str, output: str) -> None:
    """Show this node's volumes: PV, phase, claim, cleanup state and progress, skipped entries."""
    import json

    from localpv.agent.status import StatusUnavailable, fetch_status, render_status

    try:
        doc = fetch_status(agent_url)
    except StatusUnavailable as err:
        click.echo(f"error: {err} (is the agent running? run this inside its pod)", err=True)
        sys.exit(1)
    click.echo(json.dumps(doc, indent=2) if output == "json" else render_status(doc), nl=output == "json")


@cli.command()
@CONFIG_OPTION
@click.option("--node", "node_name", envvar="MY_NODE_NAME", default=None, callback=_node_name,
              help="This node (env MY_NODE_NAME).")
@click.option("--namespace", envvar="MY_NAMESPACE", default="default", show_default=True, callback=_namespace,
              help="Namespace of cleanup Jobs (env MY_NAMESPACE).")
@KUBECONFIG_OPTION
@click.option("--in-pod/--on-host", default=None,
              help="Whether mounts reach this process through a pod volume (default: in a pod when "
                   "KUBERNETES_SERVICE_HOST is set); decides whether mount propagation matters.")
@click.option("--no-cluster", is_flag=True, help="Check the host only (no Node, StorageClass or RBAC checks).")
@click.option("--agent-url", default="http://127.0.0.1:8080", show_default=True, envvar="LOCALPV_AGENT_URL",
              callback=_agent_url, help="The running agent, asked for the volumes it holds or sees unhealthy "
                                        "(its --listen-address); not asked with --no-cluster.")
def doctor(config_path: str, node_name: str | None, namespace: str, kubeconfig: str | None, in_pod: bool | None,
           no_cluster: bool, agent_url: str) -> None:
    """Explain why volumes on this node do not become PVs; exit 1 when something is wrong.

    Run it in the agent pod (kubectl exec <pod> -- localpv doctor) or on the node with
    --kubeconfig. Each problem is printed with its fix.
    """
    import os

    from localpv.agent.status import StatusUnavailable, fetch_status
    from localpv.config import ConfigError, load_config
    from localpv.doctor import AgentFacts, diagnose, failed, gather_cluster, gather_host, render

    try:
        loaded = load_config(config_path)
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"ERROR  config: {problem}\n       fix: correct the ConfigMap (localpv config check PATH)")
        sys.exit(1)
    config = loaded.config
    pod = in_pod if in_pod is not None else bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    cluster = None
    agent = None
    if not no_cluster:
        try:
            agent = AgentFacts.from_status(fetch_status(agent_url, timeout=2.0))
        except StatusUnavailable as err:
            agent = AgentFacts(unavailable=str(err))
        if not node_name:
            raise click.UsageError("--node (or MY_NODE_NAME) is required unless --no-cluster is given")
        from localpv.kube.api import KubeApi
        from localpv.kube.errors import Backoff

        api = KubeApi(_api_client_or_exit(kubeconfig), backoff=Backoff(attempts=2), user_agent="localpv-doctor")
        cluster = gather_cluster(api, config, node_name, namespace)
    findings = diagnose(config, gather_host(config, in_pod=pod), cluster, agent)
    click.echo(render(findings), nl=False)
    sys.exit(1 if failed(findings) else 0)


#: Volumes the demo makes at most: each is a real tmpfs mount as root.
DEMO_MAX_VOLUMES = 50
#: Longest step the demo allows, in seconds.
DEMO_MAX_TIMEOUT = 3600.0


def _step_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= DEMO_MAX_TIMEOUT):
        raise _bad_parameter(ctx, param, value,
                             f"expected seconds, more than 0 and at most {DEMO_MAX_TIMEOUT:g}, found {value:g}")
    return value


@cli.command()
@click.option("--volumes", default=2, show_default=True, type=click.IntRange(1, DEMO_MAX_VOLUMES),
              help="How many volumes to make.")
@click.option("--timeout", default=30.0, show_default=True, type=float, callback=_step_timeout,
              help="Seconds allowed for each step.")
@click.option("--simulate-mounts", is_flag=True, help="Plain directories even as root (what non-root gets).")
def demo(volumes: int, timeout: float, simulate_mounts: bool) -> None:
    """Run the whole lifecycle of a local volume against the embedded API emulator.

    Real tmpfs mounts when run as root, simulated mount points otherwise. Exits 0 when
    every step happened and the tenant's data was really wiped.
    """
    from localpv.demo import Demo, DemoFailed, DemoStopped

    try:
        Demo(sys.stdout, volumes=volumes, timeout=timeout, simulate=simulate_mounts).run()
    except DemoFailed as err:
        click.echo(f"demo failed: {err}", err=True)
        sys.exit(1)
    except DemoStopped as stopped:
        click.echo(f"demo stopped by {stopped}; its volumes were unmounted and removed", err=True)
        sys.exit(128 + stopped.signum)


def _octal_mode(ctx: click.Context, param: click.Parameter, value: str) -> int:
    try:
        mode = int(value, 8)
    except ValueError as err:
        raise click.BadParameter(f"expected an octal mode such as 0777, got {value!r}") from err
    if not 0 <= mode <= 0o7777:
        raise click.BadParameter(f"mode {value!r} out of range")
    return mode


@cli.command()
@click.option("--nfs-server", envvar="NFS_SERVER", default="", help="NFS server put in every PV (env NFS_SERVER).")
@click.option("--nfs-path", envvar="NFS_PATH", default="", help="Exported path on the server (env NFS_PATH).")
@click.option("--provisioner-name", envvar="PROVISIONER_NAME", default="",
              help="Must equal StorageClass.provisioner (env PROVISIONER_NAME).")
@click.option("--enable-leader-election", "leader_election", envvar="ENABLE_LEADER_ELECTION", default="true",
              show_default=True, help="Go ParseBool value (env ENABLE_LEADER_ELECTION).")
@KUBECONFIG_OPTION
@click.option("--namespace", envvar="POD_NAMESPACE", default=None, callback=_namespace,
              help="Namespace of the leader Lease (env POD_NAMESPACE; else the service account's, else default).")
@click.option("--mount-dir", envvar="NFS_MOUNT_DIR", default="/persistentvolumes", show_default=True,
              help="Where the export is mounted in this pod (env NFS_MOUNT_DIR).")
@click.option("--dir-mode", envvar="NFS_DIR_MODE", default="0777", show_default=True, callback=_octal_mode,
              help="Mode of each volume directory, set explicitly (env NFS_DIR_MODE).")
@click.option("--cluster-id", envvar="LOCALPV_CLUSTER_ID", default="",
              help="This cluster's id in the ownership records on the export (env LOCALPV_CLUSTER_ID); empty: the "
                   "uid of namespace kube-system. A rebuilt cluster sets its old id to take its directories back.")
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz.")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(1, 256), envvar="LOCALPV_WORKERS",
              help="Claim workers, and as many volume workers.")
@click.option("--resync-period", default="15m", show_default=True, callback=_duration, envvar="LOCALPV_RESYNC_PERIOD",
              help="Offer every claim and volume again, re-arming items that were given up.")
@click.option("--retry-initial", default="15s", show_default=True, callback=_duration,
              envvar="LOCALPV_RETRY_INITIAL", help="First delay after a failure; it doubles per failure.")
@click.option("--retry-max", default="1000s", show_default=True, callback=_duration, envvar="LOCALPV_RETRY_MAX",
              help="Longest delay between retries of one item.")
@click.option("--failed-provision-threshold", default=15, show_default=True, type=click.IntRange(0),
              envvar="LOCALPV_FAILED_PROVISION_THRESHOLD", help="Retries before giving up until resync (0: never).")
@click.option("--failed-delete-threshold", default=15, show_default=True, type=click.IntRange(0),
              envvar="LOCALPV_FAILED_DELETE_THRESHOLD", help="Retries before giving up until resync (0: never).")
@click.option("--lease-duration", default="15s", show_default=True, callback=_duration,
              envvar="LOCALPV_LEASE_DURATION",
              help="Leader election: how long other replicas wait after the last renewal before taking over.")
@click.option("--renew-deadline", default="10s", show_default=True, callback=_duration,
              envvar="LOCALPV_RENEW_DEADLINE",
              help="Leader election: the leader steps down when it cannot renew within this long.")
@click.option("--retry-period", default="2s", show_default=True, callback=_duration, envvar="LOCALPV_RETRY_PERIOD",
              help="Leader election: wait between attempts to acquire or renew the Lease.")
@_kube_api_rate_options(CONTROLLER_RATE)
def nfs(nfs_server: str, nfs_path: str, provisioner_name: str, leader_election: str, kubeconfig: str | None,
        namespace: str | None, mount_dir: str, dir_mode: int, cluster_id: str, listen_address: str, workers: int,
        resync_period: float, retry_initial: float, retry_max: float, failed_provision_threshold: int,
        failed_delete_threshold: int, lease_duration: float, renew_deadline: float, retry_period: float,
        kube_api_qps: float, kube_api_burst: int) -> None:
    """Provision one subdirectory of an NFS export per claim (nfs-subdir-external-provisioner).

    Every setting is checked before anything starts; all problems are reported at once, one
    line each, exit 2: the provisioner name as Kubernetes will check it (StorageClass, Lease),
    the kubeconfig, the listen address (bound here, so a port in use is reported first). Then
    the cluster id: without ``--cluster-id`` it is read from the cluster, and a provisioner that
    cannot read it exits (2 when setting it is the fix, 1 when the API server did not answer).
    """
    from localpv.httpserver import ListenError, parse_listen_address
    from localpv.kube.client import kubeconfig_problem
    from localpv.kube.leader import LeaseConfig
    from localpv.kube.workqueue import ItemBackoff
    from localpv.nfs.app import NfsOptions, check_mount_dir, election_namespace, run
    from localpv.nfs.cluster import CLUSTER_NAMESPACE, ClusterIdUnavailable
    from localpv.nfs.controller import ControllerSettings
    from localpv.nfs.ownership import cluster_id_problem
    from localpv.nfs.params import parse_bool
    from localpv.nfs.provisioner import NfsSource

    problems = [f"{env} is required (or {flag})" for env, flag, value in (
        ("NFS_SERVER", "--nfs-server", nfs_server), ("NFS_PATH", "--nfs-path", nfs_path),
        ("PROVISIONER_NAME", "--provisioner-name", provisioner_name)) if not value]
    elect: bool | None = None
    try:
        elect = parse_bool(leader_election)
    except ValueError as err:
        problems.append(f"ENABLE_LEADER_ELECTION: {err}")
    if provisioner_name and elect is not None:
        name_problem = provisioner_name_problem(provisioner_name, leader_election=elect)
        if name_problem:
            problems.append(f"PROVISIONER_NAME (--provisioner-name) {_quote(provisioner_name)}: {name_problem}")
    try:
        source = NfsSource(nfs_server, nfs_path, mount_dir, dir_mode) if nfs_path else None
    except ValueError as err:
        problems.append(str(err))
    problems += [p for p in (check_mount_dir(mount_dir),) if p]
    if cluster_id and (id_problem := cluster_id_problem(cluster_id)):
        problems.append(f"{_named('cluster_id', '--cluster-id', 'LOCALPV_CLUSTER_ID', _quote(cluster_id))}: "
                        f"{id_problem}")
    try:
        LeaseConfig("", "", "", lease_duration, renew_deadline, retry_period)  # validates the timing
    except ValueError as err:
        problems.append(str(err))
    if kubeconfig and (kc_problem := kubeconfig_problem(kubeconfig)):
        problems.append(f"{_named('kubeconfig', '--kubeconfig', 'KUBECONFIG', kubeconfig)}: {kc_problem}")
    try:
        parse_listen_address(listen_address)
    except ListenError as err:
        named = _named("listen_address", "--listen-address", "LOCALPV_LISTEN_ADDRESS", _quote(listen_address))
        problems.append(f"{named}: {err}")
    if problems:
        for problem in problems:
            click.echo(f"error: {_one_line(problem)}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    assert source is not None and elect is not None
    settings = ControllerSettings(
        provisioner_name=provisioner_name, workers=workers, resync_period=resync_period,
        backoff=ItemBackoff(retry_initial, retry_max), failed_provision_threshold=failed_provision_threshold,
        failed_delete_threshold=failed_delete_threshold,
    )
    options = NfsOptions(source=source, controller=settings, cluster_id=cluster_id or None, leader_election=elect,
                         namespace=election_namespace(namespace), lease_duration=lease_duration,
                         renew_deadline=renew_deadline, retry_period=retry_period)
    api_client = _api_client_or_exit(kubeconfig)
    listener = _listen_or_exit(listen_address)
    try:
        code = run(options, api_client=api_client, listener=listener,
                   limiter=rate_limiter(kube_api_qps, kube_api_burst))
    except ClusterIdUnavailable as err:
        fix = (f"set --cluster-id (or LOCALPV_CLUSTER_ID) to this cluster's id, the uid of namespace "
               f"{CLUSTER_NAMESPACE} or the id it had before a rebuild, or grant get on namespace "
               f"{CLUSTER_NAMESPACE}") if err.settable else "the provisioner needs it before it starts"
        click.echo(f"error: {_one_line(f'cannot read the cluster id: {err}; {fix}')}", err=True)
        sys.exit(CONFIG_ERROR_EXIT if err.settable else 1)
    sys.exit(code)


@cli.command("node-cleanup")
@click.option("--storageclass-names", default="", envvar="LOCALPV_STORAGECLASS_NAMES",
              help="Comma list of the StorageClasses whose PVCs and PVs may be removed (empty: none).")
@click.option("--pvc-deletion-delay", default="60s", show_default=True, callback=_duration,
              help="How long a deleted Node may take to come back before its volumes' PVCs are deleted.")
@click.option("--stale-pv-discovery-interval", default="10s", show_default=True, callback=_duration,
              help="Period of the scan that deletes unclaimed PVs of deleted Nodes.")
@click.option("--resync", default="10m", show_default=True, callback=_duration,
              help="Safety-net period of the scan for PVCs to free (a Node deletion triggers it at once).")
@click.option("--worker-threads", default=10, show_default=True, type=click.IntRange(1, 256),
              help="Concurrent PVC checks and deletions.")
@KUBECONFIG_OPTION
@click.option("--listen-address", default=":8080", show_default=True, envvar="LOCALPV_LISTEN_ADDRESS",
              help="Address for /metrics, /ready and /healthz (empty disables).")
@METRICS_PATH_OPTION
@_kube_api_rate_options(CONTROLLER_RATE)
def node_cleanup(storageclass_names: str, pvc_deletion_delay: float, stale_pv_discovery_interval: float,
                 resync: float, worker_threads: int, kubeconfig: str | None, listen_address: str,
                 metrics_path: str, kube_api_qps: float, kube_api_burst: int) -> None:
    """Remove PVCs and PVs pinned to deleted Nodes (opt-in per StorageClass; data is never touched)."""
    from localpv.agent.nodecleanup import (
        NodeCleanupController,
        NodeCleanupError,
        NodeCleanupOptions,
        parse_class_names,
    )
    from localpv.httpserver import StatusServer
    from localpv.kube.api import KubeApi
    from localpv.metrics import NodeCleanupMetrics

    options = NodeCleanupOptions(parse_class_names(storageclass_names), pvc_deletion_delay,
                                 stale_pv_discovery_interval, resync, worker_threads)
    api_client = _api_client_or_exit(kubeconfig)
    listener = _listen_or_exit(listen_address) if listen_address else None
    metrics = NodeCleanupMetrics()
    try:
        api = KubeApi(api_client, observer=metrics.api.observe, user_agent="localpv-node-cleanup",
                      limiter=rate_limiter(kube_api_qps, kube_api_burst))
        controller = NodeCleanupController(api, options, metrics=metrics)
    except (ValueError, OSError) as err:
        click.echo(f"error: {_one_line(str(err))}", err=True)
        sys.exit(1)
    server = StatusServer(listener, metrics.registry, ready=controller.ready, healthy=controller.healthy,
                          metrics_path=metrics_path) if listener is not None else None
    if server is not None:
        server.start()
    try:
        controller.start()
        _wait_for_signal()
    except NodeCleanupError as err:
        click.echo(f"error: {_one_line(str(err))}", err=True)
        sys.exit(1)
    finally:
        controller.stop()
        if server is not None:
            server.stop()


def main() -> None:
    """Console-script entry point."""
    cli(obj={})

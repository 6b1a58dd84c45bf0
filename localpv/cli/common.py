"""What the commands share: options declared once, and errors a user can cause as one line.

Whatever a user can type ends in one line on stderr naming the flag (or the variable it
came from, or the configuration key), what was expected and what was found, and exit 2:
click's usage errors included (normally four lines: usage, hint, blank, error). Commands
import what they need inside their bodies, so that ``localpv --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click
from click.core import ParameterSource

from localpv.naming import (
    namespace_problem,
    node_name_problem,
    quote,
    secret_name_problem,
)

if TYPE_CHECKING:
    import socket
    from collections.abc import Callable

    from click.decorators import FC

    from localpv.config import LoadedConfig
    from localpv.kube.ratelimit import RateLimit
    from localpv.kube.transport import Transport


CONFIG_ERROR_EXIT = 2


#: Options several commands share, declared once.
CONFIG_OPTION = click.option("--config", "config_path", default="/etc/provisioner/config", show_default=True,
                             envvar="LOCALPV_CONFIG", type=click.Path(),
                             help="Mounted ConfigMap directory or YAML file.")


KUBECONFIG_OPTION = click.option("--kubeconfig", envvar="KUBECONFIG", default=None,
                                 help="Out-of-cluster kubeconfig (env KUBECONFIG).")


def kube_api_rate_options(default: RateLimit, events: RateLimit) -> Callable[[FC], FC]:
    """``--kube-api-qps`` / ``--kube-api-burst``: the process's client-side rate limit, and
    ``--event-qps`` / ``--event-burst``: the events' own (the kubelet's flag names)."""
    def decorate(f: FC) -> FC:
        f = click.option("--event-burst", default=events.burst, show_default=True, type=click.IntRange(min=1),
                         envvar="LOCALPV_EVENT_BURST", help="Events the API server may get at once above "
                                                            "--event-qps.")(f)
        f = click.option("--event-qps", default=events.qps, show_default=True, type=click.FloatRange(min=0),
                         envvar="LOCALPV_EVENT_QPS",
                         help="Events per second, on top of --kube-api-qps (0: no limit).")(f)
        f = click.option("--kube-api-burst", default=default.burst, show_default=True, type=click.IntRange(min=1),
                         envvar="LOCALPV_KUBE_API_BURST",
                         help="Requests the API server may get at once above the QPS rate.")(f)
        return click.option("--kube-api-qps", default=default.qps, show_default=True, type=click.FloatRange(min=0),
                            envvar="LOCALPV_KUBE_API_QPS",
                            help="Requests per second to the API server, all threads together (0: no limit).")(f)
    return decorate


def one_line(text: str) -> str:
    return " ".join(text.split())


class OneLineUsageError(click.ClickException):
    exit_code = CONFIG_ERROR_EXIT

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {one_line(self.format_message())}", err=True)


def as_one_line(err: click.UsageError) -> click.ClickException:
    message = err.format_message()
    param = getattr(err, "param", None)
    if isinstance(err, click.MissingParameter) and param is not None and isinstance(param.envvar, str):
        state = "set but empty" if os.environ.get(param.envvar) == "" else "not set"
        message = f"{message.rstrip('.')} (or {param.envvar}, which is {state})"
    return OneLineUsageError(message)


def named(name: str, flag: str, envvar: str, value: str) -> str:
    """How to name a value in a message: ``--flag value``, or ``VAR=value`` when it came from there."""
    ctx = click.get_current_context()
    if ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT:
        return f"{envvar}={value}"
    return f"{flag} {value}"


def refuse(named: str, problem: str) -> NoReturn:
    """Exit 2 with one line: the flag and its value, what was expected, what was found."""
    click.echo(f"error: {one_line(f'{named}: {problem}')}", err=True)
    sys.exit(CONFIG_ERROR_EXIT)


def bad_parameter(ctx: click.Context, param: click.Parameter, value: object, problem: str) -> click.BadParameter:
    """A callback's error; it names the variable too when the value came from one.

    (Callbacks run before click records where a value came from: a variable that is set
    to the very value is taken as its source.)
    """
    hint = None
    envvar = param.envvar if isinstance(param.envvar, str) else None
    if envvar and isinstance(value, str) and value and os.environ.get(envvar) == value:
        hint = f"{param.get_error_hint(ctx)} (from {envvar})"
    return click.BadParameter(problem, ctx=ctx, param=param, param_hint=hint)


def node_name_param(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--node``: a Node name; doctor's optional one may be left out (None or empty)."""
    if value is None or (value == "" and not param.required):
        return None
    problem = node_name_problem(value)
    if problem is not None:
        raise bad_parameter(ctx, param, value, problem)
    return value


def namespace_param(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    problem = namespace_problem(value)
    if problem is not None:
        raise bad_parameter(ctx, param, value, problem)
    return value


def secret_names_param(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    """A comma-separated list of Secret names (none when unset or empty)."""
    if not value:
        return ()
    names = tuple(name.strip() for name in value.split(","))
    for name in names:
        problem = secret_name_problem(name)
        if problem is not None:
            raise bad_parameter(ctx, param, value, problem)
    return names


def duration_param(ctx: click.Context, param: click.Parameter, value: str) -> float:
    """A Go duration ("10s", "1h30m"): positive, and short enough for a thread to wait on."""
    import threading

    from localpv.config import format_go_duration, parse_go_duration

    try:
        seconds = parse_go_duration(value)
    except ValueError as err:
        raise bad_parameter(ctx, param, value, str(err)) from err
    if not seconds > 0:
        raise bad_parameter(ctx, param, value, f'expected a positive duration such as "10s", found {quote(value)}')
    if not seconds <= threading.TIMEOUT_MAX:
        longest = format_go_duration(threading.TIMEOUT_MAX)
        raise bad_parameter(ctx, param, value, f"expected a duration of at most {longest}, found {quote(value)}")
    return seconds


def url_path_param(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An HTTP path: without its leading "/" no request would ever match it, and the metrics
    would silently be served nowhere."""
    if not value.startswith("/") or any(c.isspace() or c in "?#" for c in value):
        raise bad_parameter(ctx, param, value, f'expected a URL path starting with "/", such as /metrics, '
                                                f"found {quote(value)}")
    return value


METRICS_PATH_OPTION = click.option(
    "--metrics-path", default="/metrics", show_default=True, callback=url_path_param,
    help="URL path of the Prometheus metrics.")


def api_client_or_exit(kubeconfig: str | None, **kwargs: Any) -> Transport:
    """The transport to the cluster (:func:`~localpv.kube.client.make_api_client`), or exit 2
    with one line naming --kubeconfig (or KUBECONFIG)."""
    from localpv.kube.client import ClientConfigError, make_api_client

    try:
        return make_api_client(kubeconfig, **kwargs)
    except ClientConfigError as err:
        if err.kubeconfig is not None:
            refuse(named("kubeconfig", "--kubeconfig", "KUBECONFIG", err.kubeconfig), err.problem)
        click.echo(f"error: {one_line(str(err))}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)


def listen_or_exit(address: str) -> socket.socket:
    """Listen on ``--listen-address`` now: a bad address or a port in use is one line, exit 2."""
    from localpv.httpserver import ListenError, bind_listener

    try:
        return bind_listener(address)
    except ListenError as err:
        refuse(named("listen_address", "--listen-address", "LOCALPV_LISTEN_ADDRESS", quote(address)), str(err))


def load_config_or_exit(path: str, *, strict: bool = False, dash_is_stdin: bool = False) -> LoadedConfig:
    """Load the configuration; on problems print each (with typo hints), one line each, and exit 2.

    Warnings of a valid configuration go to stderr too: they are usually typos. With
    ``dash_is_stdin``, ``-`` reads one file's content from standard input.
    """
    from localpv.config import ConfigError, load_config

    try:
        loaded = load_config(sys.stdin.buffer if dash_is_stdin and path == "-" else path, strict=strict)
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"error: {one_line(problem)}", err=True)
        for warning in err.warnings:
            click.echo(f"warning: {one_line(warning)}", err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    for warning in loaded.warnings:
        click.echo(f"warning: {warning}", err=True)
    return loaded


def agent_url_param(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--agent-url``: an http(s) URL with a host (and a valid port, if any)."""
    from urllib.parse import urlsplit

    example = "a URL such as http://127.0.0.1:8080"
    try:
        parts = urlsplit(value)
        _ = parts.port  # parsing it is the check
    except ValueError as err:
        raise bad_parameter(ctx, param, value,
                             f"expected {example} (a port 0-65535), found {quote(value)}: {err}") from err
    if parts.scheme not in ("http", "https"):
        found = f"scheme {quote(parts.scheme)}" if parts.scheme else f"{quote(value)}, which has no scheme"
        raise bad_parameter(ctx, param, value, f"expected {example} (http:// or https://), found {found}")
    if not parts.hostname:
        raise bad_parameter(ctx, param, value, f"expected {example} (with a host), found {quote(value)}, with none")
    return value

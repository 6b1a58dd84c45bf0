"""gRPC services on a unix socket, wired by hand from typed handlers.

The kubelet talks to a node plugin over gRPC on unix sockets: the registration socket and
the CSI socket. This module is the one place that touches grpcio's server API, so the
servicers (:mod:`localpv.csi.identity`, :mod:`localpv.csi.node`,
:mod:`localpv.csi.registration`) are plain typed methods from a request message to a
response message, and tests call them over a real socket with a real client.

Why by hand rather than a generated ``_pb2_grpc`` module: that module is untyped, and the
method table below is all it would add.

Failure policy: a servicer raises :class:`RpcError` with a gRPC status code and a message
that says what is wrong and what to do (the kubelet shows it in the pod's events);
anything else is a bug, logged with its traceback and answered ``INTERNAL``, never a
crashed server thread.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

log = logging.getLogger(__name__)

#: Called after every call: (full method name, status code name, seconds).
CallObserver = Callable[[str, str, float], None]


class RpcError(Exception):
    """A refusal with its gRPC status (``NOT_FOUND``, ``FAILED_PRECONDITION``...)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Method:
    """One unary method: its request type and what answers it."""

    request: type[Message]
    handler: Callable[[Any], Message]


def _behaviour(full_name: str, method: Method, observer: CallObserver | None) -> Callable[[Any, Any], Message]:
    def call(request: Message, context: grpc.ServicerContext) -> Message:
        started = time.monotonic()
        code = grpc.StatusCode.OK
        try:
            return method.handler(request)
        except RpcError as err:
            code = err.code
            log.warning("%s: %s: %s", full_name, err.code.name, err.message)
            context.abort(err.code, err.message)
        except Exception as err:  # a bug: one failed call, not a dead server
            code = grpc.StatusCode.INTERNAL
            log.exception("%s failed", full_name)
            context.abort(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
        finally:
            seconds = time.monotonic() - started
            log.debug("%s: %s in %.3fs", full_name, code.name, seconds)
            if observer is not None:
                observer(full_name, code.name, seconds)
        raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises

    return call


def service(name: str, methods: Mapping[str, Method], observer: CallObserver | None = None) -> grpc.GenericRpcHandler:
    """The handler of gRPC service ``name`` (``package.Service``) with these unary methods."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        method_name: grpc.unary_unary_rpc_method_handler(
            _behaviour(f"/{name}/{method_name}", method, observer),
            request_deserializer=method.request.FromString,
            response_serializer=lambda message: message.SerializeToString(),
        )
        for method_name, method in methods.items()
    }
    return grpc.method_handlers_generic_handler(name, handlers)


class SocketInUse(Exception):
    """Something that is not a socket is where the socket must go."""


def _clear_stale_socket(path: str) -> None:
    """Remove a socket left by an earlier process (the kubelet's plugin watcher expects a
    plugin to listen anew under the same name); refuse to remove anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path}: expected a unix socket or nothing, found another kind of file; "
                          "move it away")
    os.unlink(path)


class UnixServer:
    """A gRPC server listening on one unix socket, with a few worker threads."""

    def __init__(self, path: str, handlers: list[grpc.GenericRpcHandler], *, workers: int = 4) -> None:
        self.path = path
        self._handlers = handlers
        self._workers = workers
        self._server: grpc.Server | None = None

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        _clear_stale_socket(self.path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers,
                                                        thread_name_prefix=f"grpc-{os.path.basename(self.path)}"),
                             handlers=self._handlers)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        log.info("serving gRPC on unix://%s", self.path)

    def stop(self, grace: float = 2.0) -> None:
        """Stop serving and remove the socket, so the kubelet sees the plugin go."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(grace + 1)
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def serving(self) -> bool:
        return self._server is not None and os.path.exists(self.path)


def unary_call(channel: grpc.Channel, full_name: str, request: Message, response: type[Message],
               timeout: float = 10.0) -> Message:
    """Call one unary method (tests, benchmarks and the registration self-check use it)."""
    stub: grpc.UnaryUnaryMultiCallable[Message, Message] = channel.unary_unary(
        full_name, request_serializer=lambda m: m.SerializeToString(), response_deserializer=response.FromString)
    result: Message = stub(request, timeout=timeout)
    return result

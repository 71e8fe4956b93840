"""grpc.aio server plumbing shared by every service.

- `build_server` adds server reflection and grpc.health.v1 and binds loopback.
- `map_errors` wraps every RPC of a servicer so that domain errors become a
  gRPC status with details (errors.to_status) in exactly one place, and checks
  every string of every request first (kestrel.validation.check_strings: no
  control characters, bounded length), so a new RPC is covered without a line.
- `completes` runs work that must not stop half-way (a decision between its commit
  and its announcement) to its end although the RPC awaiting it is cancelled.
- `Server` installs `DecodeGuard`: a request that does not parse as its message
  (garbage bytes, invalid UTF-8 in a string field) answers INVALID_ARGUMENT
  instead of grpc's UNKNOWN "Unexpected <class DecodeError>".
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from kestrel import reflection
from kestrel.errors import InvalidArgument, KestrelError, to_status, transient
from kestrel.validation import check_strings
from kestrel_sdk.tls import Tls

log = logging.getLogger("kestrel.grpc")

T = TypeVar("T")


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    status = rpc_status.to_status(to_status(exc))
    await context.abort(status.code, status.details, status.trailing_metadata)


_finishing: set[asyncio.Future[Any]] = set()  # work left running by cancelled RPCs


async def completes(work: Awaitable[T]) -> T:
    """Await `work` and run it to its end even if this RPC is cancelled meanwhile (the
    client's deadline passed, it hung up): grpc.aio cancels the handler's task, which
    would cut a decision between its commit and what must follow it (its hold in
    memory, its announcement). The caller still sees its status; the work finishes in
    the background and a failure then is logged."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _finishing.add(task)
        task.add_done_callback(_finished)
        raise


def _finished(task: asyncio.Future[Any]) -> None:
    _finishing.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("work of a cancelled rpc failed after it: %s", task.exception())


def request_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and isinstance(value, str):
            return value[:64]
    return uuid.uuid4().hex[:16]


def log_failure(name: str, rid: str, exc: Exception) -> None:
    """One line per failed call (or per failed item of a batch call): a domain error as
    the status it becomes, a store away once without a traceback, anything else with
    its traceback."""
    if isinstance(exc, KestrelError):
        log.info("rpc %s request_id=%s -> %s: %s", name, rid, exc.code.name, exc.message)
    elif transient(exc):  # a store away: said once, without a traceback per call
        log.warning("rpc %s request_id=%s -> UNAVAILABLE: %s: %s", name, rid,
                    type(exc).__name__, exc)
    else:
        log.error("rpc %s request_id=%s failed", name, rid, exc_info=exc)


def _wrap_unary(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        rid = request_id(context)
        try:
            check_strings(request)
            return await fn(self, request, context)
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception as exc:
            log_failure(name, rid, exc)
            await abort_with(context, exc)
        return None  # unreachable: abort raises

    return wrapper


def _wrap_stream(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        rid = request_id(context)
        try:
            check_strings(request)
            async for item in fn(self, request, context):
                yield item
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception as exc:
            log_failure(name, rid, exc)
            await abort_with(context, exc)

    return wrapper


def map_errors(cls: type[T]) -> type[T]:
    """Class decorator: every public async method (an RPC) maps domain errors once."""
    for name, member in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        if inspect.isasyncgenfunction(member):
            setattr(cls, name, _wrap_stream(name, member))
        elif inspect.iscoroutinefunction(member):
            setattr(cls, name, _wrap_unary(name, member))
    return cls


class Undecodable:
    """What a guarded deserializer returns for bytes that are not the request message."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    @property
    def sentence(self) -> str:
        return f"request could not be decoded: {self.error}"[:500]


def lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A deserializer that never raises: a failure comes back as an `Undecodable`."""
    if deserializer is None:
        return None
    parse = deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, and whatever a parser may raise
            return Undecodable(exc)

    return deserialize


async def _reject(name: str, bad: Undecodable,
                  context: grpc.aio.ServicerContext[Any, Any]) -> None:
    log.info("rpc %s request_id=%s -> INVALID_ARGUMENT: %s", name, request_id(context),
             bad.sentence)
    await abort_with(context, InvalidArgument([], message=bad.sentence))


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Answers INVALID_ARGUMENT for a request that does not decode, for every unary-request
    method of the server (Kestrel's, health's); grpc's own answer would be UNKNOWN."""

    def __init__(self) -> None:
        # Registered handlers are fixed: each is guarded once, not on every call.
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        name = handler_call_details.method
        cached = self._guarded.get(name)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = self._guard(name, handler)
        self._guarded[name] = (handler, guarded)
        return guarded

    @staticmethod
    def _guard(name: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.unary_unary is not None:
            unary = handler.unary_unary
            if not inspect.iscoroutinefunction(unary):
                return handler

            async def guarded_unary(request: Any,
                                    context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, Undecodable):
                    await _reject(name, request, context)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                guarded_unary, lenient(handler.request_deserializer),
                handler.response_serializer)
        stream = handler.unary_stream
        if inspect.isasyncgenfunction(stream):
            async def guarded_gen(request: Any,
                                  context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, Undecodable):
                    await _reject(name, request, context)
                async for item in stream(request, context):
                    yield item

            behaviour: Callable[..., Any] = guarded_gen
        elif inspect.iscoroutinefunction(stream):
            async def guarded_writer(request: Any,
                                     context: grpc.aio.ServicerContext[Any, Any]) -> None:
                if isinstance(request, Undecodable):
                    await _reject(name, request, context)
                await stream(request, context)

            behaviour = guarded_writer
        else:
            return handler
        return grpc.unary_stream_rpc_method_handler(
            behaviour, lenient(handler.request_deserializer), handler.response_serializer)


class Server:
    """A grpc.aio server with reflection and health, bound to host:port."""

    def __init__(self, host: str, port: int, service_names: Iterable[str],
                 interceptors: Iterable[grpc.aio.ServerInterceptor] = ()) -> None:
        # Extra interceptors (kestrel.metrics.GrpcMetrics) run outside DecodeGuard.
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)],
                                      interceptors=[*interceptors, DecodeGuard()])
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names = list(service_names)
        reflection.enable([*self.service_names, health.SERVICE_NAME], self.server)
        tls = Tls.from_env()  # KESTREL_TLS_*: TLS, mutual when a CA is given
        self.tls = tls.serving
        self.port = (self.server.add_secure_port(f"{host}:{port}", tls.server_credentials())
                     if tls.serving else self.server.add_insecure_port(f"{host}:{port}"))
        self.address = f"{host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)

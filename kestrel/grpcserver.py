"""grpc.aio server plumbing shared by every service.

- `build_server` adds server reflection and grpc.health.v1 and binds loopback.
- `map_errors` wraps every RPC of a servicer so that domain errors become a
  gRPC status with details (errors.to_status) in exactly one place.
"""

from __future__ import annotations

import functools
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from kestrel.errors import KestrelError, to_status

log = logging.getLogger("kestrel.grpc")

T = TypeVar("T")


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    status = rpc_status.to_status(to_status(exc))
    await context.abort(status.code, status.details, status.trailing_metadata)


def _request_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and isinstance(value, str):
            return value[:64]
    return uuid.uuid4().hex[:16]


def _wrap_unary(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        rid = _request_id(context)
        try:
            return await fn(self, request, context)
        except KestrelError as exc:
            log.info("rpc %s request_id=%s -> %s: %s", name, rid, exc.code.name, exc.message)
            await abort_with(context, exc)
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception as exc:
            log.exception("rpc %s request_id=%s failed", name, rid)
            await abort_with(context, exc)
        return None  # unreachable: abort raises

    return wrapper


def _wrap_stream(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        rid = _request_id(context)
        try:
            async for item in fn(self, request, context):
                yield item
        except KestrelError as exc:
            log.info("rpc %s request_id=%s -> %s: %s", name, rid, exc.code.name, exc.message)
            await abort_with(context, exc)
        except (grpc.aio.AbortError, grpc.aio.UsageError):
            raise
        except Exception as exc:
            log.exception("rpc %s request_id=%s failed", name, rid)
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


class Server:
    """A grpc.aio server with reflection and health, bound to host:port."""

    def __init__(self, host: str, port: int, service_names: Iterable[str]) -> None:
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names = list(service_names)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        self.address = f"{host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float) -> None:
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)

"""Prometheus figures every service exports the same way.

Names follow Prometheus' conventions: the unit in the name (`_seconds`,
`_messages`), counters end in `_total`, labels are bounded (a service's RPC
method, a stream and its durable consumer; never a job id).

- `GrpcMetrics`: a grpc.aio interceptor counting handled RPCs by method and status
  code (`kestrel_grpc_server_handled_total`) with their latency
  (`kestrel_grpc_server_handling_seconds`).
- `watch_consumers`: how many messages each durable JetStream consumer of the
  service has not yet acknowledged (`kestrel_consumer_pending_messages`), read
  from JetStream's own consumer info every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger("kestrel.metrics")

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class GrpcMetrics(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts and times every unary RPC of the server it is installed on."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.handled = Counter("kestrel_grpc_server_handled_total",
                               "RPCs completed, by method and gRPC status code",
                               ["method", "code"], registry=registry)
        self.latency = Histogram("kestrel_grpc_server_handling_seconds",
                                 "Time to answer an RPC, by method", ["method"],
                                 buckets=LATENCY_BUCKETS, registry=registry)
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None \
                or not inspect.iscoroutinefunction(handler.unary_unary):
            return handler
        full = handler_call_details.method
        cached = self._wrapped.get(full)
        if cached is not None and cached[0] is handler:
            return cached[1]
        method = full.rsplit("/", 1)[-1]  # "/kestrel.v1.Gateway/SubmitJob" -> SubmitJob
        unary = handler.unary_unary

        async def timed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            t0 = time.perf_counter()
            code = "OK"
            try:
                return await unary(request, context)
            except grpc.aio.AbortError:
                got = context.code()
                code = got.name if isinstance(got, grpc.StatusCode) else "UNKNOWN"
                raise
            except Exception:
                code = "UNKNOWN"
                raise
            finally:
                self.handled.labels(method, code).inc()
                self.latency.labels(method).observe(time.perf_counter() - t0)

        wrapped = grpc.unary_unary_rpc_method_handler(
            timed, handler.request_deserializer, handler.response_serializer)
        self._wrapped[full] = (handler, wrapped)
        return wrapped


def consumer_pending_gauge(registry: CollectorRegistry) -> Gauge:
    return Gauge("kestrel_consumer_pending_messages",
                 "Messages of a stream a durable consumer has not acknowledged yet "
                 "(not delivered plus delivered and unacknowledged)",
                 ["stream", "consumer"], registry=registry)


async def watch_consumers(js: JetStreamContext, gauge: Gauge,
                          consumers: Sequence[tuple[str, str]], stop: asyncio.Event,
                          every_s: float = 5.0) -> None:
    """Set `gauge` for each (stream, durable) from JetStream's consumer info until stop,
    every `every_s` (Prometheus scrapes every 5 s; each info is a JetStream API call and
    an advisory, 1.5 a second each across three services at the 2 s this was)."""
    while not stop.is_set():
        for stream, durable in consumers:
            try:
                info = await js.consumer_info(stream, durable)
                gauge.labels(stream, durable).set(info.num_pending + info.num_ack_pending)
            except Exception as exc:  # not created yet, or NATS away: the next round
                log.debug("consumer info %s/%s: %s", stream, durable, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every_s)

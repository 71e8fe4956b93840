"""Transport: the OpenAI-compatible HTTP API of the gateway, on Starlette under uvicorn,
in the gateway's own process and event loop.

    POST /v1/embeddings      embed texts on one of the caller's endpoints
    GET  /v1/models          the caller's endpoints, as OpenAI models
    GET  /v1/models/<name>   one of them
    GET  /healthz            200 while the process serves (probes)

Each request authenticates as a gRPC call does (Callers: `Authorization: Bearer <key>`,
one token of the tenant's rate limit), and an embeddings request then goes through
`Inference.infer`, the very path of gRPC Infer (inference.py). The shapes and the error
mapping are openai_wire.py's, pure. Binds loopback unless KESTREL_BIND_HOST says
otherwise; serves HTTPS when the gateway has a certificate (KESTREL_TLS_CERT_FILE and
KEY_FILE), without asking clients for one: OpenAI clients have none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kestrel.errors import FieldViolation, InvalidArgument
from kestrel.grpcserver import log_failure
from kestrel.metrics import LATENCY_BUCKETS
from kestrel.validation import check_strings
from kestrel_sdk.tls import CERT, KEY
from services.gateway import openai_wire as wire
from services.gateway.callers import Callers
from services.gateway.endpoints import Endpoints
from services.gateway.inference import Inference
from services.gateway.store import Profile

log = logging.getLogger("kestrel.gateway.http")
JSON = "application/json"
MODELS_PAGE = 500
MAX_MODELS = 10_000


class BodyTooLarge(Exception):
    pass


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.handled = Counter("kestrel_http_server_handled_total",
                               "HTTP requests answered, by route and status",
                               ["route", "status"], registry=registry)
        self.latency = Histogram("kestrel_http_server_handling_seconds",
                                 "Time to answer an HTTP request, by route", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=registry)


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given[:64] if given.isprintable() and given else uuid.uuid4().hex[:16]


def _answer(err: wire.HttpError, rid: str) -> Response:
    return Response(err.body, err.status, {**err.headers, "x-request-id": rid},
                    media_type=JSON)


async def _body(request: Request) -> bytes:
    """The request body, refused past MAX_BODY_BYTES without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > wire.MAX_BODY_BYTES:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > wire.MAX_BODY_BYTES:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class OpenAIApi:
    def __init__(self, callers: Callers, endpoints: Endpoints, inference: Inference,
                 registry: CollectorRegistry | None = None) -> None:
        self.callers = callers
        self.endpoints = endpoints
        self.inference = inference
        self.metrics = HttpMetrics(registry) if registry is not None else None
        self.app = Starlette(routes=[
            Route("/v1/embeddings", self._handler("embeddings", self.embeddings),
                  methods=["POST"]),
            Route("/v1/models", self._handler("models", self.models), methods=["GET"]),
            Route("/v1/models/{model:path}", self._handler("model", self.model),
                  methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
        ], exception_handlers={404: self._no_route, 405: self._no_method})

    def _handler(self, route: str, fn: Callable[[Request, Profile, str],
                                                 Awaitable[Response]]
                 ) -> Callable[[Request], Awaitable[Response]]:
        """Authenticate, run, map any failure once (openai_wire.error_of), count."""

        async def handle(request: Request) -> Response:
            t0 = time.perf_counter()
            rid = _request_id(request)
            try:
                tenant = await self.callers.tenant(
                    (("authorization", request.headers.get("authorization", "")),))
                resp = await fn(request, tenant, rid)
            except BodyTooLarge:
                resp = _answer(wire.HttpError(413, wire.error_body(
                    f"the body is larger than {wire.MAX_BODY_BYTES} bytes",
                    "invalid_request_error", "body_too_large"), {}), rid)
            except Exception as exc:
                log_failure(f"HTTP {request.method} {request.url.path}", rid, exc)
                resp = _answer(wire.error_of(exc, rid), rid)
            resp.headers["x-request-id"] = rid
            if self.metrics is not None:
                self.metrics.handled.labels(route, str(resp.status_code)).inc()
                self.metrics.latency.labels(route).observe(time.perf_counter() - t0)
            return resp

        return handle

    async def embeddings(self, request: Request, tenant: Profile, rid: str) -> Response:
        call = wire.parse_embeddings(await _body(request))
        priority = wire.priority_of(request.headers.get(wire.PRIORITY_HEADER))
        timeout_ms = wire.timeout_ms_of(request.headers.get(wire.TIMEOUT_HEADER))
        if wire.is_endpoint_id(call.model):
            endpoint_id = call.model
        else:
            endpoint_id = (await self.endpoints.named(tenant.tenant, call.model)).endpoint_id
        request_pb = wire.infer_request(call, endpoint_id, priority, timeout_ms)
        check_strings(request_pb)  # as map_errors does for every gRPC request
        resp = await self.inference.infer(tenant, request_pb, None)
        headers = {"x-kestrel-replica": resp.replica,
                   "x-kestrel-queue-ms": f"{resp.queue_ms:.1f}"}
        if resp.truncated:
            headers["x-kestrel-truncated"] = ",".join(str(i) for i in resp.truncated)
        return Response(wire.embeddings_body(call, resp), 200, headers, media_type=JSON)

    async def models(self, request: Request, tenant: Profile, rid: str) -> Response:
        entries: list[dict[str, Any]] = []
        after = 0
        while len(entries) < MAX_MODELS:
            rows = await self.endpoints.store.live(tenant.tenant, after, MODELS_PAGE)
            entries += [wire.model_entry(r.name, r.created_us, r.tenant) for r in rows]
            if len(rows) < MODELS_PAGE:
                break
            after = rows[-1].seq
        return Response(wire.models_body(entries), 200, media_type=JSON)

    async def model(self, request: Request, tenant: Profile, rid: str) -> Response:
        name = request.path_params["model"]
        if (problem := wire.model_problem(name)) is not None:
            raise InvalidArgument([FieldViolation("model", problem)])
        if wire.is_endpoint_id(name):
            row = await self.endpoints.get(tenant.tenant, name, cached=True)
        else:
            row = await self.endpoints.named(tenant.tenant, name)
        return Response(wire.model_json(row.name, row.created_us, row.tenant), 200,
                        media_type=JSON)

    async def healthz(self, request: Request) -> Response:
        return Response(b'{"status":"ok"}', 200, media_type=JSON)

    async def _no_route(self, request: Request, exc: Exception) -> Response:
        return _answer(wire.not_found_route(request.url.path), _request_id(request))

    async def _no_method(self, request: Request, exc: Exception) -> Response:
        headers = exc.headers if isinstance(exc, HTTPException) and exc.headers else {}
        allowed = next((v for k, v in headers.items() if k.lower() == "allow"), "")
        return _answer(wire.method_not_allowed(request.method, request.url.path, allowed),
                       _request_id(request))


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the gateway process owns SIGTERM and SIGINT
    (kestrel.service.stop_event_on_signals) and stops this server itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpListener:
    """The API served on host:port until `stop()`; port 0 disables it. A port another
    process holds does not stop the gateway (as /metrics): it serves gRPC alone and
    says so."""

    def __init__(self, api: OpenAIApi, host: str, port: int,
                 env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        cert, key = env.get(CERT, ""), env.get(KEY, "")
        self.tls = bool(cert and key)
        self.config = uvicorn.Config(
            api.app, host=host, port=port, http="httptools", loop="none", lifespan="off",
            access_log=False, log_level="warning", server_header=False,
            timeout_graceful_shutdown=5, ssl_certfile=cert or None, ssl_keyfile=key or None)
        self.server = _Server(self.config)
        self.port = port
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.port <= 0:
            return
        try:  # bound here: uvicorn's own bind would sys.exit the process on failure
            sock = socket.create_server((self.config.host, self.port), reuse_port=False)
        except OSError as exc:
            log.error("no OpenAI-compatible API: cannot listen on %s:%d (%s)",
                      self.config.host, self.port, exc)
            return
        sock.set_inheritable(True)
        self._task = asyncio.create_task(self.server.serve(sockets=[sock]))
        while not self.server.started:
            if self._task.done():
                await self._task
                raise OSError(f"the HTTP listener on {self.config.host}:{self.port} did "
                              "not start")
            await asyncio.sleep(0.01)
        log.info("gateway serving the OpenAI-compatible API on %s://%s:%d/v1",
                 "https" if self.tls else "http", self.config.host, self.port)

    async def stop(self) -> None:
        if self._task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self._task

"""Issue 10, pure: the generic string checks over every RPC of every Kestrel service,
their application by map_errors, undecodable requests, the downstream mapping and the
rate limiter's refusal when Redis is saturated. No I/O."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import asyncpg
import grpc
import nats.errors
import nats.js.errors
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2
from grpc_status import rpc_status
from redis.asyncio import BlockingConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError

from kestrel.errors import (
    FieldViolation,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    details_of,
    to_status,
)
from kestrel.grpcserver import DecodeGuard, Undecodable, lenient
from kestrel.validation import DEFAULT_MAX_CHARS, check_strings, string_violations
from kestrel_sdk.v1 import admission_pb2, gateway_pb2, meter_pb2, placer_pb2, replicas_pb2
from services.admission.servicer import AdmissionServicer
from services.gateway import ratelimit
from services.gateway.replicas_servicer import ReplicasServicer
from services.gateway.servicer import GatewayServicer
from services.gateway.upstream import downstream
from services.meter.servicer import MeterServicer
from services.placer.servicer import PlacerServicer

SERVICES: list[tuple[ServiceDescriptor, type]] = [
    (gateway_pb2.DESCRIPTOR.services_by_name["Gateway"], GatewayServicer),
    (meter_pb2.DESCRIPTOR.services_by_name["Meter"], MeterServicer),
    (admission_pb2.DESCRIPTOR.services_by_name["Admission"], AdmissionServicer),
    (placer_pb2.DESCRIPTOR.services_by_name["Placer"], PlacerServicer),
    (replicas_pb2.DESCRIPTOR.services_by_name["Replicas"], ReplicasServicer),
]


def _new(desc: Descriptor) -> Message:
    msg: Message = message_factory.GetMessageClass(desc)()
    return msg


def nul_cases(desc: Descriptor, depth: int = 0) -> Iterator[tuple[str, Message]]:
    """For every string reachable in `desc` (nested, repeated, map keys and values): the
    field path the checks must report, and a message with a NUL in just that string."""
    if depth > 5:
        return
    for fd in desc.fields:
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            key_fd, value_fd = entry.fields_by_name["key"], entry.fields_by_name["value"]
            if key_fd.type == FieldDescriptor.TYPE_STRING:
                m = _new(desc)
                container: Any = getattr(m, fd.name)
                if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    container["k\x00"].SetInParent()
                else:
                    container["k\x00"] = _default(value_fd)
                yield f"{fd.name}['k\\x00']", m
            if value_fd.type == FieldDescriptor.TYPE_STRING:
                m = _new(desc)
                getattr(m, fd.name)[_key(key_fd)] = "v\x00"
                yield f"{fd.name}[{_key(key_fd)}]", m
            elif value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                assert value_fd.message_type is not None
                for sub, inner in nul_cases(value_fd.message_type, depth + 1):
                    m = _new(desc)
                    getattr(m, fd.name)[_key(key_fd)].CopyFrom(inner)
                    yield f"{fd.name}[{_key(key_fd)}].{sub}", m
        elif fd.type == FieldDescriptor.TYPE_STRING:
            m = _new(desc)
            if fd.is_repeated:
                getattr(m, fd.name).extend(["ok", "a\x00b"])
                yield f"{fd.name}[1]", m
            else:
                setattr(m, fd.name, "a\x00b")
                yield fd.name, m
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            assert entry is not None
            for sub, inner in nul_cases(entry, depth + 1):
                m = _new(desc)
                if fd.is_repeated:
                    getattr(m, fd.name).add().CopyFrom(inner)
                    yield f"{fd.name}[0].{sub}", m
                else:
                    getattr(m, fd.name).CopyFrom(inner)
                    yield f"{fd.name}.{sub}", m


def _key(fd: FieldDescriptor) -> str | int:
    return "k" if fd.type == FieldDescriptor.TYPE_STRING else 1


def _default(fd: FieldDescriptor) -> Any:
    return {FieldDescriptor.TYPE_STRING: "", FieldDescriptor.TYPE_BOOL: False}.get(fd.type, 0)


RPC_CASES = [
    (f"{service.name}.{method.name}:{path}", service, cls, method.name, path, msg)
    for service, cls in SERVICES
    for method in service.methods
    for path, msg in nul_cases(method.input_type)
]


def test_the_table_covers_every_service_and_the_strings_that_matter() -> None:
    names = {case[0] for case in RPC_CASES}
    for expected in ("Gateway.TopUp:note", "Gateway.TopUp:top_up_id", "Meter.TopUp:note",
                     "Gateway.SubmitJob:spec.command[1]", "Gateway.SubmitJob:spec.labels[k]",
                     "Gateway.SubmitJob:spec.labels['k\\x00']",
                     "Admission.Admit:job.spec.name", "Placer.EnsureTenant:quota[0].flavor",
                     "Gateway.CreateTenant:tenant.gpu_quota['k\\x00']"):
        assert expected in names


@pytest.mark.parametrize(("name", "path", "msg"), [(c[0], c[4], c[5]) for c in RPC_CASES],
                         ids=[c[0] for c in RPC_CASES])
def test_a_nul_in_any_string_of_any_request_is_named(name: str, path: str,
                                                     msg: Message) -> None:
    violations = string_violations(msg)
    assert [v.field for v in violations] == [path], name
    assert "control characters" in violations[0].description


class AbortCalled(grpc.aio.AbortError):  # type: ignore[misc]
    pass


class FakeContext:
    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str, Any] | None = None

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing: Any = ()) -> None:
        self.aborted = (code, details, trailing)
        raise AbortCalled()


@pytest.mark.parametrize(("name", "cls", "method", "path", "msg"),
                         [(c[0], c[2], c[3], c[4], c[5]) for c in RPC_CASES],
                         ids=[c[0] for c in RPC_CASES])
async def test_every_rpc_of_every_servicer_refuses_a_nul_before_its_body_runs(
        name: str, cls: type, method: str, path: str, msg: Message) -> None:
    servicer: Any = object.__new__(cls)  # no collaborators: the body must never be reached
    ctx = FakeContext()
    call = getattr(servicer, method)
    with pytest.raises(AbortCalled):
        result = call(msg, ctx)
        if hasattr(result, "__anext__"):
            async for _ in result:
                pass
        else:
            await result
    assert ctx.aborted is not None
    code, _, trailing = ctx.aborted
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(_Call(code, ctx.aborted[1], trailing))
    assert status is not None
    violations, _ = details_of(status)
    assert [v.field for v in violations] == [path], name


class _Call:
    """Enough of a grpc.Call for rpc_status.from_call."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: Any) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailing


def test_every_rpc_of_every_service_is_wrapped_by_map_errors() -> None:
    for service, cls in SERVICES:
        for method in service.methods:
            assert hasattr(vars(cls).get(method.name), "__wrapped__"), \
                f"{cls.__name__}.{method.name} is not wrapped by map_errors"


def test_text_may_hold_tabs_and_newlines_and_unicode_but_no_other_controls() -> None:
    ok = gateway_pb2.GatewayTopUpRequest(tenant="acme", amount="5",
                                         note="line one\n\tline two — café ✓")
    check_strings(ok)
    for bad in ("\x00", "\x1b[31m", "\r", "\x7f", "\x85", "\x08"):
        req = gateway_pb2.GatewayTopUpRequest(tenant="acme", amount="5", note=f"a{bad}b")
        assert [v.field for v in string_violations(req)] == ["note"], repr(bad)


def test_an_over_long_string_is_refused_with_the_limit_in_the_sentence() -> None:
    fits = gateway_pb2.GatewayTopUpRequest(note="n" * DEFAULT_MAX_CHARS)
    assert string_violations(fits) == []
    huge = gateway_pb2.GatewayTopUpRequest(note="n" * 1_000_000, top_up_id="x" * 5000)
    with pytest.raises(InvalidArgument) as err:
        check_strings(huge)
    assert [v.field for v in err.value.violations] == ["top_up_id", "note"]
    assert f"at most {DEFAULT_MAX_CHARS} characters" in err.value.violations[1].description


# --- undecodable requests ------------------------------------------------------------------


def test_a_lenient_deserializer_returns_a_marker_instead_of_raising() -> None:
    parse = lenient(gateway_pb2.GatewayTopUpRequest.FromString)
    assert parse is not None
    assert parse(b"\x0a\x04acme").tenant == "acme"
    for raw in (b"\x0a\x02\xff\xfe", b"\xff\xff\xff\xff"):
        bad = parse(raw)
        assert isinstance(bad, Undecodable)
        assert bad.sentence.startswith("request could not be decoded: ")


async def test_the_decode_guard_answers_invalid_argument_for_unary_and_streaming() -> None:
    reached: list[object] = []

    async def unary(request: object, context: object) -> str:
        reached.append(request)
        return "ok"

    async def stream(request: object, context: object) -> Any:
        reached.append(request)
        yield "ok"

    guard = DecodeGuard()
    parse = gateway_pb2.GetJobRequest.FromString
    for handler in (grpc.unary_unary_rpc_method_handler(unary, parse),
                    grpc.unary_stream_rpc_method_handler(stream, parse)):
        async def continuation(details: object, h: Any = handler) -> Any:
            return h

        guarded = await guard.intercept_service(continuation, _Details("/x/Y"))
        assert await guard.intercept_service(continuation, _Details("/x/Y")) is guarded
        request = guarded.request_deserializer(b"\x0a\x02\xff\xfe")
        ctx = FakeContext()
        with pytest.raises(AbortCalled):
            if guarded.unary_unary is not None:
                await guarded.unary_unary(request, ctx)
            else:
                async for _ in guarded.unary_stream(request, ctx):
                    pass
        assert ctx.aborted is not None
        assert ctx.aborted[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert ctx.aborted[1].startswith("request could not be decoded: ")
        good = guarded.request_deserializer(b"\x0a\x03job")
        if guarded.unary_unary is not None:
            assert await guarded.unary_unary(good, FakeContext()) == "ok"
        else:
            assert [x async for x in guarded.unary_stream(good, FakeContext())] == ["ok"]
    assert len(reached) == 2  # only the decodable requests reached the methods


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


# --- retryable refusals and the downstream mapping -----------------------------------------


def test_unavailable_carries_retry_info_like_resource_exhausted() -> None:
    for exc in (Unavailable("busy", retry_after_s=0.5), ResourceExhausted("slow", 2.25)):
        status = to_status(exc)
        assert status.code in (code_pb2.UNAVAILABLE, code_pb2.RESOURCE_EXHAUSTED)
        _, retry = details_of(status)
        assert retry == exc.retry_after_s


@pytest.mark.parametrize("exc", [
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    ConnectionRefusedError(111, "Connect call failed"),
    TimeoutError(),
    nats.errors.ConnectionReconnectingError(),
    nats.js.errors.NoStreamResponseError()], ids=lambda e: type(e).__name__)
def test_a_store_or_the_bus_away_is_unavailable_with_retry_info_not_internal(
        exc: Exception) -> None:
    status = to_status(exc)
    assert status.code == code_pb2.UNAVAILABLE
    assert details_of(status)[1] == 1.0
    assert "retry" in status.message
    assert not str(exc) or str(exc) not in status.message  # the internals stay inside


@pytest.mark.parametrize("exc", [KeyError("x"), asyncpg.UniqueViolationError("dup"),
                                 asyncpg.InterfaceError("another operation is in progress")],
                         ids=lambda e: type(e).__name__)
def test_a_bug_or_a_constraint_is_still_internal_and_says_nothing_of_itself(
        exc: Exception) -> None:
    status = to_status(exc)
    assert (status.code, status.message) == (code_pb2.INTERNAL, "internal error")


def _rpc_error(exc: Exception) -> grpc.aio.AioRpcError:
    status = rpc_status.to_status(to_status(exc))
    return grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(),
                                grpc.aio.Metadata(*status.trailing_metadata), status.details)


def test_downstream_passes_a_backends_invalid_argument_through_with_its_fields() -> None:
    err = _rpc_error(InvalidArgument([FieldViolation("note", "must be at most 500"),
                                      FieldViolation("top_up_id", "bad id")]))
    mapped = downstream(err)
    assert isinstance(mapped, InvalidArgument)
    assert [v.field for v in mapped.violations] == ["note", "top_up_id"]
    assert mapped.message == err.details()
    bad = error_details_pb2.BadRequest()
    assert to_status(mapped).details[0].Unpack(bad)
    assert [v.field for v in bad.field_violations] == ["note", "top_up_id"]


def test_downstream_keeps_failed_precondition_and_makes_the_rest_retryable() -> None:
    from kestrel.errors import FailedPrecondition
    assert isinstance(downstream(_rpc_error(FailedPrecondition("suspended"))),
                      FailedPrecondition)
    away = downstream(_rpc_error(Unavailable("restarting", retry_after_s=3)))
    assert isinstance(away, Unavailable) and away.retry_after_s == 3
    bare = downstream(grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                           grpc.aio.Metadata(), grpc.aio.Metadata(), "slow"))
    assert isinstance(bare, Unavailable) and bare.retry_after_s > 0


class _FakeRedis:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def register_script(self, script: str) -> Any:
        async def run(keys: list[str], args: list[object]) -> Any:
            raise self.error

        return run


@pytest.mark.parametrize("error", [MaxConnectionsError("Too many connections"),
                                   RedisConnectionError("No connection available."),
                                   TimeoutError()],
                         ids=["pool-full", "no-connection-in-time", "timeout"])
async def test_a_saturated_or_absent_redis_is_unavailable_with_a_retry_delay(
        error: Exception) -> None:
    limiter = ratelimit.RateLimiter(_FakeRedis(error))  # type: ignore[arg-type]
    with pytest.raises(Unavailable) as err:
        await limiter.take("acme", 10, 10)
    assert err.value.retry_after_s > 0


def test_the_redis_pool_is_bounded_and_waits() -> None:
    client = ratelimit.connect("redis://127.0.0.1:1/0", max_connections=7, wait_s=1.5)
    pool = client.connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    assert (pool.max_connections, pool.timeout) == (7, 1.5)

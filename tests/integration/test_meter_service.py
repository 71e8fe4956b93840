"""The meter as a process: bus in, ledger and gRPC out, against real Postgres and NATS."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from decimal import Decimal

import asyncpg
import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from kestrel import bus
from kestrel_sdk.v1 import meter_pb2, meter_pb2_grpc
from kestrel_tools.procs import REPO, ServiceProcess
from tests.integration.helpers import T0, eventually, publish_events, wev

pytestmark = pytest.mark.integration


@pytest.fixture
async def meter(meter_factory: Callable[..., ServiceProcess]) -> ServiceProcess:
    return meter_factory(KESTREL_METER_TICK_S="0.2").start()


@pytest.fixture
async def stub(meter: ServiceProcess) -> AsyncIterator[meter_pb2_grpc.MeterStub]:
    async with grpc.aio.insecure_channel(meter.grpc_address) as ch:
        yield meter_pb2_grpc.MeterStub(ch)


@pytest.fixture
async def db(database: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database)
    yield conn
    await conn.close()


async def count(db: asyncpg.Connection, sql: str, *args: object) -> int:
    return int(await db.fetchval(sql, *args))


async def test_events_on_the_bus_become_exact_ledger_rows(
        meter: ServiceProcess, stub: meter_pb2_grpc.MeterStub, db: asyncpg.Connection,
        clean_bus: str) -> None:
    await stub.CreateAccount(meter_pb2.CreateAccountRequest(tenant="acme",
                                                            initial_credits="100"))
    await publish_events(clean_bus, [wev("a1", "acme", "job-1", 1, T0, gpus=4),
                                     wev("f1", "acme", "job-1", 3, T0 + 2_500_000, gpus=4)])
    rows = await eventually(lambda: db.fetch("SELECT * FROM ledger WHERE workload_id='job-1'"),
                            lambda r: len(r) == 1)
    assert [(r["gpu_us"], r["cost"]) for r in rows] == [(10_000_000, Decimal("0.01"))]
    runway = (await stub.GetRunway(meter_pb2.GetRunwayRequest(tenant="acme"))).runway
    assert (runway.credits, runway.charged, runway.remaining) == ("100", "0.01", "99.99")
    page = await stub.ListUsage(meter_pb2.ListUsageRequest(tenant="acme", workload_id="job-1"))
    assert [r.gpu_us for r in page.rows] == [10_000_000]


async def test_redelivered_events_change_nothing(
        meter: ServiceProcess, db: asyncpg.Connection, clean_bus: str) -> None:
    events = [wev(f"{k}-{i}", "acme", f"job-{i}", t, T0 + (i + (t == 3)) * 1_000_000, gpus=2)
              for i in range(50) for k, t in (("a", 1), ("s", 2), ("f", 3))]
    await publish_events(clean_bus, events)
    await eventually(lambda: count(db, "SELECT count(*) FROM ledger"), lambda n: n == 50)
    before = await db.fetch("SELECT * FROM ledger ORDER BY row_id")
    # Same event ids, new message ids: JetStream stores them again, the meter must drop them.
    await publish_events(clean_bus, events, msg_id_suffix="-redelivered")
    await eventually(lambda: count(db, "SELECT count(*) FROM workload_events"),
                     lambda n: n == 150)
    await publish_events(clean_bus, [wev("marker", "acme", "m", 1, T0)])
    await eventually(lambda: count(db, "SELECT count(*) FROM allocations WHERE workload_id='m'"),
                     lambda n: n == 1)
    after = await db.fetch("SELECT * FROM ledger WHERE workload_id <> 'm' ORDER BY row_id")
    assert [dict(r) for r in after] == [dict(r) for r in before]


async def test_a_finish_before_its_start_and_a_repeated_finish_are_metered_once(
        meter: ServiceProcess, db: asyncpg.Connection, clean_bus: str) -> None:
    await publish_events(clean_bus, [wev("f", "acme", "late", 3, T0 + 3_000_000, gpus=2)])
    await eventually(lambda: count(db, "SELECT count(*) FROM workload_events"), lambda n: n == 1)
    assert await count(db, "SELECT count(*) FROM ledger") == 0
    await publish_events(clean_bus, [wev("a", "acme", "late", 1, T0, gpus=2),
                                     wev("f-again", "acme", "late", 3, T0 + 9_000_000, gpus=2)])
    await eventually(lambda: count(db, "SELECT count(*) FROM workload_events"), lambda n: n == 3)
    assert await db.fetchval("SELECT sum(gpu_us) FROM ledger WHERE workload_id='late'") == (
        2 * 3_000_000)


async def test_an_undecodable_event_is_terminated_and_does_not_block_the_stream(
        meter: ServiceProcess, db: asyncpg.Connection, clean_bus: str) -> None:
    nc = await bus.connect(clean_bus, "t")
    js = nc.jetstream()
    await js.publish("kestrel.workload.acme.finished", b"\xff\xff not protobuf",
                     headers={bus.TYPE_HEADER: "kestrel.v1.WorkloadEvent"})
    await bus.publish(js, "kestrel.workload.acme.admitted", wev("", "acme", "x", 1, T0),
                      f"bad-{uuid.uuid4().hex}")
    await nc.drain()
    await publish_events(clean_bus, [wev("ok", "acme", "good", 1, T0)])
    assert await eventually(lambda: count(db, "SELECT count(*) FROM allocations"),
                            lambda n: n == 1) == 1
    assert await count(db, "SELECT count(*) FROM workload_events") == 1


async def test_server_reflection_lists_the_meter(meter: ServiceProcess) -> None:
    async with grpc.aio.insecure_channel(meter.grpc_address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in responses for s in r.list_services_response.service]
    assert "kestrel.v1.Meter" in names and "grpc.health.v1.Health" in names


GRPCURL = REPO / ".venv" / "bin" / "grpcurl"  # the pinned one (make grpcurl, before make test)


@pytest.mark.parametrize(("symbol", "says"), [
    pytest.param("kestrel.v1.Meter", "kestrel.v1.Meter is a service:", id="a service"),
    pytest.param("kestrel.v1.Meter.GetRunway",
                 "rpc GetRunway ( .kestrel.v1.GetRunwayRequest ) returns "
                 "( .kestrel.v1.GetRunwayResponse );", id="a method"),
    pytest.param("kestrel.v1.GetRunwayRequest", "kestrel.v1.GetRunwayRequest is a message:",
                 id="a message"),
    pytest.param("grpc.reflection.v1.ServerReflection",
                 "stream .grpc.reflection.v1.ServerReflectionRequest", id="reflection v1"),
])
def test_grpcurl_describes_what_operators_ask_for(meter: ServiceProcess, symbol: str,
                                                  says: str) -> None:
    assert GRPCURL.exists(), "build the pinned grpcurl first: make grpcurl"
    out = subprocess.run([str(GRPCURL), "-plaintext", meter.grpc_address, "describe", symbol],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert says in out.stdout


def test_an_unknown_method_is_not_found_by_reflection(meter: ServiceProcess) -> None:
    out = subprocess.run([str(GRPCURL), "-plaintext", meter.grpc_address, "describe",
                          "kestrel.v1.Meter.NoSuchMethod"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode != 0 and "Symbol not found" in out.stderr


async def test_reflection_v1_answers_as_v1alpha_does(meter: ServiceProcess) -> None:
    """Tools that speak only v1 (grpcurl tries it first; newer grpc clients) get the same
    answers: v1's messages are v1alpha's field for field."""
    async with grpc.aio.insecure_channel(meter.grpc_address) as ch:
        call = ch.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        responses = call(iter([reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="kestrel.v1.Meter.GetRunway")]))
        [r] = [r async for r in responses]
    names = {descriptor_pb2.FileDescriptorProto.FromString(b).name
             for b in r.file_descriptor_response.file_descriptor_proto}
    assert "kestrel/v1/meter.proto" in names


def violations(err: grpc.aio.AioRpcError) -> dict[str, str]:
    status = rpc_status.from_call(err)
    assert status is not None
    out: dict[str, str] = {}
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            out.update({v.field: v.description for v in bad.field_violations})
    return out


BAD = [
    ("a negative top-up", "TopUp", meter_pb2.TopUpRequest(tenant="acme", amount="-5"),
     grpc.StatusCode.INVALID_ARGUMENT, "amount"),
    ("a zero top-up", "TopUp", meter_pb2.TopUpRequest(tenant="acme", amount="0"),
     grpc.StatusCode.INVALID_ARGUMENT, "amount"),
    ("an absurd top-up", "TopUp", meter_pb2.TopUpRequest(tenant="acme", amount="1e30"),
     grpc.StatusCode.INVALID_ARGUMENT, "amount"),
    ("a top-up with too many decimals", "TopUp",
     meter_pb2.TopUpRequest(tenant="acme", amount="1.0000000001"),
     grpc.StatusCode.INVALID_ARGUMENT, "amount"),
    ("a top-up that is not a number", "TopUp", meter_pb2.TopUpRequest(tenant="acme", amount="NaN"),
     grpc.StatusCode.INVALID_ARGUMENT, "amount"),
    ("a top-up for an invalid tenant name", "TopUp",
     meter_pb2.TopUpRequest(tenant="Acme Corp!", amount="5"),
     grpc.StatusCode.INVALID_ARGUMENT, "tenant"),
    ("a top-up for an unknown tenant", "TopUp", meter_pb2.TopUpRequest(tenant="ghost", amount="5"),
     grpc.StatusCode.NOT_FOUND, None),
    ("a usage range that ends before it starts", "ListUsage",
     meter_pb2.ListUsageRequest(tenant="acme", start_us=T0 + 10, end_us=T0),
     grpc.StatusCode.INVALID_ARGUMENT, "end_us"),
    ("a usage range in seconds instead of microseconds", "ListUsage",
     meter_pb2.ListUsageRequest(tenant="acme", start_us=1_700_000_000),
     grpc.StatusCode.INVALID_ARGUMENT, "start_us"),
    ("a page token that was never issued", "ListUsage",
     meter_pb2.ListUsageRequest(tenant="acme", page_token="bm90LWEtdG9rZW4"),
     grpc.StatusCode.INVALID_ARGUMENT, "page_token"),
    ("an oversized page", "ListUsage", meter_pb2.ListUsageRequest(tenant="acme", page_size=5000),
     grpc.StatusCode.INVALID_ARGUMENT, "page_size"),
    ("the runway of an unknown tenant", "GetRunway", meter_pb2.GetRunwayRequest(tenant="ghost"),
     grpc.StatusCode.NOT_FOUND, None),
    ("a zero adjustment", "Adjust",
     meter_pb2.AdjustRequest(tenant="acme", amount="0", note="typo"),
     grpc.StatusCode.INVALID_ARGUMENT, "amount"),
    ("an adjustment that says not why", "Adjust",
     meter_pb2.AdjustRequest(tenant="acme", amount="-5"),
     grpc.StatusCode.INVALID_ARGUMENT, "note"),
    ("a negative price", "SetPrice",
     meter_pb2.SetPriceRequest(flavor="gpu-h100", price_per_gpu_s="-1"),
     grpc.StatusCode.INVALID_ARGUMENT, "price_per_gpu_s"),
]


@pytest.mark.parametrize(("name", "method", "request_", "code", "field"), BAD,
                         ids=[b[0] for b in BAD])
async def test_bad_input_answers_a_clear_status_and_writes_nothing(
        stub: meter_pb2_grpc.MeterStub, db: asyncpg.Connection, name: str, method: str,
        request_: object, code: grpc.StatusCode, field: str | None) -> None:
    await stub.CreateAccount(meter_pb2.CreateAccountRequest(tenant="acme", initial_credits="10"))
    tables = ("credits", "prices", "tenants", "ledger")
    before = [await count(db, f"SELECT count(*) FROM {t}") for t in tables]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await getattr(stub, method)(request_)
    assert err.value.code() == code
    if field:
        assert field in violations(err.value)
    assert [await count(db, f"SELECT count(*) FROM {t}") for t in tables] == before


async def test_a_top_up_with_the_same_id_applies_once(stub: meter_pb2_grpc.MeterStub) -> None:
    await stub.CreateAccount(meter_pb2.CreateAccountRequest(tenant="acme"))
    first = await stub.TopUp(meter_pb2.TopUpRequest(tenant="acme", amount="5", top_up_id="x1"))
    again = await stub.TopUp(meter_pb2.TopUpRequest(tenant="acme", amount="5", top_up_id="x1"))
    assert (first.applied, again.applied) == (True, False)
    assert again.runway.credits == "5"


async def test_usage_pages_cover_every_row_once(
        meter: ServiceProcess, stub: meter_pb2_grpc.MeterStub, db: asyncpg.Connection,
        clean_bus: str) -> None:
    await publish_events(clean_bus, [
        e for i in range(25) for e in (wev(f"a{i}", "acme", f"j{i}", 1, T0 + i),
                                       wev(f"f{i}", "acme", f"j{i}", 3, T0 + i + 1000))])
    await eventually(lambda: count(db, "SELECT count(*) FROM allocations WHERE status = 2"),
                     lambda n: n == 25)
    ids: list[int] = []
    token = ""
    while True:
        page = await stub.ListUsage(meter_pb2.ListUsageRequest(
            tenant="acme", page_size=7, page_token=token))
        assert len(page.rows) <= 7
        ids += [r.row_id for r in page.rows]
        token = page.next_page_token
        if not token:
            break
    in_ledger = [r["row_id"] for r in await db.fetch(
        "SELECT row_id FROM ledger WHERE tenant = 'acme' ORDER BY row_id")]
    assert ids == in_ledger and len(ids) >= 25


async def test_an_adjustment_below_what_is_spent_leaves_the_budget_negative_and_is_published(
        meter: ServiceProcess, stub: meter_pb2_grpc.MeterStub, db: asyncpg.Connection,
        clean_bus: str) -> None:
    await stub.CreateAccount(meter_pb2.CreateAccountRequest(tenant="acme",
                                                            initial_credits="10"))
    await publish_events(clean_bus, [wev("a", "acme", "j", 1, T0, gpus=1),
                                     wev("f", "acme", "j", 3, T0 + 2_000_000_000, gpus=1)])
    await eventually(lambda: count(db, "SELECT count(*) FROM ledger"), lambda n: n == 1)
    resp = await stub.Adjust(meter_pb2.AdjustRequest(tenant="acme", amount="-9.5",
                                                     adjust_id="cut-1", note="budget cut"))
    again = await stub.Adjust(meter_pb2.AdjustRequest(tenant="acme", amount="-9.5",
                                                      adjust_id="cut-1", note="budget cut"))
    assert (resp.applied, again.applied) == (True, False)
    assert (resp.runway.credits, resp.runway.charged, resp.runway.remaining) == (
        "0.5", "2", "-1.5")
    rows = await db.fetch("SELECT kind, amount FROM credits ORDER BY credit_id")
    assert [(r["kind"], r["amount"]) for r in rows] == [("top_up", Decimal("10")),
                                                        ("adjustment", Decimal("-9.5"))]

"""Bad input gets a clear status and loses nothing; a restarted admission loses nothing."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable

import asyncpg
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from kestrel import bus
from kestrel_sdk.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.conftest import OPERATOR_TOKEN, Plane

pytestmark = pytest.mark.integration
Md = tuple[tuple[str, str], ...]
OP: Md = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)
TABLES = ("jobs", "job_transitions", "reservations", "api_keys", "tenant_profiles", "credits")


async def setup_tenant(stub: gateway_pb2_grpc.GatewayStub, name: str, credits: str) -> Md:
    await stub.CreateTenant(gateway_pb2.CreateTenantRequest(
        tenant=gateway_pb2.Tenant(tenant=name, gpu_quota={"gpu-h100": 8, "gpu-a10": 8},
                                  rate_limit=gateway_pb2.RateLimit(per_s=1000, burst=1000)),
        initial_credits=credits), metadata=OP)
    key = await stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(tenant=name, name="k"),
                                  metadata=OP)
    return (("authorization", f"Bearer {key.secret}"),)


def spec(**kw: object) -> common_pb2.JobSpec:
    base: dict[str, object] = {"name": "train", "gpus": 1, "max_duration_s": 60}
    base.update(kw)
    return common_pb2.JobSpec(**base)  # type: ignore[arg-type]


def fractional_gpus_request() -> bytes:
    """A SubmitJobRequest whose spec.gpus is the double 1.5, as a sloppy client sends it."""
    body = b"\x0a\x05train" + b"\x21" + struct.pack("<d", 1.5) + b"\x30\x3c"
    return b"\x0a" + bytes([len(body)]) + body


CASES: list[tuple[str, object, grpc.StatusCode, str | None]] = [
    ("zero gpus", spec(gpus=0), grpc.StatusCode.INVALID_ARGUMENT, "spec.gpus"),
    ("negative gpus", spec(gpus=-2), grpc.StatusCode.INVALID_ARGUMENT, "spec.gpus"),
    ("fractional gpus", "fractional", grpc.StatusCode.INVALID_ARGUMENT, "spec.gpus"),
    ("gpus above the largest node", spec(gpus=9), grpc.StatusCode.INVALID_ARGUMENT, "spec.gpus"),
    ("a missing max duration", spec(max_duration_s=0), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.max_duration_s"),
    ("an absurd max duration", spec(max_duration_s=10 * 365 * 86400),
     grpc.StatusCode.INVALID_ARGUMENT, "spec.max_duration_s"),
    ("an unknown flavor", spec(flavor="gpu-tpu9000"), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.flavor"),
    ("an oversized name", spec(name="a" * 100), grpc.StatusCode.INVALID_ARGUMENT, "spec.name"),
    ("a non-printable name", spec(name="train\x00"), grpc.StatusCode.INVALID_ARGUMENT,
     "spec.name"),
    ("an oversized label value", spec(labels={"team": "x" * 200}),
     grpc.StatusCode.INVALID_ARGUMENT, "spec.labels[team]"),
    ("a non-printable label value", spec(labels={"team": "a\x07b"}),
     grpc.StatusCode.INVALID_ARGUMENT, "spec.labels[team]"),
    ("too many labels", spec(labels={f"k{i}": "v" for i in range(40)}),
     grpc.StatusCode.INVALID_ARGUMENT, "spec.labels"),
    ("a wrong key", "wrong-key", grpc.StatusCode.UNAUTHENTICATED, None),
    ("a revoked key", "revoked-key", grpc.StatusCode.UNAUTHENTICATED, None),
    ("a missing key", "no-key", grpc.StatusCode.UNAUTHENTICATED, None),
    ("another tenant's job id", "foreign-job", grpc.StatusCode.NOT_FOUND, None),
    ("an operator call with a tenant key", "operator-call", grpc.StatusCode.PERMISSION_DENIED,
     None),
]


@pytest.fixture
async def channel(plane: Plane) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(plane.address("gateway")) as ch:
        yield ch


@pytest.mark.parametrize(("name", "what", "code", "field"), CASES, ids=[c[0] for c in CASES])
async def test_bad_input_answers_the_right_status_and_writes_nothing(
        channel: grpc.aio.Channel, database: str, name: str, what: object,
        code: grpc.StatusCode, field: str | None) -> None:
    stub = gateway_pb2_grpc.GatewayStub(channel)
    key = await setup_tenant(stub, "acme", "100")
    other = await setup_tenant(stub, "other", "100")
    foreign = (await stub.SubmitJob(gateway_pb2.SubmitJobRequest(spec=spec()),
                                    metadata=other)).job
    revoked = await stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(tenant="acme", name="r"),
                                      metadata=OP)
    await stub.RevokeApiKey(gateway_pb2.RevokeApiKeyRequest(key_id=revoked.key.key_id),
                            metadata=OP)
    db = await asyncpg.connect(database)
    before = [await db.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES]
    submit = gateway_pb2.SubmitJobRequest
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if isinstance(what, common_pb2.JobSpec):
            await stub.SubmitJob(submit(spec=what), metadata=key)
        elif what == "fractional":
            raw = channel.unary_unary("/kestrel.v1.Gateway/SubmitJob")
            await raw(fractional_gpus_request(), metadata=key)
        elif what == "wrong-key":
            await stub.SubmitJob(submit(spec=spec()), metadata=(
                ("authorization", "Bearer ks_0123456789abcdef_" + "A" * 43),))
        elif what == "revoked-key":
            await stub.SubmitJob(submit(spec=spec()),
                                 metadata=(("authorization", f"Bearer {revoked.secret}"),))
        elif what == "no-key":
            await stub.SubmitJob(submit(spec=spec()))
        elif what == "foreign-job":
            await stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=foreign.job_id),
                                 metadata=key)
        elif what == "operator-call":
            await stub.TopUp(gateway_pb2.GatewayTopUpRequest(tenant="acme", amount="5"),
                             metadata=key)
    assert err.value.code() == code, err.value.details()
    assert err.value.details()  # a sentence for a person
    if field:
        status = rpc_status.from_call(err.value)
        assert status is not None
        bad = error_details_pb2.BadRequest()
        assert status.details[0].Unpack(bad)
        assert field in [v.field for v in bad.field_violations]
    assert [await db.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES] == before
    await db.close()


async def test_a_restart_of_admission_mid_stream_loses_nothing(
        plane: Plane, database: str, clean_bus: str) -> None:
    async with grpc.aio.insecure_channel(plane.address("gateway")) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        key = await setup_tenant(stub, "steady", "30")
        done: list[common_pb2.Job] = []
        twenty_done = asyncio.Event()
        retried = 0

        async def submit(i: int) -> None:
            nonlocal retried
            while True:
                try:
                    resp = await stub.SubmitJob(gateway_pb2.SubmitJobRequest(
                        spec=spec(max_duration_s=100), idempotency_key=f"k-{i}"),
                        metadata=key, timeout=10)
                    done.append(resp.job)
                    if len(done) >= 20:
                        twenty_done.set()
                    return
                except grpc.aio.AioRpcError as err:
                    assert err.code() in (grpc.StatusCode.UNAVAILABLE,
                                          grpc.StatusCode.DEADLINE_EXCEEDED), err.details()
                    retried += 1
                    await asyncio.sleep(0.2)

        async def crash_after_twenty(restart: Callable[[], object]) -> None:
            await twenty_done.wait()
            plane.procs["admission"].kill9()
            await asyncio.to_thread(restart)

        sem = asyncio.Semaphore(8)

        async def limited(i: int) -> None:
            async with sem:
                await submit(i)

        await asyncio.gather(crash_after_twenty(lambda: plane.start("admission")),
                             *(limited(i) for i in range(60)))
    assert retried > 0, "the crash must land while submissions are in flight"
    db = await asyncpg.connect(database)
    per_key = await db.fetch("SELECT idempotency_key, count(*) n FROM jobs GROUP BY 1")
    assert len(per_key) == 60 and all(r["n"] == 1 for r in per_key)
    states = {r["state"]: r["n"] for r in await db.fetch(
        "SELECT state, count(*) n FROM jobs GROUP BY state")}
    assert states == {common_pb2.JOB_STATE_ADMITTED: 30, common_pb2.JOB_STATE_HELD: 30}
    assert await db.fetchval("SELECT sum(amount) FROM reservations") == 30
    await db.close()
    nc = await bus.connect(clean_bus, "check")
    info = await nc.jetstream().stream_info("KESTREL_JOBS")
    # Every job reached the placer's queue once (held ones too: they wait at the runway check).
    assert info.state.messages == 60
    await nc.close()

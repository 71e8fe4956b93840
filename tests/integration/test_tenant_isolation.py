"""Issue 17, part 3: tenant isolation as a matrix over kestrel.v1.Gateway.

Every RPC of the Gateway descriptor is classified here as an operator or a tenant RPC
(a new RPC fails `test_every_gateway_rpc_is_classified` until it is). Then:

- every tenant RPC, called with tenant B's key on tenant A's objects (a job id, a
  usage row's workload id, a page token, an idempotency key), answers exactly what it
  answers for an object that never existed: same code, same message and same
  status details byte for byte once the id itself is masked, and never a byte of A's
  data. The rule for ids (jobs, endpoints): NOT_FOUND. The rule for page tokens: another tenant's
  token is INVALID_ARGUMENT "page_token: is not a token this query returned",
  exactly as a token nobody issued (the token is bound to the query, and B's query
  names B);
- timing: GetJob on A's job and on a missing one run the same statement (job id
  AND tenant in one WHERE), so no branch tells them apart; measured anyway and
  printed, and the difference of the means must stay within the noise;
- every operator RPC refuses a tenant key (PERMISSION_DENIED) and no credentials
  (UNAUTHENTICATED), the same whatever tenant the request names;
- a revoked key stops working at once on the gateway that revoked it (it drops the
  key from its cache as it revokes); another gateway caches a key for CACHE_S
  (1 s), which bounds how long a revoked key lives there: measured with a second
  gateway process.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from kestrel import bus
from kestrel.paging import encode_token
from kestrel_sdk.v1 import common_pb2, events_pb2, gateway_pb2, gateway_pb2_grpc
from kestrel_tools.devstack import free_port
from kestrel_tools.procs import ServiceProcess
from services.gateway.callers import CACHE_S
from tests.conftest import OPERATOR_TOKEN, Plane
from tests.integration.helpers import eventually

pytestmark = pytest.mark.integration
Md = tuple[tuple[str, str], ...]
OP: Md = (("authorization", f"Bearer {OPERATOR_TOKEN}"),)
GATEWAY = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"]

OPERATOR_RPCS = {"CreateTenant", "GetTenant", "ListTenants", "SuspendTenant", "UpdateTenant",
                 "CreateApiKey", "RevokeApiKey", "TopUp", "AdjustCredits", "ListAllEndpoints",
                 "ListAllJobs"}
TENANT_RPCS = {"SubmitJob", "GetJob", "ListJobs", "CancelJob", "WatchJob", "GetMyRunway",
               "ListMyUsage", "CreateEndpoint", "GetEndpoint", "ListEndpoints",
               "DeleteEndpoint", "Infer"}


def test_every_gateway_rpc_is_classified() -> None:
    names = {m.name for m in GATEWAY.methods}
    assert names == OPERATOR_RPCS | TENANT_RPCS, names ^ (OPERATOR_RPCS | TENANT_RPCS)
    assert not OPERATOR_RPCS & TENANT_RPCS


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    details: str
    rich: bytes  # grpc-status-details-bin
    body: bytes

    def masked(self, secret: str) -> tuple[Any, ...]:
        return (self.code, self.details.replace(secret, "<id>"),
                self.rich.replace(secret.encode(), b"<id>"), self.body)


async def ask(channel: grpc.aio.Channel, rpc: str, request: Any, md: Md) -> Answer:
    method = GATEWAY.methods_by_name[rpc]
    path = f"/kestrel.v1.Gateway/{rpc}"
    data = request.SerializeToString()
    try:
        if method.server_streaming:
            body = b""
            async for item in channel.unary_stream(path)(data, metadata=md, timeout=2):
                body += item
        else:
            body = await channel.unary_unary(path)(data, metadata=md, timeout=10)
    except grpc.aio.AioRpcError as err:
        rich = b"".join(v for k, v in (err.trailing_metadata() or ())
                        if k == "grpc-status-details-bin" and isinstance(v, bytes))
        return Answer(err.code(), err.details() or "", rich, b"")
    return Answer(grpc.StatusCode.OK, "", b"", body)


@dataclass
class Tenants:
    channel: grpc.aio.Channel
    a: Md
    b: Md
    a_jobs: list[str]
    a_idem: str
    a_jobs_token: str
    a_usage_token: str
    a_endpoint: str
    a_endpoint_name: str
    a_endpoints_token: str


async def tenant(stub: gateway_pb2_grpc.GatewayStub, name: str) -> Md:
    await stub.CreateTenant(gateway_pb2.CreateTenantRequest(
        tenant=gateway_pb2.Tenant(tenant=name, gpu_quota={"gpu-h100": 8, "gpu-a10": 8},
                                  rate_limit=gateway_pb2.RateLimit(per_s=100_000,
                                                                   burst=100_000)),
        initial_credits="1000"), metadata=OP)
    key = await stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(tenant=name, name="k"),
                                  metadata=OP)
    return (("authorization", f"Bearer {key.secret}"),)


@pytest.fixture
async def tenants(plane: Plane, clean_bus: str) -> AsyncIterator[Tenants]:
    async with grpc.aio.insecure_channel(plane.address("gateway")) as ch:
        stub = gateway_pb2_grpc.GatewayStub(ch)
        a, b = await tenant(stub, "iso-a"), await tenant(stub, "iso-b")
        jobs = [(await stub.SubmitJob(gateway_pb2.SubmitJobRequest(
            spec=common_pb2.JobSpec(name=f"a{i}", gpus=1, max_duration_s=3600,
                                    flavor="gpu-a10"), idempotency_key=f"a-{i}"),
            metadata=a)).job.job_id for i in range(3)]
        await stub.SubmitJob(gateway_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            name="b0", gpus=1, max_duration_s=60, flavor="gpu-a10")), metadata=b)
        # A's first job runs (as the placer would report it): the meter cuts usage rows.
        nc = await bus.connect(clean_bus, "iso")
        await bus.publish(nc.jetstream(), bus.subject_workload("iso-a", 1),
                          events_pb2.WorkloadEvent(
                              event_id=f"iso-{jobs[0]}", tenant="iso-a", workload_id=jobs[0],
                              kind=common_pb2.WORKLOAD_KIND_JOB, type=1,  # type: ignore[arg-type]
                              time_us=int(time.time() * 1e6) - 5_000_000, flavor="gpu-a10",
                              gpus=1, max_duration_s=3600), f"iso-{jobs[0]}")
        await nc.close()
        usage = await eventually(
            lambda: stub.ListMyUsage(gateway_pb2.ListMyUsageRequest(page_size=1), metadata=a),
            lambda r: bool(r.next_page_token))
        assert usage.next_page_token, "A has at least two usage rows"
        page = await stub.ListJobs(gateway_pb2.ListJobsRequest(page_size=1), metadata=a)
        endpoints = [(await stub.CreateEndpoint(gateway_pb2.CreateEndpointRequest(
            spec=common_pb2.EndpointSpec(name=f"a-ep{i}")), metadata=a)).endpoint.endpoint_id
            for i in range(2)]
        eps = await stub.ListEndpoints(gateway_pb2.ListEndpointsRequest(page_size=1),
                                       metadata=a)
        yield Tenants(ch, a, b, jobs, "a-0", page.next_page_token, usage.next_page_token,
                      endpoints[0], "a-ep0", eps.next_page_token)


def missing_job() -> str:
    return f"job-{uuid.uuid4().hex[:16]}"


# tenant RPC -> cases: (what, request on A's object, request on one that never existed,
# the secret to mask: A's id and the missing id appear in messages)
Case = tuple[str, Any, Any, str, str]


def cases(t: Tenants) -> dict[str, list[Case]]:
    job, gone = t.a_jobs[1], missing_job()
    ep, no_ep = t.a_endpoint, f"ep-{uuid.uuid4().hex[:16]}"
    never_eps = encode_token(1, ("endpoints", "nobody"))
    never_jobs = encode_token(2, ("jobs", "iso-a", ()))  # A's query, but B asks: a forgery
    never_usage = encode_token(7, ("nobody", 0, 0, ""))
    g = gateway_pb2
    return {
        "GetJob": [("job id", g.GetJobRequest(job_id=job), g.GetJobRequest(job_id=gone),
                    job, gone)],
        "CancelJob": [("job id", g.CancelJobRequest(job_id=job),
                       g.CancelJobRequest(job_id=gone), job, gone)],
        "WatchJob": [("job id", g.WatchJobRequest(job_id=job), g.WatchJobRequest(job_id=gone),
                      job, gone)],
        "ListJobs": [("page token", g.ListJobsRequest(page_token=t.a_jobs_token),
                      g.ListJobsRequest(page_token=never_jobs), "", "")],
        "ListMyUsage": [
            ("usage rows of a workload", g.ListMyUsageRequest(workload_id=t.a_jobs[0]),
             g.ListMyUsageRequest(workload_id=gone), "", ""),
            ("page token", g.ListMyUsageRequest(page_token=t.a_usage_token),
             g.ListMyUsageRequest(page_token=never_usage), "", "")],
        "GetEndpoint": [("endpoint id", g.GetEndpointRequest(endpoint_id=ep),
                         g.GetEndpointRequest(endpoint_id=no_ep), ep, no_ep)],
        "DeleteEndpoint": [("endpoint id", g.GatewayDeleteEndpointRequest(endpoint_id=ep),
                            g.GatewayDeleteEndpointRequest(endpoint_id=no_ep), ep, no_ep)],
        "Infer": [("endpoint id", g.InferRequest(endpoint_id=ep, inputs=["hi"]),
                   g.InferRequest(endpoint_id=no_ep, inputs=["hi"]), ep, no_ep)],
        "ListEndpoints": [("page token", g.ListEndpointsRequest(page_token=t.a_endpoints_token),
                           g.ListEndpointsRequest(page_token=never_eps), "", "")],
    }


# Tenant RPCs that take no id of another tenant's: what they must show B instead.
NO_FOREIGN_ID = {"SubmitJob": "an idempotency key is per tenant: B's submit makes B's job",
                 "GetMyRunway": "the runway of the caller's tenant, named by the key alone",
                 "CreateEndpoint": "names are per tenant: B may take the name A uses"}


async def test_b_on_as_objects_answers_as_for_objects_that_never_existed(
        tenants: Tenants) -> None:
    t = tenants
    table = cases(t)
    assert set(table) | set(NO_FOREIGN_ID) == TENANT_RPCS, "every tenant RPC has its case"
    rows = []
    for rpc, rpc_cases in table.items():
        for what, on_a, never, a_id, gone_id in rpc_cases:
            foreign = await ask(t.channel, rpc, on_a, t.b)
            missing = await ask(t.channel, rpc, never, t.b)
            rows.append(f"{rpc:<15} {what:<25} {foreign.code.name:<17} {missing.code.name}")
            assert foreign.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                                    grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED), rpc
            if what in ("job id", "endpoint id"):
                assert foreign.code == grpc.StatusCode.NOT_FOUND, (rpc, foreign)
            if what == "page token":
                assert foreign.code == grpc.StatusCode.INVALID_ARGUMENT, (rpc, foreign)
            assert foreign.masked(a_id) == missing.masked(gone_id) if a_id else \
                foreign == missing, (rpc, what, foreign, missing)
            for secret in (b"iso-a", t.a_endpoint.encode(), *(j.encode() for j in t.a_jobs)):
                assert secret not in foreign.body + foreign.rich + foreign.details.encode() \
                    or secret == a_id.encode(), (rpc, secret)
    # Nothing of A's moved: B's CancelJob did not cancel it.
    a_view = await ask(t.channel, "GetJob", gateway_pb2.GetJobRequest(job_id=t.a_jobs[1]), t.a)
    job = gateway_pb2.GetJobResponse.FromString(a_view.body).job
    assert job.state == common_pb2.JOB_STATE_ADMITTED
    # The id-less tenant RPCs show B its own things only.
    stub = gateway_pb2_grpc.GatewayStub(t.channel)
    mine = await stub.SubmitJob(gateway_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
        name="b1", gpus=1, max_duration_s=60), idempotency_key=t.a_idem), metadata=t.b)
    assert mine.job.tenant == "iso-b" and mine.job.job_id not in t.a_jobs
    runway = await stub.GetMyRunway(gateway_pb2.GetMyRunwayRequest(), metadata=t.b)
    assert runway.runway.tenant == "iso-b"
    listed = await stub.ListJobs(gateway_pb2.ListJobsRequest(), metadata=t.b)
    assert {j.tenant for j in listed.jobs} == {"iso-b"}
    usage = await stub.ListMyUsage(gateway_pb2.ListMyUsageRequest(), metadata=t.b)
    assert all(r.tenant == "iso-b" for r in usage.rows)
    named = await stub.CreateEndpoint(gateway_pb2.CreateEndpointRequest(
        spec=common_pb2.EndpointSpec(name=t.a_endpoint_name)), metadata=t.b)
    assert named.endpoint.tenant == "iso-b" and named.endpoint.endpoint_id != t.a_endpoint
    eps = await stub.ListEndpoints(gateway_pb2.ListEndpointsRequest(), metadata=t.b)
    assert [e.endpoint_id for e in eps.endpoints] == [named.endpoint.endpoint_id]
    # A's endpoint is still there: B's DeleteEndpoint did nothing.
    assert (await stub.GetEndpoint(gateway_pb2.GetEndpointRequest(endpoint_id=t.a_endpoint),
                                   metadata=t.a)).endpoint.endpoint_id == t.a_endpoint
    print("\nrpc             object                    B on A's          never existed\n"
          + "\n".join(rows))


async def test_a_foreign_job_id_takes_as_long_as_a_missing_one(tenants: Tenants) -> None:
    """Same statement either way; the means differ by less than the noise."""
    t = tenants
    times: dict[str, list[float]] = {"foreign": [], "missing": []}
    ids = {"foreign": t.a_jobs[1], "missing": missing_job()}
    for _ in range(3):  # warm the key cache and the statement
        await ask(t.channel, "GetJob", gateway_pb2.GetJobRequest(job_id=ids["missing"]), t.b)
    for _ in range(50):
        for which in ("foreign", "missing"):  # interleaved: drift hits both alike
            t0 = time.perf_counter()
            answer = await ask(t.channel, "GetJob", gateway_pb2.GetJobRequest(job_id=ids[which]),
                               t.b)
            times[which].append(time.perf_counter() - t0)
            assert answer.code == grpc.StatusCode.NOT_FOUND
    mean = {k: statistics.fmean(v) for k, v in times.items()}
    spread = max(statistics.stdev(v) for v in times.values())
    diff = abs(mean["foreign"] - mean["missing"])
    print(f"\nGetJob by B: foreign mean {mean['foreign'] * 1e3:.2f} ms, missing mean "
          f"{mean['missing'] * 1e3:.2f} ms, difference {diff * 1e3:.3f} ms, "
          f"stdev {spread * 1e3:.2f} ms (50 calls each)")
    assert diff <= max(spread, 0.001), "a timing gap above the noise"


async def test_operator_rpcs_refuse_tenant_keys_and_no_credentials(tenants: Tenants) -> None:
    t = tenants
    for rpc in sorted(OPERATOR_RPCS):
        cls = gateway_pb2.DESCRIPTOR.message_types_by_name[
            GATEWAY.methods_by_name[rpc].input_type.name]
        from google.protobuf import message_factory

        request = message_factory.GetMessageClass(cls)()
        if "tenant" in cls.fields_by_name and cls.fields_by_name["tenant"].message_type is None:
            named_a, named_none = type(request)(tenant="iso-a"), type(request)(tenant="nobody")
        else:
            named_a, named_none = request, request
        as_b = await ask(t.channel, rpc, named_a, t.b)
        as_b_none = await ask(t.channel, rpc, named_none, t.b)
        anonymous = await ask(t.channel, rpc, named_a, ())
        assert as_b.code == grpc.StatusCode.PERMISSION_DENIED, (rpc, as_b)
        assert as_b == as_b_none, rpc  # nothing about the tenant named
        assert anonymous.code == grpc.StatusCode.UNAUTHENTICATED, (rpc, anonymous)


async def _until(fn: Callable[[], Awaitable[Answer]], code: grpc.StatusCode,
                 timeout_s: float) -> float:
    t0 = time.monotonic()
    while (await fn()).code != code:
        assert time.monotonic() - t0 < timeout_s, f"still not {code.name}"
        await asyncio.sleep(0.01)
    return time.monotonic() - t0


@pytest.fixture
def second_gateway(plane: Plane, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**plane.env, "KESTREL_GATEWAY_PORT": str(port),
           "KESTREL_REPLICAS_PORT": str(free_port())}
    proc = ServiceProcess("gateway", env,
                          f"127.0.0.1:{port}", tmp_path / "gateway-second.log").start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.stop()


async def test_a_revoked_key_stops_at_once(tenants: Tenants, second_gateway: str) -> None:
    t = tenants
    stub = gateway_pb2_grpc.GatewayStub(t.channel)
    runway = gateway_pb2.GetMyRunwayRequest()
    async with grpc.aio.insecure_channel(second_gateway) as other_ch:
        for _ in range(2):
            key = await stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(
                tenant="iso-a", name="soon-revoked"), metadata=OP)
            md: Md = (("authorization", f"Bearer {key.secret}"),)
            # Both gateways have the key cached and valid.
            assert (await ask(t.channel, "GetMyRunway", runway, md)).code == grpc.StatusCode.OK
            assert (await ask(other_ch, "GetMyRunway", runway, md)).code == grpc.StatusCode.OK
            await stub.RevokeApiKey(gateway_pb2.RevokeApiKeyRequest(key_id=key.key.key_id),
                                    metadata=OP)
            at_once = await ask(t.channel, "GetMyRunway", runway, md)
            assert at_once.code == grpc.StatusCode.UNAUTHENTICATED, at_once
            waited = await _until(lambda md=md: ask(other_ch, "GetMyRunway", runway, md),  # type: ignore[misc]
                                  grpc.StatusCode.UNAUTHENTICATED, CACHE_S + 1.0)
            print(f"\nrevoked: refused by the revoking gateway on the next call; by another "
                  f"gateway after {waited * 1e3:.0f} ms (bound: CACHE_S = {CACHE_S} s)")
            assert waited <= CACHE_S + 0.5

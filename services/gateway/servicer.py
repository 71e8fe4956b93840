"""Transport: kestrel.v1.Gateway. Each RPC checks who calls (callers.py: the operator
token, or a tenant key and its rate limit), validates, calls the core (core.py: tenants
and jobs across services; endpoints.py: endpoints) or reads (the meter's runway and
usage; upstream.py maps backend failures) and converts back. Errors are mapped once,
by map_errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, TypeAlias

import grpc
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from kestrel import bus
from kestrel.clock import now_us
from kestrel.errors import (
    FailedPrecondition,
    NotFound,
    Violations,
)
from kestrel.grpcserver import map_errors
from kestrel.jobs import JobRow, JobState, job_to_wire
from kestrel.paging import after_int, after_str, encode_token
from kestrel_sdk.money import MoneyError, parse_amount
from kestrel_sdk.v1 import (
    admission_pb2_grpc,
    common_pb2,
    events_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    meter_pb2,
    meter_pb2_grpc,
    placer_pb2_grpc,
)
from services.gateway import auth
from services.gateway.callers import Callers
from services.gateway.core import Gateway, ProfileChange
from services.gateway.endpoint_checks import check_endpoint_id, check_endpoint_spec
from services.gateway.endpoint_store import EndpointStore
from services.gateway.endpoints import Endpoints
from services.gateway.infer import InferBackend
from services.gateway.inference import Inference
from services.gateway.ratelimit import RateLimiter
from services.gateway.replicas import Replicas
from services.gateway.store import GatewayStore, KeyRow, Profile
from services.gateway.upstream import call
from services.gateway.validation import (
    JOB_ID_RE,
    check_amount,
    check_page,
    check_submit,
    check_tenant,
    name_problem,
    printable,
)

log = logging.getLogger("kestrel.gateway")
Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
DEFAULT_RATE, DEFAULT_BURST = 50.0, 100


def _tenant_wire(p: Profile) -> gateway_pb2.Tenant:
    return gateway_pb2.Tenant(tenant=p.tenant, display_name=p.display_name,
                              gpu_quota=p.gpu_quota, gpu_borrow=p.gpu_borrow,
                              rate_limit=gateway_pb2.RateLimit(per_s=p.rate_per_s, burst=p.burst),
                              suspended=p.suspended, created_us=p.created_us)


def _key_wire(k: KeyRow) -> gateway_pb2.ApiKey:
    return gateway_pb2.ApiKey(key_id=k.key_id, tenant=k.tenant, name=k.name,
                              created_us=k.created_us, revoked_us=k.revoked_us)


async def live_endpoints_page(endpoints: Endpoints, tenant: str, page_size: int,
                              page_token: str) -> tuple[list[common_pb2.Endpoint], str]:
    """One page of every live endpoint (one tenant's when `tenant` is set) and the next
    page's token: the operators' ListAllEndpoints and the autoscaler's ListLiveEndpoints."""
    v = Violations()
    size = check_page(v, page_size)
    query = ("all-endpoints", tenant)
    after = after_int(v, page_token, query)
    v.raise_if_any()
    rows = await endpoints.store.every_live(tenant, after, size + 1)
    token = encode_token(rows[size - 1].seq, query) if len(rows) > size else ""
    return [await endpoints.wire(r) for r in rows[:size]], token


@map_errors
class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, store: GatewayStore, limiter: RateLimiter,
                 admission: admission_pb2_grpc.AdmissionStub, meter: meter_pb2_grpc.MeterStub,
                 nc: NATS, operator_token_hash: str, max_node_gpus: int,
                 placer: placer_pb2_grpc.PlacerStub | None = None,
                 infer_backend: InferBackend | None = None,
                 runways: Mapping[str, common_pb2.Runway] | None = None) -> None:
        self.placer = placer
        self.infer_backend = infer_backend
        self.endpoints = Endpoints(EndpointStore(store.pool), store,
                                   Replicas(admission, placer), meter, infer_backend,
                                   placed=placer is not None, runways=runways)
        self.store = store
        self.meter = meter
        self.nc = nc
        self.max_node_gpus = max_node_gpus
        self.callers = Callers(store, limiter, operator_token_hash)
        self.core = Gateway(store, admission, meter, placer, self.callers.forget)
        self.inference = Inference(self.endpoints, infer_backend, placed=placer is not None)

    # --- callers -------------------------------------------------------------

    def _operator(self, context: Ctx) -> None:
        self.callers.operator(context.invocation_metadata())

    async def _tenant(self, context: Ctx) -> Profile:
        """The calling tenant (its key checked, one token of its rate limit spent)."""
        return await self.callers.tenant(context.invocation_metadata())

    # --- operator: tenants and keys -----------------------------------------

    async def CreateTenant(self, request: gateway_pb2.CreateTenantRequest,
                           context: Ctx) -> gateway_pb2.CreateTenantResponse:
        self._operator(context)
        v = Violations()
        check_tenant(v, request.tenant, await self.core.flavor_names())
        check_amount(v, "initial_credits", request.initial_credits, optional=True)
        v.raise_if_any()
        t = request.tenant
        rate = t.rate_limit if t.HasField("rate_limit") else None
        profile, runway = await self.core.create_tenant(
            Profile(t.tenant, t.display_name, dict(t.gpu_quota),
                    rate.per_s if rate else DEFAULT_RATE, rate.burst if rate else DEFAULT_BURST,
                    False, now_us(), dict(t.gpu_borrow)),
            request.initial_credits)
        return gateway_pb2.CreateTenantResponse(tenant=_tenant_wire(profile), runway=runway)

    async def GetTenant(self, request: gateway_pb2.GetTenantRequest,
                        context: Ctx) -> gateway_pb2.GetTenantResponse:
        self._operator(context)
        p = await self.core.existing(request.tenant)
        runway = await call(self.meter.GetRunway(meter_pb2.GetRunwayRequest(tenant=p.tenant),
                                                  timeout=10))
        return gateway_pb2.GetTenantResponse(tenant=_tenant_wire(p), runway=runway.runway)

    async def ListTenants(self, request: gateway_pb2.ListTenantsRequest,
                          context: Ctx) -> gateway_pb2.ListTenantsResponse:
        self._operator(context)
        v = Violations()
        size = check_page(v, request.page_size)
        after = after_str(v, request.page_token, ("tenants",))
        v.raise_if_any()
        rows = await self.store.profiles(after, size + 1)
        token = encode_token(rows[size - 1].tenant, ("tenants",)) if len(rows) > size else ""
        return gateway_pb2.ListTenantsResponse(tenants=[_tenant_wire(p) for p in rows[:size]],
                                               next_page_token=token)

    async def SuspendTenant(self, request: gateway_pb2.SuspendTenantRequest,
                            context: Ctx) -> gateway_pb2.SuspendTenantResponse:
        self._operator(context)
        updated = await self.core.suspend_tenant(request.tenant, request.suspended)
        return gateway_pb2.SuspendTenantResponse(tenant=_tenant_wire(updated))

    async def UpdateTenant(self, request: gateway_pb2.UpdateTenantRequest,
                           context: Ctx) -> gateway_pb2.UpdateTenantResponse:
        self._operator(context)
        v = Violations()
        check_tenant(v, request.tenant, await self.core.flavor_names())
        v.raise_if_any()
        t = request.tenant
        rate = t.rate_limit if t.HasField("rate_limit") else None
        updated = await self.core.update_tenant(t.tenant, ProfileChange(
            t.display_name, dict(t.gpu_quota), dict(t.gpu_borrow),
            (rate.per_s, rate.burst) if rate else None))
        return gateway_pb2.UpdateTenantResponse(tenant=_tenant_wire(updated))

    async def CreateApiKey(self, request: gateway_pb2.CreateApiKeyRequest,
                           context: Ctx) -> gateway_pb2.CreateApiKeyResponse:
        self._operator(context)
        v = Violations()
        if (problem := name_problem(request.tenant)) is not None:
            v.add("tenant", problem)
        if not request.name or not printable(request.name, 100):
            v.add("name", "is required: at most 100 printable characters")
        v.raise_if_any()
        await self.core.existing(request.tenant)
        new = auth.new_key()
        row = KeyRow(new.key_id, request.tenant, request.name, new.secret_hash, now_us(), 0)
        await self.store.insert_key(row)
        return gateway_pb2.CreateApiKeyResponse(key=_key_wire(row), secret=new.secret)

    async def RevokeApiKey(self, request: gateway_pb2.RevokeApiKeyRequest,
                           context: Ctx) -> gateway_pb2.RevokeApiKeyResponse:
        self._operator(context)
        row = await self.store.revoke_key(request.key_id, now_us())
        if row is None:
            raise NotFound(f"key {request.key_id[:32]!r} does not exist")
        self.callers.revoked(request.key_id)
        return gateway_pb2.RevokeApiKeyResponse(key=_key_wire(row))

    async def TopUp(self, request: gateway_pb2.GatewayTopUpRequest,
                    context: Ctx) -> gateway_pb2.GatewayTopUpResponse:
        self._operator(context)
        v = Violations()
        if (problem := name_problem(request.tenant)) is not None:
            v.add("tenant", problem)
        check_amount(v, "amount", request.amount, optional=False)
        v.raise_if_any()
        await self.core.existing(request.tenant)
        resp = await call(self.meter.TopUp(meter_pb2.TopUpRequest(
            tenant=request.tenant, amount=request.amount, top_up_id=request.top_up_id,
            note=request.note), timeout=10))
        return gateway_pb2.GatewayTopUpResponse(runway=resp.runway, applied=resp.applied)

    async def AdjustCredits(self, request: gateway_pb2.AdjustCreditsRequest,
                            context: Ctx) -> gateway_pb2.AdjustCreditsResponse:
        self._operator(context)
        v = Violations()
        if (problem := name_problem(request.tenant)) is not None:
            v.add("tenant", problem)
        try:
            parse_amount(request.amount, signed=True)
        except MoneyError as exc:
            v.add("amount", str(exc))
        if not request.note or not printable(request.note, 500):
            v.add("note", "is required (why the budget changes): at most 500 printable "
                          "characters")
        v.raise_if_any()
        await self.core.existing(request.tenant)
        resp = await call(self.meter.Adjust(meter_pb2.AdjustRequest(
            tenant=request.tenant, amount=request.amount, adjust_id=request.adjust_id,
            note=request.note), timeout=10))
        return gateway_pb2.AdjustCreditsResponse(runway=resp.runway, applied=resp.applied)

    # --- tenant: jobs --------------------------------------------------------

    async def SubmitJob(self, request: gateway_pb2.SubmitJobRequest,
                        context: Ctx) -> gateway_pb2.SubmitJobResponse:
        tenant = await self._tenant(context)
        check_submit(request, await self.core.flavor_names(), self.max_node_gpus)
        if tenant.suspended:
            raise FailedPrecondition(f"tenant {tenant.tenant!r} is suspended")
        job = common_pb2.Job(job_id=f"job-{uuid.uuid4().hex[:16]}", tenant=tenant.tenant,
                             spec=request.spec, idempotency_key=request.idempotency_key,
                             created_us=now_us())
        remaining = context.time_remaining()
        timeout = min(10.0, remaining) if remaining is not None else 10.0
        return gateway_pb2.SubmitJobResponse(job=await self.core.submit(job, timeout))

    async def _job(self, tenant: str, job_id: str) -> JobRow:
        if not JOB_ID_RE.match(job_id):
            v = Violations()
            v.add("job_id", "must look like job-<16 hex digits>")
            v.raise_if_any()
        return await self.core.job(tenant, job_id)

    async def GetJob(self, request: gateway_pb2.GetJobRequest,
                     context: Ctx) -> gateway_pb2.GetJobResponse:
        tenant = await self._tenant(context)
        return gateway_pb2.GetJobResponse(
            job=job_to_wire(await self._job(tenant.tenant, request.job_id)))

    async def ListJobs(self, request: gateway_pb2.ListJobsRequest,
                       context: Ctx) -> gateway_pb2.ListJobsResponse:
        tenant = await self._tenant(context)
        jobs, token = await self._jobs_page(tenant.tenant, request.states, request.page_size,
                                            request.page_token)
        return gateway_pb2.ListJobsResponse(jobs=jobs, next_page_token=token)

    async def ListAllJobs(self, request: gateway_pb2.ListAllJobsRequest,
                          context: Ctx) -> gateway_pb2.ListAllJobsResponse:
        self._operator(context)
        jobs, token = await self._jobs_page(request.tenant, request.states, request.page_size,
                                            request.page_token, scope="all-jobs")
        return gateway_pb2.ListAllJobsResponse(jobs=jobs, next_page_token=token)

    async def _jobs_page(self, tenant: str, wire_states: Iterable[int], page_size: int,
                         page_token: str, scope: str = "jobs"
                         ) -> tuple[list[common_pb2.Job], str]:
        """One page of a tenant's jobs ('': every tenant's), optionally of some states."""
        v = Violations()
        size = check_page(v, page_size)
        states = sorted({int(s) for s in wire_states})
        if any(s not in {int(x) for x in JobState} for s in states):
            v.add("states", "contains an unknown state")
        query = (scope, tenant, tuple(states))
        after = after_int(v, page_token, query)
        v.raise_if_any()
        rows = await self.store.jobs(tenant, states, after, size + 1)
        token = encode_token(rows[size - 1].seq, query) if len(rows) > size else ""
        return [job_to_wire(r) for r in rows[:size]], token

    async def CancelJob(self, request: gateway_pb2.CancelJobRequest,
                        context: Ctx) -> gateway_pb2.CancelJobResponse:
        tenant = await self._tenant(context)
        v = Violations()
        if not JOB_ID_RE.match(request.job_id):
            v.add("job_id", "must look like job-<16 hex digits>")
        if not printable(request.reason, 200):
            v.add("reason", "must be at most 200 printable characters")
        v.raise_if_any()
        return gateway_pb2.CancelJobResponse(
            job=await self.core.cancel(tenant.tenant, request.job_id, request.reason))

    async def WatchJob(self, request: gateway_pb2.WatchJobRequest,
                       context: Ctx) -> AsyncIterator[gateway_pb2.WatchJobResponse]:
        tenant = await self._tenant(context)
        row = await self._job(tenant.tenant, request.job_id)
        changed = asyncio.Event()

        async def on_state(msg: Msg) -> None:
            with contextlib.suppress(Exception):
                if events_pb2.JobStateChanged.FromString(msg.data).job_id == request.job_id:
                    changed.set()

        sub = await self.nc.subscribe(bus.subject_job_state(tenant.tenant), cb=on_state)
        try:
            last = None
            while True:
                snapshot = (row.state, row.reason, row.started_us, row.finished_us, row.flavor)
                if snapshot != last:
                    yield gateway_pb2.WatchJobResponse(job=job_to_wire(row))
                    last = snapshot
                if row.state.terminal:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=5.0)  # poll as a safety net
                changed.clear()
                row = await self._job(tenant.tenant, request.job_id)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # --- tenant: money -------------------------------------------------------

    async def GetMyRunway(self, request: gateway_pb2.GetMyRunwayRequest,
                          context: Ctx) -> gateway_pb2.GetMyRunwayResponse:
        tenant = await self._tenant(context)
        resp = await call(self.meter.GetRunway(meter_pb2.GetRunwayRequest(tenant=tenant.tenant),
                                                timeout=10))
        return gateway_pb2.GetMyRunwayResponse(runway=resp.runway)

    async def ListMyUsage(self, request: gateway_pb2.ListMyUsageRequest,
                          context: Ctx) -> gateway_pb2.ListMyUsageResponse:
        tenant = await self._tenant(context)
        resp = await call(self.meter.ListUsage(meter_pb2.ListUsageRequest(
            tenant=tenant.tenant, start_us=request.start_us, end_us=request.end_us,
            workload_id=request.workload_id, page_size=request.page_size,
            page_token=request.page_token), timeout=10))
        return gateway_pb2.ListMyUsageResponse(rows=resp.rows,
                                               next_page_token=resp.next_page_token)

    # --- tenant: endpoints (services/gateway/endpoints.py) ----------------------

    async def ListAllEndpoints(self, request: gateway_pb2.ListAllEndpointsRequest,
                               context: Ctx) -> gateway_pb2.ListAllEndpointsResponse:
        self._operator(context)
        endpoints, token = await live_endpoints_page(self.endpoints, request.tenant,
                                                     request.page_size, request.page_token)
        return gateway_pb2.ListAllEndpointsResponse(endpoints=endpoints, next_page_token=token)

    async def CreateEndpoint(self, request: gateway_pb2.CreateEndpointRequest,
                             context: Ctx) -> gateway_pb2.CreateEndpointResponse:
        tenant = await self._tenant(context)
        v = Violations()
        check_endpoint_spec(v, request.spec, await self.core.flavor_names(), self.max_node_gpus)
        v.raise_if_any()
        if tenant.suspended:
            raise FailedPrecondition(f"tenant {tenant.tenant!r} is suspended")
        row = await self.endpoints.create(tenant.tenant, request.spec)
        return gateway_pb2.CreateEndpointResponse(endpoint=await self.endpoints.wire(row))

    async def GetEndpoint(self, request: gateway_pb2.GetEndpointRequest,
                          context: Ctx) -> gateway_pb2.GetEndpointResponse:
        tenant = await self._tenant(context)
        row = await self.endpoints.get(tenant.tenant, request.endpoint_id)
        return gateway_pb2.GetEndpointResponse(endpoint=await self.endpoints.wire(row))

    async def ListEndpoints(self, request: gateway_pb2.ListEndpointsRequest,
                            context: Ctx) -> gateway_pb2.ListEndpointsResponse:
        tenant = await self._tenant(context)
        v = Violations()
        size = check_page(v, request.page_size)
        query = ("endpoints", tenant.tenant)
        after = after_int(v, request.page_token, query)
        v.raise_if_any()
        rows = await self.endpoints.store.live(tenant.tenant, after, size + 1)
        token = encode_token(rows[size - 1].seq, query) if len(rows) > size else ""
        return gateway_pb2.ListEndpointsResponse(
            endpoints=[await self.endpoints.wire(r) for r in rows[:size]],
            next_page_token=token)

    async def DeleteEndpoint(self, request: gateway_pb2.GatewayDeleteEndpointRequest,
                             context: Ctx) -> gateway_pb2.GatewayDeleteEndpointResponse:
        tenant = await self._tenant(context)
        v = Violations()
        check_endpoint_id(v, request.endpoint_id)
        v.raise_if_any()
        deleted = await self.endpoints.delete(tenant.tenant, request.endpoint_id)
        return gateway_pb2.GatewayDeleteEndpointResponse(deleted=deleted)

    async def Infer(self, request: gateway_pb2.InferRequest,
                    context: Ctx) -> gateway_pb2.InferResponse:
        tenant = await self._tenant(context)
        return await self.inference.infer(tenant, request, context.time_remaining())

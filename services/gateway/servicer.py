"""Transport: kestrel.v1.Gateway. Each RPC authenticates, rate-limits,
validates, calls a collaborator (store, admission, meter) and converts back.
Errors are mapped once, by map_errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from decimal import Decimal
from typing import Any, TypeAlias

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from kestrel import bus
from kestrel.clock import now_us
from kestrel.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    KestrelError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Violations,
    details_of,
)
from kestrel.grpcserver import map_errors
from kestrel.jobs import JobRow, JobState, job_to_wire
from kestrel.money import MoneyError, parse_amount
from kestrel.paging import after_int, after_str, encode_token
from kestrel.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    common_pb2,
    events_pb2,
    gateway_pb2,
    gateway_pb2_grpc,
    meter_pb2,
    meter_pb2_grpc,
    placer_pb2,
    placer_pb2_grpc,
)
from kestrel.workloads import simulated_flavor
from services.gateway import auth
from services.gateway.endpoint_checks import (
    check_endpoint_id,
    check_endpoint_spec,
    check_infer,
    normalised_spec,
)
from services.gateway.endpoint_store import EndpointRow, EndpointStore
from services.gateway.infer import InferBackend
from services.gateway.ratelimit import RateLimiter
from services.gateway.replicas import Replicas, horizon_of
from services.gateway.store import GatewayStore, KeyRow, Profile
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
CACHE_S = 1.0
DEFAULT_RATE, DEFAULT_BURST = 50.0, 100


def _tenant_wire(p: Profile) -> gateway_pb2.Tenant:
    return gateway_pb2.Tenant(tenant=p.tenant, display_name=p.display_name,
                              gpu_quota=p.gpu_quota, gpu_borrow=p.gpu_borrow,
                              rate_limit=gateway_pb2.RateLimit(per_s=p.rate_per_s, burst=p.burst),
                              suspended=p.suspended, created_us=p.created_us)


def _key_wire(k: KeyRow) -> gateway_pb2.ApiKey:
    return gateway_pb2.ApiKey(key_id=k.key_id, tenant=k.tenant, name=k.name,
                              created_us=k.created_us, revoked_us=k.revoked_us)


def _rich_status(err: grpc.aio.AioRpcError) -> status_pb2.Status | None:
    """The google.rpc.Status a Kestrel backend attached (grpc-status-details-bin)."""
    try:
        return rpc_status.from_call(err)
    except ValueError:  # details that contradict the status line: ignore them
        return None


def downstream(err: grpc.aio.AioRpcError) -> KestrelError:
    """A failure of another Kestrel service, as this service reports it.

    Input a backend rejects is the caller's: INVALID_ARGUMENT passes through with the
    backend's field violations. A backend that is away or saturated is UNAVAILABLE with
    RetryInfo (the backend's delay where it gave one)."""
    code = err.code()
    rich = _rich_status(err)
    violations, retry_after = details_of(rich) if rich is not None else ([], None)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(err.details() or "not found")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(violations, message=err.details() or "rejected by a backend")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailedPrecondition(err.details() or "rejected by a backend")
    return Unavailable(f"a backend is unavailable ({code.name}); retry",
                       retry_after_s=retry_after if retry_after is not None else 1.0)


async def _call(coro: Any) -> Any:
    """Await a call to another service, mapping its failures to ours."""
    try:
        return await coro
    except grpc.aio.AioRpcError as err:
        raise downstream(err) from None


@map_errors
class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, store: GatewayStore, limiter: RateLimiter,
                 admission: admission_pb2_grpc.AdmissionStub, meter: meter_pb2_grpc.MeterStub,
                 nc: NATS, operator_token_hash: str, max_node_gpus: int,
                 placer: placer_pb2_grpc.PlacerStub | None = None,
                 infer_backend: InferBackend | None = None) -> None:
        self.placer = placer
        self.infer_backend = infer_backend
        self.replicas = Replicas(admission, placer)
        self._spent: dict[str, tuple[float, bool]] = {}
        self.endpoint_store = EndpointStore(store.pool)
        self._endpoint_rows: dict[tuple[str, str], tuple[float, EndpointRow | None]] = {}
        self._scale_locks: dict[str, asyncio.Lock] = {}
        self.store = store
        self.limiter = limiter
        self.admission = admission
        self.meter = meter
        self.nc = nc
        self.operator_token_hash = operator_token_hash
        self.max_node_gpus = max_node_gpus
        self._keys: dict[str, tuple[float, KeyRow | None]] = {}
        self._revocations = 0  # bumped by every revocation: see _cached_key
        self._profiles: dict[str, tuple[float, Profile | None]] = {}
        self._flavors: tuple[float, set[str]] = (0.0, set())

    # --- auth ----------------------------------------------------------------

    def _operator(self, context: Ctx) -> None:
        token = auth.bearer(context.invocation_metadata())
        if not auth.token_matches(token, self.operator_token_hash):
            raise PermissionDenied("this call needs the operator token")

    async def _cached_key(self, key_id: str) -> KeyRow | None:
        """A key row, cached for CACHE_S: what bounds a revoked key's life on the other
        gateway replicas (this one drops it as it revokes). A read that a revocation
        overtook is not cached: it could hold the key as it was before."""
        hit = self._keys.get(key_id)
        if hit and time.monotonic() - hit[0] < CACHE_S:
            return hit[1]
        before = self._revocations
        row = await self.store.key(key_id)
        if self._revocations == before:
            self._keys[key_id] = (time.monotonic(), row)
        return row

    async def _profile(self, tenant: str) -> Profile | None:
        hit = self._profiles.get(tenant)
        if hit and time.monotonic() - hit[0] < CACHE_S:
            return hit[1]
        p = await self.store.profile(tenant)
        self._profiles[tenant] = (time.monotonic(), p)
        return p

    async def _flavor_names(self) -> set[str]:
        at, names = self._flavors
        if time.monotonic() - at > 10 or not names:
            names = await self.store.flavors()
            self._flavors = (time.monotonic(), names)
        return names

    async def _tenant(self, context: Ctx) -> Profile:
        """Authenticate a tenant key and spend one token of its rate limit."""
        key_id, secret = auth.parse_key(auth.bearer(context.invocation_metadata()))
        key = await self._cached_key(key_id)
        if key is None or not auth.secret_matches(secret, key.secret_hash):
            raise Unauthenticated("the API key is not valid")
        if key.revoked_us:
            raise Unauthenticated("the API key was revoked")
        profile = await self._profile(key.tenant)
        if profile is None:
            raise Unauthenticated("the API key's tenant no longer exists")
        verdict = await self.limiter.take(profile.tenant, profile.rate_per_s, profile.burst)
        if not verdict.allowed:
            raise ResourceExhausted(
                f"rate limit of {profile.rate_per_s:g}/s (burst {profile.burst}) exceeded",
                retry_after_s=verdict.retry_after_s)
        return profile

    def _forget(self, tenant: str) -> None:
        self._profiles.pop(tenant, None)

    async def _ensure_queues(self, p: Profile) -> None:
        """Ask the placer for the tenant's namespace and queues now. Best effort: the
        placer also ensures them before a tenant's first Job and follows profile changes."""
        if self.placer is None:
            return
        try:
            await self.placer.EnsureTenant(placer_pb2.EnsureTenantRequest(
                tenant=p.tenant, quota=[
                    placer_pb2.FlavorQuota(flavor=f, gpus=p.gpu_quota.get(f, 0),
                                           borrow_gpus=p.gpu_borrow.get(f, 0))
                    for f in sorted(set(p.gpu_quota) | set(p.gpu_borrow))]), timeout=10)
        except grpc.aio.AioRpcError as err:
            log.warning("placer EnsureTenant(%s): %s %s", p.tenant, err.code().name,
                        err.details())

    # --- operator: tenants and keys -----------------------------------------

    async def CreateTenant(self, request: gateway_pb2.CreateTenantRequest,
                           context: Ctx) -> gateway_pb2.CreateTenantResponse:
        self._operator(context)
        v = Violations()
        check_tenant(v, request.tenant, await self._flavor_names())
        check_amount(v, "initial_credits", request.initial_credits, optional=True)
        v.raise_if_any()
        t = request.tenant
        rate = t.rate_limit if t.HasField("rate_limit") else None
        profile = Profile(t.tenant, t.display_name, dict(t.gpu_quota),
                          rate.per_s if rate else DEFAULT_RATE,
                          rate.burst if rate else DEFAULT_BURST, False, now_us(),
                          dict(t.gpu_borrow))
        if await self.store.profile(t.tenant) is not None:
            raise AlreadyExists(f"tenant {t.tenant!r} exists")
        account = await _call(self.meter.CreateAccount(meter_pb2.CreateAccountRequest(
            tenant=t.tenant, initial_credits=request.initial_credits), timeout=10))
        if not await self.store.insert_profile(profile):
            raise AlreadyExists(f"tenant {t.tenant!r} exists")
        self._forget(t.tenant)
        await self._ensure_queues(profile)
        return gateway_pb2.CreateTenantResponse(tenant=_tenant_wire(profile),
                                                runway=account.runway)

    async def _existing(self, tenant: str) -> Profile:
        p = await self.store.profile(tenant)
        if p is None:
            raise NotFound(f"tenant {tenant!r} does not exist")
        return p

    async def GetTenant(self, request: gateway_pb2.GetTenantRequest,
                        context: Ctx) -> gateway_pb2.GetTenantResponse:
        self._operator(context)
        p = await self._existing(request.tenant)
        runway = await _call(self.meter.GetRunway(meter_pb2.GetRunwayRequest(tenant=p.tenant),
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
        p = await self._existing(request.tenant)
        updated = await self.store.update_profile(replace(p, suspended=request.suspended))
        assert updated is not None
        self._forget(p.tenant)
        return gateway_pb2.SuspendTenantResponse(tenant=_tenant_wire(updated))

    async def UpdateTenant(self, request: gateway_pb2.UpdateTenantRequest,
                           context: Ctx) -> gateway_pb2.UpdateTenantResponse:
        self._operator(context)
        v = Violations()
        check_tenant(v, request.tenant, await self._flavor_names())
        v.raise_if_any()
        p = await self._existing(request.tenant.tenant)
        t = request.tenant
        rate = t.rate_limit if t.HasField("rate_limit") else None
        updated = await self.store.update_profile(replace(
            p, display_name=t.display_name or p.display_name,
            gpu_quota=dict(t.gpu_quota) or p.gpu_quota,
            gpu_borrow={**p.gpu_borrow, **t.gpu_borrow} if t.gpu_borrow else p.gpu_borrow,
            rate_per_s=rate.per_s if rate else p.rate_per_s,
            burst=rate.burst if rate else p.burst))
        assert updated is not None
        self._forget(p.tenant)
        await self._ensure_queues(updated)
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
        await self._existing(request.tenant)
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
        self._revocations += 1
        self._keys.pop(request.key_id, None)
        return gateway_pb2.RevokeApiKeyResponse(key=_key_wire(row))

    async def TopUp(self, request: gateway_pb2.GatewayTopUpRequest,
                    context: Ctx) -> gateway_pb2.GatewayTopUpResponse:
        self._operator(context)
        v = Violations()
        if (problem := name_problem(request.tenant)) is not None:
            v.add("tenant", problem)
        check_amount(v, "amount", request.amount, optional=False)
        v.raise_if_any()
        await self._existing(request.tenant)
        resp = await _call(self.meter.TopUp(meter_pb2.TopUpRequest(
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
        await self._existing(request.tenant)
        resp = await _call(self.meter.Adjust(meter_pb2.AdjustRequest(
            tenant=request.tenant, amount=request.amount, adjust_id=request.adjust_id,
            note=request.note), timeout=10))
        return gateway_pb2.AdjustCreditsResponse(runway=resp.runway, applied=resp.applied)

    # --- tenant: jobs --------------------------------------------------------

    async def SubmitJob(self, request: gateway_pb2.SubmitJobRequest,
                        context: Ctx) -> gateway_pb2.SubmitJobResponse:
        tenant = await self._tenant(context)
        check_submit(request, await self._flavor_names(), self.max_node_gpus)
        if tenant.suspended:
            raise FailedPrecondition(f"tenant {tenant.tenant!r} is suspended")
        job = common_pb2.Job(job_id=f"job-{uuid.uuid4().hex[:16]}", tenant=tenant.tenant,
                             spec=request.spec, idempotency_key=request.idempotency_key,
                             created_us=now_us())
        remaining = context.time_remaining()
        timeout = min(10.0, remaining) if remaining is not None else 10.0
        resp = await _call(self.admission.Admit(admission_pb2.AdmitRequest(job=job),
                                                timeout=timeout))
        return gateway_pb2.SubmitJobResponse(job=resp.job)

    async def _job(self, tenant: str, job_id: str) -> JobRow:
        if not JOB_ID_RE.match(job_id):
            v = Violations()
            v.add("job_id", "must look like job-<16 hex digits>")
            v.raise_if_any()
        row = await self.store.job(tenant, job_id)
        if row is None:  # another tenant's job is simply not there
            raise NotFound(f"job {job_id} not found")
        return row

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
        await self._job(tenant.tenant, request.job_id)
        if not printable(request.reason, 200):
            v = Violations()
            v.add("reason", "must be at most 200 printable characters")
            v.raise_if_any()
        resp = await _call(self.admission.Release(admission_pb2.ReleaseRequest(
            tenant=tenant.tenant, job_id=request.job_id, reason=request.reason), timeout=10))
        if self.placer is not None:
            # Delete the Kubernetes Job: its allocation ends at this instant. Should the
            # placer be away, the runway check rejects the cancelled job's Workload and
            # Kueue deactivates it, which closes the allocation too.
            try:
                await self.placer.CancelWorkload(placer_pb2.CancelWorkloadRequest(
                    tenant=tenant.tenant, workload_id=request.job_id,
                    reason=request.reason or "cancelled by the tenant"), timeout=10)
            except grpc.aio.AioRpcError as err:
                log.warning("placer CancelWorkload(%s): %s", request.job_id, err.code().name)
        return gateway_pb2.CancelJobResponse(job=resp.job)

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
        resp = await _call(self.meter.GetRunway(meter_pb2.GetRunwayRequest(tenant=tenant.tenant),
                                                timeout=10))
        return gateway_pb2.GetMyRunwayResponse(runway=resp.runway)

    async def ListMyUsage(self, request: gateway_pb2.ListMyUsageRequest,
                          context: Ctx) -> gateway_pb2.ListMyUsageResponse:
        tenant = await self._tenant(context)
        resp = await _call(self.meter.ListUsage(meter_pb2.ListUsageRequest(
            tenant=tenant.tenant, start_us=request.start_us, end_us=request.end_us,
            workload_id=request.workload_id, page_size=request.page_size,
            page_token=request.page_token), timeout=10))
        return gateway_pb2.ListMyUsageResponse(rows=resp.rows,
                                               next_page_token=resp.next_page_token)

    # --- tenant: endpoints ---------------------------------------------------
    # With a placer, each replica is a Kestrel job (services/gateway/replicas.py) that
    # admission reserves a rolling horizon for and Kueue admits on the real cluster.
    # Without one (a plane with no cluster), replicas are host processes an operator
    # starts with KESTREL_WORKER_ENDPOINT=<endpoint id>.

    async def _endpoint(self, tenant: str, endpoint_id: str,
                        cached: bool = False) -> EndpointRow:
        """The caller's live endpoint; another tenant's is one that never existed. Infer
        reads through a CACHE_S cache (a deletion on another gateway holds within it)."""
        v = Violations()
        check_endpoint_id(v, endpoint_id)
        v.raise_if_any()
        key = (tenant, endpoint_id)
        hit = self._endpoint_rows.get(key) if cached else None
        if hit and time.monotonic() - hit[0] < CACHE_S:
            row = hit[1]
        else:
            row = await self.endpoint_store.get(tenant, endpoint_id)
            self._endpoint_rows[key] = (time.monotonic(), row)
            if len(self._endpoint_rows) > 10_000:
                self._endpoint_rows.clear()
        if row is None:
            raise NotFound(f"endpoint {endpoint_id} not found")
        if row.deleted_us:
            raise NotFound(f"endpoint {endpoint_id} was deleted")
        return row

    async def _endpoint_wire(self, row: EndpointRow) -> common_pb2.Endpoint:
        fresh = await self.infer_backend.ready_replicas(row.endpoint_id) \
            if self.infer_backend is not None else set()
        live = await self._live_replicas(row)
        placed = len(live)
        # Placed replicas heartbeat under their job id: one stopped a moment ago still
        # heartbeats for up to three intervals and is not ready. Host processes (no
        # placer) are ready when they heartbeat.
        ready = len(fresh & set(live)) if self.placer is not None else len(fresh)
        if ready:
            reason = ""
        elif self.placer is None:
            reason = ("no ready replica: with no cluster, replicas are host processes "
                      f"started with KESTREL_WORKER_ENDPOINT={row.endpoint_id}")
        elif row.deleted_us:
            reason = "deleted"
        else:
            reason = (f"{placed} replica(s) placed on {row.spec.flavor}; waiting for a "
                      "worker's first heartbeat (Kueue admission, then the model load)")
        # Placed replicas are the count; without a placer, those heartbeating.
        replicas = placed if self.placer is not None else max(placed, ready)
        return common_pb2.Endpoint(endpoint_id=row.endpoint_id, tenant=row.tenant,
                                   spec=row.spec, replicas=replicas,
                                   ready_replicas=ready, reason=reason,
                                   created_us=row.created_us,
                                   simulated=self.placer is not None
                                   and simulated_flavor(row.spec.flavor))

    async def _live_replicas(self, row: EndpointRow) -> tuple[str, ...]:
        """Its replicas that have not ended (one evicted at zero budget has)."""
        if not row.replicas or self.placer is None:
            return row.replicas
        ended = await self.store.ended(row.replicas)
        return tuple(j for j in row.replicas if j not in ended)

    async def ListAllEndpoints(self, request: gateway_pb2.ListAllEndpointsRequest,
                               context: Ctx) -> gateway_pb2.ListAllEndpointsResponse:
        self._operator(context)
        v = Violations()
        size = check_page(v, request.page_size)
        query = ("all-endpoints", request.tenant)
        after = after_int(v, request.page_token, query)
        v.raise_if_any()
        rows = await self.endpoint_store.every_live(request.tenant, after, size + 1)
        token = encode_token(rows[size - 1].seq, query) if len(rows) > size else ""
        return gateway_pb2.ListAllEndpointsResponse(
            endpoints=[await self._endpoint_wire(r) for r in rows[:size]],
            next_page_token=token)

    async def ScaleEndpoint(self, request: gateway_pb2.GatewayScaleEndpointRequest,
                            context: Ctx) -> gateway_pb2.GatewayScaleEndpointResponse:
        self._operator(context)
        v = Violations()
        check_endpoint_id(v, request.endpoint_id)
        if not request.tenant:
            v.add("tenant", "is required")
        v.raise_if_any()
        row = await self.endpoint_store.get(request.tenant, request.endpoint_id)
        if row is None or row.deleted_us:
            raise NotFound(f"endpoint {request.endpoint_id} of {request.tenant!r} not found")
        if not 0 <= request.replicas <= row.spec.max_replicas:
            v.add("replicas", f"must be 0..{row.spec.max_replicas} (the endpoint's max)")
            v.raise_if_any()
        if self.placer is None:
            raise FailedPrecondition("this gateway has no cluster: replicas are host "
                                     "processes, started by hand")
        lock = self._scale_locks.setdefault(row.endpoint_id, asyncio.Lock())
        async with lock:
            row = await self.endpoint_store.get(request.tenant, request.endpoint_id) or row
            live = await self._live_replicas(row)
            started: tuple[str, ...] = ()
            stopped: tuple[str, ...] = ()
            refusal = ""
            if request.replicas > len(live):
                added = await self.replicas.add(row.tenant, row.endpoint_id, row.spec,
                                                len(live), request.replicas - len(live),
                                                now_us())
                started, refusal = added.job_ids, added.refusal
            elif request.replicas < len(live):
                stopped = live[request.replicas:]  # the newest go first
                await self.replicas.stop(row.tenant, stopped,
                                         f"scaled down: {request.reason or 'operator'}")
            keep = tuple(j for j in live if j not in stopped) + started
            await self.endpoint_store.set_replicas(row.tenant, row.endpoint_id, keep)
            self._endpoint_rows.pop((row.tenant, row.endpoint_id), None)
            row = replace(row, replicas=keep)
        return gateway_pb2.GatewayScaleEndpointResponse(
            endpoint=await self._endpoint_wire(row), started=started, stopped=stopped,
            refusal=refusal)

    async def CreateEndpoint(self, request: gateway_pb2.CreateEndpointRequest,
                             context: Ctx) -> gateway_pb2.CreateEndpointResponse:
        tenant = await self._tenant(context)
        v = Violations()
        check_endpoint_spec(v, request.spec, await self._flavor_names(), self.max_node_gpus)
        v.raise_if_any()
        if tenant.suspended:
            raise FailedPrecondition(f"tenant {tenant.tenant!r} is suspended")
        spec = normalised_spec(request.spec)
        if self.placer is not None:
            spec.reservation_horizon_s = horizon_of(spec)
        row = await self.endpoint_store.insert(f"ep-{uuid.uuid4().hex[:16]}", tenant.tenant,
                                               spec, now_us())
        if row is None:
            raise AlreadyExists(f"an endpoint named {request.spec.name!r} exists")
        if self.placer is not None:
            row = await self._start_replicas(row)
        return gateway_pb2.CreateEndpointResponse(endpoint=await self._endpoint_wire(row))

    async def _start_replicas(self, row: EndpointRow) -> EndpointRow:
        """Its first replicas (min_replicas, at least one), each admitted against the
        budget for the horizon; if the budget cannot hold them all, none is kept and
        the endpoint is not created."""
        count = max(1, row.spec.min_replicas)
        try:
            added = await self.replicas.add(row.tenant, row.endpoint_id, row.spec, 0, count,
                                            now_us())
        except grpc.aio.AioRpcError as err:
            await self.endpoint_store.delete(row.tenant, row.endpoint_id, now_us())
            raise downstream(err) from None
        if added.refusal:
            await self.replicas.stop(row.tenant, added.job_ids, "the endpoint was not created")
            await self.endpoint_store.delete(row.tenant, row.endpoint_id, now_us())
            raise FailedPrecondition(
                f"the budget cannot hold {count} replica(s) of {row.spec.name} for its "
                f"horizon of {horizon_of(row.spec)} s: {added.refusal}")
        await self.endpoint_store.set_replicas(row.tenant, row.endpoint_id, added.job_ids)
        return replace(row, replicas=added.job_ids)

    async def _budget_spent(self, tenant: str) -> bool:
        """credits - charged <= 0, as the meter last said (cached 2 s per tenant): the
        runway check has deactivated (or is deactivating) every replica."""
        hit = self._spent.get(tenant)
        if hit and time.monotonic() - hit[0] < 2.0:
            return hit[1]
        runway = (await _call(self.meter.GetRunway(
            meter_pb2.GetRunwayRequest(tenant=tenant), timeout=5))).runway
        spent = Decimal(runway.credits or "0") - Decimal(runway.charged or "0") <= 0
        self._spent[tenant] = (time.monotonic(), spent)
        return spent

    async def GetEndpoint(self, request: gateway_pb2.GetEndpointRequest,
                          context: Ctx) -> gateway_pb2.GetEndpointResponse:
        tenant = await self._tenant(context)
        row = await self._endpoint(tenant.tenant, request.endpoint_id)
        return gateway_pb2.GetEndpointResponse(endpoint=await self._endpoint_wire(row))

    async def ListEndpoints(self, request: gateway_pb2.ListEndpointsRequest,
                            context: Ctx) -> gateway_pb2.ListEndpointsResponse:
        tenant = await self._tenant(context)
        v = Violations()
        size = check_page(v, request.page_size)
        query = ("endpoints", tenant.tenant)
        after = after_int(v, request.page_token, query)
        v.raise_if_any()
        rows = await self.endpoint_store.live(tenant.tenant, after, size + 1)
        token = encode_token(rows[size - 1].seq, query) if len(rows) > size else ""
        return gateway_pb2.ListEndpointsResponse(
            endpoints=[await self._endpoint_wire(r) for r in rows[:size]],
            next_page_token=token)

    async def DeleteEndpoint(self, request: gateway_pb2.GatewayDeleteEndpointRequest,
                             context: Ctx) -> gateway_pb2.GatewayDeleteEndpointResponse:
        tenant = await self._tenant(context)
        v = Violations()
        check_endpoint_id(v, request.endpoint_id)
        v.raise_if_any()
        row = await self.endpoint_store.get(tenant.tenant, request.endpoint_id)
        if row is None:
            raise NotFound(f"endpoint {request.endpoint_id} not found")
        deleted = await self.endpoint_store.delete(tenant.tenant, request.endpoint_id, now_us())
        self._endpoint_rows.pop((tenant.tenant, request.endpoint_id), None)
        if deleted and row.replicas:
            await self.replicas.stop(tenant.tenant, row.replicas, "the endpoint was deleted")
        return gateway_pb2.GatewayDeleteEndpointResponse(deleted=deleted)

    async def Infer(self, request: gateway_pb2.InferRequest,
                    context: Ctx) -> gateway_pb2.InferResponse:
        tenant = await self._tenant(context)
        priority, timeout_s = check_infer(request, context.time_remaining())
        row = await self._endpoint(tenant.tenant, request.endpoint_id, cached=True)
        if self.infer_backend is None:
            raise Unavailable("inference is not configured on this gateway", 5.0)
        if self.placer is not None and await self._budget_spent(tenant.tenant):
            raise FailedPrecondition(
                f"tenant {tenant.tenant!r}'s budget is spent: the replicas of endpoint "
                f"{row.endpoint_id} were stopped; top up, then create the endpoint again")
        reply = await self.infer_backend.infer(tenant.tenant, row.endpoint_id,
                                               list(request.inputs), priority, timeout_s)
        if reply.error:
            raise Unavailable(f"replica {reply.replica} could not serve the request: "
                              f"{reply.error}", retry_after_s=1.0)
        if len(reply.embeddings) != len(request.inputs):
            raise Unavailable(f"replica {reply.replica} answered {len(reply.embeddings)} "
                              f"vectors for {len(request.inputs)} inputs", retry_after_s=1.0)
        return gateway_pb2.InferResponse(
            embeddings=[gateway_pb2.Embedding(values=e.values) for e in reply.embeddings],
            model=reply.model, latency_ms=reply.latency_ms, replica=reply.replica,
            truncated=reply.truncated, max_input_tokens=reply.max_input_tokens,
            queue_ms=reply.queue_ms, simulated=reply.simulated)

"""`kestrel_sdk.AsyncClient`: the grpc.aio client of the public kestrel.v1.Gateway API.

The same methods as `kestrel_sdk.Client`, as coroutines; the listing methods and
`watch_job` return async iterators (`async for job in client.list_jobs(): ...`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio

from kestrel_sdk._common import DEFAULT_PAGE_SIZE, Settings, check_page_size
from kestrel_sdk._convert import (
    ApiKey,
    ApiKeyCreated,
    Job,
    JobState,
    Runway,
    Tenant,
    TopUpResult,
    UsageRow,
    create_tenant_request,
    list_all_jobs_request,
    list_jobs_request,
    money_text,
    submit_job_request,
)
from kestrel_sdk._endpoints import (
    Endpoint,
    InferResult,
    Priority,
    call_timeout,
    create_endpoint_request,
    infer_request,
)
from kestrel_sdk._errors import from_rpc_error
from kestrel_sdk.tls import aio_channel
from kestrel_sdk.v1 import gateway_pb2, gateway_pb2_grpc

R = TypeVar("R")


class AsyncClient:
    """asyncio client (grpc.aio). Credentials and defaults as for `kestrel_sdk.Client`.

    Use `async with AsyncClient() as c:` (or `await c.close()`).
    """

    def __init__(self, address: str | None = None, *, api_key: str | None = None,
                 operator_token: str | None = None, timeout_s: float = 10.0,
                 channel_credentials: grpc.ChannelCredentials | None = None) -> None:
        self._settings = Settings.resolve(address, api_key, operator_token, timeout_s)
        addr = self._settings.address
        self._channel: grpc.aio.Channel = (
            grpc.aio.secure_channel(addr, channel_credentials)
            if channel_credentials is not None else aio_channel(addr))
        self._stub = gateway_pb2_grpc.GatewayStub(self._channel)

    @property
    def address(self) -> str:
        return self._settings.address

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Awaitable[R]], request: Any, *,
                    operator: bool) -> R:
        metadata, request_id = self._settings.metadata(operator=operator)
        try:
            return await method(request, metadata=metadata, timeout=self._settings.timeout_s)
        except grpc.RpcError as exc:  # grpc.aio.AioRpcError is one
            raise from_rpc_error(exc, request_id=request_id) from exc

    # --- operator ---------------------------------------------------------------------

    async def create_tenant(self, tenant: str, *, display_name: str = "",
                            gpu_quota: Mapping[str, int], rate_per_s: float, burst: int,
                            initial_credits: Decimal | str,
                            gpu_borrow: Mapping[str, int] | None = None) -> Tenant:
        req = create_tenant_request(tenant, display_name=display_name, gpu_quota=gpu_quota,
                                    rate_per_s=rate_per_s, burst=burst,
                                    initial_credits=initial_credits, gpu_borrow=gpu_borrow)
        resp = await self._call(self._stub.CreateTenant, req, operator=True)
        return Tenant.from_pb(resp.tenant, resp.runway if resp.HasField("runway") else None)

    async def get_tenant(self, tenant: str) -> Tenant:
        resp = await self._call(self._stub.GetTenant,
                                gateway_pb2.GetTenantRequest(tenant=tenant), operator=True)
        return Tenant.from_pb(resp.tenant, resp.runway if resp.HasField("runway") else None)

    def list_tenants(self, *, page_size: int = DEFAULT_PAGE_SIZE) -> AsyncIterator[Tenant]:
        """Every tenant, fetching page after page as the iterator advances."""
        check_page_size(page_size)
        self._settings.metadata(operator=True)

        async def pages() -> AsyncIterator[Tenant]:
            token = ""
            while True:
                resp = await self._call(self._stub.ListTenants, gateway_pb2.ListTenantsRequest(
                    page_size=page_size, page_token=token), operator=True)
                for t in resp.tenants:
                    yield Tenant.from_pb(t)
                token = resp.next_page_token
                if not token:
                    return

        return pages()

    async def suspend_tenant(self, tenant: str, suspended: bool = True,
                             reason: str = "") -> Tenant:
        resp = await self._call(self._stub.SuspendTenant, gateway_pb2.SuspendTenantRequest(
            tenant=tenant, suspended=suspended, reason=reason), operator=True)
        return Tenant.from_pb(resp.tenant)

    async def create_api_key(self, tenant: str, name: str) -> ApiKeyCreated:
        resp = await self._call(self._stub.CreateApiKey,
                                gateway_pb2.CreateApiKeyRequest(tenant=tenant, name=name),
                                operator=True)
        return ApiKeyCreated.from_pb(resp)

    async def revoke_api_key(self, key_id: str) -> ApiKey:
        resp = await self._call(self._stub.RevokeApiKey,
                                gateway_pb2.RevokeApiKeyRequest(key_id=key_id), operator=True)
        return ApiKey.from_pb(resp.key)

    async def top_up(self, tenant: str, amount: Decimal | str, top_up_id: str | None = None,
                     note: str = "") -> TopUpResult:
        resp = await self._call(self._stub.TopUp, gateway_pb2.GatewayTopUpRequest(
            tenant=tenant, amount=money_text(amount), top_up_id=top_up_id or "", note=note),
            operator=True)
        return TopUpResult(applied=resp.applied, runway=Runway.from_pb(resp.runway))

    async def adjust_credits(self, tenant: str, amount: Decimal | str, note: str,
                             adjust_id: str | None = None) -> TopUpResult:
        resp = await self._call(self._stub.AdjustCredits, gateway_pb2.AdjustCreditsRequest(
            tenant=tenant, amount=money_text(amount), adjust_id=adjust_id or "", note=note),
            operator=True)
        return TopUpResult(applied=resp.applied, runway=Runway.from_pb(resp.runway))

    # --- tenant -----------------------------------------------------------------------

    async def submit_job(self, *, name: str, gpus: int, max_duration_s: int,
                         flavor: str = "", image: str = "", command: Iterable[str] = (),
                         priority: int = 0, labels: Mapping[str, str] | None = None,
                         sim_duration_s: int = 0, idempotency_key: str = "") -> Job:
        req = submit_job_request(name=name, gpus=gpus, max_duration_s=max_duration_s,
                                 flavor=flavor, image=image, command=command,
                                 priority=priority, labels=labels,
                                 sim_duration_s=sim_duration_s,
                                 idempotency_key=idempotency_key)
        return Job.from_pb((await self._call(self._stub.SubmitJob, req, operator=False)).job)

    async def get_job(self, job_id: str) -> Job:
        resp = await self._call(self._stub.GetJob, gateway_pb2.GetJobRequest(job_id=job_id),
                                operator=False)
        return Job.from_pb(resp.job)

    def list_jobs(self, states: Iterable[JobState | str] = (),
                  page_size: int = DEFAULT_PAGE_SIZE) -> AsyncIterator[Job]:
        """Every job of the tenant (only in `states` when given), page after page."""
        check_page_size(page_size)
        first = list_jobs_request(states, page_size, "")  # bad state names fail here
        return self._jobs(self._stub.ListJobs, first, operator=False)

    def list_all_jobs(self, tenant: str = "", states: Iterable[JobState | str] = (),
                      page_size: int = DEFAULT_PAGE_SIZE) -> AsyncIterator[Job]:
        """Operator: every tenant's jobs (or `tenant`'s; only in `states` when given), in
        submission order, page after page."""
        check_page_size(page_size)
        first = list_all_jobs_request(tenant, states, page_size)  # bad state names fail here
        return self._jobs(self._stub.ListAllJobs, first, operator=True)

    def _jobs(self, method: Any, first: Any, *, operator: bool) -> AsyncIterator[Job]:
        """The jobs of `first`'s listing and of every page after it (the same request
        with each next_page_token). Credentials are checked now, the pages read lazily."""
        self._settings.metadata(operator=operator)

        async def pages() -> AsyncIterator[Job]:
            req = first
            while True:
                resp = await self._call(method, req, operator=operator)
                for j in resp.jobs:
                    yield Job.from_pb(j)
                if not resp.next_page_token:
                    return
                req = type(first)()
                req.CopyFrom(first)
                req.page_token = resp.next_page_token

        return pages()

    async def cancel_job(self, job_id: str, reason: str = "") -> Job:
        resp = await self._call(self._stub.CancelJob,
                                gateway_pb2.CancelJobRequest(job_id=job_id, reason=reason),
                                operator=False)
        return Job.from_pb(resp.job)

    def watch_job(self, job_id: str, *, timeout_s: float | None = None) -> AsyncIterator[Job]:
        """Snapshots of the job as the server streams them, ending after a terminal state
        (or when the server ends the stream). No deadline unless `timeout_s` is given."""
        metadata, request_id = self._settings.metadata(operator=False)

        async def snapshots() -> AsyncIterator[Job]:
            call = self._stub.WatchJob(gateway_pb2.WatchJobRequest(job_id=job_id),
                                       metadata=metadata, timeout=timeout_s)
            try:
                async for resp in call:
                    job = Job.from_pb(resp.job)
                    yield job
                    if job.terminal:
                        return
            except grpc.RpcError as exc:
                raise from_rpc_error(exc, request_id=request_id) from exc
            finally:
                call.cancel()

        return snapshots()

    async def runway(self) -> Runway:
        resp = await self._call(self._stub.GetMyRunway, gateway_pb2.GetMyRunwayRequest(),
                                operator=False)
        return Runway.from_pb(resp.runway)

    def usage(self, start_us: int = 0, end_us: int = 0, workload_id: str = "", *,
              page_size: int = DEFAULT_PAGE_SIZE) -> AsyncIterator[UsageRow]:
        """The tenant's ledger rows overlapping [start_us, end_us) (0: unbounded), oldest
        first, page after page."""
        check_page_size(page_size)
        self._settings.metadata(operator=False)

        async def pages() -> AsyncIterator[UsageRow]:
            token = ""
            while True:
                resp = await self._call(self._stub.ListMyUsage, gateway_pb2.ListMyUsageRequest(
                    start_us=start_us, end_us=end_us, workload_id=workload_id,
                    page_size=page_size, page_token=token), operator=False)
                for r in resp.rows:
                    yield UsageRow.from_pb(r)
                token = resp.next_page_token
                if not token:
                    return

        return pages()

    # --- tenant: endpoints -----------------------------------------------------------

    async def create_endpoint(self, name: str, *, min_replicas: int = 0, max_replicas: int = 1,
                              flavor: str = "", model: str = "", horizon_s: int = 0,
                              warm_pool: int = 0, flavors: Sequence[str] = (),
                              target_p95_ms: int = 0, missed_slo_value_per_s: str = ""
                              ) -> Endpoint:
        """A new endpoint of the caller's tenant. With a cluster, its first replicas
        (min_replicas, at least one) start at once, each reserving its cost for the
        endpoint's horizon (FailedPrecondition when the budget cannot hold them): on
        flavor `cpu` a pod on the real kubelet, on a GPU flavor a simulated KWOK pod
        answered by a host stand-in. Without one, replicas are host processes
        (`KESTREL_WORKER_ENDPOINT=<endpoint_id> python -m services.worker`).
        `horizon_s`: seconds of spend each replica holds (0: the gateway's 600);
        `warm_pool`: replicas the autoscaler keeps ready while the budget allows;
        `flavors`: other flavors its replicas may run on (the autoscaler then picks
        the mix by cost per request under `target_p95_ms`); `missed_slo_value_per_s`:
        what a second of missed p95 is worth (sizes the warm replica from cost)."""
        resp = await self._call(self._stub.CreateEndpoint, create_endpoint_request(
            name, min_replicas=min_replicas, max_replicas=max_replicas, flavor=flavor,
            model=model, horizon_s=horizon_s, warm_pool=warm_pool, flavors=flavors,
            target_p95_ms=target_p95_ms, missed_slo_value_per_s=missed_slo_value_per_s),
            operator=False)
        return Endpoint.from_pb(resp.endpoint)

    async def get_endpoint(self, endpoint_id: str) -> Endpoint:
        resp = await self._call(self._stub.GetEndpoint,
                          gateway_pb2.GetEndpointRequest(endpoint_id=endpoint_id),
                          operator=False)
        return Endpoint.from_pb(resp.endpoint)

    async def list_endpoints(self, *, page_size: int = DEFAULT_PAGE_SIZE) -> list[Endpoint]:
        check_page_size(page_size)
        out: list[Endpoint] = []
        token = ""
        while True:
            resp = await self._call(self._stub.ListEndpoints, gateway_pb2.ListEndpointsRequest(
                page_size=page_size, page_token=token), operator=False)
            out += [Endpoint.from_pb(e) for e in resp.endpoints]
            token = resp.next_page_token
            if not token:
                return out

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        """True when this call deleted it; False when it was deleted before."""
        resp = await self._call(self._stub.DeleteEndpoint,
                          gateway_pb2.GatewayDeleteEndpointRequest(endpoint_id=endpoint_id),
                          operator=False)
        return bool(resp.deleted)

    async def infer(self, endpoint_id: str, inputs: Sequence[str], *,
              priority: Priority | str | int = Priority.NORMAL,
              timeout_s: float | None = None) -> InferResult:
        """Embeddings of `inputs` (1..256 texts). Waits up to `timeout_s` (default 10 s):
        then DeadlineExceeded (queued, not computed) or Unavailable (no ready replica)."""
        req = infer_request(endpoint_id, inputs, priority, timeout_s)
        metadata, request_id = self._settings.metadata(operator=False)
        try:
            resp = await self._stub.Infer(req, metadata=metadata,
                                      timeout=call_timeout(self._settings.timeout_s, timeout_s))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, request_id=request_id) from exc
        return InferResult.from_pb(resp)

"""A tenant's inference endpoints behind the gateway: what each holds, what it shows,
and how its replicas are started, scaled and stopped. The servicer checks who calls
and what they sent; this module does the rest.

With a placer, each replica is a Kestrel job (services/gateway/replicas.py) that
admission reserves a rolling horizon for and Kueue admits on the real cluster.
Without one (a plane with no cluster), replicas are host processes an operator starts
with KESTREL_WORKER_ENDPOINT=<endpoint id>.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal

import grpc

from kestrel.clock import now_us
from kestrel.errors import AlreadyExists, FailedPrecondition, NotFound, Violations
from kestrel.workloads import simulated_flavor
from kestrel_sdk import budget
from kestrel_sdk.v1 import common_pb2, meter_pb2, meter_pb2_grpc
from services.gateway.callers import CACHE_S
from services.gateway.endpoint_checks import (
    check_endpoint_id,
    check_flavor_replicas,
    flavors_of,
    normalised_spec,
)
from services.gateway.endpoint_store import EndpointRow, EndpointStore
from services.gateway.infer import InferBackend
from services.gateway.replicas import Replicas, horizon_of
from services.gateway.store import GatewayStore
from services.gateway.upstream import call, downstream

SPENT_CACHE_S = 2.0
log = logging.getLogger("kestrel.gateway.endpoints")


@dataclass(frozen=True)
class Scaled:
    row: EndpointRow
    started: tuple[str, ...]
    stopped: tuple[str, ...]
    refusal: str  # why fewer were started than asked, if so


class Endpoints:
    def __init__(self, store: EndpointStore, jobs: GatewayStore, replicas: Replicas,
                 meter: meter_pb2_grpc.MeterStub, infer_backend: InferBackend | None,
                 placed: bool, runways: Mapping[str, common_pb2.Runway] | None = None
                 ) -> None:
        self.store = store
        self.jobs = jobs
        self.replicas = replicas
        self.meter = meter
        self.infer_backend = infer_backend
        self.placed = placed  # a placer runs replicas on the cluster
        # Every tenant's last runway as the meter published it (kestrel.runway.follow);
        # None: ask the meter (a gateway without the stream, the endpoint race tests).
        self.runways = runways
        self._rows: dict[tuple[str, str], tuple[float, EndpointRow | None]] = {}
        self._spent: dict[str, tuple[float, bool]] = {}
        self._scale_locks: dict[str, asyncio.Lock] = {}

    async def _row(self, key: tuple[str, str], cached: bool,
                   load: Callable[[], Awaitable[EndpointRow | None]]) -> EndpointRow | None:
        """A row by `key` through the CACHE_S cache (when `cached`), else from `load`."""
        hit = self._rows.get(key) if cached else None
        if hit and time.monotonic() - hit[0] < CACHE_S:
            return hit[1]
        row = await load()
        self._rows[key] = (time.monotonic(), row)
        if len(self._rows) > 10_000:
            self._rows.clear()
        return row

    async def get(self, tenant: str, endpoint_id: str, cached: bool = False) -> EndpointRow:
        """The caller's live endpoint; another tenant's is one that never existed. Infer
        reads through a CACHE_S cache (a deletion on another gateway holds within it)."""
        v = Violations()
        check_endpoint_id(v, endpoint_id)
        v.raise_if_any()
        row = await self._row((tenant, endpoint_id), cached,
                              lambda: self.store.get(tenant, endpoint_id))
        if row is None:
            raise NotFound(f"endpoint {endpoint_id} not found")
        if row.deleted_us:
            raise NotFound(f"endpoint {endpoint_id} was deleted")
        return row

    async def named(self, tenant: str, name: str) -> EndpointRow:
        """The caller's live endpoint called `name` (the OpenAI API's `model`), through
        the same cache as `get`; another tenant's is one that never existed."""
        row = await self._row((tenant, f"name:{name}"), True,
                              lambda: self.store.named(tenant, name))
        if row is None or row.deleted_us:
            raise NotFound(f"the model {name!r} does not exist: it names none of your "
                           "endpoints")
        return row

    async def wire(self, row: EndpointRow) -> common_pb2.Endpoint:
        fresh = await self.infer_backend.ready_replicas(row.endpoint_id) \
            if self.infer_backend is not None else set()
        live = await self.live_replicas(row)
        placed = len(live)
        # Placed replicas heartbeat under their job id: one stopped a moment ago still
        # heartbeats for up to three intervals and is not ready. Host processes (no
        # placer) are ready when they heartbeat.
        ready = len(fresh & set(live)) if self.placed else len(fresh)
        if ready:
            reason = ""
        elif not self.placed:
            reason = ("no ready replica: with no cluster, replicas are host processes "
                      f"started with KESTREL_WORKER_ENDPOINT={row.endpoint_id}")
        elif row.deleted_us:
            reason = "deleted"
        else:
            reason = (f"{placed} replica(s) placed on {row.spec.flavor}; waiting for a "
                      "worker's first heartbeat (Kueue admission, then the model load)")
        # Placed replicas are the count; without a placer, those heartbeating.
        replicas = placed if self.placed else max(placed, ready)
        by, ready_by = (await self.flavor_counts(row, live, fresh) if self.placed
                        else ({row.spec.flavor: replicas} if replicas else {},
                              {row.spec.flavor: ready} if ready else {}))
        return common_pb2.Endpoint(endpoint_id=row.endpoint_id, tenant=row.tenant,
                                   spec=row.spec, replicas=replicas,
                                   ready_replicas=ready, reason=reason,
                                   created_us=row.created_us,
                                   simulated=self.placed and any(
                                       simulated_flavor(f) for f in by or [row.spec.flavor]),
                                   flavor_replicas=by, flavor_ready=ready_by)

    async def live_replicas(self, row: EndpointRow) -> tuple[str, ...]:
        """Its replicas that have not ended (one evicted at zero budget has)."""
        if not row.replicas or not self.placed:
            return row.replicas
        ended = await self.jobs.ended(row.replicas)
        return tuple(j for j in row.replicas if j not in ended)

    async def create(self, tenant: str, spec: common_pb2.EndpointSpec) -> EndpointRow:
        """A checked spec becomes an endpoint with its first replicas placed. The row
        is visible (to ListEndpoints, to the autoscaler) before its replicas are; any
        scaling of it waits for them under the endpoint's lock."""
        spec = normalised_spec(spec)
        if self.placed:
            spec.reservation_horizon_s = horizon_of(spec)
        endpoint_id = f"ep-{uuid.uuid4().hex[:16]}"
        async with self._locked(endpoint_id):
            row = await self.store.insert(endpoint_id, tenant, spec, now_us())
            if row is None:
                raise AlreadyExists(f"an endpoint named {spec.name!r} exists")
            if self.placed:
                row = await self._start_replicas(row)
        return row

    @contextlib.asynccontextmanager
    async def _locked(self, endpoint_id: str) -> AsyncIterator[None]:
        """This gateway's lock of the endpoint, then every gateway's (the store's)."""
        async with self._scale_locks.setdefault(endpoint_id, asyncio.Lock()), \
                self.store.changing(endpoint_id):
            yield

    async def _start_replicas(self, row: EndpointRow) -> EndpointRow:
        """Its first replicas (min_replicas, at least one), each admitted against the
        budget for the horizon; if the budget cannot hold them all, none is kept and
        the endpoint is not created. Deleted meanwhile (ListEndpoints showed it), the
        replicas it got are stopped and it answers NotFound."""
        count = max(1, row.spec.min_replicas)
        try:
            added = await self.replicas.add(row.tenant, row.endpoint_id, row.spec, 0, count,
                                            now_us())
        except grpc.aio.AioRpcError as err:
            await self.store.delete(row.tenant, row.endpoint_id, now_us())
            raise downstream(err) from None
        if added.refusal:
            await self.replicas.stop(row.tenant, added.job_ids, "the endpoint was not created")
            await self.store.delete(row.tenant, row.endpoint_id, now_us())
            raise FailedPrecondition(
                f"the budget cannot hold {count} replica(s) of {row.spec.name} for its "
                f"horizon of {horizon_of(row.spec)} s: {added.refusal}")
        if not await self.store.set_replicas(row.tenant, row.endpoint_id, added.job_ids):
            await self._deleted_meanwhile(row, added.job_ids)
        log.info("endpoint %s of %s created on %s: replicas %s", row.endpoint_id, row.tenant,
                 row.spec.flavor, ", ".join(added.job_ids))
        return replace(row, replicas=added.job_ids)

    async def _deleted_meanwhile(self, row: EndpointRow, started: tuple[str, ...]) -> None:
        """The endpoint was deleted while `started` were being admitted: the deletion
        stopped the replicas recorded before it, these were not among them."""
        log.warning("endpoint %s of %s was deleted while %d replica(s) started; stopping "
                    "%s", row.endpoint_id, row.tenant, len(started), ", ".join(started))
        await self.replicas.stop(row.tenant, started, "the endpoint was deleted")
        raise NotFound(f"endpoint {row.endpoint_id} was deleted")

    async def scale(self, tenant: str, endpoint_id: str, replicas: int,
                    reason: str, by_flavor: Mapping[str, int] | None = None) -> Scaled:
        """Start or stop replicas until `replicas` run (the newest stop first), or, with
        `by_flavor`, that many of each flavor (a flavor left out keeps none; stops come
        first, so the money they hold pays for the starts); one scaling of an endpoint
        at a time."""
        row = await self.store.get(tenant, endpoint_id)
        if row is None or row.deleted_us:
            raise NotFound(f"endpoint {endpoint_id} of {tenant!r} not found")
        v = Violations()
        if by_flavor:
            check_flavor_replicas(v, row.spec, replicas, by_flavor)
        elif not 0 <= replicas <= row.spec.max_replicas:
            v.add("replicas", f"must be 0..{row.spec.max_replicas} (the endpoint's max)")
        v.raise_if_any()
        if not self.placed:
            raise FailedPrecondition("this gateway has no cluster: replicas are host "
                                     "processes, started by hand")
        async with self._locked(row.endpoint_id):
            row = await self.store.get(tenant, endpoint_id) or row
            if row.deleted_us:
                raise NotFound(f"endpoint {endpoint_id} was deleted")
            live = await self.live_replicas(row)
            started: tuple[str, ...] = ()
            stopped: tuple[str, ...] = ()
            refusal = ""
            if by_flavor:
                started, stopped, refusal = await self._scale_flavors(row, live, by_flavor,
                                                                      reason)
            elif replicas > len(live):
                added = await self.replicas.add(row.tenant, row.endpoint_id, row.spec,
                                                len(live), replicas - len(live), now_us())
                started, refusal = added.job_ids, added.refusal
            elif replicas < len(live):
                stopped = live[replicas:]
                await self.replicas.stop(row.tenant, stopped,
                                         f"scaled down: {reason or 'operator'}")
            keep = tuple(j for j in live if j not in stopped) + started
            recorded = await self.store.set_replicas(row.tenant, row.endpoint_id, keep)
            self._rows.pop((row.tenant, row.endpoint_id), None)
            if not recorded:
                await self._deleted_meanwhile(row, started)
        if started or stopped:
            log.info("endpoint %s of %s scaled %d -> %d (%s): started %s, stopped %s%s",
                     row.endpoint_id, row.tenant, len(live), len(keep), reason or "operator",
                     ", ".join(started) or "none", ", ".join(stopped) or "none",
                     f"; refused: {refusal}" if refusal else "")
        return Scaled(replace(row, replicas=keep), started, stopped, refusal)

    async def _scale_flavors(self, row: EndpointRow, live: tuple[str, ...],
                             want: Mapping[str, int], reason: str
                             ) -> tuple[tuple[str, ...], tuple[str, ...], str]:
        """(started, stopped, refusal) for per-flavor counts, under the endpoint's lock."""
        of = await self.jobs.flavors_asked(live)
        own = row.spec.flavor
        groups: dict[str, list[str]] = {}
        for j in live:
            groups.setdefault(of.get(j) or own, []).append(j)
        stopped = tuple(j for f, js in groups.items() for j in js[want.get(f, 0):])
        if stopped:
            await self.replicas.stop(row.tenant, stopped, f"scaled down: {reason or 'operator'}")
        started: list[str] = []
        refusal = ""
        for f in flavors_of(row.spec):
            more = want.get(f, 0) - len(groups.get(f, ()))
            if more <= 0:
                continue
            spec = common_pb2.EndpointSpec()
            spec.CopyFrom(row.spec)
            spec.flavor = f
            added = await self.replicas.add(row.tenant, row.endpoint_id, spec,
                                            len(live) + len(started), more, now_us())
            started += added.job_ids
            if added.refusal:
                refusal = f"{f}: {added.refusal}"
                break
        return tuple(started), stopped, refusal

    async def flavor_counts(self, row: EndpointRow, live: tuple[str, ...],
                            ready: set[str]) -> tuple[dict[str, int], dict[str, int]]:
        """Replicas and ready replicas per flavor."""
        of = await self.jobs.flavors_asked(live) if len(flavors_of(row.spec)) > 1 else {}
        counts: dict[str, int] = {}
        ready_by: dict[str, int] = {}
        for j in live:
            f = of.get(j) or row.spec.flavor
            counts[f] = counts.get(f, 0) + 1
            if j in ready:
                ready_by[f] = ready_by.get(f, 0) + 1
        return counts, ready_by

    async def delete(self, tenant: str, endpoint_id: str) -> bool:
        """Delete it and stop its replicas; False when it was deleted already. The
        replicas stopped are those recorded in the same statement that marks it deleted;
        a scaling on any gateway that started one after that finds the endpoint deleted
        and stops it itself (scale, _start_replicas)."""
        row = await self.store.get(tenant, endpoint_id)
        if row is None:
            raise NotFound(f"endpoint {endpoint_id} not found")
        async with self._locked(endpoint_id):
            replicas = await self.store.delete(tenant, endpoint_id, now_us())
            self._rows.pop((tenant, endpoint_id), None)
            self._rows.pop((tenant, f"name:{row.name}"), None)
            if replicas is None:
                return False
            log.info("endpoint %s of %s deleted; stopping %s", endpoint_id, tenant,
                     ", ".join(replicas) or "no replica")
            if replicas:
                await self.replicas.stop(tenant, replicas, "the endpoint was deleted")
        self._scale_locks.pop(endpoint_id, None)
        return True

    async def budget_spent(self, tenant: str) -> bool:
        """credits - charged <= 0, as the meter last published it (the shared runway
        view: no call per request, and a top-up or the last spend holds as soon as the
        meter commits it); for a tenant the view has not heard of yet, as the meter
        answers (cached 2 s per tenant). When spent, the runway check has deactivated
        (or is deactivating) every replica."""
        fig = self.runways.get(tenant) if self.runways is not None else None
        if fig is not None:
            return budget.spent(Decimal(fig.credits or "0"), Decimal(fig.charged or "0"))
        hit = self._spent.get(tenant)
        if hit and time.monotonic() - hit[0] < SPENT_CACHE_S:
            return hit[1]
        runway = (await call(self.meter.GetRunway(
            meter_pb2.GetRunwayRequest(tenant=tenant), timeout=5))).runway
        spent = budget.spent(Decimal(runway.credits or "0"), Decimal(runway.charged or "0"))
        self._spent[tenant] = (time.monotonic(), spent)
        return spent

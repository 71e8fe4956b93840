"""Transport: the kestrel.v1.Meter gRPC servicer. Validate, call the core, convert."""

from __future__ import annotations

import re
import uuid
from decimal import Decimal
from typing import Any, TypeAlias

import grpc

from kestrel.errors import NotFound, Violations
from kestrel.grpcserver import map_errors
from kestrel.paging import after_int, encode_token
from kestrel.workloads import TENANT_ID_RE
from kestrel_sdk.money import MoneyError, fmt, parse_amount
from kestrel_sdk.v1 import meter_pb2, meter_pb2_grpc
from services.meter.core import Meter
from services.meter.wire import row_to_wire, runway_to_wire

# \Z, not $ (see TENANT_ID_RE).
FLAVOR_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
MAX_PAGE = 1000
# 2001-09-09 .. 2286: anything outside is a unit mistake (seconds or ns, not µs).
MIN_US, MAX_US = 1_000_000_000_000_000, 9_999_999_999_999_999
Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


def check_tenant(v: Violations, tenant: str, field: str = "tenant") -> None:
    if not TENANT_ID_RE.match(tenant):
        v.add(field, "must be 1-63 characters of a-z, 0-9 and '-', starting and ending "
                     "with a letter or digit")


@map_errors
class MeterServicer(meter_pb2_grpc.MeterServicer):
    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    async def GetRunway(self, request: meter_pb2.GetRunwayRequest,
                        context: Ctx) -> meter_pb2.GetRunwayResponse:
        v = Violations()
        check_tenant(v, request.tenant)
        v.raise_if_any()
        return meter_pb2.GetRunwayResponse(
            runway=runway_to_wire(await self.meter.runway(request.tenant)))

    async def ListUsage(self, request: meter_pb2.ListUsageRequest,
                        context: Ctx) -> meter_pb2.ListUsageResponse:
        v = Violations()
        check_tenant(v, request.tenant)
        for name in ("start_us", "end_us"):
            value = getattr(request, name)
            if value != 0 and not MIN_US <= value <= MAX_US:
                v.add(name, "must be 0 (unbounded) or microseconds since the epoch")
        if request.start_us and request.end_us and request.end_us <= request.start_us:
            v.add("end_us", "must be after start_us")
        if request.workload_id and not ID_RE.match(request.workload_id):
            v.add("workload_id", "must be 1-128 characters of A-Z a-z 0-9 . _ : -")
        if request.page_size < 0 or request.page_size > MAX_PAGE:
            v.add("page_size", f"must be between 0 (default 100) and {MAX_PAGE}")
        query = (request.tenant, request.start_us, request.end_us, request.workload_id)
        after = after_int(v, request.page_token, query)
        v.raise_if_any()
        if not await self.meter.store.tenant_exists(request.tenant):
            raise NotFound(f"tenant {request.tenant!r} has no account")
        page = await self.meter.store.usage_page(
            request.tenant, request.start_us, request.end_us, request.workload_id, after,
            request.page_size or 100)
        return meter_pb2.ListUsageResponse(
            rows=[row_to_wire(i, r, rec) for i, r, rec in page.rows],
            next_page_token=encode_token(page.next_after, query) if page.next_after else "")

    async def TopUp(self, request: meter_pb2.TopUpRequest,
                    context: Ctx) -> meter_pb2.TopUpResponse:
        v = Violations()
        check_tenant(v, request.tenant)
        amount = Decimal(0)
        try:
            amount = parse_amount(request.amount)
        except MoneyError as exc:
            v.add("amount", str(exc))
        if request.top_up_id and not ID_RE.match(request.top_up_id):
            v.add("top_up_id", "must be 1-128 characters of A-Z a-z 0-9 . _ : -")
        if len(request.note) > 500:
            v.add("note", "must be at most 500 characters")
        v.raise_if_any()
        top_up_id = request.top_up_id or f"topup-{uuid.uuid4().hex}"
        figures, applied = await self.meter.top_up(request.tenant, amount, top_up_id,
                                                   request.note)
        return meter_pb2.TopUpResponse(runway=runway_to_wire(figures), applied=applied)

    async def Adjust(self, request: meter_pb2.AdjustRequest,
                     context: Ctx) -> meter_pb2.AdjustResponse:
        v = Violations()
        check_tenant(v, request.tenant)
        amount = Decimal(0)
        try:
            amount = parse_amount(request.amount, signed=True)
        except MoneyError as exc:
            v.add("amount", str(exc))
        if request.adjust_id and not ID_RE.match(request.adjust_id):
            v.add("adjust_id", "must be 1-128 characters of A-Z a-z 0-9 . _ : -")
        if not request.note or len(request.note) > 500:
            v.add("note", "is required (why the budget changes): at most 500 characters")
        v.raise_if_any()
        figures, applied = await self.meter.top_up(
            request.tenant, amount, request.adjust_id or f"adjust-{uuid.uuid4().hex}",
            request.note, adjustment=True)
        return meter_pb2.AdjustResponse(runway=runway_to_wire(figures), applied=applied)

    async def GetTenantSummary(self, request: meter_pb2.GetTenantSummaryRequest,
                               context: Ctx) -> meter_pb2.GetTenantSummaryResponse:
        v = Violations()
        check_tenant(v, request.tenant)
        v.raise_if_any()
        figures = await self.meter.runway(request.tenant)
        acc = self.meter.projection.account(request.tenant)
        return meter_pb2.GetTenantSummaryResponse(
            runway=runway_to_wire(figures),
            flavors=[meter_pb2.FlavorUsage(flavor=f, gpu_us=t.gpu_us, cost=fmt(t.cost),
                                           rows=t.rows)
                     for f, t in sorted(acc.flavors.items())],
            rows=sum(t.rows for t in acc.flavors.values()),
            open_allocations=len(acc.open), top_ups=acc.top_ups)

    async def CreateAccount(self, request: meter_pb2.CreateAccountRequest,
                            context: Ctx) -> meter_pb2.CreateAccountResponse:
        v = Violations()
        check_tenant(v, request.tenant)
        initial = None
        if request.initial_credits:
            try:
                initial = parse_amount(request.initial_credits)
            except MoneyError as exc:
                v.add("initial_credits", str(exc))
        v.raise_if_any()
        created = await self.meter.create_account(request.tenant)
        if initial is not None:
            figures, _ = await self.meter.top_up(request.tenant, initial,
                                                 f"initial-{request.tenant}", "initial credits")
        else:
            figures = await self.meter.runway(request.tenant)
        return meter_pb2.CreateAccountResponse(runway=runway_to_wire(figures), created=created)

    async def ListPrices(self, request: meter_pb2.ListPricesRequest,
                         context: Ctx) -> meter_pb2.ListPricesResponse:
        return meter_pb2.ListPricesResponse(prices=[
            meter_pb2.Price(flavor=f, price_per_gpu_s=fmt(p), price_per_gpu_h=fmt(p * 3600),
                            effective_us=eff)
            for f, (p, eff) in sorted(self.meter.prices.items())])

    async def SetPrice(self, request: meter_pb2.SetPriceRequest,
                       context: Ctx) -> meter_pb2.SetPriceResponse:
        v = Violations()
        if not FLAVOR_RE.match(request.flavor):
            v.add("flavor", "must be 1-63 characters of a-z, 0-9 and '-'")
        price = Decimal(0)
        try:
            price = parse_amount(request.price_per_gpu_s, positive=False,
                                 maximum=Decimal(1000))
        except MoneyError as exc:
            v.add("price_per_gpu_s", str(exc))
        v.raise_if_any()
        p, eff = await self.meter.set_price(request.flavor, price)
        return meter_pb2.SetPriceResponse(price=meter_pb2.Price(
            flavor=request.flavor, price_per_gpu_s=fmt(p), price_per_gpu_h=fmt(p * 3600),
            effective_us=eff))


__all__ = ["MeterServicer"]

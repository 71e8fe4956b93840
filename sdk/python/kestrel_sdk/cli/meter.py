"""`kestrel meter ...`: operator commands that talk straight to the meter's gRPC API
(kestrel.v1.Meter), bypassing the gateway. Printed by the same renderer as the rest
of the CLI; `-o json` prints the meter's protobuf answer as JSON."""

from __future__ import annotations

from typing import Annotated, NoReturn

import grpc
import typer
from rich.console import RenderableType
from rich.table import Table

from kestrel_sdk import Runway, UsageRow
from kestrel_sdk.cli import render
from kestrel_sdk.cli._common import AsJson, OutputOpt, cell, fail
from kestrel_sdk.tls import channel as tls_channel
from kestrel_sdk.v1 import common_pb2, meter_pb2, meter_pb2_grpc

app = typer.Typer(help="Operator: talk to the meter directly (ledger, runway, credits).",
                  no_args_is_help=True)

MeterAddr = Annotated[str, typer.Option(envvar="KESTREL_METER_ADDR",
                                        help="meter gRPC address")]


def _fail(exc: grpc.RpcError) -> NoReturn:
    code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    fail(f"{code}: {detail}")


def _meter(addr: str) -> meter_pb2_grpc.MeterStub:
    return meter_pb2_grpc.MeterStub(tls_channel(addr))


def _runway(r: common_pb2.Runway) -> list[RenderableType]:
    return render.runway_parts(Runway.from_pb(r))


@app.command()
def runway(ctx: typer.Context, tenant: str, meter: MeterAddr = "127.0.0.1:50053",
           as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Current runway of TENANT (operator view, from the meter): how long the money
    lasts at the current burn, and what is still free to reserve."""
    try:
        resp = _meter(meter).GetRunway(meter_pb2.GetRunwayRequest(tenant=tenant), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)
    render.show(ctx, resp, lambda: _runway(resp.runway), as_json=as_json, output=output)


@app.command()
def usage(ctx: typer.Context, tenant: str, workload: Annotated[str, typer.Option()] = "",
          limit: Annotated[int, typer.Option(help="rows to show")] = 50,
          meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False,
          output: OutputOpt = None) -> None:
    """Ledger rows of TENANT, oldest first."""
    rows: list[meter_pb2.UsageRow] = []
    token = ""
    stub = _meter(meter)
    try:
        while len(rows) < limit:
            resp = stub.ListUsage(meter_pb2.ListUsageRequest(
                tenant=tenant, workload_id=workload, page_size=min(1000, limit - len(rows)),
                page_token=token), timeout=10)
            rows += resp.rows
            token = resp.next_page_token
            if not token:
                break
    except grpc.RpcError as exc:
        _fail(exc)
    render.show(ctx, meter_pb2.ListUsageResponse(rows=rows), lambda: [render.usage_table(
        [UsageRow.from_pb(r) for r in rows], f"ledger rows of {tenant}", cause=True)],
        as_json=as_json, output=output)


@app.command("top-up")
def top_up(ctx: typer.Context, tenant: str, amount: str,
           top_up_id: Annotated[str, typer.Option()] = "",
           note: Annotated[str, typer.Option()] = "",
           meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False,
           output: OutputOpt = None) -> None:
    """Operator: add AMOUNT credits to TENANT."""
    try:
        resp = _meter(meter).TopUp(meter_pb2.TopUpRequest(
            tenant=tenant, amount=amount, top_up_id=top_up_id, note=note), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)
    render.show(ctx, resp, lambda: [
        "applied" if resp.applied else "already applied (same top-up id)",
        *_runway(resp.runway)], as_json=as_json, output=output)


@app.command()
def account(ctx: typer.Context, tenant: str,
            initial_credits: Annotated[str, typer.Option()] = "",
            meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False,
            output: OutputOpt = None) -> None:
    """Operator: open TENANT's billing account (idempotent)."""
    try:
        resp = _meter(meter).CreateAccount(meter_pb2.CreateAccountRequest(
            tenant=tenant, initial_credits=initial_credits), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)
    render.show(ctx, resp, lambda: _runway(resp.runway), as_json=as_json, output=output)


@app.command()
def summary(ctx: typer.Context, tenant: str, meter: MeterAddr = "127.0.0.1:50053",
            as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Totals of TENANT per flavor, from the ledger."""
    try:
        resp = _meter(meter).GetTenantSummary(
            meter_pb2.GetTenantSummaryRequest(tenant=tenant), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)

    def human() -> list[RenderableType]:
        t = Table(title="usage per flavor")
        for col in ("flavor", "GPU-seconds", "spend", "rows"):
            t.add_column(col, justify="right")
        for f in resp.flavors:
            t.add_row(cell(f.flavor), f"{f.gpu_us / 1e6:,.6f}", cell(f.cost), str(f.rows))
        return [*_runway(resp.runway), t]

    render.show(ctx, resp, human, as_json=as_json, output=output)


@app.command()
def prices(ctx: typer.Context, meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False,
           output: OutputOpt = None) -> None:
    """Prices per flavor in force."""
    try:
        resp = _meter(meter).ListPrices(meter_pb2.ListPricesRequest(), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)

    def human() -> list[RenderableType]:
        t = Table(title="prices")
        for col in ("flavor", "per GPU-second", "per GPU-hour"):
            t.add_column(col, justify="right")
        for p in resp.prices:
            t.add_row(cell(p.flavor), cell(p.price_per_gpu_s), cell(p.price_per_gpu_h))
        return [t]

    render.show(ctx, resp, human, as_json=as_json, output=output)

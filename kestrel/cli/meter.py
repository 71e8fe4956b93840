"""`kestrel meter ...`: operator commands that talk straight to the meter's gRPC API
(kestrel.v1.Meter), bypassing the gateway. Same behaviour as before they moved here."""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

import grpc
import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.table import Table

from kestrel.cli._common import console, fail
from kestrel.v1 import meter_pb2, meter_pb2_grpc

app = typer.Typer(help="Operator: talk to the meter directly (ledger, runway, credits).",
                  no_args_is_help=True)

MeterAddr = Annotated[str, typer.Option(envvar="KESTREL_METER_ADDR",
                                        help="meter gRPC address")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _fail(exc: grpc.RpcError) -> NoReturn:
    code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    fail(f"{code}: {detail}")


def _meter(addr: str) -> meter_pb2_grpc.MeterStub:
    return meter_pb2_grpc.MeterStub(grpc.insecure_channel(addr))


def _dump(msg: Message) -> None:
    print(json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True),
                     indent=2))


def _runway_table(r: Any) -> Table:
    t = Table(title=f"runway of {r.tenant}")
    for col in ("credits", "charged", "reserved", "remaining", "burn/s", "runway", "GPUs"):
        t.add_column(col, justify="right")
    runway = "unlimited" if r.unlimited else f"{r.runway_s:,.1f}s"
    t.add_row(r.credits, r.charged, r.reserved, r.remaining, r.burn_per_s, runway,
              str(r.running_gpus))
    return t


@app.command()
def runway(tenant: str, meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False) -> None:
    """Current runway of TENANT (operator view, from the meter)."""
    try:
        resp = _meter(meter).GetRunway(meter_pb2.GetRunwayRequest(tenant=tenant), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)
    if as_json:
        _dump(resp)
    else:
        console.print(_runway_table(resp.runway))


@app.command()
def usage(tenant: str, workload: Annotated[str, typer.Option()] = "",
          limit: Annotated[int, typer.Option(help="rows to show")] = 50,
          meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False) -> None:
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
    if as_json:
        _dump(meter_pb2.ListUsageResponse(rows=rows))
        return
    t = Table(title=f"ledger rows of {tenant}")
    for col in ("row", "workload", "flavor", "gpus", "start_us", "end_us", "gpu_s", "cost",
                "cause"):
        t.add_column(col)
    for r in rows:
        t.add_row(str(r.row_id), r.workload_id, r.flavor, str(r.gpus), str(r.start_us),
                  str(r.end_us), f"{r.gpu_us / 1e6:.6f}", r.cost, r.cause_id)
    console.print(t)


@app.command("top-up")
def top_up(tenant: str, amount: str, top_up_id: Annotated[str, typer.Option()] = "",
           note: Annotated[str, typer.Option()] = "",
           meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False) -> None:
    """Operator: add AMOUNT credits to TENANT."""
    try:
        resp = _meter(meter).TopUp(meter_pb2.TopUpRequest(
            tenant=tenant, amount=amount, top_up_id=top_up_id, note=note), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)
    if as_json:
        _dump(resp)
    else:
        console.print("applied" if resp.applied else "already applied (same top-up id)")
        console.print(_runway_table(resp.runway))


@app.command()
def account(tenant: str, initial_credits: Annotated[str, typer.Option()] = "",
            meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False) -> None:
    """Operator: open TENANT's billing account (idempotent)."""
    try:
        resp = _meter(meter).CreateAccount(meter_pb2.CreateAccountRequest(
            tenant=tenant, initial_credits=initial_credits), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)
    if as_json:
        _dump(resp)
    else:
        console.print(_runway_table(resp.runway))


@app.command()
def summary(tenant: str, meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False) -> None:
    """Totals of TENANT per flavor, from the ledger."""
    try:
        resp = _meter(meter).GetTenantSummary(
            meter_pb2.GetTenantSummaryRequest(tenant=tenant), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)
    if as_json:
        _dump(resp)
        return
    console.print(_runway_table(resp.runway))
    t = Table(title="usage per flavor")
    for col in ("flavor", "GPU-seconds", "spend", "rows"):
        t.add_column(col, justify="right")
    for f in resp.flavors:
        t.add_row(f.flavor, f"{f.gpu_us / 1e6:,.6f}", f.cost, str(f.rows))
    console.print(t)


@app.command()
def prices(meter: MeterAddr = "127.0.0.1:50053", as_json: AsJson = False) -> None:
    """Prices per flavor in force."""
    try:
        resp = _meter(meter).ListPrices(meter_pb2.ListPricesRequest(), timeout=10)
    except grpc.RpcError as exc:
        _fail(exc)
    if as_json:
        _dump(resp)
        return
    t = Table(title="prices")
    for col in ("flavor", "per GPU-second", "per GPU-hour"):
        t.add_column(col, justify="right")
    for p in resp.prices:
        t.add_row(p.flavor, p.price_per_gpu_s, p.price_per_gpu_h)
    console.print(t)

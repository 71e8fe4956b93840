"""The `kestrel` command line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Annotated, Any

import grpc
import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from kestrel.v1 import meter_pb2, meter_pb2_grpc

app = typer.Typer(help="Kestrel: runway-aware GPU compute. Operator and tenant commands.",
                  no_args_is_help=True, add_completion=False)
console = Console()

MeterAddr = Annotated[str, typer.Option(envvar="KESTREL_METER_ADDR",
                                        help="meter gRPC address")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _fail(exc: grpc.RpcError) -> None:
    code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    console.print(f"[red]error[/red] {code}: {detail}", highlight=False)
    raise typer.Exit(2)


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
def tap(subject: Annotated[str, typer.Argument(help="NATS subject, wildcards allowed")]
        = "kestrel.>",
        nats_url: Annotated[str, typer.Option(envvar="KESTREL_NATS_URL")]
        = "nats://127.0.0.1:4222",
        count: Annotated[int, typer.Option(help="stop after N messages (0: never)")] = 0,
        ) -> None:
    """Print every bus message on SUBJECT decoded from protobuf, one JSON line each."""
    from kestrel.tap import tap as run_tap

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_tap(nats_url, subject, count=count))


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


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)




if __name__ == "__main__":
    main()

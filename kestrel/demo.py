"""make demo: the ledger deciding live, end to end on real infrastructure.

Brings up Postgres, NATS JetStream and Redis on loopback and the meter, then
plays a scenario. Until the placer lands (issue 5), the workload events are
published by this demo exactly as the placer will publish them: labelled
SIMULATED PLACER wherever shown. Everything else is real: JetStream, the
meter process, the append-only ledger in Postgres, the runway stream.

    python -m kestrel.demo [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from dataclasses import dataclass, field
from decimal import Decimal

import asyncpg
import grpc
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from kestrel import bus
from kestrel.clock import now_us
from kestrel.devstack import Stack, free_port
from kestrel.procs import REPO, ServiceProcess
from kestrel.v1 import common_pb2, events_pb2, meter_pb2, meter_pb2_grpc

_probe = Console()
console = _probe if _probe.is_terminal else Console(width=110)
# Demo prices (credits per GPU-second), high so budgets move within seconds.
PRICES = "gpu-h100=0.05,gpu-a10=0.015"
REASONS = {v.number: v.name.removeprefix("RUNWAY_CHANGE_REASON_").lower()
           for v in events_pb2.RunwayChangeReason.DESCRIPTOR.values}


@dataclass(frozen=True)
class Job:
    tenant: str
    wid: str
    flavor: str
    gpus: int
    at_s: float  # admitted this many seconds into the scenario
    run_s: float  # then finished after this long


SCENARIO = [
    Job("acme", "acme-train-1", "gpu-h100", 8, 0.0, 6.0),
    Job("acme", "acme-eval-1", "gpu-a10", 4, 0.5, 9.0),
    Job("acme", "acme-train-2", "gpu-h100", 2, 3.0, 5.0),
    # 4 GPUs x 0.05 burn tiny's 1 credit in 5 s: exhausted at ~6 s, before its finish.
    Job("tiny", "tiny-finetune-1", "gpu-h100", 4, 1.0, 6.0),
    Job("tiny", "tiny-finetune-2", "gpu-a10", 2, 8.0, 3.0),
]
CREDITS = {"acme": "100", "tiny": "1"}
TOP_UP_AT_S, TOP_UP = 7.0, ("tiny", "2")


@dataclass
class View:
    runway: dict[str, events_pb2.RunwayChanged] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def note(self, text: str) -> None:
        self.log.append(f"[dim]{time.monotonic() - self.started:5.1f}s[/dim] {text}")
        del self.log[:-8]

    def render(self) -> Group:
        t = Table(title="runway, live from kestrel.runway.> (figures from ledger rows)")
        for col in ("tenant", "credits", "charged", "remaining", "burn/s", "runway",
                    "GPUs", "last change"):
            t.add_column(col, justify="right")
        for tenant, msg in sorted(self.runway.items()):
            r = msg.runway
            runway = "∞" if r.unlimited else f"{r.runway_s:,.1f}s"
            style = "red" if Decimal(r.remaining) <= 0 else ""
            t.add_row(tenant, r.credits, f"{Decimal(r.charged):.4f}",
                      f"[{style}]{Decimal(r.remaining):.4f}[/{style}]" if style
                      else f"{Decimal(r.remaining):.4f}", r.burn_per_s, runway,
                      str(r.running_gpus), REASONS.get(msg.reason, "?"))
        return Group(t, Panel("\n".join(self.log) or "starting", title="events",
                              border_style="dim"))


async def play(stack: Stack, meter_addr: str, view: View, live: Live) -> dict[str, int]:
    nc = await bus.connect(stack.nats_url, "demo")
    js = nc.jetstream()

    async def on_runway(msg: object) -> None:
        m = events_pb2.RunwayChanged.FromString(msg.data)  # type: ignore[attr-defined]
        view.runway[m.runway.tenant] = m
        if m.reason in (events_pb2.RUNWAY_CHANGE_REASON_THRESHOLD_50,
                        events_pb2.RUNWAY_CHANGE_REASON_THRESHOLD_10,
                        events_pb2.RUNWAY_CHANGE_REASON_EXHAUSTED):
            view.note(f"[yellow]meter: {m.runway.tenant} {REASONS[m.reason]}[/yellow] "
                      f"(remaining {Decimal(m.runway.remaining):.4f})")
        live.update(view.render())

    await nc.subscribe("kestrel.runway.>", cb=on_runway)
    async with grpc.aio.insecure_channel(meter_addr) as ch:
        meter = meter_pb2_grpc.MeterStub(ch)
        for tenant, credits in CREDITS.items():
            await meter.CreateAccount(meter_pb2.CreateAccountRequest(
                tenant=tenant, initial_credits=credits))
            view.note(f"operator: account [b]{tenant}[/b] opened with {credits} credits")

        elapsed_us: dict[str, int] = {}
        t0 = time.monotonic()

        async def publish(job: Job, typ: int, name: str, at: int) -> None:
            e = events_pb2.WorkloadEvent(
                event_id=f"{job.wid}-{name}", tenant=job.tenant, workload_id=job.wid,
                kind=common_pb2.WORKLOAD_KIND_JOB, type=typ,  # type: ignore[arg-type]
                time_us=at, flavor=job.flavor, gpus=job.gpus)
            await bus.publish(js, bus.subject_workload(job.tenant, name), e, e.event_id)

        async def run_job(job: Job) -> None:
            await asyncio.sleep(max(0.0, job.at_s - (time.monotonic() - t0)))
            start = now_us()
            await publish(job, 1, "admitted", start)
            view.note(f"SIMULATED PLACER: {job.wid} admitted, {job.gpus}x {job.flavor}")
            await asyncio.sleep(job.run_s)
            end = now_us()
            await publish(job, 3, "finished", end)
            elapsed_us[job.wid] = job.gpus * (end - start)
            view.note(f"SIMULATED PLACER: {job.wid} finished after {(end - start) / 1e6:.2f}s")

        async def top_up() -> None:
            await asyncio.sleep(TOP_UP_AT_S)
            tenant, amount = TOP_UP
            await meter.TopUp(meter_pb2.TopUpRequest(tenant=tenant, amount=amount,
                                                     top_up_id=f"demo-{tenant}-1"))
            view.note(f"operator: top-up of {amount} credits for [b]{tenant}[/b]")

        await asyncio.gather(*(run_job(j) for j in SCENARIO), top_up())
        await asyncio.sleep(1.5)  # a tick or two after the last finish
    await nc.close()
    return elapsed_us


async def summary(stack: Stack, elapsed_us: dict[str, int]) -> bool:
    db = await asyncpg.connect(stack.postgres_dsn)
    rows = await db.fetch("""
        SELECT l.tenant, l.workload_id, sum(l.gpu_us) AS gpu_us, sum(l.cost) AS cost,
               count(*) AS n
        FROM ledger l GROUP BY l.tenant, l.workload_id""")
    credits = {r["tenant"]: r["s"] for r in await db.fetch(
        "SELECT tenant, sum(amount) s FROM credits GROUP BY tenant")}
    await db.close()
    t = Table(title="summary per tenant (ledger rows vs gpus x elapsed of the events)")
    for col in ("tenant", "jobs", "ledger rows", "GPU-s (ledger)", "GPU-s (recomputed)",
                "equal", "spend", "credits", "spend beyond credits"):
        t.add_column(col, justify="right")
    all_equal = True
    for tenant in sorted(CREDITS):
        mine = [r for r in rows if r["tenant"] == tenant]
        ledger_s = Decimal(sum(int(r["gpu_us"]) for r in mine)) / 1_000_000
        recomputed_s = Decimal(sum(v for k, v in elapsed_us.items()
                                   if k.startswith(tenant + "-"))) / 1_000_000
        spend = sum((r["cost"] for r in mine), Decimal(0))
        equal = ledger_s == recomputed_s
        all_equal &= equal
        # The meter only measures and signals; it stops nothing. Admission (issue 4)
        # makes this zero by construction, reserving gpus x max_duration before work.
        overrun = max(Decimal(0), spend - credits.get(tenant, Decimal(0)))
        t.add_row(tenant, str(len(mine and {r["workload_id"] for r in mine})),
                  str(sum(int(r["n"]) for r in mine)), f"{ledger_s:.6f}", f"{recomputed_s:.6f}",
                  "[green]yes[/green]" if equal else "[red]NO[/red]", f"{spend:.6f}",
                  f"{credits.get(tenant, 0):.2f}", f"{overrun:.6f}")
    console.print(t)
    return all_equal


async def main_async(keep: bool) -> int:
    root = REPO / ".run" / "demo"
    shutil.rmtree(root, ignore_errors=True)
    stack = Stack(root, durable=True)
    console.rule("[bold]Kestrel demo[/bold]: the usage ledger, live")
    console.print("starting Postgres, NATS JetStream and Redis on 127.0.0.1 …")
    meter: ServiceProcess | None = None
    try:
        await asyncio.to_thread(stack.up)
        port = free_port()
        meter = ServiceProcess("meter", {**stack.env(), "KESTREL_METER_PORT": str(port),
                                         "KESTREL_METER_METRICS_PORT": str(free_port()),
                                         "KESTREL_PRICES": PRICES, "KESTREL_METER_TICK_S": "0.5",
                                         "KESTREL_LOG_LEVEL": "WARNING"},
                               f"127.0.0.1:{port}", root / "meter.log")
        await asyncio.to_thread(meter.start)
        console.print(f"meter serving on {meter.grpc_address}; demo prices {PRICES} "
                      "credits per GPU-second")
        view = View()
        with Live(view.render(), console=console, refresh_per_second=8) as live:
            elapsed = await play(stack, meter.grpc_address, view, live)
        ok = await summary(stack, elapsed)
        if keep:
            console.print(f"left running (--keep): {stack.env()}; meter {meter.grpc_address}")
            meter = None
        return 0 if ok else 1
    finally:
        if meter is not None:
            meter.stop()
        if not keep:
            await asyncio.to_thread(stack.destroy)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="leave the stack running")
    sys.exit(asyncio.run(main_async(ap.parse_args().keep)))


if __name__ == "__main__":
    main()

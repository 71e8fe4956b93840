"""make bench-scale: does Kestrel's cost per job grow as work piles up?

With meter, gateway and admission running as processes on a durable devstack (no
cluster: this measures Kestrel's own state, not Kubernetes'), for each queue depth:

  1. fill: jobs are submitted until DEPTH of them wait, spread over all TENANTS
     tenants (admitted, their budget held, never placed: no placer runs, so each one
     stays an open hold in the meter's reserved figure, a row in admission's jobs and
     a hold in its books);
  2. probe: PROBE_RATE submits/s for PROBE_S seconds in open loop from a tenth of
     the tenants, billing the CPU every Kestrel process and store spent meanwhile
     (bench/account.py: services + Postgres, NATS, Redis; the meter's ticks and runway
     refreshes included) and timing each decision (SubmitJob through the gateway:
     admission's decision plus one hop).

It prints CPU-ms per probe job and decision p99 at each depth, then the last line:
    scale: depths=<a,b,c> cpu_ms_per_job=<a,b,c> decide_p99_ms=<a,b,c> growth=<x>
growth is the CPU per job at the deepest queue over the shallowest (flat: 1.0).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from decimal import Decimal

import grpc
from rich.console import Console
from rich.table import Table

from bench import account
from bench.gateway import TOKEN, open_loop, pct, submit_path
from kestrel_sdk.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from kestrel_tools.devstack import Stack
from kestrel_tools.procs import REPO

console = Console(stderr=True)
OP = (("authorization", f"Bearer {TOKEN}"),)
JOB_COST = Decimal("0.06")  # 1 GPU x 60 s on gpu-h100 at 0.001/GPU-s


async def run(depths: list[int], tenants: int, probe_rate: float, probe_s: float,
              keep: bool) -> int:
    root = REPO / ".run" / "bench-scale"
    shutil.rmtree(root, ignore_errors=True)
    stack = Stack(root, durable=True)
    console.print(f"[bold]bench-scale[/bold]: depths {depths}, {tenants} tenants; devstack "
                  f"in {root}")
    quiet = await asyncio.to_thread(account.background)
    console.print(f"  {quiet.note()}")
    await asyncio.to_thread(stack.up)
    ports, procs = submit_path(stack, root)
    rows: list[tuple[int, float, float, float, int]] = []
    errors = 0
    try:
        for p in procs:
            await asyncio.to_thread(p.start)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{ports['gateway']}")
        stub = gateway_pb2_grpc.GatewayStub(channel)
        # Every tenant can hold its share of the deepest queue and all the probes.
        per_tenant = max(depths) // tenants + int(probe_rate * probe_s) * len(depths) + 10
        keys = []
        for t in range(tenants):
            name = f"scale-{t:03d}"
            await stub.CreateTenant(gateway_pb2.CreateTenantRequest(
                tenant=gateway_pb2.Tenant(tenant=name, gpu_quota={"gpu-h100": 64},
                                          rate_limit=gateway_pb2.RateLimit(
                                              per_s=100_000, burst=100_000)),
                initial_credits=str(JOB_COST * per_tenant)), metadata=OP)
            k = await stub.CreateApiKey(gateway_pb2.CreateApiKeyRequest(
                tenant=name, name="bench"), metadata=OP)
            keys.append((("authorization", f"Bearer {k.secret}"),))
        request = gateway_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
            name="scale", gpus=1, max_duration_s=60, flavor="gpu-h100"))
        probers = max(1, tenants // 10)
        waiting = 0

        async def fill(i: int, n: int) -> None:
            await stub.SubmitJob(request, metadata=keys[(n * 32 + i) % tenants], timeout=30)

        async def probe(i: int, n: int) -> None:
            await stub.SubmitJob(request, metadata=keys[n % probers], timeout=30)

        for depth in depths:
            need = depth - waiting
            if need > 0:
                console.print(f"  fill to {depth} waiting ({need} submits)")
                done = 0
                while done < need:  # closed loop, 32 at a time, exactly `need` jobs
                    batch = min(32, need - done)
                    results = await asyncio.gather(
                        *(fill(i, done + i) for i in range(batch)), return_exceptions=True)
                    errors += sum(1 for r in results if isinstance(r, Exception))
                    done += batch
                waiting += need
            await asyncio.sleep(3)  # the fill's runway refreshes settle
            before = account.take_cpu()
            lat, errs = await open_loop(probe, probe_rate, probe_s)
            spent = account.spent(before, account.take_cpu())
            errors += errs
            waiting += len(lat)
            ms = account.kestrel_share(spent) * 1000 / max(1, len(lat))
            rows.append((depth, ms, pct(lat, 0.5), pct(lat, 0.99), len(lat)))
            console.print(f"    depth {depth}: {ms:.1f} CPU-ms/job, p99 {pct(lat, 0.99):.1f} ms "
                          f"({len(lat)} probes, {errs} errors)", soft_wrap=True)
            parts = {n: v * 1000 / max(1, len(lat)) for n, v in spent.items()
                     if account.kestrel_share({n: v})}
            console.print("      " + ", ".join(f"{n} {v:.1f}" for n, v in
                                               sorted(parts.items(), key=lambda kv: -kv[1])),
                          soft_wrap=True)
        await channel.close()
    finally:
        for p in procs:
            p.stop()
        if not keep:
            await asyncio.to_thread(stack.destroy)

    growth = rows[-1][1] / rows[0][1] if rows and rows[0][1] else float("nan")
    table = Table(title=f"bench-scale (2 cores; {tenants} tenants, probes from {probers} at "
                    f"{probe_rate:.0f}/s for {probe_s:.0f} s; no cluster)")
    for col in ("jobs waiting", "Kestrel CPU-ms per job", "decide p50 / p99 ms", "probes"):
        table.add_column(col, justify="right")
    for depth, ms, p50, p99, n in rows:
        table.add_row(f"{depth:,}", f"{ms:.1f}", f"{p50:.1f} / {p99:.1f}", f"{n}")
    table.add_row("growth (deepest / shallowest)", f"{growth:.2f}", "target <= 1.2 (p99 < 50)", "")
    Console().print(table)
    print(quiet.note())
    print(f"scale: depths={','.join(str(r[0]) for r in rows)} "
          f"cpu_ms_per_job={','.join(f'{r[1]:.1f}' for r in rows)} "
          f"decide_p99_ms={','.join(f'{r[3]:.1f}' for r in rows)} growth={growth:.2f}")
    return 0 if errors == 0 else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="250,1000,4000")
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--probe-rate", type=float, default=50)
    ap.add_argument("--probe-seconds", type=float, default=6)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    depths = sorted(int(d) for d in args.depths.split(","))
    sys.exit(asyncio.run(run(depths, args.tenants, args.probe_rate, args.probe_seconds,
                             args.keep)))


if __name__ == "__main__":
    main()

"""make bench-gateway: the public submit path against this machine's gRPC ceiling.

With meter, gateway and admission running as processes on a durable devstack:
  (c) the limit: 64 concurrent clients calling a trivial method of the gateway
      (grpc.health.v1 Check) — what grpc.aio gives on this machine;
  (a) saturation: the same 64 clients submitting jobs for ~10 s;
  (b) latency: an open-loop load at half the saturation rate (a) measured in the
      same run (absolute rates differ threefold between machines; a fixed rate
      would mean a different load on each), for ~10 s: each request is sent on
      schedule whether or not earlier ones answered; p50/p99.
Then it checks that no tenant's reservations exceed its budget (double admits).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from decimal import Decimal
from pathlib import Path

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from bench import account
from kestrel_sdk.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from kestrel_tools.devstack import Stack, port_map
from kestrel_tools.procs import REPO, ServiceProcess

console = Console(stderr=True)
TOKEN = "kso_bench-operator"
OP = (("authorization", f"Bearer {TOKEN}"),)
# A tenant's credits cover ADMIT_PER_TENANT jobs of 1 GPU x 60 s on gpu-h100 (0.001/GPU-s).
ADMIT_PER_TENANT = 2000
JOB_COST = Decimal("0.06")


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


async def closed_loop(call: object, clients: int, seconds: float) -> tuple[int, int, float]:
    """(ok, errors, elapsed) of `clients` coroutines calling back to back."""
    ok = errors = 0
    deadline = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal ok, errors
        n = 0
        while time.perf_counter() < deadline:
            try:
                await call(i, n)  # type: ignore[operator]
                ok += 1
            except grpc.aio.AioRpcError as err:
                errors += 1
                if errors <= 3:
                    console.print(f"  error: {err.code().name}: {err.details()}")
            n += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return ok, errors, time.perf_counter() - t0


async def open_loop(call: object, rate: float, seconds: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors = 0
    tasks = []

    async def one(n: int) -> None:
        nonlocal errors
        t = time.perf_counter()
        try:
            await call(n % 64, n)  # type: ignore[operator]
            latencies.append((time.perf_counter() - t) * 1000)
        except grpc.aio.AioRpcError:
            errors += 1

    t0 = time.perf_counter()
    n = 0
    while n < rate * seconds:
        target = t0 + n / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(n)))
        n += 1
    await asyncio.gather(*tasks)
    return latencies, errors


def submit_path(stack: Stack, root: Path) -> tuple[dict[str, int], list[ServiceProcess]]:
    """Meter, gateway and admission over `stack` (no placer, no runway check): the
    submit path alone. Their ports, and the processes, not yet started."""
    ports = port_map("meter", "gateway", "admission", "replicas")
    env = {**stack.env(), "KESTREL_OPERATOR_TOKEN": TOKEN, "KESTREL_LOG_LEVEL": "WARNING",
           "KESTREL_RUNWAY_CHECK": "", "KESTREL_PLACER_ADDR": "",
           "KESTREL_METER_ADDR": f"127.0.0.1:{ports['meter']}",
           "KESTREL_ADMISSION_ADDR": f"127.0.0.1:{ports['admission']}",
           **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in ports.items()},
           "KESTREL_METER_METRICS_PORT": "0", "KESTREL_ADMISSION_METRICS_PORT": "0",
           "KESTREL_GATEWAY_METRICS_PORT": "0"}
    return ports, [ServiceProcess(n, env, f"127.0.0.1:{ports[n]}", root / f"{n}.log")
                   for n in ("meter", "gateway", "admission")]


async def run(clients: int, seconds: float, rate: float, tenants: int, keep: bool) -> int:
    root = REPO / ".run" / "bench-gateway"
    shutil.rmtree(root, ignore_errors=True)
    stack = Stack(root, durable=True)
    console.print(f"[bold]bench-gateway[/bold]: devstack in {root}")
    quiet = await asyncio.to_thread(account.background)
    console.print(f"  {quiet.note()}")
    await asyncio.to_thread(stack.up)
    ports, procs = submit_path(stack, root)
    try:
        for p in procs:
            await asyncio.to_thread(p.start)
        gw = f"127.0.0.1:{ports['gateway']}"
        channels = [grpc.aio.insecure_channel(gw, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(4)]
        stubs = [gateway_pb2_grpc.GatewayStub(c) for c in channels]
        health = [health_pb2_grpc.HealthStub(c) for c in channels]
        credits = JOB_COST * ADMIT_PER_TENANT
        keys = []
        for t in range(tenants):
            name = f"bench-{t:02d}"
            await stubs[0].CreateTenant(gateway_pb2.CreateTenantRequest(
                tenant=gateway_pb2.Tenant(tenant=name, gpu_quota={"gpu-h100": 64},
                                          rate_limit=gateway_pb2.RateLimit(per_s=100_000,
                                                                           burst=100_000)),
                initial_credits=str(credits)), metadata=OP)
            k = await stubs[0].CreateApiKey(gateway_pb2.CreateApiKeyRequest(
                tenant=name, name="bench"), metadata=OP)
            keys.append((("authorization", f"Bearer {k.secret}"),))
        spec = common_pb2.JobSpec(name="bench", gpus=1, max_duration_s=60, flavor="gpu-h100")
        request = gateway_pb2.SubmitJobRequest(spec=spec)

        async def submit(i: int, n: int) -> None:
            await stubs[i % 4].SubmitJob(request, metadata=keys[i % tenants], timeout=30)

        async def trivial(i: int, n: int) -> None:
            await health[i % 4].Check(health_pb2.HealthCheckRequest(), timeout=30)

        console.print(f"(c) limit: {clients} clients x health Check for {seconds:.0f}s")
        await closed_loop(trivial, clients, 1)  # warm-up
        t_ok, t_err, t_s = await closed_loop(trivial, clients, seconds)
        trivial_rate = t_ok / t_s
        console.print(f"    {trivial_rate:,.0f} calls/s")
        console.print(f"(a) saturation: {clients} clients x SubmitJob for {seconds:.0f}s "
                      f"({tenants} tenants)")
        s_ok, s_err, s_s = await closed_loop(submit, clients, seconds)
        submit_rate = s_ok / s_s
        console.print(f"    {submit_rate:,.0f} submits/s, {s_err} errors")
        rate = rate or submit_rate / 2
        console.print(f"(b) latency: open loop at {rate:.0f} submits/s (half the saturation "
                      f"rate) for {seconds:.0f}s")
        # Half load is measured in its steady state, not in the saturation phase's
        # aftermath: the meter and admission still working through that burst's
        # announcements and runway re-reads, Postgres its writes.
        waited, left = await account.settle()
        console.print(f"    the saturation phase's work settled after {waited:.1f}s "
                      f"({left:.2f} cores busy)")
        busy0, t0 = account.machine_busy(), time.monotonic()
        lat, l_err = await open_loop(submit, rate, seconds)
        # How loaded "half the saturation rate" left the machine: a submit costs more CPU
        # at half load than at saturation (smaller batches), so it is not half the cores.
        busy = (account.machine_busy() - busy0) / (time.monotonic() - t0)
        console.print(f"    p50 {pct(lat, 0.5):.1f} ms, p99 {pct(lat, 0.99):.1f} ms; "
                      f"{busy:.2f} of {quiet.cores} cores busy")
        for c in channels:
            await c.close()

        db = await asyncpg.connect(stack.postgres_dsn)
        over = await db.fetch("""
            SELECT r.tenant, sum(r.amount) AS held,
                   (SELECT sum(amount) FROM credits c WHERE c.tenant = r.tenant) AS credits
            FROM reservations r GROUP BY r.tenant""")
        double_admits = sum(1 for r in over if r["held"] > r["credits"])
        states = {r["state"]: r["n"] for r in await db.fetch(
            "SELECT state, count(*) n FROM jobs GROUP BY state")}
        await db.close()
    finally:
        for p in procs:
            p.stop()
        if not keep:
            await asyncio.to_thread(stack.destroy)

    submits = s_ok + len(lat)
    errors = s_err + l_err + t_err
    ratio = submit_rate / trivial_rate
    table = Table(title="bench-gateway (2 cores; client, services, Postgres fsync on, one machine)")
    for col in ("figure", "value", "target"):
        table.add_column(col)
    table.add_row("trivial RPC/s (health Check, same clients)", f"{trivial_rate:,.0f}", "baseline")
    table.add_row("submits/s at saturation", f"{submit_rate:,.0f}", "")
    table.add_row("ratio (submits / trivial calls)", f"{ratio:.2f}", ">= 0.25")
    table.add_row(f"submit p50 / p99 at {rate:.0f}/s",
                  f"{pct(lat, 0.5):.1f} / {pct(lat, 0.99):.1f} ms", "p99 <= 50 ms")
    table.add_row(f"cores busy at {rate:.0f}/s (client, services, stores)",
                  f"{busy:.2f} of {quiet.cores}", "")
    table.add_row("jobs admitted / held", f"{states.get(2, 0):,} / {states.get(1, 0):,}", "")
    table.add_row("errors / double admits", f"{errors} / {double_admits}", "0 / 0")
    Console().print(table)
    print(quiet.note())
    print(f"gateway: submits={submits} submit_per_s={submit_rate:.0f} "
          f"trivial_rpc_per_s={trivial_rate:.0f} ratio={ratio:.2f} "
          f"open_loop_per_s={rate:.0f} "
          f"submit_p50_ms={pct(lat, 0.5):.1f} submit_p99_ms={pct(lat, 0.99):.1f} "
          f"errors={errors} double_admits={double_admits}")
    return 0 if errors == 0 and double_admits == 0 else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rate", type=float, default=0,
                    help="open-loop rate (default: half the saturation rate measured)")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    sys.exit(asyncio.run(run(args.clients, args.seconds, args.rate, args.tenants, args.keep)))


if __name__ == "__main__":
    main()

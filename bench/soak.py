"""make soak: mixed tenant load at half of saturation for a long while; does anything
grow that should not?

With meter, gateway and admission as processes on a durable devstack (as
bench-gateway), tenants call the public API in a mix: SubmitJob (30%), CancelJob of
one of their own jobs (30%, so the queue stays level), GetJob (20%), GetMyRunway
(10%) and ListJobs (10%). First the mix's saturation rate is measured closed loop
in the same run; then it is sent open loop at half of that rate for --minutes.
Every process's RSS and open file descriptors (the three services, Postgres'
postmaster, nats-server, redis-server) are read after a warm-up minute and at the end;
p99 latency is printed per minute. Infer is not in the mix: its replicas are model
workers whose cost would dominate two cores (bench-infer measures them).

Last line: soak: minutes=<n> rss_growth_pct=<x> fd_growth=<n> errors=<n> p99_drift_pct=<x>
(rss_growth_pct: the largest growth among the Kestrel services; p99_drift_pct: the
last minute's p99 against the first's). Targets: rss_growth_pct <= 10, fd_growth = 0,
errors = 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from decimal import Decimal

import grpc
from rich.console import Console
from rich.table import Table

from bench.gateway import closed_loop, pct
from kestrel_sdk.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from kestrel_tools.devstack import Stack, port_map
from kestrel_tools.procs import REPO, ServiceProcess

console = Console(stderr=True)
TOKEN = "kso_bench-soak"
OP = (("authorization", f"Bearer {TOKEN}"),)
SERVICES = ("meter", "gateway", "admission")
# As many cancels as submits: the queue stays level, so whatever grows is a leak, not
# work piling up (bench-scale is where the queue grows on purpose).
MIX = (("submit", 30), ("cancel", 30), ("get", 20), ("runway", 10), ("list", 10))


def usage(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of a process."""
    rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


class Mix:
    """The tenants' calls, each a coroutine; remembers each tenant's live jobs."""

    def __init__(self, stubs: list[gateway_pb2_grpc.GatewayStub],
                 keys: Sequence[tuple[tuple[str, str], ...]]) -> None:
        self.stubs, self.keys = stubs, keys
        self.jobs: list[list[str]] = [[] for _ in keys]
        self.rng = random.Random(7)
        self.kinds = [k for k, w in MIX for _ in range(w)]
        self.spec = common_pb2.JobSpec(name="soak", gpus=1, max_duration_s=60,
                                       flavor="gpu-h100")

    async def call(self, i: int, n: int) -> str:
        t = n % len(self.keys)
        stub, md = self.stubs[n % len(self.stubs)], self.keys[t]
        kind = self.rng.choice(self.kinds)
        mine = self.jobs[t]
        if kind in ("cancel", "get") and not mine:
            kind = "submit"
        if kind == "submit":
            resp = await stub.SubmitJob(gateway_pb2.SubmitJobRequest(spec=self.spec),
                                        metadata=md, timeout=30)
            mine.append(resp.job.job_id)
        elif kind == "cancel":
            job = mine.pop(self.rng.randrange(len(mine)))
            await stub.CancelJob(gateway_pb2.CancelJobRequest(job_id=job, reason="soak"),
                                 metadata=md, timeout=30)
        elif kind == "get":
            await stub.GetJob(gateway_pb2.GetJobRequest(job_id=self.rng.choice(mine)),
                              metadata=md, timeout=30)
        elif kind == "runway":
            await stub.GetMyRunway(gateway_pb2.GetMyRunwayRequest(), metadata=md, timeout=30)
        else:
            await stub.ListJobs(gateway_pb2.ListJobsRequest(page_size=20), metadata=md,
                                timeout=30)
        return kind


async def open_loop_minutes(mix: Mix, rate: float, minutes: float,
                            per_minute: dict[int, list[float]], errors: list[str]) -> None:
    """Requests on schedule (not waiting for earlier answers); latency by minute."""
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()

    async def one(n: int, minute: int) -> None:
        t = time.perf_counter()
        try:
            await mix.call(0, n)
            per_minute[minute].append((time.perf_counter() - t) * 1000)
        except grpc.aio.AioRpcError as err:
            errors.append(f"{err.code().name}: {err.details()}")

    n = 0
    last = -1
    while n < rate * minutes * 60:  # by schedule: the last minute is a whole one
        elapsed = time.perf_counter() - t0
        target = t0 + n / rate
        if (delay := target - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(n, int((target - t0) // 60)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
        minute = int(elapsed // 60)
        if minute != last and minute > 0 and per_minute.get(minute - 1):
            done = per_minute[minute - 1]
            console.print(f"  minute {minute}: {len(done)} calls, p50 {pct(done, 0.5):.1f} ms, "
                          f"p99 {pct(done, 0.99):.1f} ms, errors so far {len(errors)}")
        last = minute
    await asyncio.gather(*tasks)


async def run(minutes: float, tenants: int, clients: int, keep: bool) -> int:
    root = REPO / ".run" / "bench-soak"
    shutil.rmtree(root, ignore_errors=True)
    stack = Stack(root, durable=True)
    console.print(f"[bold]soak[/bold]: devstack in {root}")
    await asyncio.to_thread(stack.up)
    ports = port_map(*SERVICES, "replicas")  # + the gateway's internal Replicas
    env = {**stack.env(), "KESTREL_OPERATOR_TOKEN": TOKEN, "KESTREL_LOG_LEVEL": "WARNING",
           "KESTREL_RUNWAY_CHECK": "", "KESTREL_PLACER_ADDR": "",
           "KESTREL_METER_ADDR": f"127.0.0.1:{ports['meter']}",
           "KESTREL_ADMISSION_ADDR": f"127.0.0.1:{ports['admission']}",
           **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in ports.items()},
           **{f"KESTREL_{n.upper()}_METRICS_PORT": "0" for n in SERVICES}}
    procs = {n: ServiceProcess(n, env, f"127.0.0.1:{ports[n]}", root / f"{n}.log")
             for n in SERVICES}
    per_minute: dict[int, list[float]] = defaultdict(list)
    errors: list[str] = []
    try:
        for p in procs.values():
            await asyncio.to_thread(p.start)
        gw = f"127.0.0.1:{ports['gateway']}"
        channels = [grpc.aio.insecure_channel(gw, options=[("grpc.use_local_subchannel_pool",
                                                             1)]) for _ in range(4)]
        stubs = [gateway_pb2_grpc.GatewayStub(c) for c in channels]
        keys = []
        for t in range(tenants):
            name = f"soak-{t:02d}"
            await stubs[0].CreateTenant(gateway_pb2.CreateTenantRequest(
                tenant=gateway_pb2.Tenant(tenant=name, gpu_quota={"gpu-h100": 64},
                                          rate_limit=gateway_pb2.RateLimit(per_s=100_000,
                                                                           burst=100_000)),
                initial_credits=str(Decimal(10) ** 9)), metadata=OP)
            k = await stubs[0].CreateApiKey(gateway_pb2.CreateApiKeyRequest(
                tenant=name, name="soak"), metadata=OP)
            keys.append((("authorization", f"Bearer {k.secret}"),))
        mix = Mix(stubs, keys)
        console.print(f"saturation: {clients} clients x the mix for 15 s")
        ok, err, s = await closed_loop(mix.call, clients, 15)
        saturation = ok / s
        rate = saturation / 2
        console.print(f"  {saturation:,.0f} calls/s ({err} errors); soaking at {rate:,.0f}/s "
                      f"for {minutes:g} min after a warm-up minute")
        await open_loop_minutes(mix, rate, 1, defaultdict(list), errors)  # warm-up
        pids = {**{n: p.pid for n, p in procs.items()},
                **{n: stack.pids[n] for n in ("postgres", "nats", "redis")}}
        start = {n: usage(pid) for n, pid in pids.items()}
        await open_loop_minutes(mix, rate, minutes, per_minute, errors)
        end = {n: usage(pid) for n, pid in pids.items()}
        for c in channels:
            await c.close()
    finally:
        for p in procs.values():
            p.stop()
        if not keep:
            await asyncio.to_thread(stack.destroy)

    table = Table(title=f"soak: {minutes:g} min at {rate:,.0f} calls/s "
                        f"(half of {saturation:,.0f}), {tenants} tenants")
    for col in ("process", "RSS start MiB", "RSS end MiB", "growth %", "fds start", "fds end"):
        table.add_column(col)
    growth: dict[str, float] = {}
    for n in pids:
        (r0, f0), (r1, f1) = start[n], end[n]
        growth[n] = (r1 - r0) / r0 * 100 if r0 else 0.0
        table.add_row(n, f"{r0:.1f}", f"{r1:.1f}", f"{growth[n]:+.1f}", str(f0), str(f1))
    Console().print(table)
    minutes_seen = sorted(per_minute)
    lat = Table(title="p99 per minute")
    for col in ("minute", "calls", "p50 ms", "p99 ms"):
        lat.add_column(col)
    for m in minutes_seen:
        v = per_minute[m]
        lat.add_row(str(m + 1), str(len(v)), f"{pct(v, 0.5):.1f}", f"{pct(v, 0.99):.1f}")
    Console().print(lat)
    for e in sorted(set(errors))[:5]:
        console.print(f"  error: {e}")
    rss_growth = max(growth[n] for n in SERVICES)
    fd_growth = sum(end[n][1] - start[n][1] for n in pids)
    first, final = per_minute[minutes_seen[0]], per_minute[minutes_seen[-1]]
    drift = (pct(final, 0.99) - pct(first, 0.99)) / pct(first, 0.99) * 100
    print(f"soak: minutes={minutes:g} rss_growth_pct={rss_growth:.1f} fd_growth={fd_growth} "
          f"errors={len(errors)} p99_drift_pct={drift:.1f}")
    return 0 if rss_growth <= 10 and fd_growth <= 0 and not errors else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    sys.exit(asyncio.run(run(args.minutes, args.tenants, args.clients, args.keep)))


if __name__ == "__main__":
    main()

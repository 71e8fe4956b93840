"""make bench-autoscale: the autoscaler's live loop on the real cluster.

The whole plane (meter, gateway, admission, placer, autoscaler) on the real
Kubernetes control plane; CPU endpoints whose replicas are pods of the Kestrel image
on the real kubelet node, serving the real model. Short windows (stable 10 s, panic
3 s, scale-up cooldown 1 s, scale-down cooldown 5 s) so one run sees whole cycles.

  baseline    CreateEndpoint -> its first replica serving: what starting a replica
              costs on this machine (Kueue admission, the kubelet, the model load)
  scale_up    sustained overload from 6 clients -> a second replica serving a request
  scale_down  the load stops -> back to the floor (1 replica)
  cold_start  an endpoint at zero replicas: its first request -> its answer
  exhaustion  the budget withdrawn while 2 replicas run: the committed credits row
              that exhausts it -> every replica deactivated (Kubernetes' own eviction
              instants, from the placer's events), and the replica unit-seconds the
              ledger metered after that row (at most one meter tick of them)
  sla         seconds of the overload in which the clients' p95 exceeded 250 ms

Last line: autoscale: scale_up_s=.. cold_start_s=.. scale_down_s=..
zero_after_exhaustion_ms=.. overrun_unit_s=.. sla_violation_s=..
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import TypeVar

import asyncpg
from rich.console import Console
from rich.table import Table

from kestrel_sdk import AsyncClient, Endpoint, KestrelError
from kestrel_tools import cluster
from kestrel_tools.devstack import Stack, port_map
from kestrel_tools.procs import REPO, ServiceProcess

console = Console(stderr=True)
TOKEN = "kso_bench-autoscale"
TICK_S = 0.2
TEXTS = [f"A man is eating a piece of bread on day {i}." for i in range(8)]
NAMES = ("meter", "gateway", "admission", "placer", "autoscaler")
T = TypeVar("T")


async def until(what: str, fn: Callable[[], Awaitable[T | None]], timeout_s: float = 180,
                every_s: float = 0.05) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await fn()
        if got is not None:
            return got
        await asyncio.sleep(every_s)
    raise TimeoutError(f"bench-autoscale: timed out waiting for {what}")


def endpoint_with(c: AsyncClient, endpoint_id: str, replicas: int, ready: int
                  ) -> Callable[[], Awaitable[Endpoint | None]]:
    async def check() -> Endpoint | None:
        e = await c.get_endpoint(endpoint_id)
        return e if e.replicas == replicas and e.ready_replicas >= ready else None
    return check


class Load:
    """Closed-loop clients sending 8 texts each; latencies by the second they ended in."""

    def __init__(self, c: AsyncClient, endpoint_id: str, clients: int) -> None:
        self.c, self.endpoint_id, self.clients = c, endpoint_id, clients
        self.stop = asyncio.Event()
        self.samples: list[tuple[float, float, str]] = []  # (end time, latency s, replica)
        self.errors: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def _client(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                r = await self.c.infer(self.endpoint_id, TEXTS, timeout_s=10)
                self.samples.append((time.monotonic(), time.monotonic() - t, r.replica))
            except KestrelError as e:
                self.errors.append(e.code_name)
                await asyncio.sleep(0.2)

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]

    async def end(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    def sla_violation_s(self, target_ms: float = 250.0) -> int:
        """Whole seconds whose p95 exceeded the target."""
        by_s: dict[int, list[float]] = {}
        for end, lat, _ in self.samples:
            by_s.setdefault(int(end), []).append(lat * 1e3)
        bad = 0
        for lats in by_s.values():
            lats.sort()
            bad += lats[min(len(lats) - 1, int(0.95 * len(lats)))] > target_ms
        return bad


async def run(keep: bool) -> int:
    was_up = await asyncio.to_thread(cluster.is_up)
    info = await asyncio.to_thread(cluster.ensure_cluster,
                                   lambda s: console.print(f"  [dim]cluster[/dim] {s}"))
    root = REPO / ".run" / "bench-autoscale"
    shutil.rmtree(root, ignore_errors=True)
    stack = Stack(root, durable=True)
    await asyncio.to_thread(stack.up)
    ports = port_map(*NAMES, "replicas")  # + the gateway's internal Replicas
    env = {**stack.env(), "KESTREL_OPERATOR_TOKEN": TOKEN, "KESTREL_LOG_LEVEL": "WARNING",
           "KESTREL_KUBECONFIG": str(info.kubeconfig), "KESTREL_METER_TICK_S": str(TICK_S),
           "KESTREL_PRICES": "gpu-h100=0.01,gpu-a10=0.001,cpu=0.002",
           "KESTREL_AUTOSCALER_INTERVAL_S": "0.25", "KESTREL_AUTOSCALER_STABLE_WINDOW_S": "10",
           "KESTREL_AUTOSCALER_PANIC_WINDOW_S": "3",
           "KESTREL_AUTOSCALER_SCALE_UP_COOLDOWN_S": "1",
           "KESTREL_AUTOSCALER_SCALE_DOWN_COOLDOWN_S": "5",
           "KESTREL_AUTOSCALER_REPLICA_RPS": "3",
           "KESTREL_AUTOSCALER_LEASE": "bench-autoscaler",
           **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in ports.items()},
           **{f"KESTREL_{n.upper()}_ADDR": f"127.0.0.1:{p}" for n, p in ports.items()},
           **{f"KESTREL_{n.upper()}_METRICS_PORT": "0" for n in ports}}
    procs = [ServiceProcess(n, env, f"127.0.0.1:{ports[n]}", root / f"{n}.log") for n in NAMES]
    gw = f"127.0.0.1:{ports['gateway']}"
    tenants = ("bench", "spend")
    figures: dict[str, float] = {}
    try:
        for p in procs:
            await asyncio.to_thread(p.start)
        async with AsyncClient(gw, operator_token=TOKEN) as op:
            keys = {}
            for t in tenants:
                await op.create_tenant(t, gpu_quota={"gpu-a10": 1}, rate_per_s=1000,
                                       burst=1000, initial_credits="100")
                keys[t] = (await op.create_api_key(t, "bench")).secret
        c = AsyncClient(gw, api_key=keys["bench"])

        console.print("(1) baseline: CreateEndpoint -> its first replica serving")
        t0 = time.monotonic()
        e = await c.create_endpoint("embed", min_replicas=1, max_replicas=2, flavor="cpu",
                                    horizon_s=60)
        await until("a ready replica", endpoint_with(c, e.endpoint_id, 1, 1))
        await c.infer(e.endpoint_id, TEXTS)
        figures["baseline_s"] = time.monotonic() - t0
        console.print(f"    {figures['baseline_s']:.2f} s")

        console.print("(2) scale up: 6 clients of 8 texts each, back to back")
        load = Load(c, e.endpoint_id, 6)
        t0 = time.monotonic()
        load.start()
        await until("requests served", lambda: _some(load.samples))
        first = load.samples[0][2]  # the only replica until a second one serves

        async def second_serving() -> float | None:
            new = [end for end, _, r in load.samples if r != first]
            return min(new) if new else None
        when = await until("a second replica serving", second_serving, timeout_s=120)
        figures["scale_up_s"] = when - t0
        await asyncio.sleep(3)  # a little steady state at two replicas
        await load.end()
        figures["sla_violation_s"] = load.sla_violation_s()
        console.print(f"    {figures['scale_up_s']:.2f} s; {len(load.samples)} requests, "
                      f"{len(load.errors)} errors")

        console.print("(3) scale down: the load stops")
        t0 = time.monotonic()
        await until("back to one replica", endpoint_with(c, e.endpoint_id, 1, 1), 120)
        figures["scale_down_s"] = time.monotonic() - t0
        console.print(f"    {figures['scale_down_s']:.2f} s")

        console.print("(4) cold start: an endpoint at zero replicas, its first request")
        cold = await c.create_endpoint("cold", min_replicas=0, max_replicas=1, flavor="cpu",
                                       horizon_s=60)
        await until("the cold endpoint at zero", endpoint_with(c, cold.endpoint_id, 0, 0), 120)
        await asyncio.sleep(1)
        t0 = time.monotonic()
        await c.infer(cold.endpoint_id, TEXTS, timeout_s=60)
        figures["cold_start_s"] = time.monotonic() - t0
        console.print(f"    {figures['cold_start_s']:.2f} s")
        await c.delete_endpoint(cold.endpoint_id)
        await c.delete_endpoint(e.endpoint_id)

        console.print("(5) exhaustion: the budget withdrawn while 2 replicas run")
        s = AsyncClient(gw, api_key=keys["spend"])
        se = await s.create_endpoint("embed", min_replicas=2, max_replicas=2, flavor="cpu",
                                     horizon_s=60)
        await until("two ready replicas", endpoint_with(s, se.endpoint_id, 2, 2))
        async with AsyncClient(gw, operator_token=TOKEN) as op:
            r = await s.runway()
            await op.adjust_credits("spend", -r.unspent, note="bench: budget withdrawn")
        await until("zero replicas", endpoint_with(s, se.endpoint_id, 0, 0), 60)
        await asyncio.sleep(2 * TICK_S + 1)  # the closes reach the ledger
        zero_ms, overrun = await exhaustion(stack.postgres_dsn)
        figures["zero_after_exhaustion_ms"], figures["overrun_unit_s"] = zero_ms, overrun
        console.print(f"    every replica deactivated {zero_ms:.0f} ms after the row; "
                      f"{overrun:.3f} unit-s metered after it")
        await s.close()
        await c.close()
    finally:
        for p in reversed(procs):
            p.stop()
        if not keep:
            for t in tenants:
                await asyncio.to_thread(cluster.kubectl, "delete", "namespace",
                                        f"kestrel-{t}", "--wait=false", "--ignore-not-found",
                                        check=False)
                await asyncio.to_thread(cluster.kubectl, "delete", "clusterqueue",
                                        f"kestrel-{t}", "--ignore-not-found", check=False)
            await asyncio.to_thread(stack.destroy)
            if not was_up:
                await asyncio.to_thread(cluster.down, lambda s: None)

    tick_units = 2 * TICK_S  # one tick of the 2 replicas that were running
    tab = Table(title="bench-autoscale (2 cores; CPU replicas on the real kubelet)")
    for col in ("figure", "value", "target"):
        tab.add_column(col)
    b = figures["baseline_s"]
    tab.add_row("baseline: CreateEndpoint -> serving", f"{b:.2f} s", "the cost of a replica")
    tab.add_row("scale_up_s (overload -> 2nd replica serving)",
              f"{figures['scale_up_s']:.2f} s ({figures['scale_up_s'] / b:.2f} x baseline)",
              "<= 5")
    tab.add_row("cold_start_s (request at zero -> answer)",
              f"{figures['cold_start_s']:.2f} s ({figures['cold_start_s'] / b:.2f} x baseline)",
              "<= 10")
    tab.add_row("scale_down_s (load stops -> floor)", f"{figures['scale_down_s']:.2f} s",
              "stable window 10 s + cooldown 5 s")
    tab.add_row("zero_after_exhaustion_ms", f"{figures['zero_after_exhaustion_ms']:.0f}",
              "<= 1500")
    tab.add_row("overrun_unit_s", f"{figures['overrun_unit_s']:.3f}",
              f"<= {tick_units:.1f} (one tick x 2 replicas)")
    tab.add_row("sla_violation_s (p95 > 250 ms)", f"{figures['sla_violation_s']:.0f}", "")
    Console(width=120).print(tab)
    print(f"autoscale: scale_up_s={figures['scale_up_s']:.2f} "
          f"cold_start_s={figures['cold_start_s']:.2f} "
          f"scale_down_s={figures['scale_down_s']:.2f} "
          f"zero_after_exhaustion_ms={figures['zero_after_exhaustion_ms']:.0f} "
          f"overrun_unit_s={figures['overrun_unit_s']:.3f} "
          f"sla_violation_s={figures['sla_violation_s']:.0f}")
    return 0


async def _some(xs: list[tuple[float, float, str]]) -> bool | None:
    return True if xs else None


async def exhaustion(dsn: str) -> tuple[float, float]:
    """(ms from the exhausting credits row to the last replica's deactivation, replica
    unit-seconds the ledger metered after that row)."""
    db = await asyncpg.connect(dsn)
    try:
        row = await db.fetchrow("""
            SELECT recorded_us FROM credits WHERE tenant = 'spend' AND kind = 'adjustment'
            ORDER BY recorded_us DESC LIMIT 1""")
        assert row is not None
        at = int(row["recorded_us"])
        ends = [int(r["t"]) for r in await db.fetch("""
            SELECT min(time_us) t FROM workload_events WHERE tenant = 'spend'
              AND type IN (3, 4, 5, 7) GROUP BY workload_id""")]
        after = await db.fetchval("""
            SELECT coalesce(sum(greatest(0, end_us - greatest(start_us, $1)) * gpus), 0)
            FROM ledger WHERE tenant = 'spend' AND end_us > $1""", at)
    finally:
        await db.close()
    return (max(ends) - at) / 1000 if ends else float("nan"), float(
        Decimal(int(after)) / 1_000_000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="leave the tenants and stack")
    sys.exit(asyncio.run(run(ap.parse_args().keep)))


if __name__ == "__main__":
    main()

"""make demo: the runway loop on a real Kubernetes control plane.

Brings up the data plane (etcd, kube-apiserver, scheduler, controller-manager,
Kueue, KWOK GPU nodes: built from the Go module registry on first use, cached),
Postgres, NATS JetStream and Redis, the meter, gateway, admission and placer, and a
Prometheus scraping them, kube-apiserver and Kueue (its address is printed).
Then an operator creates two tenants, one with a large budget and one small;
both submit GPU jobs; the small tenant's jobs are HELD when its budget is
reserved, then released by a top-up. Meanwhile acme serves the real embedding model
(all-MiniLM-L6-v2 on onnxruntime) from an endpoint on the CPU pool: its replica is a
pod on the real kubelet node, admitted by Kueue, holding a rolling reservation and
metered per core-second, and a client sends it requests throughout. A live table
shows runway, reservations, job states and the endpoint's traffic; the summary
compares the ledger's GPU-seconds with gpus x elapsed recomputed from Kubernetes' own
timestamps, and the endpoint's core-seconds with its replica's admission and
deletion instants.

GPUs are simulated (KWOK nodes): pods "run" for their declared duration. The
control plane, Kueue quota, the CPU pool's kubelet, the model, the ledger and the
runway are real.

    python -m kestrel.demo [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from dataclasses import dataclass
from decimal import Decimal

import asyncpg
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from kestrel import cluster, prometheus
from kestrel.cli import render
from kestrel.devstack import Stack, port_map
from kestrel.procs import REPO, ServiceProcess
from kestrel.sdk import AsyncClient, Endpoint, Job, JobState, KestrelError, Runway

_probe = Console()
console = _probe if _probe.is_terminal else Console(width=120)
TOKEN = "kso_demo-operator"
# Demo prices, credits per GPU-second (per core-second on the CPU pool), high so that
# budgets move within seconds.
PRICES = "gpu-h100=0.05,gpu-a10=0.015,cpu=0.002"
ENDPOINT = ("acme", "embed")  # acme's endpoint on the CPU pool, one replica
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.",
         "The girl is carrying a baby.", "A man is riding a horse.",
         "A woman is playing the violin.", "Two men pushed carts through the woods.",
         "A monkey is playing drums.", "A cheetah is running behind its prey."]
MIN_REQUESTS = 20  # the demo keeps sending until the endpoint served at least this many


@dataclass(frozen=True)
class Plan:
    tenant: str
    name: str
    gpus: int
    flavor: str
    run_s: int  # simulated run time on the fake GPU node
    max_s: int  # max_duration_s: the reservation's bound
    at_s: float


TENANTS = {"acme": ("200", {"gpu-h100": 16, "gpu-a10": 16}),
           "tiny": ("3", {"gpu-h100": 8, "gpu-a10": 8})}
PLAN = [
    Plan("acme", "pretrain", 8, "gpu-h100", 6, 10, 0.0),
    Plan("acme", "eval", 4, "gpu-a10", 6, 15, 0.5),
    Plan("acme", "sweep", 2, "gpu-h100", 4, 10, 1.0),
    # tiny: 3 credits; each job reserves 2 GPUs x 10 s x 0.05 = 1 credit.
    Plan("tiny", "finetune-1", 2, "gpu-h100", 3, 10, 0.0),
    Plan("tiny", "finetune-2", 2, "gpu-h100", 3, 10, 0.3),
    Plan("tiny", "finetune-3", 2, "gpu-h100", 3, 10, 0.6),
    Plan("tiny", "finetune-4", 2, "gpu-h100", 3, 10, 0.9),   # no budget left: HELD
    Plan("tiny", "too-big", 8, "gpu-h100", 5, 10, 1.2),      # 4 > 3 credits: REJECTED
]
TOP_UP_AT_S, TOP_UP = 5.0, ("tiny", "2")


class Demo:
    def __init__(self, gateway: str) -> None:
        self.op = AsyncClient(gateway, operator_token=TOKEN)
        self.clients: dict[str, AsyncClient] = {}
        self.jobs: dict[str, Job] = {}
        self.runways: dict[str, Runway] = {}
        self.log: list[str] = []
        self.t0 = time.monotonic()
        self.endpoint: Endpoint | None = None
        self.served: list[float] = []  # latency (ms) of each answered request
        self.failed: list[str] = []
        self.replica = ""  # the replica's job id (the worker names itself after it)
        self.traffic_stop = asyncio.Event()

    def note(self, text: str) -> None:
        self.log.append(f"[dim]{time.monotonic() - self.t0:5.1f}s[/dim] {text}")
        del self.log[:-7]

    async def setup(self) -> None:
        for tenant, (credits, quota) in TENANTS.items():
            await self.op.create_tenant(tenant, gpu_quota=quota, rate_per_s=100, burst=200,
                                        initial_credits=credits)
            key = await self.op.create_api_key(tenant, "demo")
            self.clients[tenant] = AsyncClient(self.op.address, api_key=key.secret)
            self.note(f"operator: tenant [b]{tenant}[/b] with {credits} credits, quota {quota}")

    async def submit(self, p: Plan) -> None:
        await asyncio.sleep(max(0.0, p.at_s - (time.monotonic() - self.t0)))
        job = await self.clients[p.tenant].submit_job(
            name=p.name, gpus=p.gpus, max_duration_s=p.max_s, flavor=p.flavor,
            sim_duration_s=p.run_s)
        self.jobs[job.job_id] = job
        self.note(f"{p.tenant}: {p.name} ({p.gpus}x {p.flavor}) -> [b]{job.state.value}[/b]"
                  f" {job.reason[:70]}")

    async def serve(self) -> None:
        """acme's endpoint: create it (its replica is admitted like a job), wait for the
        worker in its pod to load the model, then send requests of 8 texts, two at a
        time, until told to stop."""
        tenant, name = ENDPOINT
        c = self.clients[tenant]
        ep = self.endpoint = await c.create_endpoint(name, min_replicas=1, max_replicas=1,
                                                     flavor="cpu")
        self.note(f"{tenant}: endpoint [b]{name}[/b] on the CPU pool -> {ep.replicas} "
                  "replica admitted (a pod on the real kubelet)")
        deadline = time.monotonic() + 180
        while ep.ready_replicas < 1:
            if time.monotonic() > deadline:
                self.failed.append("no ready replica within 180 s")
                return
            await asyncio.sleep(0.5)
            ep = self.endpoint = await c.get_endpoint(ep.endpoint_id)
        self.note(f"{tenant}: endpoint [b]{name}[/b] ready: the model loaded in its pod")

        async def client() -> None:
            while not self.traffic_stop.is_set():
                t = time.perf_counter()
                try:
                    r = await c.infer(ep.endpoint_id, TEXTS, timeout_s=10)
                    self.served.append((time.perf_counter() - t) * 1e3)
                    self.replica = r.replica
                except KestrelError as e:
                    self.failed.append(e.code_name)
        await asyncio.gather(client(), client())

    async def top_up(self) -> None:
        await asyncio.sleep(TOP_UP_AT_S)
        tenant, amount = TOP_UP
        await self.op.top_up(tenant, amount, top_up_id=f"demo-{tenant}")
        self.note(f"operator: top-up of {amount} credits for [b]{tenant}[/b]")

    async def refresh(self) -> None:
        for tenant, c in self.clients.items():
            self.runways[tenant] = await c.runway()
            async for job in c.list_jobs():
                if job.spec.endpoint_id:
                    continue  # an endpoint's replica: shown with its endpoint
                old = self.jobs.get(job.job_id)
                if old is not None and old.state != job.state:
                    self.note(f"{tenant}: {job.spec.name} {old.state.value} -> "
                              f"[b]{job.state.value}[/b]"
                              + (f" on {job.flavor}" if job.state is JobState.QUEUED else ""))
                self.jobs[job.job_id] = job

        if self.endpoint is not None:
            self.endpoint = await self.clients[ENDPOINT[0]].get_endpoint(
                self.endpoint.endpoint_id)

    def done(self) -> bool:
        return (len(self.jobs) == len(PLAN) and all(j.state.terminal for j in self.jobs.values())
                and (len(self.served) >= MIN_REQUESTS or bool(self.failed)))

    def render(self) -> Group:
        r = Table(title="runway (from the ledger, live)")
        for col in ("tenant", "credits", "charged", "reserved", "free to reserve", "burn/s",
                    "money lasts", "GPUs"):
            r.add_column(col, justify="right")
        for tenant, w in sorted(self.runways.items()):
            r.add_row(tenant, f"{w.credits}", f"{w.charged:.4f}", f"{w.reserved:.4f}",
                      f"{w.free_to_reserve:.4f}", f"{w.burn_per_s}", render.money_lasts(w),
                      str(w.running_gpus))
        j = Table(title="jobs (GPU nodes simulated by KWOK; Kubernetes and Kueue real)")
        for col in ("tenant", "job", "GPUs", "state", "flavor", "reserved"):
            j.add_column(col)
        for job in sorted(self.jobs.values(), key=lambda x: (x.tenant, x.created_us)):
            j.add_row(job.tenant, job.spec.name, str(job.spec.gpus), job.state.value,
                      job.flavor or "-", f"{job.reserved}")
        e = Table(title="endpoints (CPU pool: a real kubelet node; the model runs for real)")
        for col in ("tenant", "endpoint", "flavor", "ready", "requests", "texts", "failed",
                    "p50 ms"):
            e.add_column(col)
        if self.endpoint is not None:
            ep = self.endpoint
            p50 = sorted(self.served)[len(self.served) // 2] if self.served else 0.0
            e.add_row(ep.tenant, ep.name, ep.flavor, f"{ep.ready_replicas}/{ep.replicas}",
                      str(len(self.served)), str(len(self.served) * len(TEXTS)),
                      str(len(self.failed)), f"{p50:.0f}")
        return Group(r, j, e, *self.log)

    async def close(self) -> None:
        for c in (*self.clients.values(), self.op):
            await c.close()


async def summary(stack: Stack, demo: Demo) -> bool:
    db = await asyncpg.connect(stack.postgres_dsn)
    ledger = {r["workload_id"]: (Decimal(int(r["g"])) / 1_000_000, r["c"]) for r in await db.fetch(
        "SELECT workload_id, sum(gpu_us) g, sum(cost) c FROM ledger GROUP BY workload_id")}
    # Decisions, from admission's append-only transitions: a job counts once per state.
    ever = {(r["tenant"], r["to_state"]): r["n"] for r in await db.fetch(
        "SELECT tenant, to_state, count(DISTINCT job_id) n FROM job_transitions "
        "GROUP BY tenant, to_state")}
    await db.close()
    k8s = await asyncio.to_thread(cluster.gpu_seconds_by_job,
                                  [f"kestrel-{t}" for t in sorted(TENANTS)])
    t = Table(title="summary per tenant: the ledger vs Kubernetes")
    for col in ("tenant", "admitted", "held", "rejected", "GPU-s (ledger)", "GPU-s (k8s)",
                "equal", "spend", "overrun"):
        t.add_column(col, justify="right")
    ok = True
    for tenant in sorted(TENANTS):
        jobs = [j for j in demo.jobs.values() if j.tenant == tenant]
        admitted, held, rejected = (ever.get((tenant, s), 0) for s in (2, 1, 9))
        g_ledger = sum((ledger.get(j.job_id, (Decimal(0), Decimal(0)))[0] for j in jobs),
                       Decimal(0))
        # Metered from Kueue's Admitted to Finished, never past the job's bound.
        g_k8s = sum((min(k8s.get(j.job_id, Decimal(0)),
                         Decimal(j.spec.gpus * j.spec.max_duration_s)) for j in jobs),
                    Decimal(0))
        spend = sum((ledger.get(j.job_id, (Decimal(0), Decimal(0)))[1] for j in jobs),
                    Decimal(0))
        overrun = sum((max(Decimal(0), ledger.get(j.job_id, (0, Decimal(0)))[1] - j.reserved)
                       for j in jobs), Decimal(0))
        equal = abs(g_ledger - g_k8s) < Decimal("0.0001")
        ok &= equal and overrun == 0
        t.add_row(tenant, str(admitted), str(held), str(rejected), f"{g_ledger:.6f}",
                  f"{g_k8s:.6f}", "[green]yes[/green]" if equal else "[red]NO[/red]",
                  f"{spend:.6f}", f"{overrun:.6f}")
    console.print(t)
    return await endpoint_summary(stack, demo) and ok


async def endpoint_summary(stack: Stack, demo: Demo) -> bool:
    """The endpoint's replica: requests, and its core-seconds in the ledger against its
    own instants (Kueue's admission, the deletion), from the placer's events."""
    if demo.endpoint is None:
        console.print("[red]the endpoint was never created[/red]")
        return False
    db = await asyncpg.connect(stack.postgres_dsn)
    try:
        row = await db.fetchrow("""
            SELECT (SELECT coalesce(sum(gpu_us), 0) FROM ledger WHERE workload_id = $1) u,
                   (SELECT coalesce(sum(cost), 0) FROM ledger WHERE workload_id = $1) c,
                   (SELECT max(time_us) FROM workload_events
                    WHERE workload_id = $1 AND type = 1) a,
                   (SELECT max(time_us) FROM workload_events
                    WHERE workload_id = $1 AND type IN (3, 4, 5, 7)) z""", demo.replica)
    finally:
        await db.close()
    t = Table(title="summary of the endpoint: its replica in the ledger vs its own instants")
    for col in ("tenant", "endpoint", "replica", "requests", "failed", "core-s (ledger)",
                "core-s (events)", "equal", "spend"):
        t.add_column(col, justify="right")
    used = Decimal(int(row["u"])) / 1_000_000 if row else Decimal(0)
    ok_rows = row is not None and row["a"] is not None and row["z"] is not None
    want = Decimal(int(row["z"]) - int(row["a"])) / 1_000_000 if ok_rows else Decimal(-1)
    equal = ok_rows and used == want
    t.add_row(demo.endpoint.tenant, demo.endpoint.name, demo.replica or "-",
              str(len(demo.served)), str(len(demo.failed)), f"{used:.6f}",
              f"{want:.6f}" if ok_rows else "-",
              "[green]yes[/green]" if equal else "[red]NO[/red]",
              f"{row['c'] if row else 0:.6f}")
    console.print(t)
    if demo.failed:
        console.print(f"[red]failed requests: {sorted(set(demo.failed))}[/red]")
    return bool(equal) and not demo.failed and len(demo.served) >= MIN_REQUESTS


async def main_async(keep: bool) -> int:
    console.rule("[bold]Kestrel demo[/bold]: the usage ledger decides, live")
    was_up = await asyncio.to_thread(cluster.is_up)
    console.print("data plane: etcd, kube-apiserver, scheduler, controller-manager, Kueue, "
                  "KWOK GPU nodes (first run builds them from the Go module registry) …")
    info = await asyncio.to_thread(
        cluster.ensure_cluster, lambda s: console.print(f"  [dim]cluster[/dim] {s}"))
    root = REPO / ".run" / "demo"
    shutil.rmtree(root, ignore_errors=True)
    stack = Stack(root, durable=True)
    procs: list[ServiceProcess] = []
    prom: prometheus.Prometheus | None = None
    demo: Demo | None = None
    try:
        console.print("infrastructure: Postgres, NATS JetStream, Redis on 127.0.0.1 …")
        await asyncio.to_thread(stack.up)
        names = ("meter", "gateway", "admission", "placer")
        every_port = port_map(*names, *(f"{n}-metrics" for n in names))  # all distinct
        ports = {n: every_port[n] for n in names}
        metrics_ports = {n: every_port[f"{n}-metrics"] for n in names}
        env = {**stack.env(), "KESTREL_OPERATOR_TOKEN": TOKEN, "KESTREL_PRICES": PRICES,
               "KESTREL_METER_TICK_S": "0.5", "KESTREL_LOG_LEVEL": "WARNING",
               "KESTREL_KUBECONFIG": str(info.kubeconfig),
               **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in ports.items()},
               **{f"KESTREL_{n.upper()}_ADDR": f"127.0.0.1:{p}" for n, p in ports.items()},
               **{f"KESTREL_{n.upper()}_METRICS_PORT": str(p) for n, p in metrics_ports.items()}}
        for name in ("meter", "gateway", "admission", "placer"):
            proc = ServiceProcess(name, env, f"127.0.0.1:{ports[name]}", root / f"{name}.log")
            await asyncio.to_thread(proc.start)
            procs.append(proc)
        console.print(f"services: meter, gateway, admission, placer (logs in {root}); "
                      f"demo prices {PRICES} credits per GPU-second")
        prom = prometheus.Prometheus(root / "prometheus")
        await asyncio.to_thread(prom.up, prometheus.plane_config(
            prom.root, {n: f"127.0.0.1:{p}" for n, p in metrics_ports.items()},
            scrape_interval_s=2, progress=lambda s: console.print(f"  [dim]{s}[/dim]")))
        console.print(f"prometheus: {prom.url} scrapes them, kube-apiserver and Kueue "
                      f"(alerts {prom.url}/alerts)")
        demo = Demo(f"127.0.0.1:{ports['gateway']}")
        await demo.setup()
        with Live(demo.render(), console=console, refresh_per_second=4) as live:
            work = asyncio.gather(*(demo.submit(p) for p in PLAN), demo.top_up())
            traffic = asyncio.create_task(demo.serve())
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                await demo.refresh()
                live.update(demo.render())
                if work.done() and demo.done():
                    break
                await asyncio.sleep(0.5)
            await work
            demo.traffic_stop.set()
            await traffic
            if demo.endpoint is not None:
                await demo.clients[ENDPOINT[0]].delete_endpoint(demo.endpoint.endpoint_id)
                demo.note(f"{ENDPOINT[0]}: endpoint deleted: its replica stops, metered to "
                          "that instant")
                live.update(demo.render())
        await asyncio.sleep(1.5)  # the last ticks and closes reach the ledger
        ok = await summary(stack, demo)
        if not demo.done():
            console.print("[red]not every job finished (or the endpoint did not serve "
                          f"{MIN_REQUESTS} requests) within 240 s[/red]")
            ok = False
        return 0 if ok else 1
    finally:
        if demo is not None:
            await demo.close()
        if keep:
            console.print(f"left running (--keep): gateway 127.0.0.1:{ports['gateway']}, "
                          f"operator token {TOKEN}; {stack.env()}")
            if prom is not None:
                console.print(f"prometheus {prom.url} (stop it: python -m kestrel.prometheus "
                              f"down --dir {prom.root})")
        else:
            if prom is not None:
                await asyncio.to_thread(prom.down)
            for p in reversed(procs):
                p.stop()
            await asyncio.to_thread(cleanup_tenants, sorted(TENANTS))
            await asyncio.to_thread(stack.destroy)
            if not was_up:
                await asyncio.to_thread(cluster.down, lambda s: None)


def cleanup_tenants(tenants: list[str]) -> None:
    for tenant in tenants:
        cluster.kubectl("delete", "namespace", f"kestrel-{tenant}", "--wait=false",
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "clusterqueue", f"kestrel-{tenant}", "--ignore-not-found",
                        check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="leave everything running")
    sys.exit(asyncio.run(main_async(ap.parse_args().keep)))


if __name__ == "__main__":
    main()

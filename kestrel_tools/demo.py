"""make demo: the runway loop on a real Kubernetes control plane.

Brings up the data plane (etcd, kube-apiserver, scheduler, controller-manager,
Kueue, KWOK GPU nodes: built from the Go module registry on first use, cached),
Postgres, NATS JetStream and Redis, the meter, gateway, admission and placer, and a
Prometheus scraping them, kube-apiserver and Kueue (its address is printed).
Then an operator creates two tenants, one with a large budget and one small;
both submit GPU jobs; the small tenant's jobs are HELD when its budget is
reserved, then released by a top-up. Meanwhile acme serves the real embedding model
(all-MiniLM-L6-v2 on onnxruntime) from an endpoint on the CPU pool: its replicas are
pods on the real kubelet node, admitted by Kueue, holding rolling reservations and
metered per core-second; four clients send it requests and the autoscaler grows it
to two replicas; once it is ready, one request goes through gRPC Infer and the same
texts through the OpenAI-compatible POST /v1/embeddings with curl, and the two answers
are compared. Tenant beta's endpoint runs on a simulated GPU with a small budget:
the autoscaler takes it to zero as its runway falls below the endpoint's horizon. A live table
shows runway, reservations, job states and the endpoint's traffic; the summary
compares the ledger's GPU-seconds with gpus x elapsed recomputed from Kubernetes' own
timestamps, and the endpoint's core-seconds with its replica's admission and
deletion instants.

GPUs are simulated (KWOK nodes): pods "run" for their declared duration. The
control plane, Kueue quota, the CPU pool's kubelet, the model, the ledger and the
runway are real.

    python -m kestrel_tools.demo [--keep]     # the demo (make demo)
    python -m kestrel_tools.demo env          # exports for what --keep left running
    python -m kestrel_tools.demo down         # stop it
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path

import asyncpg
import grpc
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from kestrel_sdk import AsyncClient, Endpoint, Job, JobState, KestrelError, Runway
from kestrel_sdk.cli import render
from kestrel_sdk.tls import aio_channel
from kestrel_sdk.v1 import autoscaler_pb2, autoscaler_pb2_grpc
from kestrel_tools import cluster, kubework, prometheus
from kestrel_tools.cluster.processes import pid_alive
from kestrel_tools.devstack import Stack, port_map
from kestrel_tools.procs import REPO, ServiceProcess

_probe = Console()
console = _probe if _probe.is_terminal else Console(width=120)
TOKEN = "kso_demo-operator"
# Demo prices, credits per GPU-second (per core-second on the CPU pool), high so that
# budgets move within seconds.
PRICES = "gpu-h100=0.05,gpu-a10=0.015,cpu=0.002"
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.",
         "The girl is carrying a baby.", "A man is riding a horse.",
         "A woman is playing the violin.", "Two men pushed carts through the woods.",
         "A monkey is playing drums.", "A cheetah is running behind its prey."]
MIN_REQUESTS = 20  # the demo keeps sending until acme's endpoint served at least this many


@dataclass(frozen=True)
class EndpointPlan:
    tenant: str
    name: str
    flavor: str
    min_replicas: int
    max_replicas: int
    horizon_s: int  # seconds of spend each replica holds
    clients: int  # concurrent clients sending requests of 8 texts


# acme's endpoint on the CPU pool grows with its load (the real kubelet, the real
# model); beta's on a simulated GPU, with a small budget, shrinks as its runway falls
# below the horizon and stops when the money is gone.
# acme's horizon is 2 minutes: its GPU jobs burn ~0.5 credits/s for a few seconds, a
# runway of ~6 minutes, so a 10-minute horizon would shrink the endpoint meanwhile.
ENDPOINTS = [EndpointPlan("acme", "embed", "cpu", 1, 2, 120, 4),
             EndpointPlan("beta", "embed-gpu", "gpu-a10", 1, 1, 10, 1)]
AUTOSCALER_ENV = {  # short windows so that a 40 s demo sees whole cycles
    "KESTREL_AUTOSCALER_INTERVAL_S": "0.5", "KESTREL_AUTOSCALER_STABLE_WINDOW_S": "10",
    "KESTREL_AUTOSCALER_PANIC_WINDOW_S": "3", "KESTREL_AUTOSCALER_SCALE_UP_COOLDOWN_S": "2",
    "KESTREL_AUTOSCALER_SCALE_DOWN_COOLDOWN_S": "10", "KESTREL_AUTOSCALER_REPLICA_RPS": "3"}


# The autoscaler's reasons for taking an endpoint down for money.
BUDGET_REASONS = ("runway_short", "runway_exhausted", "cost_budget_block")


@dataclass
class EndpointRun:
    """One endpoint of the demo: its traffic, as its clients saw it."""

    plan: EndpointPlan
    endpoint: Endpoint | None = None
    served: list[float] = field(default_factory=list)  # latency (ms) of each answer
    refused: int = 0  # FAILED_PRECONDITION: the tenant's budget is spent
    waited: int = 0  # UNAVAILABLE / DEADLINE_EXCEEDED: no replica at that moment
    failed: list[str] = field(default_factory=list)  # anything else
    most: int = 0  # the most replicas seen at once
    replicas: set[str] = field(default_factory=set)  # replica job ids that answered
    reason: str = ""  # the autoscaler's last reason
    # Seen at zero replicas because money could no longer pay for one over its horizon.
    stopped_by_budget: bool = False



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
           "tiny": ("3", {"gpu-h100": 8, "gpu-a10": 8}),
           # 1 simulated A10 at 0.015/s: 0.45 credits last about 30 s of its endpoint
           "beta": ("0.45", {"gpu-a10": 1})}
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
        self.keys: dict[str, str] = {}
        self.jobs: dict[str, Job] = {}
        self.runways: dict[str, Runway] = {}
        self.log: list[str] = []
        self.t0 = time.monotonic()
        self.endpoints = {p.tenant: EndpointRun(p) for p in ENDPOINTS}
        self.traffic_stop = asyncio.Event()
        self.autoscaler = ""  # its address: GetScaleState for the table
        self.http_url = ""  # the gateway's OpenAI-compatible API, http://host:port/v1
        self.transports: list[tuple[str, str, str, str, str]] = []  # one call, two ways
        self.transports_ok = False

    def note(self, text: str) -> None:
        self.log.append(f"[dim]{time.monotonic() - self.t0:5.1f}s[/dim] {text}")
        del self.log[:-7]

    async def setup(self) -> None:
        for tenant, (credits, quota) in TENANTS.items():
            await self.op.create_tenant(tenant, gpu_quota=quota, rate_per_s=100, burst=200,
                                        initial_credits=credits)
            key = await self.op.create_api_key(tenant, "demo")
            self.clients[tenant] = AsyncClient(self.op.address, api_key=key.secret)
            self.keys[tenant] = key.secret
            self.note(f"operator: tenant [b]{tenant}[/b] with {credits} credits, quota {quota}")

    async def submit(self, p: Plan) -> None:
        await asyncio.sleep(max(0.0, p.at_s - (time.monotonic() - self.t0)))
        job = await self.clients[p.tenant].submit_job(
            name=p.name, gpus=p.gpus, max_duration_s=p.max_s, flavor=p.flavor,
            sim_duration_s=p.run_s)
        self.jobs[job.job_id] = job
        self.note(f"{p.tenant}: {p.name} ({p.gpus}x {p.flavor}) -> [b]{job.state.value}[/b]"
                  f" {job.reason[:70]}")

    async def serve(self, run: EndpointRun) -> None:
        """Create the endpoint (its first replica is admitted like a job), wait for the
        model to load, then send requests of 8 texts until told to stop; the
        autoscaler sizes it meanwhile."""
        p = run.plan
        c = self.clients[p.tenant]
        ep = run.endpoint = await c.create_endpoint(
            p.name, min_replicas=p.min_replicas, max_replicas=p.max_replicas, flavor=p.flavor,
            horizon_s=p.horizon_s)
        where = ("a simulated GPU replica: a KWOK pod, a host process answers" if ep.simulated
                 else "a pod on the real kubelet")
        self.note(f"{p.tenant}: endpoint [b]{p.name}[/b] on {p.flavor} -> {ep.replicas} "
                  f"replica admitted ({where})")
        deadline = time.monotonic() + 180
        while ep.ready_replicas < 1:
            if run.stopped_by_budget:  # the money ran out before the model loaded
                self.note(f"{p.tenant}: endpoint [b]{p.name}[/b] stopped for its budget "
                          "before a replica was ready")
                return
            if time.monotonic() > deadline:
                run.failed.append("no ready replica within 180 s")
                return
            await asyncio.sleep(0.5)
            ep = run.endpoint = await c.get_endpoint(ep.endpoint_id)
        self.note(f"{p.tenant}: endpoint [b]{p.name}[/b] ready: the model loaded")
        if p.tenant == "acme" and self.http_url:
            await self.two_transports(c, self.keys[p.tenant], ep)

        async def client() -> None:
            while not self.traffic_stop.is_set():
                t = time.perf_counter()
                try:
                    r = await c.infer(ep.endpoint_id, TEXTS, timeout_s=5)
                    run.served.append((time.perf_counter() - t) * 1e3)
                    run.replicas.add(r.replica)
                except KestrelError as e:
                    if e.code is grpc.StatusCode.FAILED_PRECONDITION:
                        run.refused += 1
                    elif e.code in (grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.DEADLINE_EXCEEDED):
                        run.waited += 1
                    else:
                        run.failed.append(e.code_name)
                    await asyncio.sleep(0.5)
        await asyncio.gather(*(client() for _ in range(p.clients)))

    async def two_transports(self, c: AsyncClient, key: str, ep: Endpoint) -> None:
        """The same texts through gRPC Infer (the SDK) and through curl on the
        OpenAI-compatible URL: one path behind both, so the same vectors."""
        t = time.perf_counter()
        try:
            r = await c.infer(ep.endpoint_id, TEXTS, timeout_s=10)
        except KestrelError as e:
            self.transports.append(("gRPC Infer (SDK)", e.code_name, "-", "-", "-"))
            return
        grpc_ms = (time.perf_counter() - t) * 1e3
        self.transports.append(("gRPC Infer (SDK)", "OK", f"{len(r.embeddings)} x "
                                f"{len(r.embeddings[0])}", "-", f"{grpc_ms:.0f}"))
        body = json.dumps({"model": ep.name, "input": TEXTS, "encoding_format": "float"})
        cmd = ["curl", "-sS", "--max-time", "15", "-w", "\n%{http_code}",
               "-H", f"Authorization: Bearer {key}",
               "-H", "Content-Type: application/json", "--data-binary", "@-",
               f"{self.http_url}/embeddings"]
        t = time.perf_counter()
        proc = await asyncio.to_thread(subprocess.run, cmd, input=body, capture_output=True,
                                       text=True, timeout=30, check=False)
        http_ms = (time.perf_counter() - t) * 1e3
        text, _, status = proc.stdout.rpartition("\n")
        if proc.returncode != 0 or status != "200":
            self.transports.append(("curl POST /v1/embeddings", status or proc.stderr[:60],
                                    "-", "-", "-"))
            return
        out = json.loads(text)
        vectors = [d["embedding"] for d in out["data"]]
        diff = max(abs(a - b) for v, e in zip(vectors, r.embeddings, strict=True)
                   for a, b in zip(v, e, strict=True))
        self.transports.append((f"curl POST {self.http_url}/embeddings", status,
                                f"{len(vectors)} x {len(vectors[0])}",
                                str(out["usage"]["prompt_tokens"]), f"{http_ms:.0f}"))
        self.transports_ok = diff < 1e-4
        self.note(f"acme: the same {len(TEXTS)} texts by curl on {self.http_url}/embeddings "
                  f"-> {status}, max |difference| from gRPC Infer's vectors {diff:.1e}")

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

        for run in self.endpoints.values():
            if run.endpoint is None:
                continue
            before = run.endpoint
            run.endpoint = await self.clients[run.plan.tenant].get_endpoint(
                before.endpoint_id)
            run.most = max(run.most, run.endpoint.replicas)
            run.reason = await self.scale_reason(run)
            if run.endpoint.replicas == 0 and run.most >= 1 and run.reason in BUDGET_REASONS:
                run.stopped_by_budget = True
            if run.endpoint.replicas != before.replicas:
                self.note(f"{run.plan.tenant}: endpoint {run.plan.name} {before.replicas} -> "
                          f"[b]{run.endpoint.replicas}[/b] replicas ({run.reason or '?'})")

    async def scale_reason(self, run: EndpointRun) -> str:
        if not self.autoscaler or run.endpoint is None:
            return ""
        async with aio_channel(self.autoscaler) as ch:
            try:
                got = await autoscaler_pb2_grpc.AutoscalerStub(ch).GetScaleState(
                    autoscaler_pb2.GetScaleStateRequest(
                        tenant=run.plan.tenant, endpoint_id=run.endpoint.endpoint_id),
                    timeout=2)
            except grpc.aio.AioRpcError:
                return run.reason
        return str(got.reason)

    def done(self) -> bool:
        acme, beta = self.endpoints["acme"], self.endpoints["beta"]
        grown = acme.most >= acme.plan.max_replicas and len(acme.served) >= MIN_REQUESTS
        stopped = beta.stopped_by_budget
        failed = any(r.failed for r in self.endpoints.values())
        return (len(self.jobs) == len(PLAN) and all(j.state.terminal for j in self.jobs.values())
                and ((grown and stopped) or failed))

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
        e = Table(title="endpoints (the model runs for real; the cpu pool is a real kubelet, "
                        "GPU replicas are simulated) and the autoscaler")
        for col in ("tenant", "endpoint", "flavor", "replicas", "most", "requests",
                    "refused", "no replica", "failed", "p50 ms", "autoscaler"):
            e.add_column(col)
        for run in self.endpoints.values():
            if run.endpoint is None:
                continue
            ep = run.endpoint
            p50 = sorted(run.served)[len(run.served) // 2] if run.served else 0.0
            e.add_row(ep.tenant, ep.name, f"{ep.flavor}{' (simulated)' if ep.simulated else ''}",
                      f"{ep.ready_replicas}/{ep.replicas}", str(run.most), str(len(run.served)),
                      str(run.refused), str(run.waited), str(len(run.failed)), f"{p50:.0f}",
                      run.reason)
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
    k8s = await asyncio.to_thread(kubework.gpu_seconds_by_job,
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
    """Each endpoint's replicas (every one the autoscaler started): requests, and their
    units in the ledger against each replica's own instants from the placer's events
    (Kueue's admission to its deletion or eviction)."""
    t = Table(title="summary of the endpoints: their replicas in the ledger vs their own "
                    "instants")
    for col in ("tenant", "endpoint", "replicas", "most", "requests", "refused", "failed",
                "units-s (ledger)", "units-s (events)", "equal", "spend"):
        t.add_column(col, justify="right")
    ok = True
    db = await asyncpg.connect(stack.postgres_dsn)
    try:
        for run in demo.endpoints.values():
            if run.endpoint is None:
                ok = False
                continue
            ids = [j.job_id async for j in demo.clients[run.plan.tenant].list_jobs()
                   if j.spec.endpoint_id == run.endpoint.endpoint_id]
            rows = await db.fetch("""
                SELECT a.workload_id, a.gpus,
                       (SELECT coalesce(sum(gpu_us), 0) FROM ledger l
                        WHERE l.workload_id = a.workload_id) used,
                       (SELECT coalesce(sum(cost), 0) FROM ledger l
                        WHERE l.workload_id = a.workload_id) cost,
                       (SELECT min(time_us) FROM workload_events e
                        WHERE e.workload_id = a.workload_id AND e.type = 1) a_us,
                       (SELECT min(time_us) FROM workload_events e
                        WHERE e.workload_id = a.workload_id AND e.type IN (3, 4, 5, 7)) z_us
                FROM allocations a WHERE a.workload_id = ANY($1::text[])""", ids)
            used = sum((Decimal(int(r["used"])) for r in rows), Decimal(0)) / 1_000_000
            want = sum((Decimal(int(r["gpus"]) * (int(r["z_us"]) - int(r["a_us"])))
                        for r in rows if r["a_us"] is not None and r["z_us"] is not None),
                       Decimal(0)) / 1_000_000
            closed = all(r["z_us"] is not None for r in rows) and bool(rows)
            equal = closed and used == want
            ok &= equal and not run.failed
            spend = sum((r["cost"] for r in rows), Decimal(0))
            t.add_row(run.plan.tenant, run.plan.name, str(len(ids)), str(run.most),
                      str(len(run.served)), str(run.refused), str(len(run.failed)),
                      f"{used:.6f}", f"{want:.6f}",
                      "[green]yes[/green]" if equal else "[red]NO[/red]", f"{spend:.6f}")
            if run.failed:
                console.print(f"[red]{run.plan.name}: failed requests: "
                              f"{sorted(set(run.failed))}[/red]")
    finally:
        await db.close()
    console.print(t)
    tt = Table(title="one request, two transports: gRPC Infer and the OpenAI-compatible URL")
    for col in ("call", "status", "vectors", "prompt tokens", "ms (one call)"):
        tt.add_column(col)
    for row in demo.transports:
        tt.add_row(*row)
    tt.add_row("same vectors", "[green]yes[/green]" if demo.transports_ok else "[red]NO[/red]",
               "", "", "")
    console.print(tt)
    if not demo.transports_ok:
        console.print("[red]the curl call to /v1/embeddings did not return gRPC Infer's "
                      "vectors[/red]")
        ok = False
    acme, beta = demo.endpoints["acme"], demo.endpoints["beta"]
    if acme.most < acme.plan.max_replicas or len(acme.served) < MIN_REQUESTS:
        console.print(f"[red]acme's endpoint never grew to {acme.plan.max_replicas} replicas "
                      f"with {MIN_REQUESTS} requests served[/red]")
        ok = False
    if not beta.stopped_by_budget:
        console.print("[red]beta's endpoint never went to zero for its budget[/red]")
        ok = False
    return ok


async def main_async(keep: bool) -> int:
    console.rule("[bold]Kestrel demo[/bold]: the usage ledger decides, live")
    was_up = await asyncio.to_thread(cluster.is_up)
    console.print("data plane: etcd, kube-apiserver, scheduler, controller-manager, Kueue, "
                  "KWOK GPU nodes (first run builds them from the Go module registry) …")
    info = await asyncio.to_thread(
        cluster.ensure_cluster, lambda s: console.print(f"  [dim]cluster[/dim] {s}"))
    root = REPO / ".run" / "demo"
    # The services' logs outlive the run (the stack's directory does not): what a failed
    # demo did is there to read until the next run.
    logs = REPO / ".run" / "demo-logs"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)
    stack = Stack(root, durable=True)
    procs: list[ServiceProcess] = []
    prom: prometheus.Prometheus | None = None
    demo: Demo | None = None
    try:
        console.print("infrastructure: Postgres, NATS JetStream, Redis on 127.0.0.1 …")
        await asyncio.to_thread(stack.up)
        names = ("meter", "gateway", "admission", "placer", "autoscaler")
        every_port = port_map(*names, *(f"{n}-metrics" for n in names),  # all distinct
                              "gateway-http", "replicas")
        ports = {n: every_port[n] for n in names}
        metrics_ports = {n: every_port[f"{n}-metrics"] for n in names}
        env = {**stack.env(), "KESTREL_OPERATOR_TOKEN": TOKEN, "KESTREL_PRICES": PRICES,
               "KESTREL_METER_TICK_S": "0.5",
               "KESTREL_LOG_LEVEL": os.environ.get("KESTREL_LOG_LEVEL", "INFO"),
               "KESTREL_KUBECONFIG": str(info.kubeconfig),
               "KESTREL_GATEWAY_HTTP_PORT": str(every_port["gateway-http"]),
               "KESTREL_REPLICAS_PORT": str(every_port["replicas"]),
               "KESTREL_REPLICAS_ADDR": f"127.0.0.1:{every_port['replicas']}",
               **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in ports.items()},
               **{f"KESTREL_{n.upper()}_ADDR": f"127.0.0.1:{p}" for n, p in ports.items()},
               **{f"KESTREL_{n.upper()}_METRICS_PORT": str(p) for n, p in metrics_ports.items()}}
        env |= {**AUTOSCALER_ENV,
                "KESTREL_AUTOSCALER_LEASE": f"kestrel-demo-autoscaler-{os.getpid()}"}
        for name in names:
            proc = ServiceProcess(name, env, f"127.0.0.1:{ports[name]}", logs / f"{name}.log")
            await asyncio.to_thread(proc.start)
            procs.append(proc)
        console.print(f"services: meter, gateway, admission, placer, autoscaler (logs in {logs}); "
                      f"demo prices {PRICES} credits per GPU-second")
        prom = prometheus.Prometheus(root / "prometheus")
        await asyncio.to_thread(prom.up, prometheus.plane_config(
            prom.root, {n: f"127.0.0.1:{p}" for n, p in metrics_ports.items()},
            scrape_interval_s=2, progress=lambda s: console.print(f"  [dim]{s}[/dim]")))
        console.print(f"prometheus: {prom.url} scrapes them, kube-apiserver and Kueue "
                      f"(alerts {prom.url}/alerts)")
        demo = Demo(f"127.0.0.1:{ports['gateway']}")
        demo.autoscaler = f"127.0.0.1:{ports['autoscaler']}"
        demo.http_url = f"http://127.0.0.1:{every_port['gateway-http']}/v1"
        await demo.setup()
        with Live(demo.render(), console=console, refresh_per_second=4) as live:
            work = asyncio.gather(*(demo.submit(p) for p in PLAN), demo.top_up())
            traffic = asyncio.gather(*(demo.serve(r) for r in demo.endpoints.values()))
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
            for run in demo.endpoints.values():
                if run.endpoint is not None:
                    await demo.clients[run.plan.tenant].delete_endpoint(
                        run.endpoint.endpoint_id)
            demo.note("endpoints deleted: their replicas stop, metered to that instant")
            live.update(demo.render())
        await asyncio.sleep(1.5)  # the last ticks and closes reach the ledger
        console.print()
        ok = await summary(stack, demo)
        if not demo.done():
            console.print("[red]not every job finished (or the endpoint did not serve "
                          f"{MIN_REQUESTS} requests) within 240 s[/red]")
            ok = False
        return 0 if ok else 1
    finally:
        if demo is not None:
            await demo.close()
        if keep and procs:
            started = console_line(env, logs)
            kept = Kept({n: p.pid for n, p in zip(names, procs, strict=False)},
                        started[1], str(prom.root) if prom is not None else "",
                        {k: env[k] for k in KEPT_ENV if k in env} | {
                            "KESTREL_OPERATOR_TOKEN": TOKEN})
            kept.save()
            console.print(kept_table(kept, prom.url if prom is not None else "", started[0],
                                     logs))
        else:
            if prom is not None:
                await asyncio.to_thread(prom.down)
            for p in reversed(procs):
                p.stop()
            await asyncio.to_thread(cleanup_tenants, sorted(TENANTS))
            await asyncio.to_thread(stack.destroy)
            if not was_up:
                await asyncio.to_thread(cluster.down, lambda s: None)


def console_line(env: dict[str, str], root: Path) -> tuple[str, int]:
    """The operator console on what --keep left running: started here when it has been
    built (`make demo DEMO_ARGS=--keep` builds it first), else (the module run by hand)
    the command that builds and starts it. (where it is, its pid or 0)"""
    names = ("GATEWAY", "METER", "ADMISSION", "AUTOSCALER", "PLACER")
    wiring = {f"KESTREL_{n}_ADDR": env[f"KESTREL_{n}_ADDR"] for n in names}
    wiring["KESTREL_OPERATOR_TOKEN"] = env["KESTREL_OPERATOR_TOKEN"]
    port = os.environ.get("KESTREL_CONSOLE_PORT", "3000")
    app = REPO / "console"
    if (app / ".next" / "BUILD_ID").exists():
        log = (root / "console.log").open("ab")
        proc = subprocess.Popen(
            [str(app / "node_modules" / ".bin" / "next"), "start", "-H", "127.0.0.1", "-p", port],
            cwd=app, env={**os.environ, **wiring}, stdout=log, stderr=log,
            stdin=subprocess.DEVNULL, start_new_session=True)
        return f"http://127.0.0.1:{port}", proc.pid
    return ("not built; with the environment below loaded: make console", 0)


# What `python -m kestrel_tools.demo env` exports: where the CLI, the SDK, grpcurl and the
# console find the plane the demo left running.
KEPT_ENV = ("KESTREL_GATEWAY_ADDR", "KESTREL_METER_ADDR", "KESTREL_ADMISSION_ADDR",
            "KESTREL_AUTOSCALER_ADDR", "KESTREL_PLACER_ADDR", "KESTREL_KUBECONFIG")
KEPT_FILE = REPO / ".run" / "demo" / "kept.json"


@dataclass(frozen=True)
class Kept:
    """What `make demo DEMO_ARGS=--keep` left running, for `env` and `down`."""

    pids: dict[str, int]  # service -> pid
    console_pid: int
    prometheus_dir: str
    env: dict[str, str]

    def save(self) -> None:
        fd = os.open(KEPT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:  # the operator token is in it
            json.dump(asdict(self), f, indent=2)

    @classmethod
    def load(cls) -> Kept | None:
        if not KEPT_FILE.exists():
            return None
        return cls(**json.loads(KEPT_FILE.read_text()))


def kept_table(kept: Kept, prom_url: str, console_at: str, logs: Path) -> Table:
    t = Table(title="left running (--keep)", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    gateway = kept.env["KESTREL_GATEWAY_ADDR"]
    for k, v in (
            ("gateway", f"{gateway}  (grpcurl -plaintext {gateway} list)"),
            ("console", console_at), ("prometheus", prom_url or "-"),
            ("logs", str(logs)),
            ("operator token", "KESTREL_OPERATOR_TOKEN, exported by the line below"),
            ("load the rest", 'eval "$(.venv/bin/python -m kestrel_tools.demo env)"'),
            ("then, e.g.", ".venv/bin/kestrel tenants list"),
            ("stop it all", ".venv/bin/python -m kestrel_tools.demo down")):
        t.add_row(k, v)
    return t


def print_env() -> int:
    kept = Kept.load()
    if kept is None:
        print("nothing left running: make demo DEMO_ARGS=--keep", file=sys.stderr)
        return 1
    stack = Stack.load(KEPT_FILE.parent)
    for k, v in {**(stack.env() if stack else {}), **kept.env}.items():
        print(f"export {k}={shlex.quote(v)}")
    return 0


def down() -> int:
    """Stop what --keep left: services, console, Prometheus, the stores, the demo's
    tenants' queues; the data plane stays up (make demo reuses it)."""
    kept = Kept.load()
    if kept is None:
        print("nothing left running by make demo DEMO_ARGS=--keep")
        return 0
    pids = [p for p in [*kept.pids.values(), kept.console_pid] if p]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if kept.prometheus_dir:
        prometheus.Prometheus.open(Path(kept.prometheus_dir)).down()
    cleanup_tenants(sorted(TENANTS))
    stack = Stack.load(KEPT_FILE.parent)
    if stack is not None:
        stack.destroy()
    KEPT_FILE.unlink(missing_ok=True)
    print(f"demo stopped: {len(pids)} processes, Prometheus, the stores, the tenants' queues")
    return 0


def cleanup_tenants(tenants: list[str]) -> None:
    for tenant in tenants:
        cluster.kubectl("delete", "namespace", f"kestrel-{tenant}", "--wait=false",
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "clusterqueue", f"kestrel-{tenant}", "--ignore-not-found",
                        check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", choices=["run", "env", "down"], default="run",
                    help="run the demo (default); env: the exports for what --keep left "
                         "running; down: stop it")
    ap.add_argument("--keep", action="store_true", help="leave everything running")
    args = ap.parse_args()
    if args.command == "env":
        sys.exit(print_env())
    if args.command == "down":
        sys.exit(down())
    sys.exit(asyncio.run(main_async(args.keep)))


if __name__ == "__main__":
    main()

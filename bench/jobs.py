"""make bench-jobs: the whole plane against bare Kueue, in one run.

1. Baseline: M jobs (1 GPU, 1 s simulated run) created straight in a Kueue
   LocalQueue with the kubernetes client; admissions per second from the first
   create to the last Workload Admitted (bench/cluster_check.py's method).
   1b. The same behind an AdmissionCheck whose controller says Ready at once:
   what Kueue's admission-check protocol costs before Kestrel does anything
   (shown in the table; the ratio stays plane / bare Kueue). Run once before
   the plane and once after it (5.); ratio_vs_check is the plane against the
   mean of the two, so a cluster that slows as runs pile up weighs on both.
   Every run also shows its steady rate, between the 20th and 90th percent of
   admissions, apart from the start-up burst.
2. The plane: the same M jobs submitted through the gateway (admission reserves,
   the placer creates the Jobs, the runway AdmissionCheck lets them in), the same
   quota (32 gpu-h100 + 32 gpu-a10), measured the same way; plus each job's
   submit -> Kueue Admitted latency.
3. The gate: a tenant submits every 10 ms while an operator lowers its budget
   to nothing; the time from that adjustment's commit to the first refused
   submission.
4. The ledger: each job's GPU-seconds against gpus x (Finished - Admitted) from
   Kubernetes' own timestamps, and any GPU-seconds beyond gpus x max_duration.
5. The no-op check again, after the plane's services and Jobs are gone.

Before each of the four measured phases the Kueue manager is restarted and the
machine left to settle (kestrel_tools.cluster.restart_kueue says why): otherwise a
phase could inherit Kueue's 6-minute flush of the event series that earlier
phases' namespace deletions left behind, and with it a stall of up to a minute.

With --profile, each phase also takes the apiserver's CPU profile and the run ends
with where the apiserver's CPU per job went, by kind of work (bench/apiprof.py). The
profiler's own cost is in that run's rates, which are therefore not figures of record.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import asyncpg
from rich.console import Console
from rich.table import Table

from bench import account, apiprof
from bench.cluster_check import bench as kueue_direct
from bench.cluster_check import steady_rate
from kestrel_sdk import AsyncClient, JobState
from kestrel_tools import cluster, kubework
from kestrel_tools.devstack import Stack, port_map
from kestrel_tools.procs import REPO, ServiceProcess

console = Console(stderr=True)
TOKEN = "kso_bench-jobs"
QUOTA = {"gpu-h100": 32, "gpu-a10": 32}


def watch_admitted(ns: str, seen: dict[str, float], stop: threading.Event) -> None:
    """Job name -> monotonic instant its Workload was first seen Admitted."""
    from kubernetes import client as k8s
    from kubernetes import watch

    custom: Any = k8s.CustomObjectsApi(cluster.api_client())
    w_mod: Any = watch

    def note(obj: dict[str, Any]) -> None:
        if kubework.condition_true(obj, "Admitted"):
            owner = next((o["name"] for o in obj["metadata"].get("ownerReferences", [])), None)
            if owner:
                seen.setdefault(owner, time.monotonic())

    while not stop.is_set():
        try:
            listing = custom.list_namespaced_custom_object(
                kubework.KUEUE_GROUP, kubework.KUEUE_API_VERSION, ns, "workloads")
            for obj in listing["items"]:
                note(obj)
            w = w_mod.Watch()
            for event in w.stream(custom.list_namespaced_custom_object, kubework.KUEUE_GROUP,
                                  kubework.KUEUE_API_VERSION, ns, "workloads",
                                  resource_version=listing["metadata"]["resourceVersion"],
                                  timeout_seconds=30):
                note(event["object"])
                if stop.is_set():
                    w.stop()
                    break
        except Exception:
            time.sleep(0.2)


async def plane_run(gateway: str, m: int,
                    workers: int) -> tuple[float, float, list[float], list[str]]:
    op = AsyncClient(gateway, operator_token=TOKEN)
    await op.create_tenant("bench", gpu_quota=QUOTA, rate_per_s=100_000, burst=100_000,
                           initial_credits="1000000")
    key = await op.create_api_key("bench", "bench")
    client = AsyncClient(gateway, api_key=key.secret)
    seen: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_admitted, args=("kestrel-bench", seen, stop),
                               daemon=True)
    watcher.start()
    sent: dict[str, float] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(m):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            t = time.monotonic()
            job = await client.submit_job(name=f"j{i}", gpus=1, max_duration_s=30,
                                          sim_duration_s=1,
                                          flavor="gpu-h100" if i % 2 else "gpu-a10")
            if job.state is not JobState.ADMITTED:
                raise RuntimeError(f"job {i} was {job.state.value}: {job.reason}")
            sent[job.job_id] = t

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workers)))
    console.print(f"  submitted {m} jobs through the gateway in {time.monotonic() - t0:.1f}s")
    deadline = time.monotonic() + max(300, m * 2)
    last = 0

    def ours() -> int:  # a namespace left by `--keep` holds Workloads of other runs
        return sum(1 for j in sent if j in seen)

    while ours() < m and time.monotonic() < deadline:
        if ours() - last >= 100:
            last = ours() // 100 * 100
            console.print(f"  {ours()}/{m} admitted by Kueue after {time.monotonic() - t0:.1f}s")
        await asyncio.sleep(0.25)
    stop.set()
    if ours() < m:
        raise TimeoutError(f"only {ours()}/{m} admitted")
    rate = m / (max(seen[j] for j in sent) - t0)
    steady = steady_rate(sorted(seen[j] for j in sent))
    latencies = sorted((seen[j] - t) * 1000 for j, t in sent.items() if j in seen)
    await client.close()
    await op.close()
    return rate, steady, latencies, list(sent)


async def gate_run(gateway: str) -> float:
    op = AsyncClient(gateway, operator_token=TOKEN)
    await op.create_tenant("gate", gpu_quota={"gpu-h100": 8}, rate_per_s=100_000,
                           burst=100_000, initial_credits="100")
    key = await op.create_api_key("gate", "bench")
    client = AsyncClient(gateway, api_key=key.secret)
    closed_at: float | None = None
    refused_at: float | None = None

    async def submit_forever() -> None:
        nonlocal refused_at
        i = 0
        while refused_at is None:
            sent = time.monotonic()
            job = await client.submit_job(name=f"g{i}", gpus=1, max_duration_s=10,
                                          flavor="gpu-h100", sim_duration_s=1)
            if job.state in (JobState.HELD, JobState.REJECTED) and closed_at is not None \
                    and sent >= closed_at:
                refused_at = time.monotonic()
            i += 1
            await asyncio.sleep(0.01)

    submitter = asyncio.create_task(submit_forever())
    await asyncio.sleep(0.5)
    runway = await client.runway()
    await op.adjust_credits("gate", -runway.credits, note="bench: budget withdrawn")
    closed_at = time.monotonic()
    await asyncio.wait_for(submitter, 30)
    await client.close()
    await op.close()
    assert refused_at is not None
    return (refused_at - closed_at) * 1000


@dataclass(frozen=True)
class Bill:
    cpu: dict[str, float]  # CPU-seconds per component
    api: dict[str, float]  # apiserver writes and watch events


def snapshot() -> Bill:
    metrics = cluster.kubectl("get", "--raw", "/metrics", check=False).stdout
    return Bill(account.take_cpu(), account.parse_api(metrics))


def events_in(ns: str) -> Counter[tuple[str, str, str]]:
    """The Events Kubernetes wrote in a namespace, by who wrote them, the kind of object
    and the reason; an Event repeated (its count) counts each time. Their number moves
    from run to run (3.4 to 18.5 writes per job in the plane's runs of 2026-12-04), and a run
    whose `apiserver writes events` stands out is read by this."""
    out = cluster.kubectl("get", "events", "-n", ns, "-o", "json", check=False).stdout
    return count_events(json.loads(out or "{}").get("items") or [])


def count_events(items: list[dict[str, Any]]) -> Counter[tuple[str, str, str]]:
    """core/v1 Events by (writer, kind of object, reason), each as many times as it
    happened: `count` for one a recorder aggregated, else once. The writer is
    reportingComponent, or source.component where a recorder filled only that."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for e in items:
        who = e.get("reportingComponent") or (e.get("source") or {}).get("component") or "?"
        kind = (e.get("involvedObject") or {}).get("kind") or "?"
        counts[(who, kind, e.get("reason") or "?")] += int(e.get("count") or 1)
    return counts


def events_table(counts: Counter[tuple[str, str, str]], m: int, top: int = 12) -> Table:
    all_per_job = sum(counts.values()) / m
    t = Table(title=f"Events in the plane's namespace, per job (all {all_per_job:.2f})")
    for col in ("written by", "about", "reason", "per job"):
        t.add_column(col, justify="right" if col == "per job" else "left")
    for (who, kind, reason), n in counts.most_common(top):
        t.add_row(who, kind, reason, f"{n / m:.2f}")
    return t


API_ROWS = ("writes workloads", "writes jobs", "writes pods", "writes events",
            "reads all", "reads workloads", "reads jobs", "reads pods",
            "watch events workloads", "watch events jobs", "watch events pods")
KB_ROWS = ("watch bytes workloads", "watch bytes pods")


def bill_table(bills: dict[str, Bill], rates: dict[str, float], m: int) -> Table:
    """Per admitted job, per run: CPU-ms by component, apiserver traffic, and how many
    cores that kept busy (admitted/s x CPU-s per job: 2.0 means CPU-bound)."""
    runs = list(bills)
    names = sorted({n for b in bills.values() for n in b.cpu},
                   key=lambda n: -max(b.cpu.get(n, 0.0) for b in bills.values()))
    t = Table(title="per admitted job, from the first submit to the last admitted")
    t.add_column("")
    for r in runs:
        t.add_column(r, justify="right")
    for n in names:
        t.add_row(f"CPU-ms {n}", *(f"{bills[r].cpu.get(n, 0.0) * 1000 / m:.1f}" for r in runs))
    total = {r: sum(bills[r].cpu.values()) / m for r in runs}
    t.add_row("CPU-ms total", *(f"{total[r] * 1000:.1f}" for r in runs), end_section=True)
    t.add_row("cores busy (admitted/s x CPU-s per job)",
              *(f"{rates.get(r, 0.0) * total[r]:.2f}" for r in runs))
    base = total[runs[0]]
    t.add_row("first run's CPU per job / this run's (the ratio if CPU-bound)",
              *(f"{base / total[r]:.2f}" if total[r] else "-" for r in runs), end_section=True)
    for n in API_ROWS:
        t.add_row(f"apiserver {n}", *(f"{bills[r].api.get(n, 0.0) / m:.2f}" for r in runs))
    for n in KB_ROWS:
        t.add_row(f"apiserver {n.replace('bytes', 'KB')}",
                  *(f"{bills[r].api.get(n, 0.0) / 1024 / m:.1f}" for r in runs))
    return t


async def run(m: int, workers: int, keep: bool, profile: bool = False) -> int:
    was_up = await asyncio.to_thread(cluster.is_up)
    info = await asyncio.to_thread(cluster.ensure_cluster,
                                   lambda s: console.print(f"  [dim]cluster[/dim] {s}"))
    api = cluster.api_client()
    console.print(f"[bold]bench-jobs[/bold]: {m} jobs, 1 GPU, 1 s each; quota "
                  f"{sum(QUOTA.values())} GPUs")
    console.print("(1) straight to Kueue")
    bills: dict[str, Bill] = {}

    prof_dir = REPO / ".run" / "bench-jobs-profiles"
    captures: dict[str, apiprof.Capture] = {}
    if profile:
        shutil.rmtree(prof_dir, ignore_errors=True)
        prof_dir.mkdir(parents=True)

    def profiling(run: str) -> apiprof.Capture | None:
        if not profile:
            return None
        cap = captures[run] = apiprof.Capture(cluster.api_client(),
                                              prof_dir / f"{run.replace(' ', '-')}.pprof")
        cap.start()
        return cap

    async def profiled(cap: apiprof.Capture | None) -> None:
        if cap is not None:  # one begun runs to its end, a little past the phase
            cap.cancel()
            await asyncio.to_thread(cap.join)

    async def fresh_kueue(run: str) -> None:
        """A new Kueue manager, and a quiet machine, before phase `run`."""
        t0 = time.monotonic()
        await asyncio.to_thread(cluster.restart_kueue, lambda s: None)
        waited, left = await account.settle()
        console.print(f"    [dim]before {run}: Kueue restarted in "
                      f"{time.monotonic() - t0 - waited:.1f} s, then settled {waited:.1f} s "
                      f"({left:.2f} cores busy)[/dim]")

    def bill(run: str, before: Bill) -> None:
        after = snapshot()
        bills[run] = Bill(account.spent(before.cpu, after.cpu),
                          account.spent(before.api, after.api))

    async def straight_to_kueue(run: str, noop_check: bool) -> dict[str, float]:
        """The M jobs created straight in Kueue (behind the no-op check if asked),
        billed as `run`."""
        await fresh_kueue(run)
        before = snapshot()
        cap = profiling(run)
        try:
            result = await asyncio.to_thread(kueue_direct, api, m, 1, 8, sum(QUOTA.values()),
                                             noop_check, functools.partial(bill, run, before))
        finally:
            await profiled(cap)
        console.print(f"    {result['rate']:.1f} admitted/s")
        return result

    direct = await straight_to_kueue("direct", False)
    console.print("(1b) straight to Kueue, behind an admission check that says Ready at once")
    noop = await straight_to_kueue("no-op before", True)

    root = REPO / ".run" / "bench-jobs"
    shutil.rmtree(root, ignore_errors=True)
    stack = Stack(root, durable=True)
    await asyncio.to_thread(stack.up)
    ports = port_map("meter", "gateway", "admission", "placer", "replicas")
    env = {**stack.env(), "KESTREL_OPERATOR_TOKEN": TOKEN, "KESTREL_LOG_LEVEL": "WARNING",
           "KESTREL_KUBECONFIG": str(info.kubeconfig),
           **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in ports.items()},
           **{f"KESTREL_{n.upper()}_ADDR": f"127.0.0.1:{p}" for n, p in ports.items()},
           **{f"KESTREL_{n.upper()}_METRICS_PORT": "0" for n in ports}}
    procs = [ServiceProcess(n, env, f"127.0.0.1:{ports[n]}", root / f"{n}.log")
             for n in ("meter", "gateway", "admission", "placer")]
    gw = f"127.0.0.1:{ports['gateway']}"
    try:
        for p in procs:
            await asyncio.to_thread(p.start)
        console.print("(2) through the plane: gateway -> admission -> placer -> Kueue")
        await fresh_kueue("plane")
        before = snapshot()
        cap = profiling("plane")
        try:
            plane_rate, plane_steady, lat, job_ids = await plane_run(gw, m, workers)
            bill("plane", before)
        finally:
            await profiled(cap)
        console.print(f"    {plane_rate:.1f} admitted/s")
        console.print("(3) the gate: budget withdrawn while the tenant submits")
        gate_ms = await gate_run(gw)
        console.print(f"    refused {gate_ms:.1f} ms after the adjustment committed")

        console.print("(4) the ledger against Kubernetes (waiting for every job to end)")
        db = await asyncpg.connect(stack.postgres_dsn)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            open_n = await db.fetchval(
                "SELECT count(*) FROM jobs WHERE tenant = 'bench' AND state NOT IN (5, 6, 7, 8, 9)")
            closed = await db.fetchval("SELECT count(*) FROM allocations WHERE tenant = 'bench' "
                                       "AND status = 2")
            if open_n == 0 and closed >= m:
                break
            await asyncio.sleep(1)
        ledger = {r["workload_id"]: Decimal(int(r["g"])) / 1_000_000 for r in await db.fetch(
            "SELECT workload_id, sum(gpu_us) g FROM ledger WHERE tenant = 'bench' "
            "GROUP BY workload_id")}
        await db.close()
        k8s = await asyncio.to_thread(kubework.gpu_seconds_by_job, ["kestrel-bench"])
        plane_events = await asyncio.to_thread(events_in, "kestrel-bench")
        # The contract: metered from Kueue's Admitted to Finished, never past the bound
        # (1 GPU x max_duration 30 s). Kubernetes stopping a job late is reported, not billed.
        exact = len(k8s) >= m and all(
            ledger.get(j) == min(k8s[j], Decimal(30)) for j in job_ids if j in k8s)
        overrun = sum((max(Decimal(0), g - 30) for g in ledger.values()), Decimal(0))
        k8s_late = sum((max(Decimal(0), g - 30) for g in k8s.values()), Decimal(0))

        # The no-op check once more, now on the far side of the plane. One phase's rate
        # moves about 15 % from run to run on this machine, either way (no-op runs of
        # one bench-jobs: 8.7 before the plane and 7.4 after; in another 7.7 and 9.7), and
        # a cluster left up can slow as runs pile up. Set against the mean of one run
        # on each side, the plane meets a steadier yardstick than one run before it.
        for p in procs:
            p.stop()
        if not keep:  # the plane's Jobs are gone before it starts, as the first one's were
            await asyncio.to_thread(stack.destroy)
            await asyncio.to_thread(kubework.delete_tenant_queues, api,
                                    ["kestrel-bench", "kestrel-gate"], 600)
        console.print("(5) the no-op check again, after the plane (one on each side)")
        noop_after = await straight_to_kueue("no-op after", True)
    finally:
        for p in procs:
            p.stop()
        if not keep:
            for tenant in ("bench", "gate"):
                await asyncio.to_thread(cluster.kubectl, "delete", "namespace",
                                        f"kestrel-{tenant}", "--wait=false",
                                        "--ignore-not-found", check=False)
                await asyncio.to_thread(cluster.kubectl, "delete", "clusterqueue",
                                        f"kestrel-{tenant}", "--ignore-not-found", check=False)
            await asyncio.to_thread(stack.destroy)
            if not was_up:
                await asyncio.to_thread(cluster.down, lambda s: None)

    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    ratio = plane_rate / direct["rate"]
    # The no-op check's rate: the mean of the runs before and after the plane.
    check_rate = (noop["rate"] + noop_after["rate"]) / 2
    check_steady = (noop["steady_rate"] + noop_after["steady_rate"]) / 2
    ratio_vs_check = plane_rate / check_rate
    kestrel_ms = account.kestrel_share(bills["plane"].cpu) * 1000 / m
    t = Table(title="bench-jobs (2 cores; GPU nodes simulated by KWOK, Kueue real)")
    for col in ("figure", "value", "target"):
        t.add_column(col)
    def steady(x: float) -> str:
        return f"{x:.1f} ({x / direct['steady_rate']:.2f})"

    t.add_row("Kueue direct admitted/s", f"{direct['rate']:.1f}", "baseline")
    t.add_row("Kueue + a no-op admission check admitted/s: before the plane / after / mean",
              f"{noop['rate']:.1f} / {noop_after['rate']:.1f} / {check_rate:.1f} "
              f"({check_rate / direct['rate']:.2f})", "what any check costs")
    t.add_row("through the plane admitted/s", f"{plane_rate:.1f}", "")
    t.add_row("steady (20%-90%): direct / no-op check (mean) / plane",
              f"{direct['steady_rate']:.1f} / {steady(check_steady)} / "
              f"{steady(plane_steady)}", "after the start-up burst")
    t.add_row("ratio (plane / Kueue direct)", f"{ratio:.2f}", "")
    t.add_row("ratio vs the no-op check (plane / their mean)", f"{ratio_vs_check:.2f}",
              ">= 0.9")
    t.add_row("  against the one before the plane / the one after",
              f"{plane_rate / noop['rate']:.2f} / {plane_rate / noop_after['rate']:.2f}", "")
    t.add_row("Kestrel CPU-ms per job (services + Postgres, NATS, Redis)",
              f"{kestrel_ms:.1f}", "<= 25")
    t.add_row("submit -> Kueue Admitted p99", f"{p99:.0f} ms", "")
    t.add_row("gate close", f"{gate_ms:.1f} ms", "<= 1000 ms")
    t.add_row("overrun GPU-s / ledger exact", f"{overrun} / {exact}", "0 / true")
    t.add_row("Kubernetes past the bound (not billed)", f"{k8s_late} GPU-s", "")
    Console().print(t)
    rates = {"direct": direct["rate"], "no-op before": noop["rate"], "plane": plane_rate,
             "no-op after": noop_after["rate"]}
    Console().print(bill_table(bills, rates, m))
    Console().print(events_table(plane_events, m))
    if profile:
        go = apiprof.go_binary()
        summaries = {r: (apiprof.summarise(c.path, go) if c.error is None else c.error)
                     for r, c in captures.items()}
        Console().print(apiprof.table(summaries, {
            r: bills[r].cpu.get("kube-apiserver", 0.0) * 1000 / m for r in bills}))
        console.print(f"profiles in {prof_dir} (go tool pprof -http=: FILE); this run's "
                      "rates include the profiler's cost")
    print(f"jobs: n={m} plane_admit_per_s={plane_rate:.1f} "
          f"kueue_direct_admit_per_s={direct['rate']:.1f} "
          f"check_admit_per_s={check_rate:.1f} ratio={ratio:.2f} "
          f"ratio_vs_check={ratio_vs_check:.2f} kestrel_cpu_ms_per_job={kestrel_ms:.1f} "
          f"submit_to_admitted_p99_ms={p99:.0f} gate_close_ms={gate_ms:.1f} "
          f"overrun_gpu_s={overrun} ledger_exact={str(exact).lower()}")
    return 0 if exact and overrun == 0 else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also profile the apiserver in each phase (bench/apiprof.py)")
    args = ap.parse_args()
    sys.exit(asyncio.run(run(args.jobs, args.workers, args.keep, args.profile)))


if __name__ == "__main__":
    main()

"""make bench-infer: the Infer path against raw onnxruntime on this machine.

  (a) the limit: raw onnxruntime (the worker's own Embedder, in a replica's settings:
      one intra-op thread per core it holds, one on the CPU pool) on the same short
      texts at batch sizes 8..64; the best size's rate is the limit, measured in
      windows that alternate with the end-to-end ones (this machine's speed moves with
      what else runs on it);
  (b) end to end: gateway -> Redis -> one worker replica -> gateway, the replica a pod
      of the Kestrel image that Kueue admitted on the `cpu` flavor and the real kubelet
      (node kestrel-cpu-0) runs under its one-core limit; the whole plane (meter,
      gateway, admission, placer) on the real control plane. Concurrent SDK clients
      (kestrel_sdk.AsyncClient) send requests of 8 short texts back to back (saturation),
      then an open loop at half of that request rate: p50/p99, completed, failed; and
      a row for single-text requests.
  (c) the same through the OpenAI-compatible HTTP API (POST /v1/embeddings on the
      gateway's HTTP port, base64 vectors as the `openai` client asks for them by
      default), with httpx2 (the `openai` client's own transport), the same number of
      clients and connections: a saturation window in each round beside the gRPC one,
      then the open loop at the very rate gRPC's ran at. http_ratio is HTTP's
      saturation rate over gRPC's; http_p99_ms its half-rate p99 (target: at most 1.2x
      gRPC's).

Last line: infer: texts_per_request=8 raw_emb_per_s=.. e2e_emb_per_s=.. ratio=.. p50_ms=..
p99_ms=.. completed=.. failed=.. http_ratio=.. http_p99_ms=..
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import shutil
import sys
import time

import httpx2
from rich.console import Console
from rich.table import Table

import kestrel_sdk
from bench.texts import sentences
from kestrel.endpoints import units_of
from kestrel.workloads import CPU_FLAVOR
from kestrel_sdk import KestrelError
from kestrel_sdk.v1 import common_pb2
from kestrel_tools import cluster
from kestrel_tools.devstack import Stack, port_map
from kestrel_tools.procs import REPO, ServiceProcess
from services.worker.model import Embedder, load

console = Console(stderr=True)
TOKEN = "kso_bench-operator"
OP = (("authorization", f"Bearer {TOKEN}"),)
TEXTS_PER_REQUEST = 8
ROUNDS = 3


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def raw_rate_at(embedder: Embedder, size: int, seconds: float) -> float:
    """Embeddings/s of the worker's Embedder (its own settings) at one batch size."""
    embedder.embed(sentences(size))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        embedder.embed(sentences(size, n))
        n += size
    return n / (time.perf_counter() - t0)


NAMES = ("meter", "gateway", "admission", "placer")


async def run(clients: int, seconds: float, keep: bool) -> int:
    # A CPU replica holds one core and runs the worker with one intra-op thread per core
    # (services/placer/manifests.py): the limit is measured in those settings.
    cores = units_of(common_pb2.EndpointSpec(flavor=CPU_FLAVOR))
    console.print(f"[bold]bench-infer[/bold]: (a) raw onnxruntime, {cores} intra-op "
                  f"thread(s), as a {cores}-core CPU replica runs it")
    embedder = load(intra_op_threads=cores)
    rates: dict[int, float] = {}
    for size in (8, 16, 32, 64):
        rates[size] = await asyncio.to_thread(raw_rate_at, embedder, size, 3.0)
        console.print(f"    batch {size:>2}: {rates[size]:,.0f} embeddings/s")
    best = max(rates, key=lambda k: rates[k])
    raw_runs: list[float] = []
    e2e_runs: list[float] = []

    was_up = await asyncio.to_thread(cluster.is_up)
    info = await asyncio.to_thread(cluster.ensure_cluster,
                                   lambda m: console.print(f"  [dim]cluster[/dim] {m}"))
    root = REPO / ".run" / "bench-infer"
    shutil.rmtree(root, ignore_errors=True)
    stack = Stack(root, durable=True)
    console.print(f"(b) end to end: devstack in {root}, the plane on the real cluster")
    await asyncio.to_thread(stack.up)
    ports = port_map(*NAMES, "http", "replicas")
    http_port = ports.pop("http")
    env = {**stack.env(), "KESTREL_OPERATOR_TOKEN": TOKEN, "KESTREL_LOG_LEVEL": "WARNING",
           "KESTREL_KUBECONFIG": str(info.kubeconfig),
           "KESTREL_PRICES": "gpu-h100=0.01,gpu-a10=0.001,cpu=0.0005",
           **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in ports.items()},
           **{f"KESTREL_{n.upper()}_ADDR": f"127.0.0.1:{p}" for n, p in ports.items()},
           **{f"KESTREL_{n.upper()}_METRICS_PORT": "0" for n in ports},
           "KESTREL_GATEWAY_HTTP_PORT": str(http_port)}
    procs = [ServiceProcess(n, env, f"127.0.0.1:{ports[n]}", root / f"{n}.log")
             for n in NAMES]
    sat_lat: list[float] = []
    lat: list[float] = []
    single: dict[str, float] = {}
    failed = completed = 0
    e2e_rate = 0.0
    http_runs: list[float] = []
    http_sat: list[float] = []
    http_lat: list[float] = []
    http_failed = http_completed = 0
    http_rate = 0.0
    node = ""
    try:
        for p in procs:
            await asyncio.to_thread(p.start)
        gw = f"127.0.0.1:{ports['gateway']}"
        async with kestrel_sdk.AsyncClient(gw, operator_token=TOKEN) as op:
            await op.create_tenant("bench", gpu_quota={}, rate_per_s=100_000, burst=100_000,
                                   initial_credits="100")
            key = (await op.create_api_key("bench", "bench")).secret
        async with kestrel_sdk.AsyncClient(gw, api_key=key) as c:
            t0 = time.monotonic()
            ep = await c.create_endpoint("bench", min_replicas=1, max_replicas=1,
                                         flavor=CPU_FLAVOR, horizon_s=600)
            endpoint = ep.endpoint_id
            while (await c.get_endpoint(endpoint)).ready_replicas < 1:
                if time.monotonic() - t0 > 240:
                    raise TimeoutError("bench-infer: no ready replica after 240 s")
                await asyncio.sleep(0.2)
        node = await asyncio.to_thread(pod_node, endpoint)
        console.print(f"    replica ready in {time.monotonic() - t0:.1f} s: a pod on {node}")

        sdk = [kestrel_sdk.AsyncClient(gw, api_key=key) for _ in range(4)]
        counter = 0
        parts: list[tuple[float, float]] = []  # (queue_ms, batch model ms) per reply

        async def call(i: int, size: int = TEXTS_PER_REQUEST) -> float:
            nonlocal counter
            counter += 1
            texts = sentences(size, counter * TEXTS_PER_REQUEST)
            t = time.perf_counter()
            r = await sdk[i % 4].infer(endpoint, texts, timeout_s=10)
            assert len(r.embeddings) == size
            parts.append((r.queue_ms, r.latency_ms))
            return (time.perf_counter() - t) * 1000

        http = [httpx2.AsyncClient(base_url=f"http://127.0.0.1:{http_port}/v1", timeout=15,
                                   headers={"Authorization": f"Bearer {key}"})
                for _ in range(4)]

        async def hcall(i: int, size: int = TEXTS_PER_REQUEST) -> float:
            """One POST /v1/embeddings, its base64 vectors decoded as the openai client
            does."""
            nonlocal counter
            counter += 1
            texts = sentences(size, counter * TEXTS_PER_REQUEST)
            t = time.perf_counter()
            r = await http[i % 4].post("/embeddings", json={
                "model": "bench", "input": texts, "encoding_format": "base64"})
            if r.status_code != 200:
                raise HttpFailed(f"HTTP {r.status_code}: {r.text[:200]}")
            data = r.json()["data"]
            vectors = [array.array("f", base64.b64decode(d["embedding"])) for d in data]
            assert len(vectors) == size and len(vectors[0]) == 384
            return (time.perf_counter() - t) * 1000

        async def closed(secs: float, size: int = TEXTS_PER_REQUEST,
                         into: list[float] = sat_lat, over_http: bool = False
                         ) -> tuple[int, int, float]:
            ok = err = 0
            end = time.perf_counter() + secs
            one_call = hcall if over_http else call

            async def client(i: int) -> None:
                nonlocal ok, err
                while time.perf_counter() < end:
                    try:
                        into.append(await one_call(i, size))
                        ok += 1
                    except (KestrelError, HttpFailed, httpx2.HTTPError) as exc:
                        err += 1
                        if err <= 3:
                            console.print(f"  error: {exc}")

            t0 = time.perf_counter()
            await asyncio.gather(*(client(i) for i in range(clients)))
            return ok, err, time.perf_counter() - t0

        # This machine's speed moves with whatever else runs on it: raw and end-to-end
        # windows alternate, so each pair sees the same weather; the ratio is of the sums.
        console.print(f"    saturation: {clients} SDK clients x {TEXTS_PER_REQUEST} texts, "
                      f"{ROUNDS} rounds of raw batch {best} then end to end, "
                      f"{seconds / ROUNDS:.0f}s each")
        await closed(2)  # warm-up
        await closed(2, over_http=True, into=http_sat)
        sat_lat.clear()
        http_sat.clear()
        for k in range(ROUNDS):
            raw_runs.append(await asyncio.to_thread(raw_rate_at, embedder, best,
                                                    seconds / ROUNDS))
            ok, err, took = await closed(seconds / ROUNDS)
            failed += err
            e2e_runs.append(ok * TEXTS_PER_REQUEST / took)
            hok, herr, htook = await closed(seconds / ROUNDS, over_http=True, into=http_sat)
            http_failed += herr
            http_runs.append(hok * TEXTS_PER_REQUEST / htook)
            console.print(f"    round {k + 1}: raw {raw_runs[-1]:,.0f} emb/s, end to end "
                          f"{e2e_runs[-1]:,.0f} emb/s ({ok / took:,.1f} requests/s), "
                          f"{err} errors; HTTP {http_runs[-1]:,.0f} emb/s, {herr} errors")
        e2e_rate = sum(e2e_runs) / ROUNDS
        http_rate = sum(http_runs) / ROUNDS
        rate = e2e_rate / TEXTS_PER_REQUEST / 2
        console.print(f"    open loop at half: {rate:.1f} requests/s for {seconds:.0f}s")
        await asyncio.sleep(1)

        async def one(n: int) -> None:
            nonlocal failed, completed
            try:
                lat.append(await call(n))
                completed += 1
            except KestrelError as exc:
                failed += 1
                if failed <= 3:
                    console.print(f"  error: {exc}")

        tasks = []
        parts.clear()
        t0 = time.perf_counter()
        n = 0
        while n < rate * seconds:
            delay = t0 + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(n)))
            n += 1
        await asyncio.gather(*tasks)

        async def hone(n: int) -> None:
            nonlocal http_failed, http_completed
            try:
                http_lat.append(await hcall(n))
                http_completed += 1
            except (HttpFailed, httpx2.HTTPError) as exc:
                http_failed += 1
                if http_failed <= 3:
                    console.print(f"  HTTP error: {exc}")

        console.print(f"    open loop over HTTP at the same {rate:.1f} requests/s")
        await asyncio.sleep(1)
        htasks = []
        t0 = time.perf_counter()
        n = 0
        while n < rate * seconds:
            delay = t0 + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            htasks.append(asyncio.create_task(hone(n)))
            n += 1
        await asyncio.gather(*htasks)
        queue_p50 = pct([q for q, _ in parts], 0.5)
        model_p50 = pct([m for _, m in parts], 0.5)
        console.print(f"    p50 {pct(lat, 0.5):.1f} ms = queue {queue_p50:.1f} + batch "
                      f"{model_p50:.1f} + the rest; p99 {pct(lat, 0.99):.1f} ms")

        one_lat: list[float] = []
        console.print(f"    single-text requests: {clients} SDK clients, "
                      f"{seconds / ROUNDS:.0f}s")
        ok, err, took = await closed(seconds / ROUNDS, 1, one_lat)
        failed += err
        single = {"emb_per_s": ok / took, "p50": pct(one_lat, 0.5), "p99": pct(one_lat, 0.99)}
        for c in sdk:
            await c.close()
        for h in http:
            await h.aclose()
    finally:
        for p in reversed(procs):
            p.stop()
        if not keep:
            await asyncio.to_thread(cluster.kubectl, "delete", "namespace", "kestrel-bench",
                                    "--wait=false", "--ignore-not-found", check=False)
            await asyncio.to_thread(cluster.kubectl, "delete", "clusterqueue",
                                    "kestrel-bench", "--ignore-not-found", check=False)
            await asyncio.to_thread(stack.destroy)
            if not was_up:
                await asyncio.to_thread(cluster.down, lambda m: None)

    raw_rate = sum(raw_runs) / len(raw_runs) if raw_runs else 0.0
    ratio = e2e_rate / raw_rate if raw_rate else 0.0
    p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
    http_ratio = http_rate / e2e_rate if e2e_rate else 0.0
    http_p50, http_p99 = pct(http_lat, 0.5), pct(http_lat, 0.99)
    table = Table(title=f"bench-infer (2 cores; clients, gateway, Redis on the host, one "
                        f"{cores}-core replica pod on {node or 'the real kubelet'})")
    for col in ("figure", "value", "target"):
        table.add_column(col)
    for size, r in rates.items():
        table.add_row(f"raw onnxruntime, batch {size} (sweep)", f"{r:,.0f} emb/s",
                      "the best" if size == best else "")
    table.add_row(f"raw onnxruntime, batch {best}, {ROUNDS} rounds", " / ".join(
        f"{r:,.0f}" for r in raw_runs) + " emb/s", "the limit (mean)")
    table.add_row("end to end, the same rounds", " / ".join(
        f"{r:,.0f}" for r in e2e_runs) + " emb/s", "")
    table.add_row(f"end to end, {clients} SDK clients, {TEXTS_PER_REQUEST} texts/request",
                  f"{e2e_rate:,.0f} emb/s", "")
    table.add_row("ratio", f"{ratio:.2f}", ">= 0.7")
    table.add_row("saturation p50 / p99", f"{pct(sat_lat, 0.5):.0f} / "
                  f"{pct(sat_lat, 0.99):.0f} ms", "")
    table.add_row("half-rate p50 / p99", f"{p50:.1f} / {p99:.1f} ms", "p99 <= 250 ms")
    if single:
        table.add_row(f"single-text requests, {clients} SDK clients",
                      f"{single['emb_per_s']:,.0f} emb/s; p50 / p99 {single['p50']:.0f} / "
                      f"{single['p99']:.0f} ms", "")
    table.add_row("HTTP /v1/embeddings, the same rounds", " / ".join(
        f"{r:,.0f}" for r in http_runs) + " emb/s", "")
    table.add_row("HTTP / gRPC saturation rate (http_ratio)", f"{http_ratio:.2f}", ">= 0.9")
    table.add_row("HTTP saturation p50 / p99", f"{pct(http_sat, 0.5):.0f} / "
                  f"{pct(http_sat, 0.99):.0f} ms", "")
    table.add_row("HTTP half-rate p50 / p99", f"{http_p50:.1f} / {http_p99:.1f} ms",
                  f"p99 <= {1.2 * p99:.1f} ms (1.2 x gRPC's)")
    table.add_row("completed / failed", f"{completed} / {failed}", "failed = 0")
    table.add_row("HTTP completed / failed", f"{http_completed} / {http_failed}",
                  "failed = 0")
    Console(width=120).print(table)
    print(f"infer: texts_per_request={TEXTS_PER_REQUEST} raw_emb_per_s={raw_rate:.0f} "
          f"e2e_emb_per_s={e2e_rate:.0f} ratio={ratio:.2f} p50_ms={p50:.1f} "
          f"p99_ms={p99:.1f} completed={completed} failed={failed} "
          f"http_ratio={http_ratio:.2f} http_p99_ms={http_p99:.1f}")
    return 0 if failed == 0 and http_failed == 0 else 1


class HttpFailed(Exception):
    """POST /v1/embeddings answered other than 200."""


def pod_node(endpoint_id: str) -> str:
    """The node the endpoint's replica pod runs on (kubectl get pods -o wide)."""
    out = cluster.kubectl("get", "pods", "-n", "kestrel-bench", "-l",
                          f"kestrel.dev/endpoint={endpoint_id}", "-o",
                          "jsonpath={.items[*].spec.nodeName}", check=True).stdout
    return str(out).strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    sys.exit(asyncio.run(run(args.clients, args.seconds, args.keep)))


if __name__ == "__main__":
    main()

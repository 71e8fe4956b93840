"""A throwaway Kestrel plane for the console's browser tests (and for trying the console).

    .venv/bin/python console/scripts/fixture_plane.py [--tick-s 1]

Starts, the way the project's tests do (tests/conftest.py: a devstack of its own in a
temp directory, free ports, real processes), Postgres, NATS JetStream, Redis, the meter,
gateway and admission, with a random operator token. Then, through the public API only:

- acme:  100 credits; one job admitted, then run 10 s on gpu-h100 (its workload events are
         published as the placer would from Kubernetes): finished, ledger rows, no burn.
- tiny:  1 credit; a 1 GPU x 100 s job reserves all of it, a second job is HELD.
- live:  50 credits; a job admitted and left running: an open allocation the meter cuts
         into rows every tick, so the runway falls while you watch.
- acme also has an endpoint `embed` on gpu-a10 (0..3 replicas, no load): the autoscaler
  (no Kubernetes lease: the only one) decides it stays at zero; with no placer none runs
  (nor would one be simulated: without a cluster replicas are host processes).

Prints one JSON line (addresses, token, tenants, job ids), then runs until SIGTERM,
SIGINT or end of stdin, and tears everything down. No Kubernetes, no placer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from kestrel import bus  # noqa: E402
from kestrel_sdk.v1 import common_pb2, events_pb2, gateway_pb2, gateway_pb2_grpc  # noqa: E402
from kestrel_tools.devstack import Stack, port_map  # noqa: E402
from kestrel_tools.procs import ServiceProcess  # noqa: E402

PRICES = "gpu-h100=0.01,gpu-a10=0.001"
ADMITTED, FINISHED = 1, 3


def now_us() -> int:
    return time.time_ns() // 1000


async def seed(gateway: str, nats_url: str, token: str) -> dict[str, object]:
    op = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(gateway) as ch:
        gw = gateway_pb2_grpc.GatewayStub(ch)

        async def tenant(name: str, credits: str) -> tuple[tuple[str, str], ...]:
            await gw.CreateTenant(gateway_pb2.CreateTenantRequest(
                tenant=gateway_pb2.Tenant(
                    tenant=name, gpu_quota={"gpu-h100": 8, "gpu-a10": 8},
                    rate_limit=gateway_pb2.RateLimit(per_s=1000, burst=1000)),
                initial_credits=credits), metadata=op)
            key = await gw.CreateApiKey(
                gateway_pb2.CreateApiKeyRequest(tenant=name, name="console-test"), metadata=op)
            return (("authorization", f"Bearer {key.secret}"),)

        async def submit(key: tuple[tuple[str, str], ...], name: str,
                         seconds: int) -> common_pb2.Job:
            resp = await gw.SubmitJob(gateway_pb2.SubmitJobRequest(spec=common_pb2.JobSpec(
                name=name, gpus=1, max_duration_s=seconds, flavor="gpu-h100")), metadata=key)
            job: common_pb2.Job = resp.job
            return job

        acme, tiny = await tenant("acme", "100"), await tenant("tiny", "1")
        live = await tenant("live", "50")
        trained = await submit(acme, "train", 100)
        first = await submit(tiny, "fits", 100)
        held = await submit(tiny, "waits", 50)
        assert held.state == common_pb2.JOB_STATE_HELD, held
        running = await submit(live, "serve", 3600)
        # No placer here: the endpoint is recorded with no replica (none is started).
        endpoint = (await gw.CreateEndpoint(gateway_pb2.CreateEndpointRequest(
            spec=common_pb2.EndpointSpec(name="embed", flavor="gpu-a10", min_replicas=0,
                                         max_replicas=3)), metadata=acme)).endpoint

    nc = await bus.connect(nats_url, "console-seed")
    js = nc.jetstream()
    t0, nonce = now_us(), uuid.uuid4().hex[:8]

    async def event(tenant: str, job: common_pb2.Job, typ: int, at: int) -> None:
        e = events_pb2.WorkloadEvent(event_id=f"{job.job_id}-{typ}", tenant=tenant,
                                     workload_id=job.job_id, kind=common_pb2.WORKLOAD_KIND_JOB,
                                     type=typ, time_us=at, flavor="gpu-h100", gpus=1)  # type: ignore[arg-type]
        await bus.publish(js, bus.subject_workload(tenant, typ), e, f"{e.event_id}~{nonce}")

    await event("acme", trained, ADMITTED, t0 - 20_000_000)
    await event("acme", trained, FINISHED, t0 - 10_000_000)
    await event("live", running, ADMITTED, t0)
    await nc.drain()
    return {"tenants": ["acme", "tiny", "live"],
            "jobs": {"acme": trained.job_id, "tiny_admitted": first.job_id,
                     "tiny_held": held.job_id, "live": running.job_id},
            "held_reason": held.reason, "endpoint": endpoint.endpoint_id}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tick-s", default="1", help="the meter's tick (KESTREL_METER_TICK_S)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kestrel-console-", dir="/tmp"))
    stack = Stack(root / "stack", durable=False)
    procs: list[ServiceProcess] = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        stack.up()
        ports = port_map("meter", "gateway", "admission", "autoscaler", "replicas")
        addr = {n: f"127.0.0.1:{p}" for n, p in ports.items()}
        token = f"kso_{secrets.token_hex(16)}"
        env = {**stack.service_dsns(), **stack.service_nats_urls(),
               "KESTREL_REDIS_URL": stack.redis_url,
               "KESTREL_OPERATOR_TOKEN": token,
               "KESTREL_METER_ADDR": addr["meter"], "KESTREL_ADMISSION_ADDR": addr["admission"],
               **{f"KESTREL_{n.upper()}_PORT": str(p) for n, p in ports.items()},
               **{f"KESTREL_{n.upper()}_METRICS_PORT": "0" for n in ports},
               "KESTREL_PRICES": PRICES, "KESTREL_METER_TICK_S": args.tick_s,
               "KESTREL_METER_SETTLE_US": "0",
               # No Kubernetes here: no runway check, no placer (as tests/conftest.py's Plane).
               "KESTREL_RUNWAY_CHECK": "", "KESTREL_PLACER_ADDR": "",
               "KESTREL_GATEWAY_ADDR": addr["gateway"], "KESTREL_REPLICAS_ADDR": addr["replicas"],
               "KESTREL_KUBECONFIG": ""}
        for name in ("meter", "gateway", "admission", "autoscaler"):
            procs.append(ServiceProcess(name, env, addr[name], root / f"{name}.log").start())
        seeded = asyncio.run(seed(addr["gateway"], stack.nats_url, token))
        print(json.dumps({"KESTREL_GATEWAY_ADDR": addr["gateway"],
                          "KESTREL_METER_ADDR": addr["meter"],
                          "KESTREL_ADMISSION_ADDR": addr["admission"],
                          "KESTREL_AUTOSCALER_ADDR": addr["autoscaler"],
                          "KESTREL_OPERATOR_TOKEN": token, "logs": str(root), **seeded}),
                         flush=True)

        def until_stdin_closes() -> None:
            sys.stdin.read()
            stop.set()

        threading.Thread(target=until_stdin_closes, daemon=True).start()
        stop.wait()
    finally:
        for p in reversed(procs):
            p.stop()
        stack.destroy()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

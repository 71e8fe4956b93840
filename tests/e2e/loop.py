"""The plane on the real cluster, shared by the end-to-end tests: gateway, admission
(with its Kueue AdmissionCheck controller), placer and meter as real processes, and
the helpers that wait on it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from kestrel_sdk import AsyncClient, Job, JobState
from kestrel_tools import cluster as kc
from kestrel_tools import kubework as kw
from kestrel_tools.devstack import port_map
from kestrel_tools.procs import ServiceProcess

T = TypeVar("T")
NAMES = ("meter", "gateway", "admission", "placer")
# Per unit-second: a GPU of each flavor, and a core of the CPU pool (real kubelet).
PRICES = "gpu-h100=0.01,gpu-a10=0.001,cpu=0.0005"


def plane_env(cluster: kc.ClusterInfo, service_env: dict[str, str], token: str,
              metrics: bool = False) -> dict[str, str]:
    """The environment of the four services: loopback ports, the cluster, prices, and
    the Redis the model workers of CPU replicas reach over the node's host network."""
    ports = port_map(*NAMES, *(f"{n}-metrics" for n in NAMES), "replicas")
    return {**service_env, "KESTREL_OPERATOR_TOKEN": token,
            "KESTREL_KUBECONFIG": str(cluster.kubeconfig),
            "KESTREL_PRICES": PRICES, "KESTREL_METER_TICK_S": "0.2",
            "KESTREL_WORKER_REDIS_URL": service_env["KESTREL_REDIS_URL"],
            # The gateway's internal kestrel.v1.Replicas, the autoscaler's write path.
            "KESTREL_REPLICAS_PORT": str(ports["replicas"]),
            "KESTREL_REPLICAS_ADDR": f"127.0.0.1:{ports['replicas']}",
            **{f"KESTREL_{n.upper()}_PORT": str(ports[n]) for n in NAMES},
            **{f"KESTREL_{n.upper()}_ADDR": f"127.0.0.1:{ports[n]}" for n in NAMES},
            **{f"KESTREL_{n.upper()}_METRICS_PORT": str(ports[f"{n}-metrics"] if metrics else 0)
               for n in NAMES}}


@dataclass
class Loop:
    env: dict[str, str]
    tmp: Path
    dsn: str
    procs: dict[str, ServiceProcess] = field(default_factory=dict)  # the latest per name
    started: list[ServiceProcess] = field(default_factory=list)  # all, for stop_all
    tenants: list[str] = field(default_factory=list)
    starts: int = 0

    def start(self, name: str, port: int | None = None) -> ServiceProcess:
        """Start `name` on its port, or on `port` (a second replica beside the first)."""
        self.starts += 1
        env = self.env if port is None else {**self.env, f"KESTREL_{name.upper()}_PORT": str(port)}
        self.procs[name] = ServiceProcess(
            name, env, f"127.0.0.1:{env[f'KESTREL_{name.upper()}_PORT']}",
            self.tmp / f"{name}-{self.starts}.log").start()
        self.started.append(self.procs[name])
        return self.procs[name]

    def start_all(self) -> None:
        for n in NAMES:
            self.start(n)

    def stop_all(self) -> None:
        for p in reversed(self.started):
            p.stop()
        if not self.tenants:
            return
        queues = [f"kestrel-{t}" for t in self.tenants]
        kc.kubectl("delete", "namespace", *queues, "--wait=false", "--ignore-not-found",
                   check=False)
        # One call for every queue: kubectl waits for their finalizers (Kueue's, until
        # the namespaces' workloads are gone) side by side, not one tenant after another.
        kc.kubectl("delete", "clusterqueue", *queues, "--ignore-not-found", check=False)

    async def tenant(self, credits: str, quota: dict[str, int] | None = None) -> AsyncClient:
        name = f"e2e{uuid.uuid4().hex[:8]}"
        self.tenants.append(name)
        async with self.operator() as op:
            await op.create_tenant(name, gpu_quota=quota or {"gpu-h100": 8, "gpu-a10": 8},
                                   rate_per_s=100, burst=100, initial_credits=credits)
            key = await op.create_api_key(name, "e2e")
        return AsyncClient(self.env["KESTREL_GATEWAY_ADDR"], api_key=key.secret)

    def operator(self) -> AsyncClient:
        return AsyncClient(self.env["KESTREL_GATEWAY_ADDR"],
                           operator_token=self.env["KESTREL_OPERATOR_TOKEN"])


async def until(what: str, fn: Callable[[], Awaitable[T | None]], timeout_s: float = 120) -> T:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await fn()
        if value is not None:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def in_state(client: AsyncClient, job_id: str, *states: JobState) -> Callable[
        [], Awaitable[Job | None]]:
    async def check() -> Job | None:
        job = await client.get_job(job_id)
        return job if job.state in states else None
    return check


async def allocation(dsn: str, workload_id: str) -> tuple[int, int, int] | None:
    """(status, sum of ledger units in µs, end_us) of an allocation once the meter
    closed it (units: GPUs, or cores on the CPU pool)."""
    conn = await asyncpg.connect(dsn)
    try:
        r = await conn.fetchrow(
            "SELECT status, end_us, (SELECT coalesce(sum(gpu_us), 0) FROM ledger "
            "WHERE workload_id = $1) g FROM allocations WHERE workload_id = $1", workload_id)
    finally:
        await conn.close()
    if r is None or r["status"] != 2:
        return None
    return r["status"], int(r["g"]), int(r["end_us"])


def workload(tenant: str, job_id: str) -> dict[str, Any] | None:
    from kubernetes import client as k8s

    custom: Any = k8s.CustomObjectsApi(kc.api_client())
    for w in custom.list_namespaced_custom_object(kw.KUEUE_GROUP, kw.KUEUE_API_VERSION,
                                                  f"kestrel-{tenant}", "workloads")["items"]:
        if any(o.get("name") == job_id for o in w["metadata"].get("ownerReferences", [])):
            return dict(w)
    return None

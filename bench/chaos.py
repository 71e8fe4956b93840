"""make chaos: every component faulted in turn under steady load; nothing lost or doubled.

The plane runs on the real cluster with a devstack of its own (Postgres, NATS
JetStream with its file store, Redis): meter, gateway, admission, placer and the
autoscaler as processes. Tenants submit 1-GPU jobs (KWOK runs them for 2 s) at a
steady rate (3 tenants at 0.5 job/s each by default; at 1 job/s each this 2-core
machine falls behind as Jobs pile up in the cluster, see README) and read their
runway and jobs, every call with a 5 s deadline; a
submit that fails is retried with its idempotency key, as a careful client does.
Then, one at a time, each fault is injected and repaired the way a supervisor
would (a crashed process started again at once, a restarted one brought back up):

    kill -9 of gateway, admission, placer, meter, autoscaler
    restart of nats-server (JetStream file store), kill -9 of Postgres' postmaster,
    restart of Redis, kill -9 of kube-apiserver, kill -9 of the Kueue manager

Recovery is the time from the fault until a probe tenant's new job is admitted by
Kueue and running, the meter has opened its allocation and its runway answers
(the same probe on the healthy plane first gives the baseline). A service that dies
of something it did not suffer itself is restarted too and counted.

When every fault has passed, every job must finish; then, per fault (each job is
counted against the fault during which it was submitted): lost = a submit never
answered with a job, a job that never ended or whose ledger holds less than gpus x
Kubernetes' own Admitted -> Finished time; duplicated = a second Kestrel job for one
idempotency key, a Kubernetes Job Kestrel does not know, or a ledger holding more.
Every call must end in a success or a clear status (UNAVAILABLE, DEADLINE_EXCEEDED,
RESOURCE_EXHAUSTED, ABORTED) within its deadline: INTERNAL, UNKNOWN or a call
that outlives its deadline by a second counts against the fault.

The control plane runs two kube-apiservers sharing one address (--apiservers 2, the
default: an HA control plane, kestrel_tools.cluster.start_apiserver_replica), and the fault
kills one. With --apiservers 1 the kill is a whole control-plane outage: recovery is
then bounded by Kueue's client-go reflectors, which double their wait from 0.8 s with
each refused try (README, Reliability).

--ha (make chaos-ha) runs two replicas of every service (the gateway, admission and
the meter side by side, clients and callers balancing over them; of the placer, the
autoscaler and admission's runway check the Lease holder acts), NATS as three
JetStream nodes with every stream at three replicas, and two kube-apiservers; the
faults are kill -9 of one replica of each service (the Lease holder where there is
one), of the NATS node leading KESTREL_WORKLOADS and of one kube-apiserver, and the
supervisor starts the killed one again meanwhile: recovery is what the survivors give.
Postgres is a primary and a synchronous standby under Patroni (pg_nodes=2,
kestrel_tools.pgpair): the postgres fault is kill -9 of the primary's postmaster,
Patroni promotes the standby and brings the old primary back as its standby.
Last line: ha: replicas=<n> nats_nodes=<n> pg_nodes=<n> faults=<n> survived=<n> lost=<n>
dup=<n> max_recovery_s=<x>

KESTREL_CHAOS_VERBOSE=1 prints each state the probe job passes through, and what
Kubernetes holds of it, with its time since the fault, then the CPU each component
spent until the plane recovered (where a recovery's seconds go).

Last line: chaos: faults=<n> survived=<n> lost=<n> duplicated=<n> max_recovery_s=<x>
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from rich.table import Table

from bench import account
from kestrel import bus
from kestrel.workloads import JOB_ID_LABEL, EventType
from kestrel_sdk import AsyncClient, JobState, KestrelError
from kestrel_tools import cluster, kubework
from kestrel_tools.devstack import Stack, port_map
from kestrel_tools.procs import ServiceProcess

console = Console(stderr=True)
TOKEN = "kso_chaos"
SERVICES = ("meter", "gateway", "admission", "placer", "autoscaler")
PRICES = "gpu-h100=0.01,gpu-a10=0.001,cpu=0.0005"
DEADLINE_S = 5.0
MAX_DURATION_S = 30  # each job's bound: never metered past it
CLEAR = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})
FAULTS = ("gateway", "admission", "placer", "meter", "autoscaler", "nats", "postgres",
          "redis", "kube-apiserver", "kueue")
HOW = {"nats": "restart", "redis": "restart"}  # the rest: kill -9
BASELINE = "none (baseline)"
# --ha: one replica of each service, the NATS node leading the workload stream, the
# Postgres primary, one of two kube-apiservers; each killed with -9 while the others
# carry on.
HA_FAULTS = ("gateway", "admission", "placer", "meter", "autoscaler", "nats", "postgres",
             "kube-apiserver")
LEASED = ("admission", "placer", "autoscaler")  # --ha kills the Lease holder of these
HA_NATS_NODES = 3
HA_PG_NODES = 2


@dataclass
class Intent:
    """One job a tenant means to submit, retried under its idempotency key until
    answered."""

    tenant: str
    key: str
    phase: str
    flavor: str
    job_ids: set[str] = field(default_factory=set)


@dataclass
class Phase:
    fault: str
    how: str = "-"
    healthy_s: float | None = None  # the same probe just before the fault
    repair_s: float | None = None  # until the supervisor had it running again
    recovery_s: float | None = None
    late: int = 0  # jobs Kubernetes stopped past their bound (billed to the bound)
    calls: int = 0
    errors: int = 0
    unclear: Counter[str] = field(default_factory=Counter)
    hung: int = 0
    restarts: list[str] = field(default_factory=list)
    jobs: int = 0
    lost: int = 0
    duplicated: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def survived(self) -> bool:
        return (self.recovery_s is not None and not self.unclear and not self.hung
                and not self.lost and not self.duplicated)


@dataclass
class Report:
    phases: list[Phase]
    apiservers: int = 1
    replicas: int = 1  # of each service (--ha: 2)
    nats_nodes: int = 1
    pg_nodes: int = 1

    @property
    def faults(self) -> list[Phase]:
        return [p for p in self.phases if p.fault != BASELINE]

    def line(self) -> str:
        rec = [p.recovery_s for p in self.faults if p.recovery_s is not None]
        worst = max(rec) if len(rec) == len(self.faults) and rec else float("inf")
        if self.replicas > 1:
            return (f"ha: replicas={self.replicas} nats_nodes={self.nats_nodes} "
                    f"pg_nodes={self.pg_nodes} faults={len(self.faults)} "
                    f"survived={sum(p.survived for p in self.faults)} "
                    f"lost={sum(p.lost for p in self.phases)} "
                    f"dup={sum(p.duplicated for p in self.phases)} "
                    f"max_recovery_s={worst:.1f}")
        return (f"chaos: faults={len(self.faults)} "
                f"survived={sum(p.survived for p in self.faults)} "
                f"lost={sum(p.lost for p in self.phases)} "
                f"duplicated={sum(p.duplicated for p in self.phases)} "
                f"max_recovery_s={worst:.1f}")

    def table(self) -> Table:
        ha = (f"{self.replicas} replicas of each service, {self.nats_nodes} NATS nodes, "
              f"{self.pg_nodes} Postgres nodes, " if self.replicas > 1 else "")
        t = Table(title=f"chaos ({ha}2 cores; GPU nodes simulated by KWOK, Kueue and the "
                        f"control plane real, {self.apiservers} kube-apiserver"
                        f"{'s' if self.apiservers > 1 else ''})")
        for col in ("fault", "how", "probe before s", "restart s", "recovery s", "calls",
                    "errors", "unclear", "hung", "other restarts", "jobs", "lost", "dup",
                    "survived"):
            t.add_column(col)
        for p in self.phases:
            t.add_row(p.fault, p.how,
                      f"{p.healthy_s:.1f}" if p.healthy_s is not None else "-",
                      f"{p.repair_s:.1f}" if p.repair_s is not None else "-",
                      f"{p.recovery_s:.1f}" if p.recovery_s is not None else "never",
                      str(p.calls), str(p.errors),
                      ",".join(f"{k}x{n}" for k, n in p.unclear.items()) or "0",
                      str(p.hung), ",".join(p.restarts) or "-", str(p.jobs), str(p.lost),
                      str(p.duplicated),
                      "-" if p.fault == BASELINE else ("yes" if p.survived else "NO"))
        return t


class Chaos:
    def __init__(self, root: Path, info: cluster.ClusterInfo, tenants: int, rate: float,
                 progress: Callable[[str], None], apiservers: int = 1,
                 ha: bool = False) -> None:
        self.root = root
        self.apiservers = apiservers
        self.info = info
        self.n_tenants = tenants
        self.rate = rate
        self.say = progress
        self.ha = ha
        self.replicas = 2 if ha else 1
        self.stack = Stack(root / "devstack", durable=True,
                           nats_nodes=HA_NATS_NODES if ha else 1,
                           pg_nodes=HA_PG_NODES if ha else 1)
        self.procs: dict[str, ServiceProcess] = {}  # by replica: `meter`, `meter-2`, ...
        self.env: dict[str, str] = {}
        self.replica_env: dict[str, dict[str, str]] = {}  # a replica's own ports
        self.repair: asyncio.Task[None] | None = None  # --ha: the killed one restarting
        self.starts = 0
        self.faulting: set[str] = set()
        self.phase = Phase(BASELINE)
        self.phases: list[Phase] = [self.phase]
        self.intents: list[Intent] = []
        self.clients: dict[str, AsyncClient] = {}
        self.tenants: list[str] = []
        self.stop = asyncio.Event()
        self.run_id = uuid.uuid4().hex[:6]
        self.last_probe = ""
        self.verbose = bool(os.environ.get("KESTREL_CHAOS_VERBOSE"))

    # --- the plane ------------------------------------------------------------------

    def replica_names(self, service: str) -> list[str]:
        return [service, *(f"{service}-{i}" for i in range(2, self.replicas + 1))]

    def lease(self, service: str) -> str:
        return f"kestrel-{service}-chaos-{self.run_id}"

    def _start(self, replica: str) -> None:
        self.starts += 1
        service = replica.split("-")[0]
        env = {**self.env, **self.replica_env.get(replica, {})}
        proc = ServiceProcess(service, env, f"127.0.0.1:{env[f'KESTREL_{service.upper()}_PORT']}",
                              self.root / f"{replica}-{self.starts}.log")
        self.procs[replica] = proc
        if service == "placer" and self.ha:
            proc.spawn()  # of two placers the standby serves only once it leads
        else:
            proc.start(timeout_s=120)

    def up(self) -> None:
        self.stack.up()
        replicas = [r for n in SERVICES for r in self.replica_names(n)]
        gateways = self.replica_names("gateway")
        # Each replica its ports, and the gateway's internal Replicas one of its own.
        ports = port_map(*replicas, *(f"{g}/replicas" for g in gateways))
        self.env = {
            **self.stack.env(), "KESTREL_OPERATOR_TOKEN": TOKEN,
            "KESTREL_LOG_LEVEL": os.environ.get("KESTREL_CHAOS_LOG_LEVEL", "WARNING"),
            "KESTREL_KUBECONFIG": str(self.info.kubeconfig), "KESTREL_PRICES": PRICES,
            "KESTREL_WORKER_REDIS_URL": self.stack.redis_url,
            "KESTREL_AUTOSCALER_LEASE": self.lease("autoscaler"),
            "KESTREL_AUTOSCALER_LEASE_S": "3",
            "KESTREL_REPLICAS_PORT": str(ports["gateway/replicas"]),
            "KESTREL_REPLICAS_ADDR": ",".join(f"127.0.0.1:{ports[f'{g}/replicas']}"
                                              for g in gateways),
            **{f"KESTREL_{n.upper()}_PORT": str(ports[n]) for n in SERVICES},
            **{f"KESTREL_{n.upper()}_ADDR": ",".join(f"127.0.0.1:{ports[r]}"
                                                     for r in self.replica_names(n))
               for n in SERVICES},
            **{f"KESTREL_{n.upper()}_METRICS_PORT": "0" for n in SERVICES}}
        if self.ha:
            self.env |= {"KESTREL_PLACER_LEASE": self.lease("placer"),
                         "KESTREL_PLACER_LEASE_S": "3",
                         "KESTREL_ADMISSION_LEASE": self.lease("admission"),
                         "KESTREL_ADMISSION_LEASE_S": "3",
                         # what a killed meter had fetched goes to the other this soon
                         "KESTREL_METER_ACK_WAIT_S": "3"}
        for r in replicas:
            service = r.split("-")[0]
            self.replica_env[r] = {f"KESTREL_{service.upper()}_PORT": str(ports[r])}
            if service == "gateway":
                self.replica_env[r]["KESTREL_REPLICAS_PORT"] = str(ports[f"{r}/replicas"])
        for r in replicas:
            self._start(r)
        if self.ha:  # one placer leads and serves before the load starts
            placers = [self.procs[r] for r in self.replica_names("placer")]
            deadline = time.monotonic() + 120
            while not any(self._serving(p) for p in placers):
                if time.monotonic() > deadline:
                    raise RuntimeError("no placer took the Lease within 120 s")
                time.sleep(0.5)

    @staticmethod
    def _serving(p: ServiceProcess) -> bool:
        try:
            p.wait(timeout_s=0.5)
            return True
        except (TimeoutError, RuntimeError):
            return False

    def down(self) -> None:
        for p in self.procs.values():
            p.stop()
        queues = [f"kestrel-{t}" for t in self.tenants]
        if queues:
            cluster.kubectl("delete", "namespace", *queues, "--wait=false",
                            "--ignore-not-found", check=False)
            cluster.kubectl("delete", "clusterqueue", *queues, "--ignore-not-found",
                            "--wait=false", check=False)  # Kueue finalizes them later
        cluster.kubectl("delete", "lease", "-n", "default",
                        *(self.lease(n) for n in LEASED), "--ignore-not-found", check=False)
        self.stack.destroy()

    def client(self, key: str) -> AsyncClient:
        return AsyncClient(self.env["KESTREL_GATEWAY_ADDR"], api_key=key, timeout_s=DEADLINE_S)

    async def make_tenants(self) -> None:
        async with AsyncClient(self.env["KESTREL_GATEWAY_ADDR"], operator_token=TOKEN) as op:
            for i in range(self.n_tenants + 1):  # the last one probes
                name = f"chaos{self.run_id}{i}"
                await op.create_tenant(name, gpu_quota={"gpu-h100": 8, "gpu-a10": 8},
                                       rate_per_s=100, burst=100, initial_credits="1000")
                self.tenants.append(name)
                self.clients[name] = self.client((await op.create_api_key(name, "chaos")).secret)

    async def supervise(self) -> None:
        """What Kubernetes would do for a Deployment: a service that exits is started
        again. Restarts of services not being faulted are counted against the fault."""
        while not self.stop.is_set():
            for name, p in list(self.procs.items()):
                if name in self.faulting or p.proc is None or p.proc.poll() is None:
                    continue
                self.phase.restarts.append(f"{name}(rc={p.proc.returncode})")
                self.say(f"    {name} exited (rc {p.proc.returncode}): restarting it")
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._start, name)
            await asyncio.sleep(0.25)

    # --- load -----------------------------------------------------------------------

    async def call(self, fn: Callable[[], Awaitable[object]]) -> object | None:
        phase = self.phase
        t0 = time.monotonic()
        try:
            result = await fn()
        except KestrelError as exc:
            result, code = None, exc.code_name
        except Exception as exc:  # anything else is a finding
            result, code = None, f"client {type(exc).__name__}"
        else:
            code = "OK"
        phase.calls += 1
        if code != "OK":
            phase.errors += 1
            if code not in CLEAR:
                phase.unclear[code] += 1
        if time.monotonic() - t0 > DEADLINE_S + 1:
            phase.hung += 1
        return result

    async def submit(self, c: AsyncClient, intent: Intent) -> bool:
        job = await self.call(lambda: c.submit_job(
            name=f"c{len(self.intents)}", gpus=1, max_duration_s=MAX_DURATION_S,
            sim_duration_s=2,
            flavor=intent.flavor, idempotency_key=intent.key))
        if job is None:
            return False
        intent.job_ids.add(job.job_id)  # type: ignore[attr-defined]
        return True

    async def tenant_load(self, tenant: str) -> None:
        c = self.clients[tenant]
        period = 1 / self.rate
        while not self.stop.is_set():
            t0 = time.monotonic()
            intent = Intent(tenant, uuid.uuid4().hex, self.phase.fault,
                            random.choice(["gpu-h100", "gpu-a10"]))
            self.intents.append(intent)
            while not self.stop.is_set() and not await self.submit(c, intent):  # noqa: ASYNC110
                await asyncio.sleep(0.25)  # a retry, not a wait for the event
            await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))

    async def tenant_reads(self, tenant: str) -> None:
        c = self.clients[tenant]
        while not self.stop.is_set():
            await self.call(c.runway)
            mine = [i for i in self.intents[-50:] if i.tenant == tenant and i.job_ids]
            if mine:
                job_id = next(iter(random.choice(mine).job_ids))
                await self.call(lambda job_id=job_id: c.get_job(job_id))  # type: ignore[misc]
            await asyncio.sleep(0.5)

    # --- faults ---------------------------------------------------------------------

    async def _kill(self, pid: int, sig: signal.Signals) -> None:
        os.kill(pid, sig)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):  # reap it if it was our child
                os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG never blocks
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"pid {pid} did not exit after {sig.name}")

    async def _repair_stack(self) -> None:
        deadline = time.monotonic() + 60
        while True:  # a killed postmaster's backends may hold its memory a moment
            try:
                await asyncio.to_thread(self.stack.up)
                return
            except Exception as exc:  # retried, then reported
                if time.monotonic() > deadline:
                    raise
                self.say(f"    devstack up failed ({str(exc)[:120]}); retrying")
                await asyncio.sleep(1)

    def _holder(self, service: str) -> str:
        """The replica whose process holds the service's Lease (`service` if none)."""
        out = cluster.kubectl("get", "lease", "-n", "default", self.lease(service), "-o",
                              "jsonpath={.spec.holderIdentity}", check=False).stdout
        for r in self.replica_names(service):
            p = self.procs.get(r)
            if p is not None and p.proc is not None and f"-{p.pid}-" in out:
                return r
        return service

    async def _nats_leader(self) -> str:
        """The NATS node leading KESTREL_WORKLOADS (every workload event goes through it)."""
        nc = await bus.connect(self.stack.nats_url, "chaos-leader")
        try:
            info = await nc.jetstream().stream_info("KESTREL_WORKLOADS")
            leader = info.cluster.leader if info.cluster else None
        finally:
            await nc.close()
        if leader not in self.stack.pids:
            raise RuntimeError(f"KESTREL_WORKLOADS is led by {leader!r}, not a node of ours")
        return str(leader)

    async def inject_ha(self, fault: str, t0: float) -> str:
        """Kill one replica (the Lease holder, the stream's leader node, one of two
        apiservers) and start it again in the background, as a supervisor would; the
        probe meanwhile measures what the survivors give. Returns what was killed."""
        if fault in SERVICES:
            victim = (await asyncio.to_thread(self._holder, fault) if fault in LEASED
                      else fault)
            self.faulting.add(victim)
            await asyncio.to_thread(self.procs[victim].kill9)

            async def restart() -> None:
                try:
                    await asyncio.to_thread(self._start, victim)
                finally:
                    self.faulting.discard(victim)
        elif fault == "nats":
            victim = await self._nats_leader()
            await self._kill(self.stack.pids[victim], signal.SIGKILL)

            async def restart() -> None:
                await self._repair_stack()
        elif fault == "postgres":
            primary = self.stack.pg_primary()
            pid = self.stack.pg_postmaster_pid(primary) if primary is not None else None
            if primary is None or pid is None:
                raise RuntimeError("the Postgres pair has no primary to kill")
            victim = f"postgres primary (member {primary + 1})"
            await self._kill(pid, signal.SIGKILL)

            async def restart() -> None:  # Patroni's: the old primary rejoins as standby
                await asyncio.to_thread(self.stack.wait_pg_pair_whole, 120)
        elif fault == "kube-apiserver":
            victim = "kube-apiserver"
            pid = next(p.pid for p in cluster.process_health() if p.component == fault)
            assert pid is not None
            await self._kill(pid, signal.SIGKILL)

            async def restart() -> None:
                await asyncio.to_thread(cluster.restart_dead, self.say)
        else:
            raise ValueError(f"unknown --ha fault {fault!r}; known: {', '.join(HA_FAULTS)}")

        phase = self.phase

        async def timed() -> None:
            await restart()
            phase.repair_s = time.monotonic() - t0

        self.repair = asyncio.create_task(timed())
        return victim

    async def inject(self, fault: str) -> None:
        if fault in SERVICES:
            self.faulting.add(fault)
            try:
                await asyncio.to_thread(self.procs[fault].kill9)
                await asyncio.to_thread(self._start, fault)
            finally:
                self.faulting.discard(fault)
        elif fault in ("nats", "postgres", "redis"):
            sig = signal.SIGKILL if fault == "postgres" else signal.SIGTERM
            await self._kill(self.stack.pids[fault], sig)
            await self._repair_stack()
        elif fault == "kube-apiserver":
            pid = next(p.pid for p in cluster.process_health() if p.component == fault)
            assert pid is not None
            await self._kill(pid, signal.SIGKILL)
            await asyncio.to_thread(cluster.restart_dead, self.say)
        elif fault == "kueue":
            pid = cluster.kueue_pid()
            assert pid is not None
            await self._kill(pid, signal.SIGKILL)
            await asyncio.to_thread(cluster.restart_dead, self.say)
        else:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")

    async def probe(self, started: float, timeout_s: float) -> float | None:
        """Seconds from `started` until a new job of the probe tenant runs in Kueue,
        the meter has opened its allocation and its runway answers."""
        c = self.clients[self.tenants[-1]]
        key = uuid.uuid4().hex
        job_id = ""
        self.last_probe = "no answer yet"
        trace: asyncio.Task[None] | None = None
        try:
            while time.monotonic() - started < timeout_s:
                try:
                    if not job_id:
                        job_id = (await c.submit_job(name="probe", gpus=1, max_duration_s=30,
                                                     sim_duration_s=1, flavor="gpu-a10",
                                                     idempotency_key=key)).job_id
                    job = await c.get_job(job_id)
                    if self.verbose and trace is None:
                        trace = asyncio.create_task(self.kube_trace(job_id, started))
                    seen = f"job {job_id} {job.state.value} ({job.reason})"
                    if self.verbose and seen != self.last_probe:
                        self.say(f"    probe +{time.monotonic() - started:.1f}s: {seen}")
                    self.last_probe = seen
                    if job.state in (JobState.RUNNING, JobState.SUCCEEDED):
                        await c.runway()
                        conn = await asyncpg.connect(self.stack.postgres_dsn, timeout=2)
                        try:
                            if await conn.fetchval("SELECT count(*) FROM allocations "
                                                   "WHERE workload_id = $1", job_id):
                                return time.monotonic() - started
                        finally:
                            await conn.close()
                except (KestrelError, OSError, asyncpg.PostgresError, TimeoutError) as exc:
                    self.last_probe = f"job {job_id or '-'}: {type(exc).__name__}: {exc}"
                await asyncio.sleep(0.1)
            return None
        finally:
            if trace is not None:
                trace.cancel()

    async def kube_trace(self, job_id: str, started: float) -> None:
        """Verbose runs: what Kubernetes holds of the probe job (its Job, its Workload's
        conditions and our check's state), polled every 0.2 s, each change printed with
        its time since `started`; how a recovery divides between the components."""
        from kubernetes import client as k8s

        from kestrel.kubeclient import new_api_client

        ns = f"kestrel-{self.tenants[-1]}"
        api = new_api_client(str(self.info.kubeconfig), 2)
        batch, custom = k8s.BatchV1Api(api), k8s.CustomObjectsApi(api)
        label = f"{JOB_ID_LABEL}={job_id}"

        def look() -> list[str]:
            seen = []
            jobs = {j.metadata.name for j in
                    batch.list_namespaced_job(ns, label_selector=label).items if j.metadata}
            seen += ["Job"] if jobs else []
            listing: Any = custom.list_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", ns, "workloads")
            for wl in listing["items"]:
                if not any(r.get("name") in jobs
                           for r in wl["metadata"].get("ownerReferences") or []):
                    continue
                st = wl.get("status") or {}
                seen.append("Workload")
                seen += [c["type"] for c in st.get("conditions") or [] if c["status"] == "True"]
                seen += [f"check {a['state']}" for a in st.get("admissionChecks") or []]
            return seen

        shown: set[str] = set()
        own = ThreadPoolExecutor(1, "kube-trace")  # not queued behind the load's threads
        try:
            while True:
                try:
                    now = set(await asyncio.get_running_loop().run_in_executor(own, look))
                except Exception as exc:
                    now = {f"apiserver: {type(exc).__name__}"}
                for s in sorted(now - shown):
                    self.say(f"    kube  +{time.monotonic() - started:.1f}s: {s}")
                shown |= now
                if "Admitted" in now:
                    return
                await asyncio.sleep(0.2)
        finally:
            own.shutdown(wait=False, cancel_futures=True)
            api.close()

    # --- the run --------------------------------------------------------------------

    async def run(self, faults: list[str], settle_s: float, recovery_timeout_s: float) -> Report:
        await self.make_tenants()
        tasks = [asyncio.create_task(self.supervise())]
        for t in self.tenants[:-1]:
            tasks += [asyncio.create_task(self.tenant_load(t)),
                      asyncio.create_task(self.tenant_reads(t))]
        try:
            await asyncio.sleep(settle_s)
            self.phase.recovery_s = await self.probe(time.monotonic(), recovery_timeout_s)
            self.say(f"  baseline: a probe job runs and is metered in "
                     f"{self.phase.recovery_s or float('nan'):.1f} s")
            for fault in faults:
                # What a new job takes on the healthy plane right now: the load piles up
                # in the cluster, so the same probe is slower late in the run.
                healthy = await self.probe(time.monotonic(), recovery_timeout_s)
                how = HOW.get(fault, "kill -9")
                if fault == "kube-apiserver" and self.apiservers > 1:
                    how += f" (1 of {self.apiservers})"
                self.phase = Phase(fault, how, healthy)
                self.phases.append(self.phase)
                t0 = time.monotonic()
                cpu0 = account.take_cpu() if self.verbose else {}
                try:
                    if self.ha:
                        self.phase.how = f"kill -9 of {await self.inject_ha(fault, t0)}"
                    else:
                        await self.inject(fault)
                        self.phase.repair_s = time.monotonic() - t0
                except Exception as exc:  # reported as not survived
                    self.phase.notes.append(f"repair failed: {exc}")
                    self.say(f"  {fault}: repair failed: {exc}")
                self.phase.recovery_s = await self.probe(t0, recovery_timeout_s)
                if self.phase.recovery_s is None:
                    self.phase.notes.append(f"probe, last seen: {self.last_probe}")
                if self.repair is not None:  # the killed one back before the next fault
                    try:
                        await self.repair
                    except Exception as exc:
                        self.phase.notes.append(f"restart failed: {exc}")
                    self.repair = None
                if self.verbose:  # where the CPU went while the plane recovered
                    bill = sorted(account.spent(cpu0, account.take_cpu()).items(),
                                  key=lambda kv: -kv[1])
                    self.say("    CPU-s until recovered: " + ", ".join(
                        f"{k} {v:.1f}" for k, v in bill[:10]))
                self.say(f"  {fault} ({self.phase.how}): recovered in "
                         f"{self.phase.recovery_s or float('nan'):.1f} s")
                await asyncio.sleep(settle_s)
        finally:
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.phase = Phase("(after the faults)")  # calls made while settling, not counted
        await self.resolve_pending()
        await self.verify()
        for c in self.clients.values():
            await c.close()
        return Report(self.phases, self.apiservers, self.replicas, self.stack.nats_nodes,
                      self.stack.pg_nodes)

    async def resolve_pending(self) -> None:
        """Submits that never got an answer are retried (same key) until they do."""
        for intent in [i for i in self.intents if not i.job_ids]:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not await self.submit(  # noqa: ASYNC110
                    self.clients[intent.tenant], intent):
                await asyncio.sleep(0.5)

    async def diagnose(self, conn: asyncpg.Connection, job_id: str, tenant: str) -> str:
        """Where a job that never ended stopped: admission's transitions, the events the
        meter received, and what Kubernetes holds (its Job and Workload)."""
        def name(state: int) -> str:
            return JobState.from_pb(state).value

        moves = [f"{name(r['from_state'])}->{name(r['to_state'])}({r['reason'][:40]})"
                 for r in await conn.fetch(
                     "SELECT from_state, to_state, reason FROM job_transitions WHERE job_id = $1 "
                     "ORDER BY transition_id", job_id)]
        seen = [EventType(r["type"]).word if r["type"] in EventType._value2member_map_
                else str(r["type"]) for r in await conn.fetch(
            "SELECT type FROM workload_events WHERE workload_id = $1 ORDER BY time_us", job_id)]
        ns = f"kestrel-{tenant}"
        kube = []
        for kind in ("job", "workloads.kueue.x-k8s.io"):
            out = await asyncio.to_thread(cluster.kubectl, "get", kind, "-n", ns, "-o", "json",
                                          check=False)
            items = json.loads(out.stdout or '{"items": []}')["items"] if out.returncode == 0 \
                else []
            mine = [o for o in items if o["metadata"]["name"] == job_id or any(
                r.get("name") == job_id for r in o["metadata"].get("ownerReferences", []))]
            if not mine:
                kube.append(f"no {kind.split('.')[0]}")
            for o in mine:
                conds = [f"{c['type']}={c['status']}" for c in o.get("status", {}).get(
                    "conditions", [])]
                checks = [f"{c['name']}:{c['state']}" for c in o.get("status", {}).get(
                    "admissionChecks", [])]
                kube.append(f"{kind.split('.')[0]} suspend={o['spec'].get('suspend')} "
                            f"{','.join(conds + checks) or 'no conditions'}")
        return (f"transitions [{' '.join(moves)}], meter saw [{' '.join(seen)}], "
                f"Kubernetes [{'; '.join(kube)}]")

    async def consumers(self) -> str:
        """The durable consumers that carry a job from decision to its end: what each
        stream still holds and what each consumer has delivered, acknowledged, owes."""
        nc = await bus.connect(self.stack.nats_url, "chaos-verify")
        try:
            js = nc.jetstream()
            out = []
            for stream, durable in (("KESTREL_JOBS", "placer"),
                                    ("KESTREL_WORKLOADS", "admission")):
                st = (await js.stream_info(stream)).state
                ci = await js.consumer_info(stream, durable)
                out.append(f"{stream} msgs={st.messages} seq={st.first_seq}-{st.last_seq}; "
                           f"{durable} delivered={ci.delivered.stream_seq} "
                           f"ack_floor={ci.ack_floor.stream_seq} "
                           f"ack_pending={ci.num_ack_pending} pending={ci.num_pending} "
                           f"redelivered={ci.num_redelivered}")
            return "NATS: " + " | ".join(out)
        except Exception as exc:  # a diagnosis only
            return f"NATS: could not read consumers: {exc}"
        finally:
            await nc.close()

    async def verify(self) -> None:
        by_phase = {p.fault: p for p in self.phases}
        ids = {j: i for i in self.intents for j in i.job_ids}
        conn = await asyncpg.connect(self.stack.postgres_dsn)
        try:
            self.say(f"  waiting for {len(ids)} jobs to end and be metered")
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                open_n = await conn.fetchval(
                    "SELECT count(*) FROM jobs WHERE job_id = ANY($1::text[]) AND state < 5",
                    list(ids))
                unclosed = await conn.fetchval(
                    "SELECT count(*) FROM allocations WHERE workload_id = ANY($1::text[]) "
                    "AND status <> 2", list(ids))
                if open_n == 0 and unclosed == 0:
                    break
                await asyncio.sleep(1)
            jobs = {r["job_id"]: r for r in await conn.fetch(
                "SELECT job_id, tenant, idempotency_key, state, gpus FROM jobs "
                "WHERE tenant = ANY($1::text[])", self.tenants[:-1])}
            ledger = {r["workload_id"]: int(r["g"]) for r in await conn.fetch(
                "SELECT workload_id, sum(gpu_us) g FROM ledger WHERE tenant = ANY($1::text[]) "
                "GROUP BY workload_id", self.tenants[:-1])}
        finally:
            await conn.close()
        namespaces = [f"kestrel-{t}" for t in self.tenants[:-1]]
        k8s_time = await asyncio.to_thread(kubework.gpu_seconds_range_by_job, namespaces)
        k8s_jobs: set[str] = set()
        for ns in namespaces:
            out = await asyncio.to_thread(cluster.kubectl, "get", "jobs", "-n", ns, "-o",
                                          "json", check=True)
            k8s_jobs |= {j["metadata"]["name"] for j in json.loads(out.stdout)["items"]}
        per_key = Counter(r["idempotency_key"] for r in jobs.values())
        states: dict[str, Counter[str]] = defaultdict(Counter)
        for intent in self.intents:
            p = by_phase[intent.phase]
            p.jobs += 1
            if not intent.job_ids:
                p.lost += 1
                p.notes.append(f"submit {intent.key} never answered")
                continue
            if len(intent.job_ids) > 1 or per_key[intent.key] > 1:
                p.duplicated += 1
                p.notes.append(f"{intent.key}: jobs {sorted(intent.job_ids)}")
            job_id = next(iter(intent.job_ids))
            row = jobs.get(job_id)
            state = JobState.from_pb(row["state"]) if row else JobState.UNSPECIFIED
            states[intent.phase][state.value] += 1
            if row is None or not state.terminal:
                p.lost += 1
                p.notes.append(f"{job_id}: {state.value}, never ended; "
                               + await self.diagnose(conn, job_id, intent.tenant))
                continue
            span = k8s_time.get(job_id)
            if span is None:
                if state is JobState.SUCCEEDED or ledger.get(job_id):
                    p.lost += 1
                    p.notes.append(f"{job_id}: {state.value}, no finished Workload")
                continue
            # Admitted -> Finished as Kubernetes recorded it; `most` differs only where
            # Kueue rewrote a torn admission's time (kubework.gpu_seconds_range_by_job).
            want, most = span
            if most > MAX_DURATION_S:  # the contract: metered up to the bound, no further
                p.late += 1
            want, most = min(want, Decimal(MAX_DURATION_S)), min(most, Decimal(MAX_DURATION_S))
            got = ledger.get(job_id, 0)
            if got < int(want * 1_000_000):
                p.lost += 1
                p.notes.append(f"{job_id}: ledger {got} us < Kubernetes {want} s")
            elif got > int(most * 1_000_000):
                p.duplicated += 1
                p.notes.append(f"{job_id}: ledger {got} us > Kubernetes {most} s")
            elif most != want:
                p.notes.append(f"{job_id}: Kueue rewrote its admission time (a retried "
                               f"write): ledger {got} us, Kubernetes {want}-{most} s")
        if any("never ended" in n for p in self.phases for n in p.notes):
            self.phases[-1].notes.append(await self.consumers())
        strangers = k8s_jobs - set(jobs)
        if strangers:
            self.phases[-1].duplicated += len(strangers)
            self.phases[-1].notes.append(f"Kubernetes Jobs Kestrel never made: {strangers}")
        for p in self.phases:
            if p.late:
                p.notes.append(f"{p.late} jobs ended in Kubernetes past their "
                               f"{MAX_DURATION_S} s bound: metered to the bound")
            if states[p.fault] and set(states[p.fault]) != {"SUCCEEDED"}:
                p.notes.append(f"job states: {dict(states[p.fault])}")


async def run(root: Path, faults: list[str], *, tenants: int = 3, rate: float = 0.5,
              settle_s: float = 8.0, recovery_timeout_s: float = 90.0,
              progress: Callable[[str], None] = print, keep: bool = False,
              show: Callable[[Report], None] = lambda r: None, apiservers: int = 1,
              ha: bool = False) -> Report:
    info = await asyncio.to_thread(cluster.ensure_cluster, lambda s: progress(f"  cluster: {s}"))
    if apiservers not in (1, 2):
        raise ValueError(f"apiservers must be 1 or 2, not {apiservers}")
    chaos = Chaos(root, info, tenants, rate, progress, apiservers, ha)
    try:
        if apiservers == 2:
            await asyncio.to_thread(cluster.start_apiserver_replica, progress)
        await asyncio.to_thread(chaos.up)
        nodes = (f" x{chaos.replicas}, NATS x{chaos.stack.nats_nodes}, "
                 f"Postgres x{chaos.stack.pg_nodes}") if ha else ""
        progress(f"  plane up: {', '.join(SERVICES)}{nodes}; "
                 f"{tenants} tenants at {rate:g} job/s each, reads every 0.5 s, "
                 f"deadline {DEADLINE_S:g} s")
        report = await chaos.run(faults, settle_s, recovery_timeout_s)
        show(report)  # before the teardown, which waits for Kubernetes' deletions
        return report
    finally:
        if not keep:
            await asyncio.to_thread(chaos.down)
            await asyncio.to_thread(cluster.stop_apiserver_replica, progress)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ha", action="store_true",
                    help="two replicas of every service and three NATS nodes; faults kill "
                         "one replica each (make chaos-ha)")
    ap.add_argument("--faults", default="",
                    help="comma-separated, in order (default: all of the mode's)")
    ap.add_argument("--tenants", type=int, default=3)
    ap.add_argument("--rate", type=float, default=0.5, help="jobs per second per tenant")
    ap.add_argument("--settle-s", type=float, default=8.0,
                    help="load before the first fault and after each recovery")
    ap.add_argument("--apiservers", type=int, choices=(1, 2), default=2,
                    help="kube-apiservers sharing the control plane's address (default 2)")
    ap.add_argument("--keep", action="store_true", help="leave the plane and devstack up")
    args = ap.parse_args()
    known = HA_FAULTS if args.ha else FAULTS
    faults = [f.strip() for f in (args.faults or ",".join(known)).split(",") if f.strip()]
    unknown = sorted(set(faults) - set(known))
    if unknown:
        ap.error(f"unknown faults {unknown}; known: {', '.join(known)}")
    was_up = cluster.is_up()
    root = Path(tempfile.mkdtemp(prefix="kestrel-chaos-", dir="/tmp"))
    os.chmod(root, 0o755)  # Postgres runs as its own user and must reach its data
    console.print(f"[bold]chaos[/bold]: {len(faults)} faults, one at a time, under load; "
                  f"state in {root}")

    def show(report: Report) -> None:
        Console(width=180).print(report.table())
        for p in report.phases:
            for note in p.notes[:5]:
                print(f"  {p.fault}: {note}")
        print(report.line(), flush=True)

    try:
        report = asyncio.run(run(root, faults, tenants=args.tenants, rate=args.rate,
                                 settle_s=args.settle_s, progress=console.print,
                                 keep=args.keep, show=show, apiservers=args.apiservers,
                                 ha=args.ha))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
            if not was_up:
                cluster.down(lambda s: None)
    sys.exit(0 if all(p.survived for p in report.faults) else 1)


if __name__ == "__main__":
    main()

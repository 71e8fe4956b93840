"""Host stand-ins for simulated GPU replicas.

A replica of an endpoint on a GPU flavor is a KWOK pod: Kueue admits it against GPU
quota, the runway check gates it and the meter counts its GPU-seconds, but no
container runs, so nothing would answer its requests. While such a pod is Running,
the placer runs the model worker as a process on this host in its place, under the
replica's name (its job id) and with KESTREL_WORKER_SIMULATED=1, so every reply and
heartbeat says the GPU is simulated. When the pod stops running (the endpoint shrank
or was deleted, the budget was spent, Kueue evicted it) the stand-in is stopped.

`wanted` decides from the pod dicts alone; `StandIns` owns the processes. A stand-in
dies with the placer (PR_SET_PDEATHSIG, set by setpriv), so a placer killed with -9
leaves none for its successor to duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kestrel.service import die_with_parent
from kestrel.workloads import ENDPOINT_LABEL, JOB_ID_LABEL, TENANT_LABEL
from services.placer.lifecycle import GPU, Obj

log = logging.getLogger("kestrel.placer.standins")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class StandIn:
    job_id: str
    endpoint_id: str
    tenant: str


def _gpus(pod: Obj) -> int:
    total = 0
    for c in ((pod.get("spec") or {}).get("containers")) or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU)
        with contextlib.suppress(TypeError, ValueError):
            total += int(value or 0)
    return total


def wanted(pods: Iterable[Obj]) -> StandIn | None:
    """The stand-in one Kestrel job's pods call for: one while a pod of an endpoint
    replica that holds GPUs (so runs on a KWOK node) is Running and not being deleted;
    None otherwise (a job, a CPU replica on the real kubelet, a pod not yet or no
    longer running)."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        endpoint, job_id = labels.get(ENDPOINT_LABEL), labels.get(JOB_ID_LABEL)
        if not endpoint or not job_id or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") != "Running" or _gpus(pod) <= 0:
            continue
        return StandIn(str(job_id), str(endpoint), str(labels.get(TENANT_LABEL, "")))
    return None


def standin_env(base: Mapping[str, str], s: StandIn, redis_url: str) -> dict[str, str]:
    """The worker's environment: this process's, without the placer's own KESTREL_*
    settings (its database credentials among them), plus the replica's."""
    env = {k: v for k, v in base.items() if not k.startswith("KESTREL_")}
    for keep in ("KESTREL_MODEL_DIR", "KESTREL_LOG_LEVEL"):
        if keep in base:
            env[keep] = base[keep]
    env.update({
        "KESTREL_WORKER_ENDPOINT": s.endpoint_id, "KESTREL_WORKER_TENANT": s.tenant,
        "KESTREL_WORKER_REPLICA": s.job_id, "KESTREL_REDIS_URL": redis_url,
        "KESTREL_WORKER_SIMULATED": "1",
        # a host process beside the plane: one intra-op thread, ports the kernel picks
        "KESTREL_WORKER_THREADS": "1", "KESTREL_WORKER_PORT": "0",
        "KESTREL_WORKER_METRICS_PORT": "0",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", ""))
                                      if p)})
    return env


async def spawn_worker(s: StandIn, redis_url: str) -> asyncio.subprocess.Process:
    # PDEATHSIG set by setpriv, not by a preexec_fn: that would make this a fork() of a
    # gRPC server, which can crash the child (kestrel_tools.procs).
    return await asyncio.create_subprocess_exec(
        *die_with_parent("TERM"), sys.executable, "-m", "services.worker", cwd=str(REPO),
        env=standin_env(os.environ, s, redis_url), stdin=asyncio.subprocess.DEVNULL)


class StandIns:
    """One worker process per simulated GPU replica that is running, keyed by job id."""

    def __init__(self, redis_url: str, stop_timeout_s: float = 10.0) -> None:
        self.redis_url = redis_url
        self.stop_timeout_s = stop_timeout_s
        self.procs: dict[str, tuple[StandIn, asyncio.subprocess.Process]] = {}
        self.reaping: set[asyncio.Task[None]] = set()

    async def set(self, job_id: str, want: StandIn | None) -> None:
        """Make job `job_id` have the stand-in `want` (None: none). Never waits for a
        stand-in to exit: the placer's observer calls this for every change it sees."""
        have = self.procs.get(job_id)
        if have is not None and (want is None or have[1].returncode is not None):
            if have[1].returncode is not None and want is not None:
                log.warning("stand-in for %s exited (%s); starting it again", job_id,
                            have[1].returncode)
            self._stop(job_id)
            have = None
        if want is not None and have is None:
            proc = await spawn_worker(want, self.redis_url)
            self.procs[job_id] = (want, proc)
            log.info("stand-in for simulated GPU replica %s of %s: pid %d", job_id,
                     want.endpoint_id, proc.pid)

    def _stop(self, job_id: str) -> None:
        _, proc = self.procs.pop(job_id)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()  # the worker finishes its batch and leaves the replica set
        task = asyncio.create_task(self._reap(job_id, proc))
        self.reaping.add(task)
        task.add_done_callback(self.reaping.discard)

    async def _reap(self, job_id: str, proc: asyncio.subprocess.Process) -> None:
        try:
            await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        log.info("stand-in for %s stopped (exit %s)", job_id, proc.returncode)

    async def stop_all(self) -> None:
        for job_id in list(self.procs):
            self._stop(job_id)
        if self.reaping:
            await asyncio.gather(*self.reaping, return_exceptions=True)

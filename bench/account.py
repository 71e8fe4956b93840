"""Where a run's work went: CPU-seconds per component and apiserver traffic.

A bench on a shared 2-core machine is bounded by CPU, so an admission rate alone
does not say who spent it. Two snapshots, before and after a run, give its bill:

- `take_cpu()` sums user+system time of every live process by component
  (kube-apiserver, kueue, postgres, each Kestrel service, the bench itself, ...).
  Processes that exit between two snapshots are not counted (none measured do).
- `parse_api(text)` reads the apiserver's own counters from its /metrics text:
  writes per resource (POST, PUT, PATCH, APPLY, DELETE) and watch events sent
  per kind, summed over all clients.

Both are plain counters; `spent(before, after)` is their difference.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
            "kwok", "kueue", "postgres", "nats-server", "redis-server")
WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE"})
READS = frozenset({"GET", "LIST"})
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_API_SERIES = frozenset({"apiserver_request_total", "apiserver_watch_events_total",
                         "apiserver_watch_events_sizes_sum"})


def component(comm: str, argv: list[str]) -> str:
    """The component a process belongs to, from its command name and argv."""
    exe = Path(argv[0]).name if argv else comm
    for name in BINARIES:
        if exe.startswith(name) or comm.startswith(name[:15]):
            return name
    if "-m" in argv and argv.index("-m") + 1 < len(argv):
        module = argv[argv.index("-m") + 1]
        if module.startswith("services."):
            return "kestrel " + module.removeprefix("services.")
        return module
    return "other"


def take_cpu(proc: Path = Path("/proc")) -> dict[str, float]:
    """CPU-seconds so far, per component, of every process alive now."""
    out: dict[str, float] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            argv = [a for a in (d / "cmdline").read_bytes().decode(errors="replace")
                    .split("\0") if a]
        except OSError:  # exited meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        utime, stime = int(fields[11]), int(fields[12])
        name = component(comm, argv)
        if name != "other":
            out[name] = out.get(name, 0.0) + (utime + stime) / TICK
    return out


STORES = ("postgres", "nats-server", "redis-server")


def kestrel_share(cpu: Mapping[str, float]) -> float:
    """CPU-seconds of Kestrel's own services and the stores only they use (Postgres,
    NATS, Redis): what the plane costs beyond Kubernetes, Kueue and the bench itself."""
    return sum(v for n, v in cpu.items() if n.startswith("kestrel ") or n in STORES)


def parse_api(metrics: str) -> dict[str, float]:
    """From the apiserver's /metrics text: ``writes <resource>`` (all clients, all
    write verbs, any response code), ``reads <resource>`` and ``reads all`` (GET and
    LIST), ``watch events <resource>`` (sent to watchers) and ``watch bytes
    <resource>`` (their size). Reads and sizes are what the apiserver does beyond the
    writes and the event count: a client that GETs, or bigger objects, show there."""
    out: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        out[key] = out.get(key, 0.0) + value

    for line in metrics.splitlines():
        name, _, rest = line.partition("{")
        if name not in _API_SERIES:
            continue
        labels = dict(_LABEL.findall(rest))
        resource, value = labels.get("resource", "?"), float(line.rsplit(" ", 1)[1])
        if name == "apiserver_watch_events_total":
            add(f"watch events {resource}", value)
        elif name == "apiserver_watch_events_sizes_sum":
            add(f"watch bytes {resource}", value)
        elif labels.get("verb") in WRITES:
            add(f"writes {resource}", value)
        elif labels.get("verb") in READS:
            add(f"reads {resource}", value)
            add("reads all", value)
    return out


def spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each counter gained between two snapshots (new ones count whole)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()
            if v - before.get(k, 0.0) > 0.005}


# --- the machine before a run ------------------------------------------------------------

# Busy above this many cores before a run, the run's figures are not those of a quiet
# machine. On this 2-core machine a Kubernetes control plane left up after bench-jobs,
# still deleting its 1,000 Jobs, took bench-scale's decide p99 from 20-30 ms to 94-115
# ms (2026-12-03): the same code, the same hour.
BUSY_NOTE_CORES = 0.15


def machine_busy(stat: Path = Path("/proc/stat")) -> float:
    """CPU-seconds the whole machine has spent busy so far, all cores (the aggregate
    `cpu` line: everything but idle and iowait)."""
    fields = stat.read_text().splitlines()[0].split()[1:]
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / TICK


async def settle(min_s: float = 2.0, max_s: float = 30.0, quiet_cores: float = 0.2,
                 window_s: float = 0.5, busy: Callable[[], float] = machine_busy,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
                 ) -> tuple[float, float]:
    """Wait until the machine is quiet: it spent under `quiet_cores` per second busy over
    the last `window_s`, at least `min_s` and at most `max_s` after the call. Returns
    (seconds waited, cores busy in the last window): what a phase left behind to finish
    before the next one is measured."""
    start = clock()
    await sleep(min_s)
    while True:
        b0, w0 = busy(), clock()
        await sleep(window_s)
        cores = (busy() - b0) / max(clock() - w0, 1e-9)
        if cores < quiet_cores or clock() - start >= max_s:
            return clock() - start, cores


@dataclass(frozen=True)
class Background:
    """What the machine was doing in the seconds before a run."""

    busy_cores: float  # CPU-seconds spent per second, the whole machine
    by_component: dict[str, float]  # the same for each known component, in cores
    cores: int

    def note(self) -> str:
        """One line for a bench's report: how busy, and a warning with the top spenders
        when that is enough to move the figures."""
        head = f"machine busy before the run: {self.busy_cores:.2f} of {self.cores} cores"
        if self.busy_cores < BUSY_NOTE_CORES:
            return head + " (quiet)"
        top = sorted(self.by_component.items(), key=lambda kv: -kv[1])[:4]
        who = ", ".join(f"{n} {c:.2f}" for n, c in top if c >= 0.01) or "no known component"
        return (f"{head} ({who}): NOT a quiet machine, so these figures are not comparable "
                f"with a quiet run; stop what runs (make cluster-down) and run again")


def background(seconds: float = 3.0) -> Background:
    """Measure the machine for `seconds` (sleeping) before a run."""
    cpu0, busy0, t0 = take_cpu(), machine_busy(), time.monotonic()
    time.sleep(seconds)
    cpu1, busy1, wall = take_cpu(), machine_busy(), time.monotonic() - t0
    return Background((busy1 - busy0) / wall,
                      {n: v / wall for n, v in spent(cpu0, cpu1).items()},
                      os.cpu_count() or 1)

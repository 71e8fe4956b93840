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

import os
import re
from collections.abc import Mapping
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
            "kwok", "kueue", "postgres", "nats-server", "redis-server")
WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE"})
_LABEL = re.compile(r'(\w+)="([^"]*)"')


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
    write verbs, any response code) and ``watch events <resource>`` (sent to watchers)."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(_LABEL.findall(line))
            if labels.get("verb") not in WRITES:
                continue
            key = f"writes {labels.get('resource', '?')}"
        elif line.startswith("apiserver_watch_events_total{"):
            labels = dict(_LABEL.findall(line))
            key = f"watch events {labels.get('resource', '?')}"
        else:
            continue
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each counter gained between two snapshots (new ones count whole)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()
            if v - before.get(k, 0.0) > 0.005}

"""The apiserver's own CPU profile in each phase of bench-jobs (`--profile`).

The bill (bench/account.py) says how much CPU the apiserver spent per job; this says
on what. During each phase a thread asks the apiserver for a CPU profile
(`/debug/pprof/profile`, Go's sampling profiler, on by default in kube-apiserver) of
`PROFILE_S` seconds, starting `DELAY_S` seconds in, past the phase's start-up burst.
Each profile is saved under the run's directory (read it whole with
`go tool pprof -http=: FILE`) and summarised by `go tool pprof -top -cum`: the share
of the samples under each kind of work in `KINDS`, times the phase's apiserver
CPU-ms per job from its bill.

Shares are cumulative: a kind includes the allocation and GC assists its own calls
made, while the background GC workers are a kind of their own. Kinds are not
exhaustive (authentication, routing, metrics and the runtime's idle work are the
rest), and a watch's fan-out to many watchers and the decode of etcd's events for
the watch cache are two different kinds: the first grows with watchers, the second
does not.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from kestrel import kubeclient

DELAY_S = 10.0
PROFILE_S = 30

# (what a person reads, the function whose cumulative share it is), fully qualified
# as `go tool pprof` prints them.
KINDS: tuple[tuple[str, str], ...] = (
    ("writes: update, patch", "k8s.io/apiserver/pkg/registry/generic/registry.(*Store).Update"),
    ("writes: create", "k8s.io/apiserver/pkg/registry/generic/registry.(*Store).Create"),
    ("writes: delete", "k8s.io/apiserver/pkg/registry/generic/registry.(*Store).Delete"),
    ("serving watches (every watcher)",
     "k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP"),
    ("decoding etcd's events (once each)",
     "k8s.io/apiserver/pkg/storage/etcd3.(*watchChan).transform"),
    ("GC: background mark workers", "runtime.gcBgMarkWorker"),
)

_ROW = re.compile(r"^\s*\S+\s+\S+%\s+\S+%\s+(\S+?)(s|ms)\s+(\S+)%\s+(.+?)\s*$")
_TOTAL = re.compile(r"Total samples = (\S+?)(s|ms)\b")


def shares(top: str) -> tuple[float, dict[str, float]]:
    """(CPU-seconds sampled, {kind: fraction of them}) from `go tool pprof -top -cum`
    text. A kind whose function never appears is 0.0 (a phase that never deleted)."""
    total_m = _TOTAL.search(top)
    if total_m is None:
        raise ValueError("not `go tool pprof -top` output: no 'Total samples' line")
    scale = {"s": 1.0, "ms": 1e-3}
    total = float(total_m.group(1)) * scale[total_m.group(2)]
    cum: dict[str, float] = {}
    for line in top.splitlines():
        m = _ROW.match(line)
        if m:
            cum.setdefault(m.group(4), float(m.group(3)) / 100)
    return total, {kind: cum.get(fn, 0.0) for kind, fn in KINDS}


def go_binary() -> str | None:
    """`go`, for its pprof: on PATH (cluster/build.sh builds with it), else Go's default
    install directory."""
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if fallback.exists() else None


class Capture(threading.Thread):
    """One profile of the apiserver, taken in the background from DELAY_S seconds on."""

    def __init__(self, api: Any, path: Path, delay_s: float = DELAY_S,
                 seconds: int = PROFILE_S) -> None:
        super().__init__(name=f"pprof-{path.stem}", daemon=True)
        self.api, self.path, self.delay_s, self.seconds = api, path, delay_s, seconds
        self.error: str | None = None
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def run(self) -> None:
        if self._cancelled.wait(self.delay_s):
            self.error = "phase over before the profile began"
            return
        try:
            resp = kubeclient.call(self.api, "GET",
                                   f"/debug/pprof/profile?seconds={self.seconds}")
            self.path.write_bytes(resp.read())
        except Exception as exc:  # a bench run goes on without its profile
            self.error = f"{type(exc).__name__}: {exc}"


def summarise(path: Path, go: str | None) -> tuple[float, dict[str, float]] | str:
    """shares() of a saved profile, or why there are none."""
    if go is None:
        return "go not found: profiles saved, not summarised"
    if not path.exists():
        return "no profile"
    out = subprocess.run([go, "tool", "pprof", "-top", "-cum", "-nodecount=100000", str(path)],
                         capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        return f"go tool pprof failed: {out.stderr.strip()[-200:]}"
    return shares(out.stdout)


def table(summaries: Mapping[str, tuple[float, dict[str, float]] | str],
          api_ms_per_job: Mapping[str, float]) -> Table:
    """Per phase: apiserver CPU-ms per job under each kind (share x the bill's figure),
    the share in brackets."""
    t = Table(title=f"apiserver CPU-ms per job by kind of work (profile of {PROFILE_S} s "
                    f"from {DELAY_S:.0f} s into each phase; share of its samples)")
    t.add_column("")
    runs = list(summaries)
    for r in runs:
        t.add_column(r, justify="right")
    for kind, _ in KINDS:
        cells = []
        for r in runs:
            s = summaries[r]
            if isinstance(s, str):
                cells.append("-")
            else:
                share = s[1][kind]
                cells.append(f"{share * api_ms_per_job.get(r, 0.0):.1f} ({share:.0%})")
        t.add_row(kind, *cells)
    t.add_row("CPU-s sampled", *(f"{s[0]:.1f}" if not isinstance(s, str) else s
                                 for s in summaries.values()))
    return t

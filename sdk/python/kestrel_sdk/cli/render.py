"""The CLI's one renderer: JSON for scripts, or Rich tables for people (from the SDK's
dataclasses), never cut when stdout is not a terminal.

Every command prints through `show`: `-o json` (or `--json`) prints the value as JSON;
`-o table` (the default) fits tables to the terminal, or prints them whole when stdout
is a pipe or a file; `-o wide` prints them whole on a terminal too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

import typer
from rich.console import Console, RenderableType
from rich.table import Table

from kestrel_sdk import ApiKey, Job, JobState, Runway, Tenant, UsageRow
from kestrel_sdk.cli._common import Output, cell, output_of, print_json, print_yaml
from kestrel_sdk.money import fmt

# Wide enough for any row: Rich sizes tables to their content, never pads to this.
WIDE = 1_000_000

_STATE_STYLE = {
    JobState.HELD: "yellow", JobState.ADMITTED: "cyan", JobState.QUEUED: "cyan",
    JobState.RUNNING: "bold blue", JobState.SUCCEEDED: "green", JobState.FAILED: "red",
    JobState.CANCELLED: "magenta", JobState.EVICTED: "red", JobState.REJECTED: "red",
}


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def out(wide: bool = False) -> Console:
    """A console on the current stdout: the terminal's width on a terminal, unlimited
    when asked (wide) or when stdout is not a terminal (a pipe, a file, a script), even
    if stdin is one or COLUMNS is set."""
    if wide or not _stdout_is_terminal():
        return Console(width=WIDE)
    return Console()


def show(ctx: typer.Context, value: Any, human: Callable[[], Iterable[RenderableType]],
         *, as_json: bool = False, output: Output | None = None) -> None:
    """Print `value` as JSON or YAML, or what `human()` returns for people."""
    mode = output_of(ctx, as_json, output)
    if mode is Output.JSON:
        print_json(value)
        return
    if mode is Output.YAML:
        print_yaml(value)
        return
    console = out(wide=mode is Output.WIDE)
    for part in human():
        console.print(part)


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


def money(value: Decimal) -> str:
    return fmt(value)


def state(s: JobState) -> str:
    return f"[{_STATE_STYLE.get(s, 'default')}]{s.value}[/]"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 45s, 3m20s, 2h05m, 3d04h."""
    if seconds < 1:
        return "under 1s"
    whole = int(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def money_lasts(r: Runway) -> str:
    """How long the money (credits - charged) lasts at the current burn."""
    if r.unspent <= 0:
        return "spent"
    if r.unlimited or r.money_runway_s is None:
        return "no burn"
    return duration(r.money_runway_s)


def runway_table(r: Runway) -> Table:
    t = Table(title=f"runway of {r.tenant}")
    for col in ("credits", "charged", "reserved", "free to reserve", "burn/s", "money lasts",
                "GPUs"):
        t.add_column(col, justify="right")
    t.add_row(money(r.credits), money(r.charged), money(r.reserved),
              money(r.free_to_reserve), money(r.burn_per_s), money_lasts(r),
              str(r.running_gpus))
    return t


def runway_lines(r: Runway) -> list[str]:
    """The two figures a person asks for, in words that cannot be misread: how long
    the money lasts, and what is still free to reserve."""
    unspent = money(r.unspent)
    if r.unspent <= 0:
        spend = f"money: spent ({money(r.charged)} charged of {money(r.credits)} credits)"
    elif r.unlimited or r.money_runway_s is None:
        spend = f"money: {unspent} left; nothing is running, so none is being spent"
    else:
        gpus = f"{r.running_gpus} GPU{'' if r.running_gpus == 1 else 's'}"
        spend = (f"money lasts {duration(r.money_runway_s)} at the current burn "
                 f"({money(r.burn_per_s)}/s on {gpus}): {unspent} of "
                 f"{money(r.credits)} credits left")
    free = f"free to reserve {money(r.free_to_reserve)} of {money(max(r.unspent, Decimal(0)))}"
    if r.reserved > 0:
        free += f" ({money(r.reserved)} reserved by admitted jobs)"
    return [spend, free]


def runway_parts(r: Runway) -> list[RenderableType]:
    return [runway_table(r), *runway_lines(r)]


def _quota(q: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in q.items()) or "-"


def tenants_table(tenants: Iterable[Tenant], title: str = "tenants") -> Table:
    t = Table(title=title)
    for col in ("tenant", "name", "GPU quota", "rate/s", "burst", "status", "created"):
        t.add_column(col)
    for x in tenants:
        borrow = f" (may borrow {_quota(x.gpu_borrow)})" if x.gpu_borrow else ""
        t.add_row(cell(x.tenant), cell(x.display_name), cell(_quota(x.gpu_quota) + borrow),
                  f"{x.rate_per_s:g}", str(x.burst),
                  "[red]suspended[/]" if x.suspended else "[green]active[/]",
                  when(x.created_at))
    return t


def jobs_table(jobs: Iterable[Job], title: str = "jobs", with_tenant: bool = False) -> Table:
    t = Table(title=title)
    cols = ("job", *(("tenant",) if with_tenant else ()), "name", "state", "GPUs", "flavor",
            "max", "reserved", "created", "reason")
    for col in cols:
        t.add_column(col, justify="right" if col in ("GPUs", "max", "reserved") else "left")
    for j in jobs:
        t.add_row(cell(j.job_id), *((cell(j.tenant),) if with_tenant else ()),
                  cell(j.spec.name), state(j.state), str(j.spec.gpus),
                  cell(j.flavor or j.spec.flavor or "-"), f"{j.spec.max_duration_s}s",
                  money(j.reserved), when(j.created_at), cell(j.reason))
    return t


def job_table(j: Job) -> Table:
    t = Table(title=f"job {j.job_id}", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    s = j.spec
    rows: list[tuple[str, object]] = [
        ("name", s.name), ("tenant", j.tenant), ("reason", j.reason),
        ("gpus", s.gpus), ("flavor asked", s.flavor or "-"),
        ("flavor placed", j.flavor or "-"), ("flavor reason", j.flavor_reason or "-"),
        ("max duration", f"{s.max_duration_s}s"),
        ("simulated duration", f"{s.sim_duration_s}s" if s.sim_duration_s else "-"),
        ("priority", s.priority), ("image", s.image or "-"),
        ("command", " ".join(s.command) or "-"),
        ("labels", ", ".join(f"{k}={v}" for k, v in s.labels.items()) or "-"),
        ("reserved", money(j.reserved)), ("created", when(j.created_at)),
        ("admitted", when(j.admitted_at)), ("started", when(j.started_at)),
        ("finished", when(j.finished_at)), ("idempotency key", j.idempotency_key or "-"),
    ]
    t.add_row("state", state(j.state))
    for k, v in rows:
        t.add_row(k, cell(v))
    return t


def usage_table(rows: Iterable[UsageRow], title: str = "ledger rows", *,
                cause: bool = False) -> Table:
    t = Table(title=title)
    cols = ["row", "workload", "flavor", "gpus", "start", "end", "GPU-s", "price/GPU-s",
            "cost"] + (["cause"] if cause else [])
    for col in cols:
        t.add_column(col, justify="right" if col in ("row", "gpus", "GPU-s", "cost") else "left")
    for r in rows:
        t.add_row(str(r.row_id), cell(r.workload_id), cell(r.flavor), str(r.gpus),
                  when(r.start), when(r.end), f"{r.gpu_us / 1e6:,.6f}",
                  money(r.price_per_gpu_s), money(r.cost), *([cell(r.cause_id)] if cause else []))
    return t


def key_table(k: ApiKey) -> Table:
    t = Table(title=f"API key {k.key_id}")
    for col in ("key", "tenant", "name", "created", "revoked"):
        t.add_column(col)
    t.add_row(cell(k.key_id), cell(k.tenant), cell(k.name), when(k.created_at),
              when(k.revoked_at))
    return t

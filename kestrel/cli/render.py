"""Rich tables for the SDK's dataclasses (the CLI's default, human output)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal

from rich.table import Table

from kestrel.cli._common import cell
from kestrel.money import fmt
from kestrel.sdk import ApiKey, Job, JobState, Runway, Tenant, UsageRow

_STATE_STYLE = {
    JobState.HELD: "yellow", JobState.ADMITTED: "cyan", JobState.QUEUED: "cyan",
    JobState.RUNNING: "bold blue", JobState.SUCCEEDED: "green", JobState.FAILED: "red",
    JobState.CANCELLED: "magenta", JobState.EVICTED: "red", JobState.REJECTED: "red",
}


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value is not None else "-"


def money(value: Decimal) -> str:
    return fmt(value)


def state(s: JobState) -> str:
    return f"[{_STATE_STYLE.get(s, 'default')}]{s.value}[/]"


def runway_text(r: Runway) -> str:
    return "unlimited" if r.unlimited or r.runway_s is None else f"{r.runway_s:,.1f}s"


def runway_table(r: Runway) -> Table:
    t = Table(title=f"runway of {r.tenant}")
    for col in ("credits", "charged", "reserved", "remaining", "burn/s", "runway", "GPUs"):
        t.add_column(col, justify="right")
    t.add_row(money(r.credits), money(r.charged), money(r.reserved), money(r.remaining),
              money(r.burn_per_s), runway_text(r), str(r.running_gpus))
    return t


def _quota(q: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in q.items()) or "-"


def tenants_table(tenants: Iterable[Tenant], title: str = "tenants") -> Table:
    t = Table(title=title)
    for col in ("tenant", "name", "GPU quota", "rate/s", "burst", "status", "created"):
        t.add_column(col)
    for x in tenants:
        t.add_row(cell(x.tenant), cell(x.display_name), cell(_quota(x.gpu_quota)),
                  f"{x.rate_per_s:g}", str(x.burst),
                  "[red]suspended[/]" if x.suspended else "[green]active[/]",
                  when(x.created_at))
    return t


def jobs_table(jobs: Iterable[Job], title: str = "jobs") -> Table:
    t = Table(title=title)
    for col in ("job", "name", "state", "GPUs", "flavor", "max", "reserved", "created",
                "reason"):
        t.add_column(col, justify="right" if col in ("GPUs", "max", "reserved") else "left")
    for j in jobs:
        t.add_row(cell(j.job_id), cell(j.spec.name), state(j.state), str(j.spec.gpus),
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


def usage_table(rows: Iterable[UsageRow], title: str = "ledger rows") -> Table:
    t = Table(title=title)
    for col in ("row", "workload", "flavor", "gpus", "start", "end", "GPU-s", "price/GPU-s",
                "cost"):
        t.add_column(col, justify="right" if col in ("row", "gpus", "GPU-s", "cost") else "left")
    for r in rows:
        t.add_row(str(r.row_id), cell(r.workload_id), cell(r.flavor), str(r.gpus),
                  when(r.start), when(r.end), f"{r.gpu_us / 1e6:,.6f}",
                  money(r.price_per_gpu_s), money(r.cost))
    return t


def key_table(k: ApiKey) -> Table:
    t = Table(title=f"API key {k.key_id}")
    for col in ("key", "tenant", "name", "created", "revoked"):
        t.add_column(col)
    t.add_row(cell(k.key_id), cell(k.tenant), cell(k.name), when(k.created_at),
              when(k.revoked_at))
    return t

"""Tenant commands through the gateway (API key): submit, jobs, job, cancel, watch,
runway and usage."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape

from kestrel_sdk import Job
from kestrel_sdk.cli import render
from kestrel_sdk.cli._common import (
    AsJson,
    LimitOpt,
    OutputOpt,
    StatesOpt,
    client,
    err_console,
    parse_duration,
    parse_pairs,
    parse_states,
    print_data,
    want_data,
)

JobId = Annotated[str, typer.Argument(help="job id")]


def submit(ctx: typer.Context,
           name: Annotated[str, typer.Option(help="job name: a-z, 0-9 and -")],
           gpus: Annotated[int, typer.Option(help="whole GPUs")],
           max_duration: Annotated[int, typer.Option(
               "--max-duration", parser=parse_duration, metavar="DURATION",
               help="hard upper bound of the run: seconds, or 90s, 15m, 2h; the budget "
                    "reserved is gpus x max duration x price")],
           command: Annotated[list[str] | None, typer.Argument(
               help="command to run, after --", show_default=False)] = None,
           flavor: Annotated[str, typer.Option(help="preferred flavor, e.g. gpu-h100")] = "",
           image: Annotated[str, typer.Option(help="container image (CPU work)")] = "",
           priority: Annotated[int, typer.Option(
               help="higher runs first among held jobs")] = 0,
           label: Annotated[list[str] | None, typer.Option(
               "--label", metavar="KEY=VALUE", help="repeatable")] = None,
           sim_duration: Annotated[int, typer.Option(
               "--sim-duration", parser=parse_duration, metavar="DURATION",
               help="simulated run time on a fake GPU node")] = 0,
           idempotency_key: Annotated[str, typer.Option(
               "--idempotency-key", help="the same key returns the same job")] = "",
           as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Submit a job. It is admitted, held or rejected against the tenant's runway."""
    labels = parse_pairs(label or [], "--label")
    with client(ctx) as c:
        job = c.submit_job(name=name, gpus=gpus, max_duration_s=max_duration, flavor=flavor,
                           image=image, command=tuple(command or ()), priority=priority,
                           labels=labels, sim_duration_s=sim_duration,
                           idempotency_key=idempotency_key)
    render.show(ctx, job, lambda: [render.job_table(job)], as_json=as_json, output=output)


def jobs(ctx: typer.Context,
         state: StatesOpt = None, limit: LimitOpt = 100,
         as_json: AsJson = False, output: OutputOpt = None) -> None:
    """The tenant's jobs."""
    states = parse_states(state or [])
    with client(ctx) as c:
        found = list(itertools.islice(c.list_jobs(states, page_size=min(limit, 1000)), limit))
    render.show(ctx, found, lambda: [render.jobs_table(found)], as_json=as_json,
                output=output)


def job(ctx: typer.Context, job_id: JobId, as_json: AsJson = False,
        output: OutputOpt = None) -> None:
    """One job in detail."""
    with client(ctx) as c:
        j = c.get_job(job_id)
    render.show(ctx, j, lambda: [render.job_table(j)], as_json=as_json, output=output)


def cancel(ctx: typer.Context, job_id: JobId,
           reason: Annotated[str, typer.Option(help="why, shown on the job")] = "",
           as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Cancel a job; its unused reservation returns to the runway."""
    with client(ctx) as c:
        j = c.cancel_job(job_id, reason)
    render.show(ctx, j, lambda: [render.job_table(j)], as_json=as_json, output=output)


def _change_line(j: Job) -> str:
    now = render.when(datetime.now(UTC))
    reason = f"  {escape(j.reason)}" if j.reason else ""
    flavor = f"  on {escape(j.flavor)}" if j.flavor else ""
    return f"{now}  {escape(j.job_id)}  {render.state(j.state)}{flavor}{reason}"


def watch(ctx: typer.Context, job_id: JobId,
          as_json: Annotated[bool, typer.Option(
              "--json", help="one JSON object per line (same as -o json)")] = False,
          output: OutputOpt = None) -> None:
    """Print each state change of a job until it ends.

    Ends at succeeded, failed, cancelled, evicted or rejected."""
    json_lines = want_data(ctx, as_json, output)
    console = render.out()
    last: Job | None = None
    with client(ctx) as c:
        for snapshot in c.watch_job(job_id):
            if last is not None and (snapshot.state, snapshot.reason, snapshot.flavor) == (
                    last.state, last.reason, last.flavor):
                continue
            last = snapshot
            if json_lines:
                print_data(ctx, snapshot, as_json=as_json, output=output, lines=True)
            else:
                console.print(_change_line(snapshot), soft_wrap=True, highlight=False)
    if last is None or not last.terminal:
        seen = last.state.value if last is not None else "nothing"
        err_console.print(f"[yellow]warning[/] the gateway ended the watch of "
                          f"{escape(job_id)} before a terminal state (last seen: {seen})",
                          soft_wrap=True)
        raise typer.Exit(1)


def runway(ctx: typer.Context, as_json: AsJson = False, output: OutputOpt = None) -> None:
    """The tenant's budget: how long the money lasts at the current burn, and what is
    still free to reserve for new jobs (with credits, charged, reserved, burn)."""
    with client(ctx) as c:
        r = c.runway()
    render.show(ctx, r, lambda: render.runway_parts(r), as_json=as_json, output=output)


def usage(ctx: typer.Context,
          start_us: Annotated[int, typer.Option(
              "--start-us", min=0, help="rows ending after this instant (0: unbounded)")] = 0,
          end_us: Annotated[int, typer.Option(
              "--end-us", min=0, help="rows starting before this instant (0: unbounded)")] = 0,
          workload: Annotated[str, typer.Option(help="only rows of this job/workload")] = "",
          limit: Annotated[int, typer.Option(min=1, help="show at most N rows")] = 100,
          as_json: AsJson = False, output: OutputOpt = None) -> None:
    """The tenant's ledger rows (what was metered, oldest first)."""
    with client(ctx) as c:
        rows = list(itertools.islice(
            c.usage(start_us, end_us, workload, page_size=min(limit, 1000)), limit))
    render.show(ctx, rows, lambda: [render.usage_table(rows)], as_json=as_json,
                output=output)

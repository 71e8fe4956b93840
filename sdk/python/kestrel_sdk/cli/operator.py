"""Operator commands through the gateway (operator token): `kestrel tenants ...`,
`kestrel keys ...` and `kestrel top-up`."""

from __future__ import annotations

import itertools
from typing import Annotated

import typer
from rich.markup import escape

from kestrel_sdk import Tenant, TopUpResult
from kestrel_sdk.cli import render
from kestrel_sdk.cli._common import (
    AsJson,
    LimitOpt,
    OutputOpt,
    StatesOpt,
    client,
    err_console,
    parse_quota,
    parse_signed_amount,
    parse_states,
    print_data,
    want_data,
)

tenants = typer.Typer(help="Operator: create, inspect, suspend and resume tenants.",
                      no_args_is_help=True)
keys = typer.Typer(help="Operator: issue and revoke tenant API keys.", no_args_is_help=True)

TenantArg = Annotated[str, typer.Argument(help="tenant id, e.g. acme")]


def _show_tenant(ctx: typer.Context, t: Tenant, as_json: bool,
                 output: OutputOpt = None) -> None:
    render.show(ctx, t, lambda: [render.tenants_table([t], title=f"tenant {t.tenant}"),
                                 *(render.runway_parts(t.runway) if t.runway else [])],
                as_json=as_json, output=output)


@tenants.command("create")
def create(ctx: typer.Context, tenant: TenantArg,
           credits: Annotated[str, typer.Option(
               "--credits", help="first credits, a decimal (none when omitted)")] = "",
           quota: Annotated[list[str] | None, typer.Option(
               "--quota", metavar="FLAVOR=GPUS",
               help="GPU quota per flavor, repeatable: --quota gpu-h100=8; a cap unless "
                    "--borrow lets the tenant go beyond it")] = None,
           borrow: Annotated[list[str] | None, typer.Option(
               "--borrow", metavar="FLAVOR=GPUS",
               help="GPUs it may borrow beyond its quota from other tenants' idle quota, "
                    "repeatable: --borrow gpu-h100=8 (default: none)")] = None,
           rate_per_s: Annotated[float, typer.Option(
               "--rate", help="API requests per second (token bucket rate)")] = 10.0,
           burst: Annotated[int, typer.Option(help="API request burst")] = 20,
           display_name: Annotated[str, typer.Option("--display-name")] = "",
           as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Create TENANT with its GPU quota, API rate limit and first credits."""
    gpu_quota = parse_quota(quota or [])
    gpu_borrow = parse_quota(borrow or [], "--borrow")
    with client(ctx) as c:
        t = c.create_tenant(tenant, display_name=display_name, gpu_quota=gpu_quota,
                            rate_per_s=rate_per_s, burst=burst, initial_credits=credits,
                            gpu_borrow=gpu_borrow)
    _show_tenant(ctx, t, as_json, output)


@tenants.command("get")
def get(ctx: typer.Context, tenant: TenantArg, as_json: AsJson = False,
        output: OutputOpt = None) -> None:
    """Show TENANT and its runway."""
    with client(ctx) as c:
        t = c.get_tenant(tenant)
    _show_tenant(ctx, t, as_json, output)


@tenants.command("list")
def list_(ctx: typer.Context, as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Every tenant."""
    with client(ctx) as c:
        found = list(c.list_tenants())
    render.show(ctx, found, lambda: [render.tenants_table(found)], as_json=as_json,
                output=output)


@tenants.command("jobs")
def jobs(ctx: typer.Context,
         tenant: Annotated[str, typer.Argument(help="only this tenant's (default: every "
                                                    "tenant's)")] = "",
         state: StatesOpt = None, limit: LimitOpt = 100,
         as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Every tenant's jobs, or TENANT's, in submission order (the operator's view)."""
    states = parse_states(state or [])
    with client(ctx) as c:
        found = list(itertools.islice(
            c.list_all_jobs(tenant, states, page_size=min(limit, 1000)), limit))
    title = f"jobs of {tenant}" if tenant else "jobs of every tenant"
    render.show(ctx, found, lambda: [render.jobs_table(found, title, with_tenant=True)],
                as_json=as_json, output=output)


def _suspend(ctx: typer.Context, tenant: str, suspended: bool, reason: str,
             as_json: bool, output: OutputOpt) -> None:
    with client(ctx) as c:
        t = c.suspend_tenant(tenant, suspended=suspended, reason=reason)
    _show_tenant(ctx, t, as_json, output)


Reason = Annotated[str, typer.Option(help="why, for the audit trail")]


@tenants.command("suspend")
def suspend(ctx: typer.Context, tenant: TenantArg, reason: Reason = "",
            as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Suspend TENANT: its keys stop working for new work until resumed."""
    _suspend(ctx, tenant, True, reason, as_json, output)


@tenants.command("resume")
def resume(ctx: typer.Context, tenant: TenantArg, reason: Reason = "",
           as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Lift the suspension of TENANT."""
    _suspend(ctx, tenant, False, reason, as_json, output)


@keys.command("create")
def key_create(ctx: typer.Context, tenant: TenantArg,
               name: Annotated[str, typer.Option(help="label of the key")] = "default",
               as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Issue an API key for TENANT. The secret is printed once and cannot be shown again."""
    with client(ctx) as c:
        created = c.create_api_key(tenant, name)
    warning = ("this secret is shown once and cannot be shown again: store it now "
               "(e.g. export KESTREL_API_KEY=...)")
    if want_data(ctx, as_json, output):
        print_data(ctx, created, as_json=as_json, output=output)
        err_console.print(f"[yellow]warning[/] {warning}", soft_wrap=True)
        return
    console = render.out()
    console.print(f"API key [bold]{escape(created.key_id)}[/] for tenant "
                  f"[bold]{escape(created.tenant)}[/] ({escape(created.name)})", soft_wrap=True)
    console.print(escape(created.secret), highlight=False, soft_wrap=True)
    err_console.print(f"[yellow]warning[/] {warning}", soft_wrap=True)


@keys.command("revoke")
def key_revoke(ctx: typer.Context, key_id: Annotated[str, typer.Argument(help="key id")],
               as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Revoke an API key: calls with it are refused from now on."""
    with client(ctx) as c:
        key = c.revoke_api_key(key_id)
    render.show(ctx, key, lambda: [render.key_table(key)], as_json=as_json, output=output)


def _show_credits(ctx: typer.Context, result: TopUpResult, what: str, as_json: bool,
                  output: OutputOpt) -> None:
    render.show(ctx, result, lambda: [
        "applied" if result.applied else f"already applied (same {what} id)",
        *render.runway_parts(result.runway)], as_json=as_json, output=output)


def top_up(ctx: typer.Context, tenant: TenantArg,
           amount: Annotated[str, typer.Argument(help="credits to add, a decimal")],
           top_up_id: Annotated[str, typer.Option(
               "--top-up-id", help="makes a retry safe: the same id applies once")] = "",
           note: Annotated[str, typer.Option()] = "", as_json: AsJson = False,
           output: OutputOpt = None) -> None:
    """Operator: add AMOUNT credits to TENANT (through the gateway and the meter)."""
    with client(ctx) as c:
        result = c.top_up(tenant, amount, top_up_id or None, note)
    _show_credits(ctx, result, "top-up", as_json, output)


# A negative AMOUNT looks like an option to the parser (-0.6 would be "-0" with
# ".6"): this command passes tokens it does not know as options on as arguments,
# and the AMOUNT's parser then refuses anything that is not a signed decimal.
SIGNED = {"ignore_unknown_options": True}


def adjust(ctx: typer.Context, tenant: TenantArg,
           amount: Annotated[str, typer.Argument(
               parser=parse_signed_amount, metavar="AMOUNT",
               help="signed credits: -50 lowers the budget, 20 raises it")],
           note: Annotated[str, typer.Option(help="why the budget changes (required)")],
           adjust_id: Annotated[str, typer.Option(
               "--adjust-id", help="makes a retry safe: the same id applies once")] = "",
           as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Operator: correct TENANT's budget by a signed AMOUNT (an append-only credits row).
    Below what is spent, the tenant's running work is evicted."""
    if tenant.startswith("-"):
        raise typer.BadParameter(f"no such option {tenant!r}", param_hint="TENANT")
    with client(ctx) as c:
        result = c.adjust_credits(tenant, amount, note, adjust_id or None)
    _show_credits(ctx, result, "adjust", as_json, output)

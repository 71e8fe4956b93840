"""`kestrel endpoints ...` (API key): create, list, show, delete, infer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

import typer
from rich.table import Table

from kestrel_sdk import Endpoint
from kestrel_sdk.cli import render
from kestrel_sdk.cli._common import AsJson, OutputOpt, cell, client

app = typer.Typer(help="Inference endpoints of the tenant: replicas on the CPU pool (a real "
                       "kubelet) or on a GPU flavor (simulated: KWOK pods, answered by host "
                       "stand-ins)", no_args_is_help=True)
EndpointId = Annotated[str, typer.Argument(help="endpoint id (ep-...)")]


def endpoints_table(items: Iterable[Endpoint], title: str = "endpoints") -> Table:
    t = Table(title=title)
    for col in ("endpoint", "name", "model", "flavor", "ready", "replicas", "created",
                "reason"):
        t.add_column(col)
    for e in items:
        flavor = e.flavor or "by runway"
        if e.flavor_replicas and set(e.flavor_replicas) != {e.flavor}:
            flavor = " + ".join(f"{n} {f}" for f, n in e.flavor_replicas.items())
        elif e.flavors:
            flavor += f" (may use {', '.join(e.flavors)})"
        t.add_row(cell(e.endpoint_id), cell(e.name), cell(e.model),
                  cell(f"{flavor} (simulated)" if e.simulated else flavor),
                  str(e.ready_replicas), f"{e.min_replicas}..{e.max_replicas}",
                  render.when(e.created_at), cell(e.reason))
    return t


@app.command()
def create(ctx: typer.Context, name: Annotated[str, typer.Argument(help="a-z, 0-9 and -")],
           min_replicas: Annotated[int, typer.Option("--min-replicas", min=0)] = 0,
           max_replicas: Annotated[int, typer.Option("--max-replicas", min=0)] = 1,
           flavor: Annotated[str, typer.Option(
               help="cpu (the CPU pool, a real kubelet) or a GPU flavor (simulated); "
                    "empty: a GPU flavor chosen by runway")] = "",
           also: Annotated[list[str] | None, typer.Option(
               "--also-flavor", help="another flavor its replicas may run on (repeat): the "
                                     "autoscaler picks the mix by cost per request")] = None,
           target_p95_ms: Annotated[int, typer.Option("--target-p95-ms", min=0)] = 0,
           missed_slo_value: Annotated[str, typer.Option(
               "--missed-slo-value", help="credits a second of missed p95 is worth: sizes "
                                          "the warm replica from cost")] = "",
           as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Create an endpoint serving all-MiniLM-L6-v2. With a cluster its replicas start at
    once, each reserving its cost for the endpoint's horizon; without one, start a
    replica on this host with KESTREL_WORKER_ENDPOINT=<endpoint id> python -m
    services.worker."""
    with client(ctx) as c:
        e = c.create_endpoint(name, min_replicas=min_replicas, max_replicas=max_replicas,
                              flavor=flavor, flavors=also or (), target_p95_ms=target_p95_ms,
                              missed_slo_value_per_s=missed_slo_value)
    render.show(ctx, e, lambda: [endpoints_table([e], "endpoint")], as_json=as_json,
                output=output)


@app.command("list")
def list_(ctx: typer.Context, as_json: AsJson = False, output: OutputOpt = None) -> None:
    """The tenant's endpoints."""
    with client(ctx) as c:
        found = c.list_endpoints()
    render.show(ctx, found, lambda: [endpoints_table(found)], as_json=as_json, output=output)


@app.command()
def show(ctx: typer.Context, endpoint_id: EndpointId, as_json: AsJson = False,
         output: OutputOpt = None) -> None:
    """One endpoint, with its ready replicas (those heartbeating)."""
    with client(ctx) as c:
        e = c.get_endpoint(endpoint_id)
    render.show(ctx, e, lambda: [endpoints_table([e], "endpoint")], as_json=as_json,
                output=output)


@app.command()
def delete(ctx: typer.Context, endpoint_id: EndpointId) -> None:
    """Delete an endpoint: its calls answer NOT_FOUND from then on."""
    with client(ctx) as c:
        deleted = c.delete_endpoint(endpoint_id)
    render.out().print(f"{endpoint_id} deleted" if deleted else f"{endpoint_id} was already "
                       "deleted", highlight=False)


@app.command()
def infer(ctx: typer.Context, endpoint_id: EndpointId,
          text: Annotated[list[str], typer.Argument(help="texts to embed")],
          priority: Annotated[str, typer.Option(help="low, normal or high")] = "normal",
          timeout: Annotated[float, typer.Option("--wait", min=0.001,
                                                 help="seconds to wait")] = 10.0,
          as_json: AsJson = False, output: OutputOpt = None) -> None:
    """Embed TEXT... on the endpoint: one unit vector of 384 floats per text."""
    with client(ctx) as c:
        r = c.infer(endpoint_id, text, priority=priority, timeout_s=timeout)

    def human() -> list[Table]:
        on = f"{r.replica} (simulated GPU replica)" if r.simulated else r.replica
        t = Table(title=f"{r.model} on {on}: {r.latency_ms:.1f} ms batch, "
                        f"{r.queue_ms:.1f} ms queued")
        for col in ("#", "text", "vector (first 4 of 384)", "truncated"):
            t.add_column(col)
        for i, (s, v) in enumerate(zip(text, r.embeddings, strict=True)):
            t.add_row(str(i), cell(s[:60]), " ".join(f"{x:+.3f}" for x in v[:4]),
                      f"yes, at {r.max_input_tokens} word pieces" if i in r.truncated else "")
        return [t]

    render.show(ctx, r, human, as_json=as_json, output=output)

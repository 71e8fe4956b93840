"""The `kestrel` command line.

- tenant commands (API key): submit, jobs, job, cancel, watch, runway, usage,
  endpoints ...
- operator commands (operator token): tenants ..., keys ..., top-up
- `kestrel meter ...`: operator commands straight to the meter
- `kestrel tap`: print bus messages, where the server distribution is installed (it adds
  the command through the `kestrel_sdk.commands` entry points)

- `kestrel config ...`: contexts (kestrel_sdk.cli.config), `kestrel --version`, shell
  completion (`kestrel --install-completion`)

Tenant and operator commands use the Python SDK (`kestrel_sdk.Client`) against the
gateway. Exit status: 0 done; 1 the API refused or failed (one line on stderr, the
gRPC status name first); 2 a usage error. Every listing and show command prints a
table (never cut when stdout is not a terminal), or with `-o json` (`--json`) JSON for
scripts, `-o yaml` YAML, or with `-o wide` a table never cut at all. Settings: a flag,
else its KESTREL_* variable, else the context (`--context`, else the current one).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
from typing import Annotated

import typer

from kestrel_sdk import ENV_ADDRESS, ENV_API_KEY, ENV_OPERATOR_TOKEN
from kestrel_sdk.cli import config, endpoints, meter, operator, tenant
from kestrel_sdk.cli._common import Globals, OutputOpt

app = typer.Typer(help="Kestrel: runway-aware GPU compute. Operator and tenant commands.",
                  no_args_is_help=True, add_completion=True)

TENANT = "Tenant (API key)"
OPERATOR = "Operator (operator token)"


def version() -> str:
    try:
        return importlib.metadata.version("kestrel-sdk")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        print(f"kestrel {version()}")
        raise typer.Exit(0)


@app.callback()
def _globals(
    ctx: typer.Context,
    gateway: Annotated[str | None, typer.Option(
        "--gateway", envvar=ENV_ADDRESS, show_default=False,
        help="gateway address host:port [default: 127.0.0.1:50051]")] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar=ENV_API_KEY, show_default=False,
        help="tenant API key (prefer the environment variable)")] = None,
    operator_token: Annotated[str | None, typer.Option(
        "--operator-token", envvar=ENV_OPERATOR_TOKEN, show_default=False,
        help="operator token (prefer the environment variable)")] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0.001, help="seconds per call")] = 10.0,
    as_json: Annotated[bool, typer.Option(
        "--json", help="JSON output for every command (same as -o json)")] = False,
    output: OutputOpt = None,
    context: Annotated[str | None, typer.Option(
        "--context", envvar="KESTREL_CONTEXT", show_default=False,
        help="the context of ~/.config/kestrel/config.toml to use [default: its current]")]
        = None,
    _version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="print the version and exit")] = False,
) -> None:
    if ctx.invoked_subcommand == "config":
        ctx.obj = Globals(timeout_s=timeout, json=as_json, output=output, context=context)
        return
    s = config.resolve({"gateway": gateway, "api-key": api_key,
                        "operator-token": operator_token}, context)
    ctx.obj = Globals(gateway=s["gateway"], api_key=s["api-key"],
                      operator_token=s["operator-token"], timeout_s=timeout, json=as_json,
                      output=output, context=context)


for _fn in (tenant.submit, tenant.jobs, tenant.job, tenant.cancel, tenant.watch,
            tenant.runway, tenant.usage):
    app.command(rich_help_panel=TENANT)(_fn)
app.add_typer(endpoints.app, name="endpoints", rich_help_panel=TENANT)
app.add_typer(operator.tenants, name="tenants", rich_help_panel=OPERATOR)
app.add_typer(operator.keys, name="keys", rich_help_panel=OPERATOR)
app.command("top-up", rich_help_panel=OPERATOR)(operator.top_up)
app.command("adjust", rich_help_panel=OPERATOR,
            context_settings=operator.SIGNED)(operator.adjust)
app.add_typer(meter.app, name="meter", rich_help_panel=OPERATOR)
app.add_typer(config.app, name="config")

# Commands another distribution adds: the server's `kestrel tap` needs its NATS client,
# which this distribution does not install. An entry point that cannot load is left out.
PLUGINS = "kestrel_sdk.commands"
for _ep in importlib.metadata.entry_points(group=PLUGINS):
    with contextlib.suppress(ImportError):
        app.command(_ep.name, rich_help_panel=OPERATOR)(_ep.load())


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()

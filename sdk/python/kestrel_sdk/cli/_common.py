"""What every command of the `kestrel` CLI shares: the global options, the SDK client,
output options (tables, wide tables or JSON; kestrel_sdk.cli.render prints them), argument
parsers and the one way errors are shown."""

from __future__ import annotations

import contextlib
import enum
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import grpc
import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.text import Text

from kestrel_sdk import Client, JobState, KestrelError, MissingCredential, to_jsonable

err_console = Console(stderr=True)


class Output(enum.StrEnum):
    TABLE = "table"  # the terminal's width; never cut when stdout is not a terminal
    WIDE = "wide"    # never cut, even on a terminal
    JSON = "json"    # machine-readable, money as exact decimal strings
    YAML = "yaml"    # the same data as JSON, in YAML


# Exit statuses, as CLIs have them: 0 done, 1 the API (or the config file) refused or
# failed, 2 the command line was wrong (click's own usage errors are 2 as well).
EXIT_API, EXIT_USAGE = 1, 2


AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table "
                                                    "(same as -o json)")]
OutputOpt = Annotated[Output | None, typer.Option(
    "--output", "-o", case_sensitive=False, show_default=False,
    help="table (default), wide (never cut at the terminal's width), json or yaml")]
# The job listings' filters (`kestrel jobs`, `kestrel tenants jobs`).
StatesOpt = Annotated[list[str] | None, typer.Option(
    "--state", help="only jobs in this state, repeatable: held, running, ...")]
LimitOpt = Annotated[int, typer.Option(min=1, help="show at most N jobs")]


@dataclass(frozen=True)
class Globals:
    gateway: str | None = None
    api_key: str | None = None
    operator_token: str | None = None
    timeout_s: float = 10.0
    json: bool = False
    output: Output | None = None
    context: str | None = None


def globals_of(ctx: typer.Context) -> Globals:
    found = ctx.find_object(Globals)
    return found if found is not None else Globals()


def make_client(g: Globals) -> Client:
    """The SDK client for the global options (tests replace this function)."""
    return Client(g.gateway, api_key=g.api_key, operator_token=g.operator_token,
                  timeout_s=g.timeout_s)


@contextlib.contextmanager
def client(ctx: typer.Context) -> Iterator[Client]:
    """An SDK client whose failures end the command with one sentence on stderr: exit
    status 1 for what the API answered (its gRPC status name first), 2 for a missing
    credential (the command line's fault)."""
    g = globals_of(ctx)
    c = make_client(g)
    try:
        yield c
    except MissingCredential as exc:
        fail(f"{exc.code_name}: no {exc.what}: pass --{exc.kwarg.replace('_', '-')}, "
             f"set {exc.envvar} or use a context (kestrel config)", status=EXIT_USAGE)
    except KestrelError as exc:
        hint = ""
        if exc.code == grpc.StatusCode.UNAVAILABLE:
            hint = (f" (gateway {c.address}; set --gateway or KESTREL_GATEWAY_ADDR)")
        fail(f"{exc}{hint}")
    finally:
        c.close()


def fail(message: str, status: int = EXIT_API) -> NoReturn:
    """Print `error <message>` on stderr as one line and exit."""
    err_console.print(Text.assemble(("error", "bold red"), " ", message), soft_wrap=True)
    raise typer.Exit(status)


def output_of(ctx: typer.Context, as_json: bool = False,
              output: Output | None = None) -> Output:
    """The command's own choice wins, then the global one; tables by default."""
    g = globals_of(ctx)
    if as_json:
        return Output.JSON
    if output is not None:
        return output
    if g.json:
        return Output.JSON
    return g.output or Output.TABLE


def jsonable(value: Any) -> Any:
    """SDK dataclasses, protobuf messages, or lists of them, as JSON-ready values."""
    if isinstance(value, Message):
        return json_format.MessageToDict(value, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return to_jsonable(value)


def print_data(ctx: typer.Context, value: Any, *, as_json: bool = False,
               output: Output | None = None, lines: bool = False) -> None:
    """JSON or YAML of the value, as the command's output options say (JSON when
    neither names YAML)."""
    if output_of(ctx, as_json, output) is Output.YAML:
        print_yaml(value, lines=lines)
    else:
        print_json(value, lines=lines)


def print_yaml(value: Any, *, lines: bool = False) -> None:
    """The JSON data as YAML; with `lines`, one document per value (a stream)."""
    import yaml

    text = yaml.safe_dump(jsonable(value), sort_keys=False, allow_unicode=True)
    print(("---\n" if lines else "") + text, end="", flush=lines)


def want_data(ctx: typer.Context, as_json: bool, output: Output | None = None) -> bool:
    """JSON or YAML rather than a table."""
    return output_of(ctx, as_json, output) in (Output.JSON, Output.YAML)


def print_json(value: Any, *, lines: bool = False) -> None:
    """JSON of SDK dataclasses or protobuf messages (or lists of them); Decimal stays an
    exact string, and a message's zero fields are printed, not left out."""
    data = jsonable(value)
    text = json.dumps(data, separators=(",", ":")) if lines else json.dumps(data, indent=2)
    print(text, flush=lines)


def cell(value: object) -> Text:
    """Table cell text taken literally (server strings are never rich markup)."""
    return Text("" if value is None else str(value))


# --- argument parsers: raise typer.BadParameter, shown as a usage error (exit 2) -----


def parse_pairs(values: Iterable[str], option: str) -> dict[str, str]:
    """KEY=VALUE options (repeatable) as a dict; a key given twice is an error."""
    out: dict[str, str] = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        key = key.strip()
        if not sep or not key:
            raise typer.BadParameter(f"{raw!r} is not KEY=VALUE", param_hint=option)
        if key in out:
            raise typer.BadParameter(f"{key!r} is given twice", param_hint=option)
        out[key] = value
    return out


def parse_quota(values: Iterable[str], option: str = "--quota") -> dict[str, int]:
    out: dict[str, int] = {}
    for flavor, count in parse_pairs(values, option).items():
        try:
            n = int(count)
        except ValueError:
            n = -1
        if n < 0:
            raise typer.BadParameter(f"{flavor}={count!r}: the GPU count must be a whole "
                                     "number >= 0", param_hint=option)
        out[flavor] = n
    return out


def parse_states(values: Iterable[str]) -> list[JobState]:
    states: list[JobState] = []
    for v in values:
        try:
            states.append(JobState.parse(v))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--state") from None
    return states


_SIGNED = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")


def parse_signed_amount(text: str) -> str:
    """A signed decimal such as -50, -0.6 or 20, passed on as text (the server checks
    its range and places)."""
    value = text.strip()
    if not _SIGNED.match(value):
        raise typer.BadParameter(f"{text!r} is not a signed decimal such as -50 or 20")
    return value


_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | int) -> int:
    """Whole seconds from '90', '90s', '15m', '2h' or '1d'."""
    if isinstance(text, int):  # an option's default
        return text
    m = _DURATION.match(text.lower())
    if not m:
        raise typer.BadParameter(f"{text!r} is not a duration such as 600, 90s, 15m or 2h")
    return int(m.group(1)) * _UNIT_S[m.group(2)]

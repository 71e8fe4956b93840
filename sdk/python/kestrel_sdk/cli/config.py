"""Contexts: named sets of connection settings in `~/.config/kestrel/config.toml`
(`$XDG_CONFIG_HOME/kestrel/config.toml`; `KESTREL_CONFIG` names another file), as
kubectl's contexts are:

    current-context = "local"

    [contexts.local]
    gateway = "127.0.0.1:50051"
    api-key = "ks_..."
    operator-token = "kso_..."
    tls-ca-file = "/etc/kestrel/ca.pem"        # verify the gateway
    tls-cert-file = "..."                      # and present a client certificate
    tls-key-file = "..."

A flag wins, then a `KESTREL_*` variable, then the current context (or the one
`--context` names), then the built-in default. The file holds secrets: it is written
0600 and read only by its owner's commands. Reading uses the standard library's
tomllib, writing tomli-w.
"""

from __future__ import annotations

import os
import stat
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tomli_w
import typer

from kestrel_sdk.cli._common import OutputOpt, fail, output_of, print_data
from kestrel_sdk.cli.render import out
from kestrel_sdk.tls import CA, CERT, KEY

app = typer.Typer(help="Contexts: named gateway addresses and credentials "
                       "(~/.config/kestrel/config.toml).", no_args_is_help=True)

# context key -> (the option it stands for, the environment variable that beats it)
KEYS = {"gateway": "KESTREL_GATEWAY_ADDR", "api-key": "KESTREL_API_KEY",
        "operator-token": "KESTREL_OPERATOR_TOKEN", "tls-ca-file": CA,
        "tls-cert-file": CERT, "tls-key-file": KEY}
SECRET = ("api-key", "operator-token")


class ConfigError(Exception):
    pass


def path() -> Path:
    given = os.environ.get("KESTREL_CONFIG")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kestrel" / "config.toml"


@dataclass
class Config:
    current: str
    contexts: dict[str, dict[str, str]]

    @classmethod
    def load(cls, where: Path | None = None) -> Config:
        where = where or path()
        try:
            doc = tomllib.loads(where.read_text())
        except FileNotFoundError:
            return cls("", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
        contexts = doc.get("contexts", {})
        if not isinstance(contexts, dict) or not all(
                isinstance(c, dict) for c in contexts.values()):
            raise ConfigError(f"{where}: [contexts.NAME] tables expected")
        for name, ctx in contexts.items():
            unknown = sorted(set(ctx) - set(KEYS))
            if unknown:
                raise ConfigError(f"{where}: context {name!r} has unknown keys "
                                  f"{', '.join(unknown)} (known: {', '.join(KEYS)})")
            if not all(isinstance(v, str) for v in ctx.values()):
                raise ConfigError(f"{where}: context {name!r}: every value is a string")
        current = doc.get("current-context", "")
        return cls(current if isinstance(current, str) else "",
                   {n: dict(c) for n, c in contexts.items()})

    def save(self, where: Path | None = None) -> Path:
        """Written whole to a 0600 file beside it, then renamed over it."""
        where = where or path()
        where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        doc: dict[str, Any] = {}
        if self.current:
            doc["current-context"] = self.current
        doc["contexts"] = self.contexts
        fd, tmp = tempfile.mkstemp(dir=where.parent, prefix=".config.", suffix=".toml")
        try:
            os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
            with os.fdopen(fd, "wb") as f:
                tomli_w.dump(doc, f)
            os.replace(tmp, where)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return where

    def context(self, name: str | None) -> dict[str, str]:
        """The named context, else the current one, else nothing ({})."""
        chosen = name or self.current
        if not chosen:
            return {}
        if chosen not in self.contexts:
            raise ConfigError(f"no context {chosen!r} in {path()} (kestrel config "
                              "get-contexts lists them)")
        return self.contexts[chosen]


def resolve(flags: dict[str, str | None], context: str | None) -> dict[str, str | None]:
    """Each setting from its flag (already with its KESTREL_* variable applied by the
    option), else the context. TLS files of the context go into this process's
    environment unless set there, where the SDK's channels read them."""
    try:
        ctx = Config.load().context(context)
    except ConfigError as exc:
        fail(str(exc), status=2)
    out_: dict[str, str | None] = {}
    for key in ("gateway", "api-key", "operator-token"):
        out_[key] = flags.get(key) or ctx.get(key) or None
    for key in ("tls-ca-file", "tls-cert-file", "tls-key-file"):
        if ctx.get(key) and not os.environ.get(KEYS[key]):
            os.environ[KEYS[key]] = ctx[key]
    return out_


def _masked(ctx: dict[str, str]) -> dict[str, str]:
    return {k: (v[:6] + "…" if k in SECRET and v else v) for k, v in ctx.items()}


@app.command("get-contexts")
def get_contexts(ctx: typer.Context, output: OutputOpt = None) -> None:
    """List the contexts (secrets shown by their first characters only)."""
    try:
        cfg = Config.load()
    except ConfigError as exc:
        fail(str(exc), status=2)
    rows = [{"name": n, "current": n == cfg.current, **_masked(c)}
            for n, c in sorted(cfg.contexts.items())]
    if output_of(ctx, False, output).value in ("json", "yaml"):
        print_data(ctx, rows, output=output)
        return
    from rich.table import Table

    t = Table(title=f"contexts ({path()})")
    for col in ("current", "name", "gateway", "credential", "tls"):
        t.add_column(col)
    for r in rows:
        cred = ("api key" if r.get("api-key") else "") + (
            " + operator token" if r.get("operator-token") else "")
        t.add_row("*" if r["current"] else "", str(r["name"]), str(r.get("gateway", "")),
                  cred.strip(" +") or "-", "yes" if r.get("tls-ca-file") else "no")
    out().print(t)


@app.command("current-context")
def current_context() -> None:
    """Print the current context's name."""
    try:
        cfg = Config.load()
    except ConfigError as exc:
        fail(str(exc), status=2)
    if not cfg.current:
        fail(f"no current context in {path()} (kestrel config use-context NAME)", status=1)
    print(cfg.current)


@app.command("use-context")
def use_context(name: Annotated[str, typer.Argument(help="a context of the file")]) -> None:
    """Make NAME the current context."""
    try:
        cfg = Config.load()
    except ConfigError as exc:
        fail(str(exc), status=2)
    if name not in cfg.contexts:
        fail(f"no context {name!r} in {path()}: create it with kestrel config set-context",
             status=2)
    cfg.current = name
    cfg.save()
    print(f"current context: {name}")


@app.command("set-context")
def set_context(
    name: Annotated[str, typer.Argument(help="the context to create or change")],
    gateway: Annotated[str | None, typer.Option(help="gateway address host:port")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key")] = None,
    operator_token: Annotated[str | None, typer.Option("--operator-token")] = None,
    tls_ca_file: Annotated[str | None, typer.Option("--tls-ca-file")] = None,
    tls_cert_file: Annotated[str | None, typer.Option("--tls-cert-file")] = None,
    tls_key_file: Annotated[str | None, typer.Option("--tls-key-file")] = None,
    use: Annotated[bool, typer.Option("--use", help="also make it current")] = False,
) -> None:
    """Create a context or change some of its settings (an empty value removes one)."""
    if not name.strip() or not name.isprintable():
        raise typer.BadParameter("must be a printable, non-empty name", param_hint="NAME")
    try:
        cfg = Config.load()
    except ConfigError as exc:
        fail(str(exc), status=2)
    entry = cfg.contexts.setdefault(name, {})
    given = {"gateway": gateway, "api-key": api_key, "operator-token": operator_token,
             "tls-ca-file": tls_ca_file, "tls-cert-file": tls_cert_file,
             "tls-key-file": tls_key_file}
    for key, value in given.items():
        if value is None:
            continue
        if value == "":
            entry.pop(key, None)
        else:
            entry[key] = value
    if use or not cfg.current:
        cfg.current = name
    where = cfg.save()
    print(f"context {name} saved in {where}" + (" (current)" if cfg.current == name else ""))

"""The layers of the tree, as pyproject's import-linter contracts name them (make lint
checks the imports): `kestrel/` is the runtime library the services share,
`kestrel_tools/` the local-development and operations tooling nobody at runtime may
import, and every module of the SDK (`kestrel_sdk`) is either contract (stubs, money,
budget, TLS: what the services may import) or client (what they may not), so a new SDK
module has to be placed."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SDK = REPO / "sdk" / "python" / "kestrel_sdk"
# What the server builds on: the wire contract and its arithmetic.
SDK_CONTRACT = {"kestrel_sdk.v1", "kestrel_sdk.money", "kestrel_sdk.budget", "kestrel_sdk.tls"}


def _contracts() -> dict[str, dict[str, Any]]:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {c["name"]: c for c in doc["tool"]["importlinter"]["contracts"]}


def _contract(prefix: str) -> dict[str, Any]:
    return next(c for n, c in _contracts().items() if n.startswith(prefix))


def _modules(package: Path, prefix: str) -> set[str]:
    return {f"{prefix}.{p.stem}" for p in package.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__")
            or (p.is_dir() and (p / "__init__.py").exists())}


def test_the_runtime_and_the_services_are_forbidden_the_same_things() -> None:
    services, runtime = _contract("services run"), _contract("the runtime")
    assert services["source_modules"] == ["services"]
    assert runtime["source_modules"] == ["kestrel"]
    assert "kestrel_tools" in services["forbidden_modules"]
    assert set(services["forbidden_modules"]) == set(runtime["forbidden_modules"]) - {
        "services"}


def test_every_sdk_module_is_contract_or_client_and_not_both() -> None:
    sdk_client = {m for m in _contract("services run")["forbidden_modules"]
                  if m.startswith("kestrel_sdk.")}
    modules = _modules(SDK, "kestrel_sdk")
    assert sdk_client & SDK_CONTRACT == set()
    unplaced = modules - sdk_client - SDK_CONTRACT
    assert unplaced == set(), f"place these SDK modules as contract or client: {unplaced}"
    assert (sdk_client | SDK_CONTRACT) - modules == set(), "contracts name modules that are gone"


def test_the_sdk_is_forbidden_the_whole_server() -> None:
    sdk = _contract("the SDK")
    assert sdk["source_modules"] == ["kestrel_sdk"]
    assert set(sdk["forbidden_modules"]) == {"kestrel", "kestrel_tools", "services"}


def test_every_service_is_independent_of_the_others() -> None:
    independent = next(c for c in _contracts().values() if c["type"] == "independence")
    assert set(independent["modules"]) == {
        f"services.{p.name}" for p in (REPO / "services").iterdir()
        if (p / "__init__.py").exists()}

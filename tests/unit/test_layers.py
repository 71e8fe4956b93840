"""The layers of the tree, as pyproject's import-linter contracts name them (make lint
checks the imports): every module of `kestrel/` is either runtime (what services may
import) or tooling (what they may not), and every module of the SDK (`kestrel_sdk`)
either contract (stubs, money, budget, TLS: what services may import) or client (what
they may not), so a new module has to be placed."""

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


def _modules(package: Path, prefix: str) -> set[str]:
    return {f"{prefix}.{p.stem}" for p in package.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__")
            or (p.is_dir() and (p / "__init__.py").exists())}


def test_every_kestrel_module_is_runtime_or_tooling_and_not_both() -> None:
    runtime_contract = next(c for n, c in _contracts().items() if n.startswith("the runtime"))
    runtime = set(runtime_contract["source_modules"])
    tooling = {m for m in runtime_contract["forbidden_modules"] if m.startswith("kestrel.")}
    modules = _modules(REPO / "kestrel", "kestrel")
    assert runtime & tooling == set()
    unplaced = modules - runtime - tooling
    assert unplaced == set(), f"place these in pyproject's import contracts: {unplaced}"
    assert (runtime | tooling) - modules == set(), "contracts name modules that are gone"


def test_services_are_forbidden_exactly_the_tooling() -> None:
    contracts = _contracts()
    services = next(c for n, c in contracts.items() if n.startswith("services run"))
    runtime = next(c for n, c in contracts.items() if n.startswith("the runtime"))
    assert set(services["forbidden_modules"]) == set(runtime["forbidden_modules"]) - {
        "services"}
    sdk_client = {m for m in services["forbidden_modules"] if m.startswith("kestrel_sdk.")}
    assert sdk_client & SDK_CONTRACT == set()
    unplaced = _modules(SDK, "kestrel_sdk") - sdk_client - SDK_CONTRACT
    assert unplaced == set(), f"place these SDK modules as contract or client: {unplaced}"
    independent = next(c for c in contracts.values() if c["type"] == "independence")
    assert set(independent["modules"]) == {
        f"services.{p.name}" for p in (REPO / "services").iterdir()
        if (p / "__init__.py").exists()}


def test_the_sdk_is_forbidden_the_whole_server() -> None:
    sdk = next(c for n, c in _contracts().items() if n.startswith("the SDK"))
    assert sdk["source_modules"] == ["kestrel_sdk"]
    assert set(sdk["forbidden_modules"]) == {"kestrel", "services"}

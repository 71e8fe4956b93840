"""The layers of the tree, as pyproject's import-linter contracts name them (make lint
checks the imports): every module of `kestrel/` is either runtime (what services may
import) or tooling (what they may not), so a new module has to be placed in one."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _contracts() -> dict[str, dict[str, Any]]:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {c["name"]: c for c in doc["tool"]["importlinter"]["contracts"]}


def test_every_kestrel_module_is_runtime_or_tooling_and_not_both() -> None:
    runtime_contract = next(c for n, c in _contracts().items() if n.startswith("the runtime"))
    runtime = set(runtime_contract["source_modules"])
    tooling = set(runtime_contract["forbidden_modules"]) - {"services"}
    modules = {f"kestrel.{p.stem}" for p in (REPO / "kestrel").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__")
               or (p.is_dir() and (p / "__init__.py").exists())}
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
    independent = next(c for c in contracts.values() if c["type"] == "independence")
    assert set(independent["modules"]) == {
        f"services.{p.name}" for p in (REPO / "services").iterdir()
        if (p / "__init__.py").exists()}

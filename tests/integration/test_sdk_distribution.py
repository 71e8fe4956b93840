"""The SDK installs alone (issue 48): `pip install ./sdk/python` in a fresh virtual
environment, on the oldest and the newest Python it supports, brings the client stack
and the CLI's libraries and none of the server's (stores, Kubernetes, the model
runtime); the SDK imports, and `kestrel --version` answers without the server there.

Real pip against the package registry, a real wheel build of sdk/python; slow, so one
venv per Python for the whole module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SDK = REPO / "sdk" / "python"
SERVER_ONLY = {"asyncpg", "nats-py", "kubernetes", "onnxruntime", "redis", "hiredis"}
PYTHONS = ["3.11", "3.13"]  # the bounds of sdk/python's requires-python


def _interpreter(version: str) -> str | None:
    """python<version> on PATH when it runs (a pyenv shim may not), else pyenv's own."""
    found = [shutil.which(f"python{version}")]
    found += sorted(map(str, (Path.home() / ".pyenv" / "versions").glob(
        f"{version}.*/bin/python{version}")), reverse=True)
    for exe in filter(None, found):
        if subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0:
            return exe
    return None


def _version() -> str:
    return str(tomllib.loads((SDK / "pyproject.toml").read_text())["project"]["version"])


@pytest.fixture(scope="module", params=PYTHONS)
def venv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = _interpreter(request.param)
    if exe is None:
        pytest.skip(f"no python{request.param} here (PATH, ~/.pyenv)")
    where = tmp_path_factory.mktemp(f"sdk-py{request.param}")
    subprocess.run([exe, "-m", "venv", str(where)], check=True)
    # A copy, so the build leaves nothing (build/, *.egg-info) in the tree.
    src = where / "src"
    shutil.copytree(SDK, src, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info"))
    done = subprocess.run(
        [str(where / "bin" / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return where


def _run(venv: Path, *argv: str) -> str:
    done = subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True,
                          text=True, cwd=venv)  # not the repo: its kestrel/ must not leak in
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_sdk_installs_none_of_the_servers_dependencies(venv: Path) -> None:
    listed = json.loads(_run(venv, "python", "-m", "pip", "list", "--format", "json"))
    installed = {p["name"].lower() for p in listed}
    assert "kestrel-sdk" in installed
    assert {"grpcio", "protobuf", "typer"} <= installed
    assert installed & SERVER_ONLY == set()
    assert "kestrel" not in installed  # the server distribution


def test_the_cli_prints_its_version_and_has_no_server_commands(venv: Path) -> None:
    assert _run(venv, "kestrel", "--version").strip() == f"kestrel {_version()}"
    # `kestrel tap` comes with the server distribution (its NATS client): absent here.
    assert " tap " not in _run(venv, "kestrel", "--help")


def test_the_sdk_and_its_stubs_import_without_the_server(venv: Path) -> None:
    out = _run(venv, "python", "-c", (
        "import importlib.util, sys, kestrel_sdk\n"
        "from kestrel_sdk.v1 import gateway_pb2\n"
        "assert kestrel_sdk.Client and kestrel_sdk.AsyncClient\n"
        "assert gateway_pb2.DESCRIPTOR.package == 'kestrel.v1'\n"
        "assert importlib.util.find_spec('kestrel') is None\n"
        "print(sys.version_info[:2])"))
    assert out.strip().startswith("(3, 1")


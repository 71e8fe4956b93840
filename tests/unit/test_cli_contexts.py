"""The CLI as CLIs behave: --version, exit statuses (0 done, 1 the API refused, 2 a usage
error), shell completion, contexts in a config file with flags and KESTREL_* variables
over it, and -o yaml beside json. The SDK client is the recording fake of
test_sdk_cli.py; the config file is a temporary one (KESTREL_CONFIG)."""

from __future__ import annotations

import importlib.metadata
import json
import stat
import tomllib
from pathlib import Path

import grpc
import pytest
import yaml
from typer.testing import CliRunner

from kestrel_sdk import NotFound
from kestrel_sdk.cli import _common, app
from kestrel_sdk.cli.config import Config
from tests.unit.test_sdk_cli import FakeClient

runner = CliRunner(env={"COLUMNS": "200"})


@pytest.fixture
def cfg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    where = tmp_path / "kestrel" / "config.toml"
    monkeypatch.setenv("KESTREL_CONFIG", str(where))
    for var in ("KESTREL_GATEWAY_ADDR", "KESTREL_API_KEY", "KESTREL_OPERATOR_TOKEN",
                "KESTREL_CONTEXT", "KESTREL_TLS_CA_FILE"):
        monkeypatch.delenv(var, raising=False)
    return where


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[_common.Globals]:
    """The Globals each command built its client from."""
    got: list[_common.Globals] = []

    def make(g: _common.Globals) -> FakeClient:
        got.append(g)
        return FakeClient()

    monkeypatch.setattr(_common, "make_client", make)
    return got


def test_version_prints_the_installed_distribution() -> None:
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0
    assert r.stdout.strip() == f"kestrel {importlib.metadata.version('kestrel')}"


def test_shell_completion_is_offered() -> None:
    r = runner.invoke(app, ["--help"])
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout


def test_an_api_error_is_status_1_and_a_usage_error_status_2(
        cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClient()
    fake.error = NotFound(grpc.StatusCode.NOT_FOUND, "job j-9 not found")
    monkeypatch.setattr(_common, "make_client", lambda g: fake)
    api = runner.invoke(app, ["--api-key", "k", "job", "j-9"])
    assert api.exit_code == 1 and api.stderr.strip() == "error NOT_FOUND: job j-9 not found"
    usage = runner.invoke(app, ["jobs", "--limit", "zero"])
    assert usage.exit_code == 2
    unknown = runner.invoke(app, ["no-such-command"])
    assert unknown.exit_code == 2


def test_set_context_writes_a_private_file_and_use_context_switches(cfg: Path) -> None:
    r = runner.invoke(app, ["config", "set-context", "prod", "--gateway", "gw.prod:443",
                            "--api-key", "ks_prod", "--tls-ca-file", "/etc/ca.pem"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["config", "set-context", "local", "--gateway", "127.0.0.1:50051",
                            "--operator-token", "kso_local"])
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    doc = tomllib.loads(cfg.read_text())
    assert doc["current-context"] == "prod"  # the first one made became current
    assert doc["contexts"]["local"] == {"gateway": "127.0.0.1:50051",
                                        "operator-token": "kso_local"}
    assert runner.invoke(app, ["config", "use-context", "local"]).exit_code == 0
    assert runner.invoke(app, ["config", "current-context"]).stdout.strip() == "local"
    listed = json.loads(runner.invoke(app, ["config", "get-contexts", "-o", "json"]).stdout)
    assert [(c["name"], c["current"]) for c in listed] == [("local", True), ("prod", False)]
    assert listed[1]["api-key"] == "ks_pro…"  # secrets are not printed whole
    missing = runner.invoke(app, ["config", "use-context", "staging"])
    assert missing.exit_code == 2 and "no context 'staging'" in missing.stderr
    # An empty value removes a setting.
    runner.invoke(app, ["config", "set-context", "prod", "--tls-ca-file", ""])
    assert "tls-ca-file" not in Config.load(cfg).contexts["prod"]


def test_a_flag_beats_its_variable_which_beats_the_context(
        cfg: Path, seen: list[_common.Globals], monkeypatch: pytest.MonkeyPatch) -> None:
    Config("prod", {"prod": {"gateway": "gw.prod:443", "api-key": "ks_ctx"},
                    "dev": {"gateway": "gw.dev:50051", "api-key": "ks_dev"}}).save(cfg)
    runner.invoke(app, ["runway"])
    assert (seen[-1].gateway, seen[-1].api_key) == ("gw.prod:443", "ks_ctx")
    monkeypatch.setenv("KESTREL_API_KEY", "ks_env")
    runner.invoke(app, ["runway"])
    assert (seen[-1].gateway, seen[-1].api_key) == ("gw.prod:443", "ks_env")
    runner.invoke(app, ["--api-key", "ks_flag", "--gateway", "gw.flag:1", "runway"])
    assert (seen[-1].gateway, seen[-1].api_key) == ("gw.flag:1", "ks_flag")
    monkeypatch.delenv("KESTREL_API_KEY")
    runner.invoke(app, ["--context", "dev", "runway"])
    assert (seen[-1].gateway, seen[-1].api_key) == ("gw.dev:50051", "ks_dev")
    bad = runner.invoke(app, ["--context", "nope", "runway"])
    assert bad.exit_code == 2 and "no context 'nope'" in bad.stderr


def test_a_broken_config_file_is_named_not_a_traceback(cfg: Path,
                                                        seen: list[_common.Globals]) -> None:
    cfg.parent.mkdir(parents=True)
    cfg.write_text("[contexts.prod]\ngateway = 5\n")
    r = runner.invoke(app, ["runway"])
    assert r.exit_code == 2 and str(cfg) in r.stderr and "every value is a string" in r.stderr
    cfg.write_text("[contexts.prod]\naddress = 'x'\n")
    r = runner.invoke(app, ["runway"])
    assert r.exit_code == 2 and "unknown keys address" in r.stderr
    assert seen == []


def test_every_read_command_prints_yaml_as_it_prints_json(cfg: Path,
                                                          seen: list[_common.Globals]) -> None:
    for args in (["runway"], ["job", "j-1"], ["jobs"], ["usage"]):
        as_json = runner.invoke(app, ["--api-key", "k", *args, "-o", "json"])
        as_yaml = runner.invoke(app, ["--api-key", "k", *args, "-o", "yaml"])
        assert as_json.exit_code == as_yaml.exit_code == 0, (args, as_yaml.output)
        assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout), args

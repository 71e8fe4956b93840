"""`python -m kestrel_tools.plane up` (what `make up` runs) says what it did to each part
of an existing plane: reused, started, or found dead and restarted (issue 10, item 11).
The devstack, the service processes and Prometheus are fakes here; the integration test
tests/integration/test_devstack_up.py kills real ones."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kestrel_tools import plane, prometheus


class FakeStack:
    def up(self) -> dict[str, str]:
        return {"postgres": "postgres is running (pid 11): reused",
                "nats": "nats was not running (pid 12 gone): restarted as pid 22",
                "redis": "redis is running (pid 13): reused"}

    def env(self) -> dict[str, str]:
        return {}


class FakePrometheus:
    url = "http://127.0.0.1:19090"

    @classmethod
    def open(cls, root: Path) -> FakePrometheus:
        return cls()

    def up(self, config: dict[str, Any], port: int = 0) -> str:
        return "prometheus started"


@dataclass
class FakeService:
    name: str
    pid: int = 0

    def start(self) -> FakeService:
        self.pid = {"meter": 31, "gateway": 32, "admission": 33}[self.name]
        return self


def test_up_reports_each_component_reused_started_or_restarted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(plane, "ROOT", tmp_path)
    monkeypatch.setattr(plane, "TOKEN_FILE", tmp_path / "operator-token")
    monkeypatch.setattr(plane, "open_stack", lambda root: FakeStack())
    monkeypatch.setattr(plane, "ServiceProcess",
                        lambda name, *a, **kw: FakeService(name))
    # A fake too: the real one was started in the repository's .run/plane (with the
    # cluster's Kueue token when a cluster was up) and left running after the test.
    monkeypatch.setattr(plane, "PROMETHEUS_DIR", tmp_path / "prometheus")
    monkeypatch.setattr(prometheus, "Prometheus", FakePrometheus)
    monkeypatch.setattr(prometheus, "plane_config", lambda root, metrics: {})
    # meter alive, gateway dead (pid 2 gone), admission never started.
    plane._save({"meter": 1, "gateway": 2})
    alive = {1}
    monkeypatch.setattr(plane, "_alive", lambda pid: pid in alive)
    plane.up(with_placer=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == list(FakeStack().up().values())
    assert lines[3] == "meter is running (pid 1): reused"
    assert lines[4] == ("gateway was not running (pid 2 gone): restarted as pid 32 on "
                        f"127.0.0.1:50051, log {tmp_path / 'gateway.log'}")
    assert lines[5] == ("admission started as pid 33 on 127.0.0.1:50052, log "
                        f"{tmp_path / 'admission.log'}")
    saved: dict[str, Any] = plane._state()
    assert saved == {"meter": 1, "gateway": 32, "admission": 33}

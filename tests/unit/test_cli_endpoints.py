"""`kestrel endpoints ...` without a server: the SDK client replaced by a fake."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from kestrel_sdk import Endpoint, InferResult, NotFound
from kestrel_sdk.cli import _common, app

runner = CliRunner(env={"COLUMNS": "200"})
EP = Endpoint("ep-0123456789abcdef", "acme", "embed", "all-MiniLM-L6-v2", "cpu", 0, 1, 1, 1,
              "", 1_700_000_000_000_000)


class FakeClient:
    address = "fake:0"

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def close(self) -> None:
        pass

    def create_endpoint(self, name: str, **kw: Any) -> Endpoint:
        self.calls.append(("create_endpoint", (name,), kw))
        return EP

    def list_endpoints(self) -> list[Endpoint]:
        self.calls.append(("list_endpoints", (), {}))
        return [EP]

    def get_endpoint(self, endpoint_id: str) -> Endpoint:
        self.calls.append(("get_endpoint", (endpoint_id,), {}))
        raise NotFound(None, f"endpoint {endpoint_id} not found")

    def delete_endpoint(self, endpoint_id: str) -> bool:
        self.calls.append(("delete_endpoint", (endpoint_id,), {}))
        return True

    def infer(self, endpoint_id: str, inputs: list[str], **kw: Any) -> InferResult:
        self.calls.append(("infer", (endpoint_id, list(inputs)), kw))
        return InferResult([[0.5, -0.25, 0.0, 0.125] + [0.0] * 380 for _ in inputs],
                           "all-MiniLM-L6-v2", "r1", 12.5, 3.0, [1], 256)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    client = FakeClient()
    monkeypatch.setattr(_common, "make_client", lambda g: client)
    return client


def test_create_list_delete_pass_through(fake: FakeClient) -> None:
    r = runner.invoke(app, ["endpoints", "create", "embed", "--max-replicas", "2",
                            "--flavor", "cpu"])
    assert r.exit_code == 0, r.output
    assert "ep-0123456789abcdef" in r.output
    assert fake.calls[0] == ("create_endpoint", ("embed",),
                             {"min_replicas": 0, "max_replicas": 2, "flavor": "cpu",
                              "flavors": (), "target_p95_ms": 0,
                              "missed_slo_value_per_s": ""})
    r = runner.invoke(app, ["endpoints", "create", "mixed", "--flavor", "cpu",
                            "--also-flavor", "gpu-a10", "--target-p95-ms", "200",
                            "--missed-slo-value", "0.01"])
    assert r.exit_code == 0, r.output
    assert fake.calls[1][2] == {"min_replicas": 0, "max_replicas": 1, "flavor": "cpu",
                                "flavors": ["gpu-a10"], "target_p95_ms": 200,
                                "missed_slo_value_per_s": "0.01"}
    r = runner.invoke(app, ["endpoints", "list", "-o", "json"])
    assert json.loads(r.output)[0]["endpoint_id"] == EP.endpoint_id
    r = runner.invoke(app, ["endpoints", "delete", EP.endpoint_id])
    assert r.exit_code == 0 and "deleted" in r.output


def test_infer_shows_each_text_and_which_were_cut(fake: FakeClient) -> None:
    r = runner.invoke(app, ["endpoints", "infer", EP.endpoint_id, "short", "long text",
                            "--priority", "high", "--wait", "2"])
    assert r.exit_code == 0, r.output
    assert fake.calls[0] == ("infer", (EP.endpoint_id, ["short", "long text"]),
                             {"priority": "high", "timeout_s": 2.0})
    assert "+0.500 -0.250 +0.000 +0.125" in r.output
    assert "yes, at 256 word pieces" in r.output
    r = runner.invoke(app, ["endpoints", "infer", EP.endpoint_id, "x", "-o", "json"])
    assert json.loads(r.output)["truncated"] == [1]


def test_a_missing_endpoint_is_one_sentence_and_status_1(fake: FakeClient) -> None:
    r = runner.invoke(app, ["endpoints", "show", "ep-ffffffffffffffff"])
    assert r.exit_code == 1
    assert "not found" in r.output

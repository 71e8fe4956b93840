"""The OpenAI embeddings shapes (services/gateway/openai_wire.py), pure: request bodies
in, InferRequests or field errors out; domain errors in, statuses and OpenAI error
bodies out."""

from __future__ import annotations

import base64
import struct

import orjson
import pytest

from kestrel.errors import (
    BudgetSpent,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NoReadyReplica,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from kestrel_sdk.v1 import gateway_pb2
from services.gateway import openai_wire as wire


@pytest.mark.parametrize(("body", "inputs", "b64"), [
    pytest.param({"model": "m", "input": "one"}, ["one"], False, id="a string is one text"),
    pytest.param({"model": "m", "input": ["a", "b"]}, ["a", "b"], False,
                 id="a list of strings is each"),
    pytest.param({"model": "m", "input": ["a"], "encoding_format": "base64"}, ["a"], True,
                 id="base64 is asked for by name"),
    pytest.param({"model": "m", "input": "a", "encoding_format": None}, ["a"], False,
                 id="a null encoding is float"),
    pytest.param({"model": "m", "input": "a", "dimensions": 384, "user": "u"}, ["a"], False,
                 id="the model's own dimensions and a user are accepted"),
])
def test_accepted_bodies(body: dict[str, object], inputs: list[str], b64: bool) -> None:
    call = wire.parse_embeddings(orjson.dumps(body))
    assert (call.model, call.inputs, call.base64) == ("m", inputs, b64)


@pytest.mark.parametrize(("body", "field"), [
    pytest.param(b"{not json", "body", id="not JSON names the body"),
    pytest.param(b"[1, 2]", "body", id="not an object names the body"),
    pytest.param(b'{"input": "x"}', "model", id="a missing model"),
    pytest.param(b'{"model": "", "input": "x"}', "model", id="an empty model"),
    pytest.param(b'{"model": "a\\u0000b", "input": "x"}', "model",
                 id="a NUL in the model never reaches a query"),
    pytest.param(b'{"model": "m"}', "input", id="a missing input"),
    pytest.param(b'{"model": "m", "input": [1, 2, 3]}', "input", id="token ids"),
    pytest.param(b'{"model": "m", "input": [[1, 2], [3]]}', "input", id="lists of token ids"),
    pytest.param(b'{"model": "m", "input": ["a", 1]}', "input", id="a mixed list"),
    pytest.param(b'{"model": "m", "input": "a", "encoding_format": "int8"}',
                 "encoding_format", id="an unknown encoding"),
    pytest.param(b'{"model": "m", "input": "a", "dimensions": 128}', "dimensions",
                 id="other dimensions"),
    pytest.param(b'{"model": "m", "input": "a", "dimensions": true}', "dimensions",
                 id="a boolean is not a dimension"),
    pytest.param(b'{"model": "m", "input": "a", "user": 5}', "user", id="a numeric user"),
])
def test_refused_bodies_name_the_field(body: bytes, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        wire.parse_embeddings(body)
    assert err.value.violations[0].field == field


def test_headers_map_to_the_wire_priority_and_timeout() -> None:
    assert wire.priority_of(None) == 0 and wire.priority_of("HIGH") == 3
    assert wire.priority_of(" low ") == 1
    assert wire.timeout_ms_of(None) == 0 and wire.timeout_ms_of("250") == 250
    for bad in ("urgent", "2"):
        with pytest.raises(InvalidArgument):
            wire.priority_of(bad)
    for bad in ("0", "60001", "1.5", "soon"):
        with pytest.raises(InvalidArgument):
            wire.timeout_ms_of(bad)


def test_the_response_carries_vectors_indexes_and_tokens_in_either_encoding() -> None:
    resp = gateway_pb2.InferResponse(
        embeddings=[gateway_pb2.Embedding(values=[0.5, -0.25]),
                    gateway_pb2.Embedding(values=[1.0, 0.0])], input_tokens=17)
    floats = orjson.loads(wire.embeddings_body(wire.EmbeddingsCall("emb", ["a", "b"], False),
                                               resp))
    assert floats == {"object": "list", "model": "emb",
                      "usage": {"prompt_tokens": 17, "total_tokens": 17},
                      "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]},
                               {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]}]}
    b64 = orjson.loads(wire.embeddings_body(wire.EmbeddingsCall("emb", ["a", "b"], True),
                                            resp))
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert struct.unpack("<2f", raw) == (0.5, -0.25)


@pytest.mark.parametrize(("exc", "status", "code", "retry"), [
    pytest.param(InvalidArgument([FieldViolation("inputs", "too many")]), 400,
                 "invalid_value", False, id="bad input is 400"),
    pytest.param(Unauthenticated("the API key is not valid"), 401, "invalid_api_key", False,
                 id="a bad key is 401"),
    pytest.param(NotFound("no"), 404, "model_not_found", False, id="an unknown model is 404"),
    pytest.param(BudgetSpent("spent"), 402, "budget_exhausted", False,
                 id="a spent budget is 402, which clients do not retry"),
    pytest.param(ResourceExhausted("slow down", 2.5), 429, "rate_limit_exceeded", True,
                 id="the rate limit is 429 with Retry-After"),
    pytest.param(NoReadyReplica("none", 1.0), 503, "no_ready_replica", True,
                 id="no ready replica is 503"),
    pytest.param(Unavailable("busy", 0.5), 503, "unavailable", True,
                 id="a busy dependency is 503"),
    pytest.param(ConnectionError("pg away"), 503, "unavailable", True,
                 id="a store away is 503"),
    pytest.param(DeadlineExceeded("late"), 504, "timeout", False,
                 id="the caller's timeout is 504"),
    pytest.param(FailedPrecondition("suspended"), 400, "failed_precondition", False,
                 id="another precondition is 400"),
    pytest.param(RuntimeError("secret detail"), 500, "internal", False,
                 id="anything else is 500 without its detail"),
])
def test_each_failure_maps_to_one_status_and_an_openai_error_body(
        exc: BaseException, status: int, code: str, retry: bool) -> None:
    err = wire.error_of(exc, "rid-1")
    body = orjson.loads(err.body)["error"]
    assert (err.status, body["code"]) == (status, code)
    assert set(body) == {"message", "type", "param", "code"}
    assert ("retry-after" in err.headers) == retry
    assert "secret detail" not in body["message"]
    if retry:
        assert int(err.headers["retry-after"]) >= 1 and int(err.headers["retry-after-ms"]) > 0


def test_a_field_violation_names_the_openai_parameter() -> None:
    err = wire.error_of(InvalidArgument([FieldViolation("inputs", "x")]), "r")
    assert orjson.loads(err.body)["error"]["param"] == "input"
    err = wire.error_of(InvalidArgument([FieldViolation("priority", "x")]), "r")
    assert orjson.loads(err.body)["error"]["param"] == wire.PRIORITY_HEADER

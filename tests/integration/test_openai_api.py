"""The gateway's OpenAI-compatible HTTP API with the clients people use: the `openai`
package pointed at it (base_url) and curl for the raw shapes, on the real Postgres,
NATS and Redis of the fixtures and a real model worker process. The vectors are the
ones gRPC Infer returns for the same texts: one path, two transports."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from tokenizers import Tokenizer

from kestrel import endpoints as ep
from kestrel.clock import now_us
from kestrel_sdk.v1 import gateway_pb2, worker_pb2
from services.worker.model import find_files
from tests.integration.endpoint_world import (
    BABY,
    BREAD,
    FOOD,
    OP,
    World,
    _create,
    cos,
    infer,
    make_tenant,
)
from tests.integration.helpers import eventually

pytestmark = pytest.mark.integration


def base_url(w: World) -> str:
    return f"http://{w.plane.address('http')}/v1"


def key_of(md: Any) -> str:
    return str(md[0][1]).removeprefix("Bearer ")


@pytest.fixture
async def client(world: World) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=base_url(world), api_key=key_of(world.md), max_retries=0)
    try:
        yield c
    finally:
        await c.close()


def curl(url: str, *args: str, body: str | bytes | None = None,
         key: str | None = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body) of one curl call."""
    cmd = ["curl", "-sS", "-D", "-", "--max-time", "20", url, *args]
    if key is not None:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    out = subprocess.run(cmd, input=body.encode() if isinstance(body, str) else body,
                         capture_output=True, check=True, timeout=30).stdout.decode()
    head, _, text = out.partition("\r\n\r\n")
    lines = head.split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(text) if text else None


async def acurl(*args: Any, **kw: Any) -> tuple[int, dict[str, str], Any]:
    return await asyncio.to_thread(curl, *args, **kw)


def tokens_of(texts: list[str]) -> int:
    """Word pieces as the model's own tokenizer counts them, cut at 256 (its file pads:
    padding is not counted)."""
    tok = Tokenizer.from_file(str(find_files().tokenizer))
    tok.enable_truncation(max_length=ep.MAX_INPUT_TOKENS)
    return sum(sum(e.attention_mask) for e in tok.encode_batch(texts))


async def test_the_openai_client_gets_the_vectors_grpc_infer_returns(
        world: World, client: openai.AsyncOpenAI) -> None:
    w = world
    w.start_worker(w.endpoint_id)
    texts = [FOOD, BREAD, BABY]
    grpc_vectors = [list(e.values) for e in (await infer(w, texts)).embeddings]

    floats = await client.embeddings.create(model="embed", input=texts,
                                            encoding_format="float")
    assert floats.object == "list" and floats.model == "embed"
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert all(d.object == "embedding" and len(d.embedding) == 384 for d in floats.data)
    # The client's default asks for base64 (little-endian float32) and decodes it.
    b64 = await client.embeddings.create(model="embed", input=texts)
    for g, f, b in zip(grpc_vectors, floats.data, b64.data, strict=True):
        assert cos(g, f.embedding) > 0.99999 and cos(g, b.embedding) > 0.99999
        assert max(abs(x - y) for x, y in zip(f.embedding, b.embedding, strict=True)) < 1e-6
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == tokens_of(texts)

    # One string, a hundred strings, one cut at the model's 256 word pieces.
    one = await client.embeddings.create(model="embed", input=FOOD)
    assert len(one.data) == 1 and cos(one.data[0].embedding, grpc_vectors[0]) > 0.99999
    many = [f"sentence number {i} about bread" for i in range(99)] + ["bread " * 600]
    hundred = await client.embeddings.create(model="embed", input=many)
    assert [d.index for d in hundred.data] == list(range(100))
    assert hundred.usage.prompt_tokens == tokens_of(many)
    assert math.isclose(math.sqrt(sum(x * x for x in hundred.data[99].embedding)), 1,
                        abs_tol=1e-3)

    # The endpoint's id names it as well as its name does.
    by_id = await client.embeddings.create(model=w.endpoint_id, input=FOOD,
                                           encoding_format="float")
    assert by_id.model == w.endpoint_id and by_id.data[0].embedding == one.data[0].embedding

    # Models: the caller's endpoints only.
    await w.stub.CreateEndpoint(_create("theirs"), metadata=w.other_md)
    assert [m.id for m in (await client.models.list()).data] == ["embed"]
    got = await client.models.retrieve("embed")
    assert got.id == "embed" and got.owned_by == "acme" and got.object == "model"

    # A bad key, an unknown model, another tenant's model (the same 404), bad input.
    bad = openai.AsyncOpenAI(base_url=base_url(w), api_key="ks_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        await bad.embeddings.create(model="embed", input=FOOD)
    await bad.close()
    assert auth.value.code == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as missing:
        await client.embeddings.create(model="nope", input=FOOD)
    with pytest.raises(openai.NotFoundError) as foreign:
        await client.embeddings.create(model="theirs", input=FOOD)
    assert missing.value.code == foreign.value.code == "model_not_found"
    assert (str(missing.value.message).replace("nope", "X")
            == str(foreign.value.message).replace("theirs", "X"))
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("theirs")
    with pytest.raises(openai.BadRequestError) as dims:
        await client.embeddings.create(model="embed", input=FOOD, dimensions=128)
    assert dims.value.param == "dimensions"
    with pytest.raises(openai.BadRequestError) as ids:
        await client.embeddings.create(model="embed", input=[[101, 2023, 102]])
    assert ids.value.param == "input" and "token-id" in ids.value.message
    with pytest.raises(openai.BadRequestError) as empty:
        await client.embeddings.create(model="embed", input=[])
    assert empty.value.param == "input"


async def test_a_spent_budget_answers_402_a_top_up_serves_again_without_the_meter(
        world: World) -> None:
    w = world
    w.start_worker(w.endpoint_id)
    await infer(w, [FOOD])  # the replica is up
    await w.stub.AdjustCredits(gateway_pb2.AdjustCreditsRequest(
        tenant="acme", amount="-100", note="spend it all for the test"), metadata=OP)
    c = openai.AsyncOpenAI(base_url=base_url(w), api_key=key_of(w.md), max_retries=0)
    try:
        async def status() -> int:
            try:
                await c.embeddings.create(model="embed", input=FOOD)
                return 200
            except openai.APIStatusError as exc:
                assert exc.code == "budget_exhausted" and exc.type == "insufficient_quota"
                return exc.status_code

        assert await eventually(status, lambda s: s == 402, 10) == 402
        await w.stub.TopUp(gateway_pb2.GatewayTopUpRequest(tenant="acme", amount="5"),
                           metadata=OP)
        assert await eventually(status, lambda s: s == 200, 10) == 200
        # The gate reads the meter's published runway, not the meter: with the meter
        # stopped, a tenant with money is still served.
        w.plane.procs["meter"].stop()
        await asyncio.sleep(2.5)  # past any per-tenant cache of a meter answer
        assert await status() == 200
    finally:
        await c.close()


async def test_curl_raw_shapes_and_each_status(world: World, tmp_path: Path) -> None:
    w = world
    url, key = base_url(w), key_of(w.md)
    req = json.dumps({"model": "embed", "input": FOOD, "encoding_format": "float"})

    # No replica yet: 503 with Retry-After, after the caller's timeout header.
    code, headers, body = await acurl(f"{url}/embeddings", "-H", "X-Kestrel-Timeout-Ms: 400",
                                      body=req, key=key)
    assert code == 503 and body["error"]["code"] == "no_ready_replica", body
    assert int(headers["retry-after"]) >= 1 and headers["x-request-id"]

    # A replica that heartbeats but never reads: 504 at the caller's timeout.
    fake = worker_pb2.WorkerHeartbeat(replica="stuck", endpoint_id=w.endpoint_id,
                                      time_us=now_us() + 60_000_000)
    await w.redis.hset(ep.replicas_key(w.endpoint_id), "stuck", fake.SerializeToString())
    code, _, body = await acurl(f"{url}/embeddings", "-H", "X-Kestrel-Timeout-Ms: 300",
                                body=req, key=key)
    assert code == 504 and body["error"]["type"] == "timeout", body
    await w.redis.hdel(ep.replicas_key(w.endpoint_id), "stuck")

    w.start_worker(w.endpoint_id)
    await infer(w, [FOOD])
    code, headers, body = await acurl(f"{url}/embeddings", "-H", "X-Kestrel-Priority: high",
                                      body=req, key=key)
    assert code == 200, body
    assert set(body) == {"object", "data", "model", "usage"}
    assert body["object"] == "list" and body["model"] == "embed"
    assert set(body["data"][0]) == {"object", "embedding", "index"}
    assert len(body["data"][0]["embedding"]) == 384
    assert body["usage"] == {"prompt_tokens": tokens_of([FOOD]),
                             "total_tokens": tokens_of([FOOD])}
    assert headers["content-type"] == "application/json" and headers["x-kestrel-replica"]
    code, _, models = await acurl(f"{url}/models", key=key)
    assert code == 200 and models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["embed"]

    bad: dict[str, tuple[list[str], str | None, str | None, int, str | None]] = {
        "no key": ([], req, None, 401, "invalid_api_key"),
        "malformed key": ([], req, "sk-not-kestrel", 401, "invalid_api_key"),
        "not JSON": ([], "{model:", key, 400, "invalid_value"),
        "no model": ([], json.dumps({"input": "x"}), key, 400, "invalid_value"),
        "number input": ([], json.dumps({"model": "embed", "input": 7}), key, 400,
                         "invalid_value"),
        "257 texts": ([], json.dumps({"model": "embed", "input": ["x"] * 257}), key, 400,
                      "invalid_value"),
        "text over 4096 characters": ([], json.dumps({"model": "embed", "input": "x" * 4097}),
                                      key, 400, "invalid_value"),
        "NUL in a text": ([], json.dumps({"model": "embed", "input": "a\x00b"}), key, 400,
                          "invalid_value"),
        "NUL in the model": ([], json.dumps({"model": "a\x00b", "input": "x"}), key, 400,
                             "invalid_value"),
        "bad encoding": ([], json.dumps({"model": "embed", "input": "x",
                                         "encoding_format": "int8"}), key, 400,
                         "invalid_value"),
        "bad priority": (["-H", "X-Kestrel-Priority: urgent"], req, key, 400, "invalid_value"),
        "bad timeout": (["-H", "X-Kestrel-Timeout-Ms: 61000"], req, key, 400,
                        "invalid_value"),
        "unknown model": ([], json.dumps({"model": "nope", "input": "x"}), key, 404,
                          "model_not_found"),
    }
    for what, (args, data, k, want, want_code) in bad.items():
        code, _, body = await acurl(f"{url}/embeddings", *args, body=data, key=k)
        assert code == want and body["error"]["code"] == want_code, (what, code, body)
        assert set(body["error"]) == {"message", "type", "param", "code"}, (what, body)
    code, _, body = await acurl(f"{url}/nothing-here", key=key)
    assert code == 404 and body["error"]["code"] == "unknown_url"
    code, headers, body = await acurl(f"{url}/embeddings", key=key)  # GET
    assert code == 405 and "POST" in headers["allow"]
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"model": "embed", "input": ["x" * 4000] * 2200}))
    code, _, body = await acurl(f"{url}/embeddings", body=huge.read_bytes(), key=key)
    assert code == 413 and body["error"]["code"] == "body_too_large"

    # The tenant's rate limit, as on gRPC: 429 with Retry-After and retry-after-ms.
    slow = await make_tenant(w.stub, "slow", rate=0.1, burst=1)
    statuses = [await acurl(f"{url}/models", key=key_of(slow)) for _ in range(3)]
    limited = [s for s in statuses if s[0] == 429]
    assert limited and all(int(h["retry-after"]) >= 1 and int(h["retry-after-ms"]) > 0
                           and b["error"]["code"] == "rate_limit_exceeded"
                           for _, h, b in limited), statuses

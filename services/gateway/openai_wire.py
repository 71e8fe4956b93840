"""The OpenAI embeddings API's shapes, pure: a request body in, an InferRequest out; an
InferResponse in, a response body out; a domain error in, a status, an OpenAI error body
and headers out. No I/O: http.py is the transport around it.

What OpenAI's clients send and expect (the `openai` package, LangChain's and
LlamaIndex's OpenAI embeddings, curl scripts written against api.openai.com or
text-embeddings-inference):

- `model`: here the name of one of the caller's endpoints (its `ep-...` id works too).
- `input`: a string or a list of strings. Token-id arrays are refused: Kestrel
  tokenises with the model's own tokenizer and cannot verify ids of another.
- `encoding_format`: `float` (default) or `base64` (little-endian float32, what the
  `openai` client asks for by default and decodes itself).
- `dimensions`: only the model's own (384): all-MiniLM-L6-v2 is not a Matryoshka model.
- `user`: accepted and ignored, as by other compatible servers.

Errors follow OpenAI's body `{"error": {"message", "type", "param", "code"}}` with the
statuses its clients map to exception classes; a spent budget answers 402 (code
`budget_exhausted`) rather than 429: OpenAI's clients retry a 429 and a spent budget
does not heal by waiting, only by a top-up.
"""

from __future__ import annotations

import array
import base64
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from kestrel.endpoints import ENDPOINT_ID_RE, Priority
from kestrel.errors import (
    AlreadyExists,
    BudgetSpent,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    KestrelError,
    NoReadyReplica,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    transient,
)
from kestrel.validation import string_problem
from kestrel_sdk.v1 import gateway_pb2

DIMENSIONS = 384  # all-MiniLM-L6-v2's
MAX_BODY_BYTES = 8 << 20  # 256 texts of 4096 characters, escaped
MAX_TIMEOUT_MS = 60_000
MAX_MODEL_CHARS = 256
PRIORITY_HEADER = "x-kestrel-priority"
TIMEOUT_HEADER = "x-kestrel-timeout-ms"
_PRIORITIES = {p.label: p for p in Priority}
# InferRequest's field names as the OpenAI request calls them.
_PARAM = {"inputs": "input", "endpoint_id": "model", "priority": PRIORITY_HEADER,
          "timeout_ms": TIMEOUT_HEADER}


@dataclass(frozen=True)
class EmbeddingsCall:
    model: str
    inputs: list[str]
    base64: bool


def _bad(param: str, description: str) -> InvalidArgument:
    return InvalidArgument([FieldViolation(param, description)])


def parse_embeddings(body: bytes) -> EmbeddingsCall:
    """The body of POST /v1/embeddings, or InvalidArgument naming the offending field."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _bad("body", f"is not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(doc, dict):
        raise _bad("body", "must be a JSON object")
    problems: list[FieldViolation] = []
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        problems.append(FieldViolation("model", "is required: the name of one of your "
                                                "endpoints"))
    elif (problem := model_problem(model)) is not None:
        problems.append(FieldViolation("model", problem))
    raw = doc.get("input")
    inputs: list[str] = []
    if isinstance(raw, str):
        inputs = [raw]
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        inputs = raw
    elif isinstance(raw, list) and raw and all(
            isinstance(x, int) or (isinstance(x, list) and all(isinstance(y, int) for y in x))
            for x in raw):
        problems.append(FieldViolation("input", "token-id arrays are not accepted: send "
                                                "the texts (the model's own tokenizer "
                                                "reads them)"))
    else:
        problems.append(FieldViolation("input", "is required: a string or a list of "
                                                "strings"))
    # How many texts (1..MAX_TEXTS) is the core's check, as on gRPC (param `input`).
    fmt = doc.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        problems.append(FieldViolation("encoding_format", "must be 'float' or 'base64'"))
    dims = doc.get("dimensions")
    if dims is not None and (isinstance(dims, bool) or dims != DIMENSIONS):
        problems.append(FieldViolation("dimensions", f"must be {DIMENSIONS} (the model's "
                                                     "own) or omitted"))
    user = doc.get("user")
    if user is not None and not isinstance(user, str):
        problems.append(FieldViolation("user", "must be a string"))
    if problems:
        raise InvalidArgument(problems)
    return EmbeddingsCall(str(model), list(inputs), fmt == "base64")


def model_problem(model: str) -> str | None:
    """Why a model name cannot name an endpoint (checked before it reaches a query)."""
    return string_problem(model, MAX_MODEL_CHARS)


def priority_of(header: str | None) -> int:
    """X-Kestrel-Priority (low, normal, high) as the wire's InferPriority; absent: 0."""
    if header is None or header == "":
        return 0
    p = _PRIORITIES.get(header.strip().lower())
    if p is None:
        raise _bad(PRIORITY_HEADER, f"must be one of {', '.join(_PRIORITIES)}")
    return int(p)


def timeout_ms_of(header: str | None) -> int:
    """X-Kestrel-Timeout-Ms: how long the caller waits (1..60000); absent: 0, the
    gateway's default (10 s), as on gRPC."""
    if header is None or header == "":
        return 0
    try:
        ms = int(header.strip())
    except ValueError:
        raise _bad(TIMEOUT_HEADER, "must be a whole number of milliseconds") from None
    if not 1 <= ms <= MAX_TIMEOUT_MS:
        raise _bad(TIMEOUT_HEADER, f"must be between 1 and {MAX_TIMEOUT_MS}")
    return ms


def is_endpoint_id(model: str) -> bool:
    return bool(ENDPOINT_ID_RE.match(model))


def infer_request(call: EmbeddingsCall, endpoint_id: str, priority: int,
                  timeout_ms: int) -> gateway_pb2.InferRequest:
    return gateway_pb2.InferRequest(endpoint_id=endpoint_id, inputs=call.inputs,
                                    priority=priority,  # type: ignore[arg-type]
                                    timeout_ms=timeout_ms)


def _b64(values: Sequence[float]) -> str:
    packed = array.array("f", values)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def embeddings_body(call: EmbeddingsCall, resp: gateway_pb2.InferResponse) -> bytes:
    """OpenAI's CreateEmbeddingResponse for the InferResponse; `model` as the caller
    named it (clients match on it)."""
    data = [{"object": "embedding", "index": i,
             "embedding": _b64(e.values) if call.base64 else list(e.values)}
            for i, e in enumerate(resp.embeddings)]
    tokens = int(resp.input_tokens)
    return orjson.dumps({"object": "list", "data": data, "model": call.model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def model_entry(name: str, created_us: int, tenant: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created_us // 1_000_000,
            "owned_by": tenant}


def model_json(name: str, created_us: int, tenant: str) -> bytes:
    return orjson.dumps(model_entry(name, created_us, tenant))


def models_body(entries: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"object": "list", "data": entries})


@dataclass(frozen=True)
class HttpError:
    status: int
    body: bytes
    headers: dict[str, str]


def error_body(message: str, typ: str, code: str | None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": typ, "param": param,
                                   "code": code}})


def _retry_headers(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds (RFC 9110), retry-after-ms as OpenAI's clients read
    first."""
    seconds = max(seconds, 0.0)
    return {"retry-after": str(max(1, math.ceil(seconds))),
            "retry-after-ms": str(max(1, round(seconds * 1000)))}


def error_of(exc: BaseException, request_id: str) -> HttpError:
    """The one mapping from a failure to an HTTP answer, as errors.to_status is for gRPC."""
    if transient(exc):
        return HttpError(503, error_body("a store this call needs is unavailable for now; "
                                    "retry", "server_error", "unavailable"),
                         _retry_headers(1.0))
    if isinstance(exc, InvalidArgument):
        first = exc.violations[0].field if exc.violations else None
        return HttpError(400, error_body(exc.message, "invalid_request_error", "invalid_value",
                                    _PARAM.get(first or "", first)), {})
    if isinstance(exc, Unauthenticated):
        return HttpError(401, error_body(f"{exc.message}: send 'Authorization: Bearer <your "
                                    "Kestrel API key>'", "invalid_request_error",
                                    "invalid_api_key"), {})
    if isinstance(exc, PermissionDenied):
        return HttpError(403, error_body(exc.message, "permission_error", "permission_denied"), {})
    if isinstance(exc, NotFound):
        return HttpError(404, error_body(exc.message, "invalid_request_error", "model_not_found",
                                    "model"), {})
    if isinstance(exc, BudgetSpent):
        return HttpError(402, error_body(exc.message, "insufficient_quota", "budget_exhausted"),
                         {})
    if isinstance(exc, ResourceExhausted):
        return HttpError(429, error_body(exc.message, "requests", "rate_limit_exceeded"),
                         _retry_headers(exc.retry_after_s))
    if isinstance(exc, NoReadyReplica):
        return HttpError(503, error_body(exc.message, "server_error", "no_ready_replica"),
                         _retry_headers(exc.retry_after_s))
    if isinstance(exc, Unavailable):
        return HttpError(503, error_body(exc.message, "server_error", "unavailable"),
                         _retry_headers(exc.retry_after_s))
    if isinstance(exc, DeadlineExceeded):
        return HttpError(504, error_body(exc.message, "timeout", "timeout"), {})
    if isinstance(exc, FailedPrecondition | AlreadyExists):
        return HttpError(409 if isinstance(exc, AlreadyExists) else 400,
                         error_body(exc.message, "invalid_request_error", "failed_precondition"),
                         {})
    if isinstance(exc, Unimplemented):
        return HttpError(501, error_body(exc.message, "invalid_request_error", "unimplemented"),
                         {})
    if isinstance(exc, KestrelError):
        return HttpError(500, error_body(exc.message, "server_error", "internal"), {})
    return HttpError(500, error_body(f"internal error (request id {request_id})", "server_error",
                                "internal"), {})


def not_found_route(path: str) -> HttpError:
    return HttpError(404, error_body(f"no route {path}: this server answers POST /v1/embeddings, "
                                "GET /v1/models and GET /v1/models/<name>",
                                "invalid_request_error", "unknown_url"), {})


def method_not_allowed(method: str, path: str, allowed: str) -> HttpError:
    return HttpError(405, error_body(f"{method} is not allowed on {path}", "invalid_request_error",
                                "method_not_allowed"), {"allow": allowed})

"""Calls from the gateway to the other Kestrel services, and their failures as the
gateway reports them (one mapping, used by every RPC that calls a backend)."""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from kestrel.errors import (
    FailedPrecondition,
    InvalidArgument,
    KestrelError,
    NotFound,
    Unavailable,
    details_of,
)


def _rich_status(err: grpc.aio.AioRpcError) -> status_pb2.Status | None:
    """The google.rpc.Status a Kestrel backend attached (grpc-status-details-bin)."""
    try:
        return rpc_status.from_call(err)
    except ValueError:  # details that contradict the status line: ignore them
        return None


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def downstream(err: grpc.aio.AioRpcError) -> KestrelError:
    """A failure of another Kestrel service, as this service reports it."""
    return failure(err.code(), err.details() or "", _rich_status(err))


def failure(code: grpc.StatusCode, message: str, rich: status_pb2.Status | None
            ) -> KestrelError:
    """A backend's failure (a call's, or one item's of a batch call) as ours.

    Input a backend rejects is the caller's: INVALID_ARGUMENT passes through with the
    backend's field violations. A backend that is away or saturated is UNAVAILABLE with
    RetryInfo (the backend's delay where it gave one)."""
    violations, retry_after = details_of(rich) if rich is not None else ([], None)
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(message or "not found")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(violations, message=message or "rejected by a backend")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailedPrecondition(message or "rejected by a backend")
    return Unavailable(f"a backend is unavailable ({code.name}); retry",
                       retry_after_s=retry_after if retry_after is not None else 1.0)


def item_failure(serialized: bytes) -> KestrelError:
    """One item's failure in a batch call: a google.rpc.Status, serialized."""
    try:
        status = status_pb2.Status.FromString(serialized)
    except Exception:  # DecodeError: a failure all the same, of unknown kind
        return failure(grpc.StatusCode.UNKNOWN, "", None)
    code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    return failure(code, status.message, status)


async def call(coro: Any) -> Any:
    """Await a call to another service, mapping its failures to ours."""
    try:
        return await coro
    except grpc.aio.AioRpcError as err:
        raise downstream(err) from None

"""SDK exceptions: every failed call raises a `KestrelError` subclass.

`from_rpc_error` maps a `grpc.RpcError` (sync or grpc.aio) once, reading the rich
status the gateway attaches: google.rpc.BadRequest field violations and
google.rpc.RetryInfo. `str(err)` is one sentence led by the gRPC code name,
e.g. ``INVALID_ARGUMENT: gpus: must be between 1 and 8``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


class KestrelError(Exception):
    """A call failed; `code` is the gRPC status code, `message` the server's sentence."""

    default_code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN

    def __init__(self, code: grpc.StatusCode | None, message: str,
                 field_violations: Sequence[tuple[str, str]] = (),
                 retry_after_s: float | None = None, *,
                 request_id: str | None = None) -> None:
        self.code: grpc.StatusCode = code if code is not None else self.default_code
        self.message = message
        self.field_violations: list[tuple[str, str]] = list(field_violations)
        self.retry_after_s = retry_after_s
        self.request_id = request_id
        super().__init__(self.__str__())

    @property
    def code_name(self) -> str:
        return str(self.code.name)

    def __str__(self) -> str:
        if self.field_violations:
            text = "; ".join(f"{f}: {d}" if f else d for f, d in self.field_violations)
        else:
            text = self.message.strip() or "no details given"
        if self.retry_after_s is not None:
            text += f" (retry after {self.retry_after_s:g}s)"
        return f"{self.code_name}: {text}"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(code={self.code_name}, message={self.message!r}, "
                f"field_violations={self.field_violations!r}, "
                f"retry_after_s={self.retry_after_s!r}, request_id={self.request_id!r})")


class Cancelled(KestrelError):
    default_code = grpc.StatusCode.CANCELLED


class InvalidArgument(KestrelError):
    default_code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(KestrelError):
    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(KestrelError):
    default_code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(KestrelError):
    default_code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(KestrelError):
    default_code = grpc.StatusCode.PERMISSION_DENIED


class RateLimited(KestrelError):
    """RESOURCE_EXHAUSTED: over the tenant's rate limit; `retry_after_s` from RetryInfo."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(KestrelError):
    default_code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(KestrelError):
    default_code = grpc.StatusCode.ABORTED


class Unimplemented(KestrelError):
    default_code = grpc.StatusCode.UNIMPLEMENTED


class Internal(KestrelError):
    default_code = grpc.StatusCode.INTERNAL


class Unavailable(KestrelError):
    default_code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(KestrelError):
    default_code = grpc.StatusCode.UNAUTHENTICATED


class MissingCredential(Unauthenticated):
    """Raised before any I/O when the call needs a key or token the client lacks."""

    def __init__(self, what: str, kwarg: str, envvar: str) -> None:
        self.what, self.kwarg, self.envvar = what, kwarg, envvar
        super().__init__(None, f"no {what} configured: pass {kwarg}= to the client "
                               f"or set {envvar}")


_BY_CODE: dict[grpc.StatusCode, type[KestrelError]] = {
    cls.default_code: cls
    for cls in (Cancelled, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                PermissionDenied, RateLimited, FailedPrecondition, Aborted, Unimplemented,
                Internal, Unavailable, Unauthenticated)
}
_CODE_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def error_class(code: grpc.StatusCode) -> type[KestrelError]:
    return _BY_CODE.get(code, KestrelError)


def _details(status: status_pb2.Status | None) -> tuple[list[tuple[str, str]], float | None]:
    violations: list[tuple[str, str]] = []
    retry_after: float | None = None
    if status is None:
        return violations, retry_after
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations += [(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            delay = info.retry_delay
            retry_after = delay.seconds + delay.nanos / 1e9
    return violations, retry_after


def from_status(status: status_pb2.Status, *, request_id: str | None = None) -> KestrelError:
    """The SDK exception for a google.rpc.Status (code, message and details)."""
    code = _CODE_BY_VALUE.get(status.code, grpc.StatusCode.UNKNOWN)
    violations, retry_after = _details(status)
    return error_class(code)(code, status.message, violations, retry_after,
                             request_id=request_id)


def from_rpc_error(exc: grpc.RpcError | Any, *, request_id: str | None = None) -> KestrelError:
    """The SDK exception for a failed call (grpc.RpcError or grpc.aio.AioRpcError)."""
    code_fn = getattr(exc, "code", None)
    code = code_fn() if callable(code_fn) else None
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    details_fn = getattr(exc, "details", None)
    message = details_fn() if callable(details_fn) else None
    if not isinstance(message, str):
        message = str(exc)
    rich: status_pb2.Status | None
    try:
        rich = rpc_status.from_call(exc) if hasattr(exc, "trailing_metadata") else None
    except Exception:  # inconsistent or corrupt details must not hide the real error
        rich = None
    violations, retry_after = _details(rich)
    return error_class(code)(code, message, violations, retry_after, request_id=request_id)


__all__ = [
    "Aborted", "AlreadyExists", "Cancelled", "DeadlineExceeded", "FailedPrecondition",
    "Internal", "InvalidArgument", "KestrelError", "MissingCredential", "NotFound",
    "PermissionDenied", "RateLimited", "Unauthenticated", "Unavailable", "Unimplemented",
    "error_class", "from_rpc_error", "from_status",
]

"""Domain errors, raised by cores and servicers and mapped to gRPC status once.

The mapping (`to_status`) is the single place where a domain failure becomes a
status code with details (google.rpc.BadRequest, RetryInfo); servicers never
build statuses by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg
import grpc
import nats.errors
import nats.js.errors
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class KestrelError(Exception):
    """Base of all domain errors; `message` is one sentence for a person."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(KestrelError):
    """Bad input: each violation names a field (its path in the request message)."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, violations: Sequence[FieldViolation], message: str | None = None) -> None:
        self.violations = list(violations)
        summary = "; ".join(f"{v.field}: {v.description}" for v in self.violations)
        super().__init__(message or f"invalid request: {summary}")


class NotFound(KestrelError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(KestrelError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(KestrelError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class BudgetSpent(FailedPrecondition):
    """The tenant's credits are used up (credits - charged <= 0): FAILED_PRECONDITION on
    gRPC, 402 with code `budget_exhausted` on the HTTP path. Retrying does not help;
    a top-up does."""


class PermissionDenied(KestrelError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(KestrelError):
    code = grpc.StatusCode.UNAUTHENTICATED


class Unavailable(KestrelError):
    """A dependency is away or saturated for now: the client retries after RetryInfo's delay."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NoReadyReplica(Unavailable):
    """An endpoint has no replica with a fresh heartbeat to serve a request."""


class DeadlineExceeded(KestrelError):
    """The caller's deadline passed before the work was done (it is then not done)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(KestrelError):
    code = grpc.StatusCode.UNIMPLEMENTED


@dataclass
class ResourceExhausted(KestrelError):
    message: str
    retry_after_s: float = field(default=1.0)
    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)


class Violations:
    """Collects field violations; `raise_if_any()` raises one InvalidArgument."""

    def __init__(self) -> None:
        self.items: list[FieldViolation] = []

    def add(self, field_name: str, description: str) -> None:
        self.items.append(FieldViolation(field_name, description))

    def raise_if_any(self) -> None:
        if self.items:
            raise InvalidArgument(self.items)


def _pack(msg: object) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg)  # type: ignore[arg-type]
    return out


def _retry_info(seconds: float) -> any_pb2.Any:
    seconds = max(seconds, 0.0)
    return _pack(error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=int(seconds),
                                          nanos=int((seconds % 1) * 1e9))))


# A store or the bus away for now: Postgres restarting or its connection lost mid-query,
# NATS reconnecting, a connect refused or timed out. The call did nothing it could
# not repeat (each write is one transaction; publishes are de-duplicated by id), so the
# client is told to retry rather than given INTERNAL for a fault that is not its own.
#
# PRIMARY_GONE is the Postgres part, which kestrel.db.retrying also runs a statement
# again on: the primary went away under it.
PRIMARY_GONE: tuple[type[Exception], ...] = (
    asyncpg.PostgresConnectionError,       # class 08: the connection is gone
    asyncpg.OperatorInterventionError,     # class 57: shutting down, starting up
    # 25006: a write reached a member that is a standby now (a Postgres pair failed over
    # under a pooled connection); the next connection finds the primary.
    asyncpg.ReadOnlySQLTransactionError,
    # asyncpg's own state machine on a connection whose server died mid-reply: "cannot
    # switch to state 11; another operation (2) is in progress" (chaos: kill -9 of the
    # postmaster answered two reads INTERNAL); also no host of a multi-host DSN
    # read-write yet (TargetServerAttributeNotMatched).
    asyncpg.InternalClientError,
    ConnectionError, TimeoutError)
TRANSIENT: tuple[type[BaseException], ...] = (
    *PRIMARY_GONE,
    nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError, nats.errors.NoServersError,
    nats.errors.OutboundBufferLimitError, nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError)


def transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT)


def to_status(exc: BaseException) -> status_pb2.Status:
    """The one mapping from exceptions to google.rpc.Status (with details)."""
    if transient(exc):
        return status_pb2.Status(
            code=code_pb2.UNAVAILABLE,
            message="a store this call needs is unavailable for now; retry",
            details=[_retry_info(1.0)])
    if isinstance(exc, InvalidArgument):
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.field,
                                                            description=v.description)
                for v in exc.violations
            ]
        )
        return status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=exc.message,
                                 details=[_pack(bad)])
    if isinstance(exc, ResourceExhausted | Unavailable):
        return status_pb2.Status(code=exc.code.value[0], message=exc.message,
                                 details=[_retry_info(exc.retry_after_s)])
    if isinstance(exc, KestrelError):
        return status_pb2.Status(code=exc.code.value[0], message=exc.message)
    return status_pb2.Status(code=code_pb2.INTERNAL, message="internal error")


def details_of(status: status_pb2.Status) -> tuple[list[FieldViolation], float | None]:
    """The inverse of `to_status` for details: field violations and the RetryInfo delay."""
    violations: list[FieldViolation] = []
    retry_after: float | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            retry_after = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return violations, retry_after

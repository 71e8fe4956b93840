"""The SDK maps a failed gRPC call to one exception with the code, the server's
field violations and retry delay, without I/O (fake call objects, real rich statuses)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from kestrel import errors as server_errors
from kestrel_sdk import (
    AlreadyExists,
    Client,
    FailedPrecondition,
    InvalidArgument,
    KestrelError,
    MissingCredential,
    NotFound,
    PermissionDenied,
    RateLimited,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
    from_status,
)
from kestrel_sdk._common import Settings


class FakeRpcError(grpc.RpcError):  # type: ignore[misc]  # grpc ships no types
    """What a failed call looks like to a client: code, details, trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailing: Sequence[tuple[str, str | bytes]] | None = ()) -> None:
        super().__init__()
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Sequence[tuple[str, str | bytes]] | None:
        return self._trailing


def rpc_error_for(status: status_pb2.Status) -> FakeRpcError:
    """The call error a server produces when it aborts with this rich status."""
    s = rpc_status.to_status(status)
    return FakeRpcError(s.code, s.details, s.trailing_metadata)


def packed(msg: error_details_pb2.BadRequest | error_details_pb2.RetryInfo) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(msg)
    return out


def bad_request(*violations: tuple[str, str], message: str = "invalid request"
                ) -> status_pb2.Status:
    bad = error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
        for f, d in violations])
    return status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=message,
                             details=[packed(bad)])


def test_field_violations_become_an_invalid_argument_whose_text_names_each_field() -> None:
    err = from_rpc_error(rpc_error_for(bad_request(
        ("spec.gpus", "must be between 1 and 8"), ("spec.name", "must match [a-z0-9-]+"))))
    assert isinstance(err, InvalidArgument)
    assert err.code is grpc.StatusCode.INVALID_ARGUMENT
    assert err.field_violations == [("spec.gpus", "must be between 1 and 8"),
                                    ("spec.name", "must match [a-z0-9-]+")]
    assert err.retry_after_s is None
    assert str(err) == ("INVALID_ARGUMENT: spec.gpus: must be between 1 and 8; "
                        "spec.name: must match [a-z0-9-]+")


def test_retry_info_becomes_a_rate_limited_error_with_the_delay_in_seconds() -> None:
    retry = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=2, nanos=250_000_000))
    err = from_rpc_error(rpc_error_for(status_pb2.Status(
        code=code_pb2.RESOURCE_EXHAUSTED, message="rate limit of acme exceeded",
        details=[packed(retry)])))
    assert isinstance(err, RateLimited)
    assert err.retry_after_s == 2.25
    assert str(err) == "RESOURCE_EXHAUSTED: rate limit of acme exceeded (retry after 2.25s)"


@pytest.mark.parametrize(("exc", "sdk_class", "code"), [
    (server_errors.InvalidArgument([server_errors.FieldViolation("gpus", "must be >= 1")]),
     InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (server_errors.NotFound("job j-1 not found"), NotFound, grpc.StatusCode.NOT_FOUND),
    (server_errors.AlreadyExists("tenant acme exists"), AlreadyExists,
     grpc.StatusCode.ALREADY_EXISTS),
    (server_errors.FailedPrecondition("tenant is suspended"), FailedPrecondition,
     grpc.StatusCode.FAILED_PRECONDITION),
    (server_errors.PermissionDenied("operator only"), PermissionDenied,
     grpc.StatusCode.PERMISSION_DENIED),
    (server_errors.Unauthenticated("unknown key"), Unauthenticated,
     grpc.StatusCode.UNAUTHENTICATED),
    (server_errors.Unavailable("meter is down"), Unavailable, grpc.StatusCode.UNAVAILABLE),
    (server_errors.ResourceExhausted("slow down", 0.5), RateLimited,
     grpc.StatusCode.RESOURCE_EXHAUSTED),
])
def test_every_status_the_services_send_maps_to_its_sdk_class(
        exc: server_errors.KestrelError, sdk_class: type[KestrelError],
        code: grpc.StatusCode) -> None:
    """Contract with kestrel.errors.to_status, the one mapping the servers use."""
    err = from_rpc_error(rpc_error_for(server_errors.to_status(exc)))
    assert type(err) is sdk_class
    assert err.code is code
    assert str(err).startswith(f"{code.name}: ")
    if isinstance(exc, server_errors.InvalidArgument):
        assert err.field_violations == [("gpus", "must be >= 1")]
        assert str(err) == "INVALID_ARGUMENT: gpus: must be >= 1"
    elif isinstance(exc, server_errors.ResourceExhausted | server_errors.Unavailable):
        assert err.retry_after_s == exc.retry_after_s  # RetryInfo: both are retryable
    else:
        assert err.message == exc.message
        assert str(err) == f"{code.name}: {exc.message}"


def test_a_status_without_details_keeps_code_and_message() -> None:
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "job j-9 not found", None))
    assert isinstance(err, NotFound)
    assert (err.field_violations, err.retry_after_s) == ([], None)
    assert str(err) == "NOT_FOUND: job j-9 not found"


def test_details_that_contradict_the_call_status_are_ignored_not_raised() -> None:
    mismatched = bad_request(("gpus", "x"), message="something else")
    s = rpc_status.to_status(mismatched)
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "gpus wrong",
                                      s.trailing_metadata))
    assert isinstance(err, InvalidArgument)
    assert err.field_violations == []
    assert str(err) == "INVALID_ARGUMENT: gpus wrong"


def test_corrupt_details_do_not_hide_the_error() -> None:
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.INTERNAL, "boom",
                                      [("grpc-status-details-bin", b"\xff\x00garbage")]))
    assert err.code is grpc.StatusCode.INTERNAL
    assert str(err) == "INTERNAL: boom"


def test_a_code_without_its_own_class_is_a_plain_kestrel_error() -> None:
    err = from_rpc_error(FakeRpcError(grpc.StatusCode.DATA_LOSS, "lost"))
    assert type(err) is KestrelError
    assert str(err) == "DATA_LOSS: lost"


def test_from_status_reads_a_google_rpc_status_directly() -> None:
    err = from_status(bad_request(("amount", "must be greater than zero")),
                      request_id="r-1")
    assert isinstance(err, InvalidArgument)
    assert err.request_id == "r-1"
    assert str(err) == "INVALID_ARGUMENT: amount: must be greater than zero"


def test_an_empty_message_still_gives_a_sentence() -> None:
    assert str(from_rpc_error(FakeRpcError(grpc.StatusCode.UNAVAILABLE, ""))) == (
        "UNAVAILABLE: no details given")


def test_sdk_errors_are_catchable_as_kestrel_error_and_keep_the_request_id() -> None:
    with pytest.raises(KestrelError) as info:
        raise from_rpc_error(FakeRpcError(grpc.StatusCode.PERMISSION_DENIED, "no"),
                             request_id="abc")
    assert isinstance(info.value, PermissionDenied)
    assert info.value.request_id == "abc"
    assert "PermissionDenied(code=PERMISSION_DENIED" in repr(info.value)


# --- credentials and metadata, before any I/O -------------------------------------------


def test_tenant_calls_send_the_api_key_and_a_fresh_request_id() -> None:
    s = Settings.resolve("gw:1", "ks_key", "op_token", 5.0)
    (auth, rid), request_id = s.metadata(operator=False)
    assert auth == ("authorization", "Bearer ks_key")
    assert rid == ("x-request-id", request_id)
    assert s.metadata(operator=False)[1] != request_id
    assert s.metadata(operator=True)[0][0] == ("authorization", "Bearer op_token")


def test_settings_fall_back_to_the_environment_then_to_the_default_address(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KESTREL_GATEWAY_ADDR", raising=False)
    monkeypatch.setenv("KESTREL_API_KEY", "from-env")
    monkeypatch.setenv("KESTREL_OPERATOR_TOKEN", "")
    s = Settings.resolve(None, None, None, 10.0)
    assert (s.address, s.api_key, s.operator_token) == ("127.0.0.1:50051", "from-env", None)
    monkeypatch.setenv("KESTREL_GATEWAY_ADDR", "gw:9")
    assert Settings.resolve(None, "arg", None, 1.0).address == "gw:9"
    assert Settings.resolve("explicit:1", "arg", None, 1.0).api_key == "arg"
    with pytest.raises(ValueError, match="timeout_s"):
        Settings.resolve(None, None, None, 0)


def test_a_missing_credential_fails_client_side_with_a_clear_unauthenticated_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KESTREL_API_KEY", raising=False)
    monkeypatch.delenv("KESTREL_OPERATOR_TOKEN", raising=False)
    with Client("127.0.0.1:1", api_key="k") as c:  # the channel connects lazily: no I/O
        with pytest.raises(MissingCredential) as info:
            c.get_tenant("acme")
        assert isinstance(info.value, Unauthenticated)
        assert str(info.value) == ("UNAUTHENTICATED: no operator token configured: pass "
                                   "operator_token= to the client or set "
                                   "KESTREL_OPERATOR_TOKEN")
        with pytest.raises(MissingCredential):
            c.list_tenants()  # raised at the call, not at the first next()
    with Client("127.0.0.1:1", operator_token="t") as c, pytest.raises(
            MissingCredential, match="KESTREL_API_KEY"):
        c.watch_job("j-1")

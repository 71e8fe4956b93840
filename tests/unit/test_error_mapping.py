"""kestrel.errors.to_status: a store or the bus away is UNAVAILABLE (the client retries);
anything else unexpected is INTERNAL without its text."""

from __future__ import annotations

import asyncpg
import nats.errors
import pytest
from google.rpc import code_pb2

from kestrel.errors import to_status


@pytest.mark.parametrize("exc", [
    asyncpg.PostgresConnectionError("connection was closed in the middle of operation"),
    asyncpg.CannotConnectNowError("the database system is starting up"),
    asyncpg.InternalClientError("cannot switch to state 11; another operation (2) is in "
                                "progress"),
    ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 41333)"),
    ConnectionResetError(104, "Connection reset by peer"),
    nats.errors.NoRespondersError(),
    TimeoutError(),
], ids=lambda e: type(e).__name__)
def test_a_store_or_the_bus_away_is_unavailable_with_a_retry_delay(exc: Exception) -> None:
    s = to_status(exc)
    assert s.code == code_pb2.UNAVAILABLE
    assert "retry" in s.message and len(s.details) == 1


@pytest.mark.parametrize("exc", [
    ValueError("a bug"), KeyError("x"),
    asyncpg.UniqueViolationError("duplicate key value violates unique constraint"),
], ids=lambda e: type(e).__name__)
def test_anything_else_is_internal_and_does_not_leak_its_text(exc: Exception) -> None:
    s = to_status(exc)
    assert s.code == code_pb2.INTERNAL and s.message == "internal error"

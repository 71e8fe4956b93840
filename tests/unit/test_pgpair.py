"""The Postgres pair's Patroni configuration: what makes a failover lose nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg
import pytest

from kestrel.errors import transient
from kestrel_tools import pgpair


def _config(**kw: Any) -> dict[str, Any]:
    return pgpair.member_config(
        name="pg-1", home=Path("/m1"), pg_port=1, rest_port=2, etcd_port=3,
        bin_dir=Path("/bin"), superuser_password="su", replication_password="rep",
        **{"durable": True, **kw})


def test_the_standby_is_synchronous_so_an_acknowledged_commit_survives_the_primary() -> None:
    dcs = _config()["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True
    assert "synchronous_commit" not in dcs["postgresql"]["parameters"]  # on, the default
    assert "fsync" not in dcs["postgresql"]["parameters"]


def test_a_crashed_primary_postmaster_fails_over_at_once_instead_of_restarting() -> None:
    assert _config()["bootstrap"]["dcs"]["primary_start_timeout"] == 0


def test_the_timings_fit_patronis_own_rule() -> None:
    dcs = _config()["bootstrap"]["dcs"]
    assert dcs["ttl"] >= 20 and dcs["loop_wait"] + 2 * dcs["retry_timeout"] <= dcs["ttl"]


def test_an_old_primary_that_diverged_rejoins_by_rewind_or_a_fresh_copy() -> None:
    c = _config()
    assert c["bootstrap"]["dcs"]["postgresql"]["use_pg_rewind"] is True
    assert c["bootstrap"]["dcs"]["postgresql"]["parameters"]["wal_log_hints"] == "on"
    assert c["postgresql"]["remove_data_directory_on_rewind_failure"] is True


def test_every_tcp_login_needs_a_password_and_only_the_replicator_replicates() -> None:
    hba = _config()["postgresql"]["pg_hba"]
    assert not any(line.startswith("host") and line.endswith("trust") for line in hba)
    assert [line for line in hba if " replication " in line] == [
        f"host replication {pgpair.REPLICATION_ROLE} 127.0.0.1/32 scram-sha-256"]
    assert _config()["restapi"]["listen"].startswith("127.0.0.1:")


def test_a_write_that_reached_a_demoted_member_is_retried_not_internal() -> None:
    assert transient(asyncpg.ReadOnlySQLTransactionError())


async def test_a_transaction_cut_off_by_a_failover_is_run_again_until_the_primary_answers(
        ) -> None:
    from kestrel.db import retrying

    tries: list[int] = []

    async def once() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise asyncpg.ConnectionDoesNotExistError("connection was closed")
        return "stored"

    assert await retrying("insert", once) == "stored" and len(tries) == 3


async def test_a_refusal_of_the_store_itself_is_not_repeated() -> None:
    from kestrel.db import retrying

    tries: list[int] = []

    async def once() -> None:
        tries.append(1)
        raise asyncpg.UniqueViolationError("duplicate key")

    with pytest.raises(asyncpg.UniqueViolationError):
        await retrying("insert", once)
    assert len(tries) == 1


async def test_a_primary_away_longer_than_the_window_is_the_callers_unavailable() -> None:
    from kestrel.db import retrying

    async def never() -> None:
        raise ConnectionRefusedError("no primary yet")

    with pytest.raises(ConnectionRefusedError):
        await retrying("insert", never, within_s=0.2)

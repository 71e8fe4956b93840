"""devstack: the ports it hands out, and where Postgres (its own user) finds its files."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from kestrel_tools.devstack import PUBLIC_PG_DIR, Stack, port_map

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="Postgres drops privileges only as root")


@root_only
def test_a_stack_under_a_private_directory_keeps_its_postgres_data_where_postgres_can_reach(
        tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)  # mkdir's mode is masked by the umask
    data = Stack(private / "checkout" / ".run" / "demo").pg_data
    assert data.is_relative_to(PUBLIC_PG_DIR)
    # One place per stack directory, the same on every call.
    assert data == Stack(private / "checkout" / ".run" / "demo").pg_data
    assert data != Stack(private / "checkout" / ".run" / "other").pg_data


@root_only
def test_a_stack_under_open_directories_keeps_its_postgres_data_inside() -> None:
    open_dir = Path(tempfile.mkdtemp(prefix="kestrel-paths-", dir="/tmp"))
    try:
        os.chmod(open_dir, 0o755)
        assert Stack(open_dir / "stack").pg_data == open_dir / "stack" / "postgres"
    finally:
        shutil.rmtree(open_dir)


def test_ports_handed_out_together_are_distinct() -> None:
    names = [f"service-{i}" for i in range(64)]
    ports = port_map(*names)
    assert list(ports) == names and len(set(ports.values())) == len(names)


def test_a_stacks_env_gives_each_service_its_own_role_and_nothing_the_superuser() -> None:
    s = Stack(Path("/nonexistent"), pg_port=5555,
              passwords={"kestrel_meter": "m", "kestrel_reader": "r", "postgres": "su"})
    env = s.env()
    assert env["KESTREL_METER_POSTGRES_DSN"] == "postgresql://kestrel_meter:m@127.0.0.1:5555/kestrel"
    for svc in ("ADMISSION", "GATEWAY", "PLACER"):
        assert f"kestrel_{svc.lower()}@" in env[f"KESTREL_{svc}_POSTGRES_DSN"]
    assert env["KESTREL_POSTGRES_OWNER_DSN"].startswith("postgresql://kestrel_owner")
    assert env["KESTREL_POSTGRES_DSN"] == env["KESTREL_POSTGRES_READER_DSN"] == s.postgres_dsn
    assert not any("postgres:" in v or "//postgres@" in v for v in env.values())
    assert s.postgres_admin_dsn == "postgresql://postgres:su@127.0.0.1:5555/postgres"


def test_a_pairs_services_connect_to_whichever_member_is_primary() -> None:
    s = Stack(Path("/nonexistent"), pg_nodes=2, pg_ports=[5555, 5556],
              passwords={"kestrel_meter": "m"})
    assert s.env()["KESTREL_METER_POSTGRES_DSN"] == (
        "postgresql://kestrel_meter:m@127.0.0.1:5555,127.0.0.1:5556/kestrel"
        "?target_session_attrs=read-write")
    assert s.pg_node_names == ["etcd", "postgres", "postgres-2"]
    assert Stack(Path("/nonexistent")).pg_node_names == ["postgres"]


def test_a_stack_whose_postgres_ran_alone_is_not_turned_into_a_pair(tmp_path: Path) -> None:
    from kestrel_tools.devstack import StackError, open_stack

    Stack(tmp_path, pg_port=5555).save()
    with pytest.raises(StackError, match="runs 1 node"):
        open_stack(tmp_path, pg_nodes=2)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert open_stack(fresh, pg_nodes=2).pg_nodes == 2

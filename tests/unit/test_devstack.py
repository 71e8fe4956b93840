"""devstack: the ports it hands out, and where Postgres (its own user) finds its files."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from kestrel.devstack import PUBLIC_PG_DIR, Stack, port_map

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

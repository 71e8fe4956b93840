"""`make chaos` in the form that fits CI: the same harness (bench/chaos.py) on the real
cluster with a devstack of its own, under the same load, with four faults of
different kinds: a Kestrel service killed mid-stream (the meter, which owns the
ledger), nats-server restarted (JetStream's file store must keep every workload
event), Postgres' postmaster killed with -9, and the Kueue manager killed with -9
(Jobs created while it restarts waited 100 s for their Workloads until the placer
learned to requeue them). The full run faults every component."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from bench import chaos
from kestrel_tools import cluster as kc

pytestmark = pytest.mark.e2e


async def test_the_plane_survives_a_crashed_meter_nats_restarted_and_postgres_and_kueue_killed(
        cluster_up: kc.ClusterInfo) -> None:
    root = Path(tempfile.mkdtemp(prefix="kestrel-chaos-", dir="/tmp"))
    os.chmod(root, 0o755)  # Postgres runs as its own user
    report = await chaos.run(root, ["meter", "nats", "postgres", "kueue"], tenants=2, rate=1.0,
                             settle_s=5.0)
    print()
    for p in report.phases:
        print(f"{p.fault}: recovery {p.recovery_s} s, {p.calls} calls ({p.errors} errors), "
              f"{p.jobs} jobs, restarts {p.restarts}, notes {p.notes[:3]}")
    print(report.line())
    for p in report.phases:
        assert p.recovery_s is not None, f"{p.fault}: the plane never recovered ({p.notes})"
        assert not p.unclear, f"{p.fault}: calls ended without a clear status: {p.unclear}"
        assert p.hung == 0, f"{p.fault}: {p.hung} calls outlived their deadline"
        assert (p.lost, p.duplicated) == (0, 0), f"{p.fault}: {p.notes}"
    assert sum(p.jobs for p in report.phases) >= 20  # the load really ran throughout
    assert all(p.calls for p in report.phases)


async def test_of_two_replicas_one_each_a_nats_node_and_the_pg_primary_die_and_nothing_is_lost(
        cluster_up: kc.ClusterInfo) -> None:
    """`make chaos-ha` in short: two replicas of every service, NATS as three nodes and a
    Postgres pair; one replica of each service (the Lease holder where one leads), the
    node leading the workload stream and the Postgres primary killed with -9 in turn,
    while the survivors carry the load."""
    root = Path(tempfile.mkdtemp(prefix="kestrel-chaos-ha-", dir="/tmp"))
    os.chmod(root, 0o755)  # Postgres runs as its own user
    report = await chaos.run(root, list(chaos.HA_FAULTS[:-1]), tenants=2, rate=1.0,
                             settle_s=4.0, ha=True)
    print()
    for p in report.phases:
        print(f"{p.fault} ({p.how}): recovery {p.recovery_s} s, {p.calls} calls "
              f"({p.errors} errors), {p.jobs} jobs, restarts {p.restarts}, notes {p.notes[:3]}")
    print(report.line())
    assert report.line().startswith("ha: replicas=2 nats_nodes=3 pg_nodes=2 faults=7 ")
    for p in report.phases:
        assert p.recovery_s is not None, f"{p.fault}: the plane never recovered ({p.notes})"
        assert not p.unclear, f"{p.fault}: calls ended without a clear status: {p.unclear}"
        assert p.hung == 0, f"{p.fault}: {p.hung} calls outlived their deadline"
        assert (p.lost, p.duplicated) == (0, 0), f"{p.fault}: {p.notes}"
    assert sum(p.jobs for p in report.phases) >= 20  # the load really ran throughout

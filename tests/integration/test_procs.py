"""Service processes: started means that service answers; SIGTERM stops one at any time."""

from __future__ import annotations

import asyncio
import functools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kestrel.service import die_with_parent
from kestrel_tools.cluster.processes import _proc_cmdline, pid_alive, runs, spawn_daemon
from kestrel_tools.devstack import free_port
from kestrel_tools.procs import REPO, ServiceProcess, as_user

pytestmark = pytest.mark.integration


def test_a_service_whose_port_another_server_holds_fails_to_start(
        service_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    thread_pool = ThreadPoolExecutor(2)
    squatter = grpc.server(thread_pool, options=[("grpc.so_reuseport", 0)])
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)  # healthy, but not a meter
    health_pb2_grpc.add_HealthServicer_to_server(servicer, squatter)
    squatter.add_insecure_port(f"127.0.0.1:{port}")
    squatter.start()
    meter = ServiceProcess("meter", {**service_env, "KESTREL_METER_PORT": str(port),
                                     "KESTREL_METER_METRICS_PORT": "0"},
                           f"127.0.0.1:{port}", tmp_path / "meter.log")
    try:
        with pytest.raises(RuntimeError, match="exited"):
            meter.start(timeout_s=30)
    finally:
        squatter.stop(0)
        thread_pool.shutdown()
        meter.stop()  # had it passed for started, it would outlive the test


def test_a_service_still_waiting_for_its_database_stops_on_sigterm(
        service_env: dict[str, str], tmp_path: Path) -> None:
    nowhere = free_port()  # nothing listens: Postgres never answers
    log = tmp_path / "meter.log"
    env = {**os.environ, **service_env, "PYTHONUNBUFFERED": "1",
           "KESTREL_METER_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:{nowhere}/none",
           "KESTREL_METER_PORT": str(free_port()), "KESTREL_METER_METRICS_PORT": "0"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "services.meter"], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "postgres connect failed" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert "stopped before start-up finished" in log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def _spawn_beside_busy_grpc(argv: list[str], n: int,
                                  **kw: object) -> list[subprocess.CompletedProcess[str]]:
    """Run `argv` n times while four clients call a gRPC server in this process, as in
    any Kestrel service (and in the test runner, whose chaos test restarts Postgres)."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stop = asyncio.Event()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def call() -> None:
            while not stop.is_set():
                await stub.Check(health_pb2.HealthCheckRequest())

        clients = [asyncio.create_task(call()) for _ in range(4)]
        try:
            return [await asyncio.to_thread(functools.partial(
                subprocess.run, argv, capture_output=True, text=True, **kw))
                for _ in range(n)]
        finally:
            stop.set()
            await asyncio.gather(*clients)
            await server.stop(0)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing user needs root")
async def test_children_started_as_another_user_beside_busy_grpc_calls_all_run_as_it() -> None:
    # Popen(user=...) forks where it would vfork, and gRPC's fork handlers crashed 49
    # of 200 such children (SIGSEGV) beside four busy calls; the prefix crashes none.
    nobody = pwd.getpwnam("nobody")
    outs = await _spawn_beside_busy_grpc(
        [*as_user(nobody.pw_uid, nobody.pw_gid), "sh", "-c", "id -u; id -G"], 100)
    assert [o.returncode for o in outs if o.returncode != 0] == []
    assert {o.stdout for o in outs} == {f"{nobody.pw_uid}\n{nobody.pw_gid}\n"}


def test_a_child_started_to_die_with_its_parent_ends_when_the_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         f"p = subprocess.Popen({die_with_parent('TERM')!r} + ['sleep', '120'])\n"
         "print(p.pid, flush=True)\ntime.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(0.2)  # past setpriv's exec: the child is sleep itself
    assert pid_alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)


def test_a_daemon_is_seen_running_its_binary_the_moment_spawn_daemon_returns(
        tmp_path: Path) -> None:
    """What every "is our kubelet alive?" check reads: /proc/<pid>/cmdline. Right after
    Popen it is empty in about one start of twenty (the kernel sets the new program's
    arguments after the exec has released the parent), which called a live kubelet dead."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    not_yet = 0
    for _ in range(200):
        proc = spawn_daemon([sleep, "60"], tmp_path / "sleep.log", cwd=tmp_path)
        try:
            shown = _proc_cmdline(proc.pid)
            not_yet += not shown or Path(shown[0]).name != "sleep"
        finally:
            proc.kill()
            proc.wait()
    assert not_yet == 0


def test_a_daemon_another_process_just_started_is_seen_as_ours(tmp_path: Path) -> None:
    """`kestrel status` while `up` starts the kubelet: a plain Popen, checked at once
    from outside, lands in the exec window where /proc/<pid>/cmdline is still empty.
    runs() reads again until the arguments show, so none of 200 is called dead; a live
    pid running another binary, or one that exited, is still not ours."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    missed = 0
    for _ in range(200):
        proc = subprocess.Popen([sleep, "60"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            missed += not runs(proc.pid, "sleep")
            assert not runs(proc.pid, "kubelet")
            assert runs(proc.pid, lambda name: name.startswith("sle"))
        finally:
            proc.kill()
            proc.wait()
        assert not runs(proc.pid, "sleep")
    assert missed == 0, f"{missed} of 200 live starts called dead"

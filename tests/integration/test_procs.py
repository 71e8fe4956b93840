"""Service processes: started means that service answers; SIGTERM stops one at any time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kestrel.devstack import free_port
from kestrel.procs import REPO, ServiceProcess

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

"""Starting a service waits for that service, not for whatever answers on its port."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kestrel.devstack import free_port
from kestrel.procs import ServiceProcess

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

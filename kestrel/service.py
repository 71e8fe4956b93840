"""Process lifecycle shared by services: logging, /metrics, SIGTERM drain."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


def setup_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")


def serve_metrics(registry: CollectorRegistry, host: str,
                  port: int) -> tuple[WSGIServer, threading.Thread] | None:
    """Prometheus /metrics on host:port (loopback by default); port 0 disables it."""
    if port <= 0:
        return None
    server, thread = start_http_server(port, addr=host, registry=registry)
    return server, thread


def stop_event_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT: the service drains and exits."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop

"""Process lifecycle shared by services: logging, the garbage collector, /metrics,
SIGTERM drain."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


def setpriv() -> str:
    path = shutil.which("setpriv")
    if path is None:  # util-linux is Essential in Debian; say what is missing if not
        raise FileNotFoundError("setpriv (util-linux) is needed to start this process")
    return path


def die_with_parent(sig: str = "TERM") -> list[str]:
    """argv prefix: the child gets `sig` when the thread that started it ends
    (PR_SET_PDEATHSIG, set by setpriv just before it execs the command): a process a
    service starts (the placer's GPU stand-ins) never outlives it."""
    return [setpriv(), f"--pdeathsig={sig}"]


def setup_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")


def serve_metrics(registry: CollectorRegistry, host: str,
                  port: int) -> tuple[WSGIServer, threading.Thread] | None:
    """Prometheus /metrics on host:port (loopback by default); port 0 disables it.

    A port another process holds does not stop the service: it serves without
    /metrics and says so (Prometheus then shows its target down)."""
    if port <= 0:
        return None
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        logging.getLogger("kestrel.service").error(
            "no /metrics: cannot listen on %s:%d (%s)", host, port, exc)
        return None
    return server, thread


class Stopped(Exception):
    """SIGTERM or SIGINT came while the service was still starting: nothing to drain."""


_stopping: asyncio.Event | None = None  # this process's stop event, once installed


def stop_event_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT: the service drains and exits."""
    global _stopping
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _stopping = stop
    return stop


async def pause_unless_stopped(delay_s: float) -> None:
    """Sleep, but raise Stopped as soon as the process is told to stop (start-up
    retries wait here, so a service whose backends never come stops on SIGTERM)."""
    stop = _stopping
    if stop is None:
        await asyncio.sleep(delay_s)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay_s)
    if stop.is_set():
        raise Stopped


# Allocations between two young collections (CPython's default is 700), and young
# collections between two of the next generation (default 10).
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Collect less often, and never again look at what start-up made.

    The services hold what they watch (the placer every Job, Workload and pod of a
    running job as parsed JSON, thousands of small objects each), and every parsed watch
    event or protobuf message allocates hundreds more; at CPython's default thresholds
    the collector ran 750 times in the placer over a 300-job run, a full collection
    five times, 0.51 s of its 3.5 s of CPU (gc.callbacks, bench-jobs' plane phase).
    Frozen start-up objects (modules, classes, clients) are skipped by every collection;
    with this the same run spent 0.12 s in the placer's collector, start-up's own
    collections included, for a few MB more of garbage waiting at most. Nothing here
    depends on when cycles are freed: connections and files are closed explicitly."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_main(service: str, run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """`python -m services.<service>`: log, run until SIGTERM or SIGINT, drain, exit."""
    setup_logging(service, os.environ.get("KESTREL_LOG_LEVEL", "INFO"))
    tune_gc()

    async def main() -> None:
        await run(stop_event_on_signals())

    try:
        asyncio.run(main())
    except Stopped:
        logging.getLogger(f"kestrel.{service}").info("stopped before start-up finished")


async def drain(server: Any, tasks: Sequence[asyncio.Task[Any]], *, task_timeout_s: float,
                http: tuple[WSGIServer, threading.Thread] | None, nc: Any, pool: Any,
                closers: Sequence[Callable[[], Awaitable[Any]]] = ()) -> None:
    """The end of every service, in order: stop taking RPCs (finishing those in flight),
    let the background tasks finish their unit of work, then close the connections.

    NATS is flushed and closed, not drained: every message a service fetched was
    acknowledged after its effect committed, or is left for redelivery."""
    await server.stop(grace_s=3)
    for t in tasks:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(t, timeout=task_timeout_s)
    if http is not None:
        http[0].shutdown()
    for close in closers:
        with contextlib.suppress(Exception):
            await close()
    with contextlib.suppress(Exception):
        await nc.flush(timeout=2)
        await nc.close()
    await pool.close()
    logging.getLogger("kestrel.service").info("stopped")


async def every(seconds: float, stop: asyncio.Event, fn: Callable[[], Awaitable[Any]],
                failure: str, log: logging.Logger) -> None:
    """Call fn every `seconds` until stop is set; a failure is logged, the next call
    is on time."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)
        if stop.is_set():
            return
        try:
            await fn()
        except Exception:
            log.exception(failure)

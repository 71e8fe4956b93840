"""Start Kestrel services as real processes and await their gRPC health.

Used by the test fixtures, the benchmarks and the demo, so every one of them
runs services exactly as an operator would (`python -m services.<name>`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kestrel.service import setpriv
from kestrel_sdk.tls import Tls
from kestrel_sdk.tls import channel as tls_channel

REPO = Path(__file__).resolve().parent.parent

# A child that needs another user or a parent-death signal gets it from an argv prefix
# (setpriv, which sets it and execs the command), never from Python's preexec_fn or
# Popen's user/group: those make subprocess fork() where it would vfork(), and a fork()
# of a process with gRPC in use runs gRPC's child fork handlers, which crash the child
# (grpcio 1.85: 49 of 200 such spawns died with SIGSEGV beside four busy calls, none
# through setpriv; Postgres restarted by the chaos test printed "Fatal Python error:
# Segmentation fault" into CI's log).


def as_user(uid: int, gid: int) -> list[str]:
    """argv prefix: run as uid:gid with no supplementary groups (util-linux setpriv)."""
    return [setpriv(), f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]




def wait_serving(address: str, timeout_s: float = 30.0, service: str = "",
                 proc: subprocess.Popen[bytes] | None = None, log: Path | None = None,
                 tls: Tls | None = None) -> None:
    """Poll grpc.health.v1 until SERVING (or the process dies). `tls`: how to dial
    (default: KESTREL_TLS_* of this process)."""
    deadline = time.monotonic() + timeout_s
    with tls_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
                raise RuntimeError(f"{address} exited with {proc.returncode}:\n{tail}")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    raise TimeoutError(f"{address} not serving after {timeout_s}s")


@dataclass
class ServiceProcess:
    """One `python -m services.<name>` child with its own env and log file."""

    name: str
    env: dict[str, str]
    grpc_address: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)
    # Detached: its own session, so it outlives the command that started it.
    detach: bool = False

    def spawn(self) -> ServiceProcess:
        """Start the process without waiting for it to serve (a standby that serves
        only once it leads); `wait()` waits."""
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"services.{self.name}", *self.extra_args], cwd=REPO,
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=self.detach)
        log.close()
        return self

    def wait(self, timeout_s: float = 60.0) -> ServiceProcess:
        """Until its gRPC health says SERVING (RuntimeError if it exits first)."""
        # Ask for this service by name: another server on the same port (a port that
        # two free_port() calls both handed out) must not pass for it.
        wait_serving(self.grpc_address, timeout_s, service=f"kestrel.v1.{self.name.title()}",
                     proc=self.proc, log=self.log_path,
                     tls=Tls.from_env({**os.environ, **self.env}))
        return self

    def start(self, timeout_s: float = 60.0) -> ServiceProcess:
        return self.spawn().wait(timeout_s)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill9(self) -> None:
        """Crash it: no drain, no goodbye."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM and wait for the drain; SIGKILL if it does not exit in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

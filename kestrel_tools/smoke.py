"""A smoke check of a running Kestrel: every service healthy, one job submitted and
metered. The Helm chart's `helm test` runs it in a pod; an operator can run it
against any installation.

    python -m kestrel_tools.smoke --service gateway=HOST:PORT --service meter=HOST:PORT ...

The gateway's address is the `gateway` service's (or KESTREL_GATEWAY_ADDR); the
operator token comes from KESTREL_OPERATOR_TOKEN. The check uses one tenant of its
own (`--tenant`, default `smoke`), created on first use with `--credits` and a quota
of one GPU on `--flavor`; each run makes an API key, submits one short simulated job
(`--sim-duration-s`), waits for it to succeed and for the ledger to hold its rows,
then revokes the key. The rows it reads are the ledger's, as metered from Kueue's
timestamps: nothing is seeded. Ends with a table; exit 0 only if every line is ok.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kestrel_sdk import Client, JobState, NotFound
from kestrel_sdk.tls import channel as tls_channel


@dataclass(frozen=True)
class Line:
    what: str
    ok: bool
    detail: str


def health(name: str, address: str, timeout_s: float) -> Line:
    """grpc.health.v1 Check of the server as a whole (service "")."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with tls_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return Line(f"health {name}", True, f"{address} {status}")
                last = status
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            if time.monotonic() >= deadline:
                return Line(f"health {name}", False, f"{address} {last}")
            time.sleep(0.5)


def _until(what: str, probe: Callable[[], str | None], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        if (found := probe()) is not None:
            return found
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} after {timeout_s:.0f}s")
        time.sleep(0.5)


def job_metered(gateway: str, token: str, args: argparse.Namespace) -> list[Line]:
    """Submit one job as the smoke tenant; wait until it succeeded and is on the ledger."""
    lines: list[Line] = []
    with Client(gateway, operator_token=token, timeout_s=15) as op:
        try:
            tenant = op.get_tenant(args.tenant)
            lines.append(Line("tenant", True, f"{tenant.tenant} (exists)"))
        except NotFound:
            op.create_tenant(args.tenant, display_name="smoke check",
                             gpu_quota={args.flavor: 1}, rate_per_s=5, burst=10,
                             initial_credits=Decimal(args.credits))
            lines.append(Line("tenant", True, f"{args.tenant} (created, {args.credits} credits)"))
        key = op.create_api_key(args.tenant, f"smoke-{int(time.time())}")
        try:
            with Client(gateway, api_key=key.secret, timeout_s=15) as me:
                job = me.submit_job(name="smoke", gpus=1, max_duration_s=120,
                                    flavor=args.flavor, sim_duration_s=args.sim_duration_s)
                lines.append(Line("submit", True, f"{job.job_id} {job.state.name}"))

                def finished() -> str | None:
                    j = me.get_job(job.job_id)
                    return j.state.name if j.terminal else None

                state = _until(f"job {job.job_id} not finished", finished, args.timeout_s)
                lines.append(Line("job", state == JobState.SUCCEEDED.name,
                                  f"{job.job_id} {state}"))

                def rows() -> str | None:
                    found = list(me.usage(workload_id=job.job_id))
                    if not found:
                        return None
                    cost = sum((r.cost for r in found), Decimal(0))
                    gpu_s = sum(r.gpu_us for r in found) / 1e6
                    return f"{len(found)} row(s), {gpu_s:.3f} GPU-s, cost {cost}"

                metered = _until(f"no ledger rows for {job.job_id}", rows, args.timeout_s)
                lines.append(Line("metered", True, metered))
        finally:
            op.revoke_api_key(key.key_id)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel_tools.smoke", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--service", action="append", default=[], metavar="NAME=HOST:PORT",
                    help="a service to health-check (repeat); `gateway` is also used "
                         "for the job")
    ap.add_argument("--tenant", default="smoke")
    ap.add_argument("--flavor", default="gpu-a10")
    ap.add_argument("--credits", default="100")
    ap.add_argument("--sim-duration-s", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=120)
    args = ap.parse_args(argv)
    services: dict[str, str] = {}
    for item in args.service:
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            ap.error(f"--service {item!r}: expected NAME=HOST:PORT")
        services[name] = address
    gateway = services.get("gateway") or os.environ.get("KESTREL_GATEWAY_ADDR", "")
    token = os.environ.get("KESTREL_OPERATOR_TOKEN", "")
    if not gateway or not token:
        ap.error("needs the gateway (--service gateway=HOST:PORT or KESTREL_GATEWAY_ADDR) "
                 "and KESTREL_OPERATOR_TOKEN")
    lines = [health(n, a, args.timeout_s) for n, a in services.items()]
    if all(line.ok for line in lines):
        try:
            lines += job_metered(gateway, token, args)
        except Exception as exc:  # reported as the failing line
            lines.append(Line("job", False, f"{type(exc).__name__}: {exc}"))
    width = max(len(line.what) for line in lines)
    print(f"{'check':<{width}}  ok    detail")
    for line in lines:
        print(f"{line.what:<{width}}  {'ok' if line.ok else 'FAIL':<4}  {line.detail}")
    ok = all(line.ok for line in lines)
    print(f"smoke: {'ok' if ok else 'fail'} checks={len(lines)} "
          f"failed={sum(not line.ok for line in lines)}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

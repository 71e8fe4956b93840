"""`python -m kestrel_tools.cluster up|down|status|build|env` (cluster/up, down and status
run it with the standard library only, before the venv exists)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from kestrel_tools.cluster.build import build
from kestrel_tools.cluster.dataplane import down, up
from kestrel_tools.cluster.paths import PATHS, ClusterError, binary_paths
from kestrel_tools.cluster.status import status


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kestrel_tools.cluster",
        description="The Kestrel data plane: a local Kubernetes control plane with Kueue "
                    "and KWOK.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="build if needed, start, wait until ready (idempotent)")
    sub.add_parser("down", help="stop Kueue and delete the cluster")
    sub.add_parser("status", help="versions, processes, nodes, queues")
    b = sub.add_parser("build", help="build missing binaries (cluster/build.sh)")
    b.add_argument("components", nargs="*")
    sub.add_parser("env", help="print KUBECONFIG=... for eval")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `cluster/status | head` exits quietly

    def say(msg: str) -> None:
        print(msg, flush=True)

    try:
        if args.cmd == "up":
            info = up(say)
            say(f"kubeconfig: {info.kubeconfig}")
            say(f"logs:       {info.log_dir} (kueue.log), {info.kwok_log_dir} (control plane)")
            kubectl_bin = binary_paths()["kubectl"]
            say(f"try:        KUBECONFIG={info.kubeconfig} {kubectl_bin} get cq,lq,workloads -A")
        elif args.cmd == "down":
            down(say)
        elif args.cmd == "status":
            return 0 if status(say) else 1
        elif args.cmd == "build":
            build(say, args.components)
        elif args.cmd == "env":
            say(f"export KUBECONFIG={PATHS.kubeconfig}")
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())

"""The Docker engine and Compose v2 for docker-compose.yml.

    python -m kestrel_tools.dockerd up|down|status|images

The engine is Debian's docker.io (scripts/setup.sh installs it); where none answers
on /var/run/docker.sock, `up` starts one: its data under ~/.cache/kestrel/docker (so
loaded images stay between runs), no bridge, no iptables rules (every Kestrel
container shares the host's network, so none are needed, and the local cluster's
pod network is left as it is). Compose v2 is built from the Go module registry at
the pinned COMPOSE_VERSION (cluster/build.sh compose, cached) and installed as the
docker CLI plugin (~/.docker/cli-plugins/docker-compose): Debian offers only v1.

`images` loads the Kestrel image that images/build.sh made for the local cluster
into the engine and tags it kestrel.dev/kestrel:local, the tag docker-compose.yml
runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kestrel_tools import cluster as kc

DATA_ROOT = kc.CACHE_DIR / "docker"
EXEC_ROOT = Path("/var/run/kestrel-docker")
SOCKET = Path("/var/run/docker.sock")
PIDFILE = DATA_ROOT / "dockerd.pid"
LOG = kc.PATHS.logs / "dockerd.log"
PLUGIN = Path.home() / ".docker" / "cli-plugins" / "docker-compose"
LOCAL_TAG = "kestrel.dev/kestrel:local"
Progress = Callable[[str], None]


class EngineError(RuntimeError):
    pass


def docker_cli() -> str:
    found = shutil.which("docker")
    if not found:
        raise EngineError("no docker CLI: run `make setup` (Debian docker.io)")
    return found


def docker(*args: str, timeout: float = 300, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([docker_cli(), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise EngineError(f"docker {' '.join(args)} failed ({proc.returncode}):\n"
                          f"{proc.stderr[-3000:]}")
    return proc


def engine_answers() -> bool:
    try:
        return docker("version", "--format", "{{.Server.Version}}", timeout=15,
                      check=False).returncode == 0
    except (EngineError, subprocess.TimeoutExpired):
        return False


def _own_pid() -> int | None:
    try:
        pid = int(PIDFILE.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def up(progress: Progress = print, timeout_s: float = 60) -> str:
    """Make sure an engine answers; start ours if none does. Returns a line saying
    which it is ("... started ..." when this call started it)."""
    if engine_answers():
        return "docker engine: answering on " + str(SOCKET)
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not Path(dockerd).exists():
        raise EngineError("no dockerd: run `make setup` (Debian docker.io)")
    for d in (DATA_ROOT, EXEC_ROOT, LOG.parent):
        d.mkdir(parents=True, exist_ok=True)
    progress(f"starting dockerd (data {DATA_ROOT}, log {LOG})")
    with open(LOG, "ab") as log:
        proc = subprocess.Popen(
            [dockerd, "--data-root", str(DATA_ROOT), "--exec-root", str(EXEC_ROOT),
             "--pidfile", str(PIDFILE), "--host", f"unix://{SOCKET}", "--bridge", "none",
             "--iptables=false", "--ip-masq=false", "--ip-forward=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not engine_answers():
        if proc.poll() is not None:
            raise EngineError(f"dockerd exited with {proc.returncode}:\n"
                              + LOG.read_text(errors="replace")[-3000:])
        if time.monotonic() > deadline:
            raise EngineError(f"dockerd not answering after {timeout_s:.0f}s; see {LOG}")
        time.sleep(0.3)
    return f"docker engine: started (pid {proc.pid})"


def down(timeout_s: float = 30) -> str:
    """Stop the engine this module started (one started otherwise is left alone)."""
    pid = _own_pid()
    if pid is None:
        return "docker engine: none of ours running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"docker engine: stopped (pid {pid})"
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    return f"docker engine: killed (pid {pid}) after {timeout_s:.0f}s"


def compose_plugin(progress: Progress = print) -> Path:
    """Compose v2 at the pinned version, built on demand, installed as the CLI plugin."""
    binary = kc.BIN_DIR / f"docker-compose-{kc.read_versions()['COMPOSE_VERSION']}"
    if not binary.exists():
        progress(f"building {binary.name} from the Go module registry (cached afterwards)")
        kc.build(progress, ["compose"])
    PLUGIN.parent.mkdir(parents=True, exist_ok=True)
    if not PLUGIN.is_symlink() or PLUGIN.resolve() != binary.resolve():
        PLUGIN.unlink(missing_ok=True)
        PLUGIN.symlink_to(binary)
    return binary


def load_images(progress: Progress = print) -> str:
    """The local cluster's Kestrel image (images/build.sh, cached by content) loaded
    into the engine as kestrel.dev/kestrel:local; a no-op when it is there already."""
    record = kc.build_images(progress)
    ref, archive = record["kestrel"]["ref"], record["kestrel"]["archive"]
    have = docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    if have.returncode != 0:
        t0 = time.monotonic()
        docker("load", "-i", archive, timeout=600)
        progress(f"loaded {ref} into the docker engine ({time.monotonic() - t0:.1f}s)")
    docker("tag", ref, LOCAL_TAG)
    return f"{LOCAL_TAG} = {ref}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel_tools.dockerd", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "images"])
    args = ap.parse_args(argv)
    try:
        if args.command == "up":
            print(up())
            compose_plugin()
            print(docker("compose", "version").stdout.strip())
        elif args.command == "down":
            print(down())
        elif args.command == "images":
            print(up())
            print(load_images())
        else:
            ok = engine_answers()
            print(f"docker engine: {'answering' if ok else 'not answering'} on {SOCKET}")
            return 0 if ok else 3
    except (EngineError, kc.ClusterError, subprocess.TimeoutExpired) as exc:
        print(f"dockerd: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Running processes: commands, kubectl, waiting with backoff, pid files and /proc,
daemons started in sessions of their own, and the lock that serialises up/down."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kestrel_tools.cluster.paths import NODE, PATHS, ClusterError, Progress, binary_paths


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout_s: float,
    progress: Progress | None = None,
    interval_s: float = 0.25,
    max_interval_s: float = 2.0,
) -> None:
    """Poll ``check`` (with backoff) until it is true; raise ClusterError on timeout."""
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    announced = False
    while True:
        if check():
            if announced and progress:
                progress(f"  {what}: ready after {time.monotonic() - started:.1f}s")
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        if not announced and progress and time.monotonic() - started > 2:
            progress(f"  waiting for {what} ...")
            announced = True
        time.sleep(interval_s)
        interval_s = min(interval_s * 1.5, max_interval_s)


def _run(
    cmd: Sequence[str | Path],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float | None = 120,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input_text,
        check=False,
    )
    if check and proc.returncode != 0:
        raise ClusterError(
            f"command failed ({proc.returncode}): {' '.join(str(c) for c in cmd)}\n"
            f"{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
        )
    return proc


def kubectl(
    *args: str, check: bool = True, timeout: float | None = 120, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the pinned kubectl against the cluster's kubeconfig."""
    kubectl_bin = binary_paths()["kubectl"]
    return _run(
        [kubectl_bin, "--kubeconfig", str(PATHS.kubeconfig), *args],
        check=check,
        timeout=timeout,
        input_text=input_text,
    )


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (one that exited between the signal and
    the read of its stat counts as gone). Shared with kestrel_tools.devstack."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pid_dead(pid: int) -> bool:
    return not pid_alive(pid)


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def runs(pid: int, exe: str | Callable[[str], bool], settle_s: float = 0.05) -> bool:
    """Whether ``pid`` is alive and running our binary: the name of its argv[0] is
    ``exe``, or, where ``exe`` is a predicate, that name satisfies it. Every "is pid N
    our daemon?" check asks this, for pid files can outlive their process and a reused
    pid can name anything.

    A live process whose /proc/<pid>/cmdline is empty is one the kernel has not yet
    given its new program's arguments: for a few ms after the exec released its parent
    (up to 10.5 ms measured here, in 10 of 200 kubelet starts). Such a read is taken
    again for up to ``settle_s`` before the answer is no, so a check made while
    someone else starts the daemon (`kestrel status` during `up`) does not call it dead.
    A zombie or kernel thread stays empty and is not ours."""
    def matches(name: str) -> bool:
        return exe(name) if callable(exe) else name == exe

    deadline = time.monotonic() + settle_s
    while pid_alive(pid):
        shown = _proc_cmdline(pid)
        if shown:
            return matches(Path(shown[0]).name)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return False


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    """Serialise up/down across processes (parallel test sessions, CLI)."""
    PATHS.state.mkdir(parents=True, exist_ok=True)
    with open(PATHS.lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def spawn_daemon(cmd: Sequence[str], log_path: Path, *, cwd: Path,
                 env: dict[str, str] | None = None,
                 exec_timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own, its output appended to ``log_path``, and
    return once /proc shows the child running ``cmd[0]`` (or it has exited).

    Popen returns as soon as the exec has replaced the child's memory, but the kernel
    sets the new program's arguments a moment later: until then /proc/<pid>/cmdline is
    empty, and every check of "is this pid our kubelet?" says no. Measured here: empty
    right after Popen in 10 of 200 kubelet starts, for up to 10.5 ms, and 22 of 300
    `sleep` starts. A start checked in that window was reported as "kubelet exited"
    (CI of a10e2b9, 59 end-to-end tests in error) while the kubelet ran on."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env or dict(os.environ),
                                cwd=str(cwd), start_new_session=True)  # fmt: skip
    runs(proc.pid, Path(cmd[0]).name, settle_s=exec_timeout_s)
    return proc


def _start_daemon(component: str, cmd: list[str], env: dict[str, str] | None = None) -> int:
    NODE.root.mkdir(parents=True, exist_ok=True)
    PATHS.logs.mkdir(parents=True, exist_ok=True)
    proc = spawn_daemon(cmd, NODE.log(component), cwd=NODE.root, env=env)
    NODE.pidfile(component).write_text(f"{proc.pid}\n")
    return proc.pid


def _stop_pid(pid: int, what: str, progress: Progress, grace_s: float = 15) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ClusterError):
        wait_until(f"{what} to exit", functools.partial(_pid_dead, pid), grace_s)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ClusterError):
            wait_until(f"{what} to be killed", functools.partial(_pid_dead, pid), 10)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    progress(f"  {what} (pid {pid}) stopped")


def _spawn(spec: dict[str, Any], log_path: Path,
           prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Start a component from its kwok.yaml entry (binary, args, envs, workDir), its
    output appended to log_path, in a session of its own; `prefix` runs before it."""
    env = {**os.environ, **{e["name"]: e.get("value", "") for e in spec.get("envs") or []}}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [*prefix, str(spec["binary"]), *[str(a) for a in spec.get("args", [])]],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            cwd=spec.get("workDir") or str(PATHS.kwok_cluster), start_new_session=True)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""

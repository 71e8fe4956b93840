"""`up` on an existing stack says what it did to each component (issue 10, item 11):
a dead one is named with the pid that is gone and restarted, a live one is reused."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kestrel_tools.devstack import Stack
from kestrel_tools.procs import REPO

pytestmark = pytest.mark.integration


@pytest.fixture
def stack() -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="kestrel-up-", dir="/tmp"))  # Postgres' user reaches it
    s = Stack(root, durable=False)
    try:
        yield s
    finally:
        (Stack.load(root) or s).destroy()  # a CLI run may have saved newer pids


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # ours: reap it, or it lingers as a zombie
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def test_up_names_the_component_it_found_dead_and_restarted(stack: Stack) -> None:
    first = stack.up()
    assert first == {n: f"{n} started (pid {stack.pids[n]})" for n in ("postgres", "nats",
                                                                         "redis")}
    dead = stack.pids["nats"]
    kill9(dead)
    again = stack.up()
    assert stack.pids["nats"] != dead
    assert again["nats"] == (f"nats was not running (pid {dead} gone): restarted as pid "
                             f"{stack.pids['nats']}")
    assert again["postgres"] == f"postgres is running (pid {stack.pids['postgres']}): reused"
    assert again["redis"] == f"redis is running (pid {stack.pids['redis']}): reused"

    # `python -m kestrel_tools.devstack up` (what `make devstack-up` runs) prints the same lines.
    gone = stack.pids["postgres"]
    kill9(gone)
    out = subprocess.run([sys.executable, "-m", "kestrel_tools.devstack", "up", "--dir",
                          str(stack.root)], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    restarted = Stack.load(stack.root)
    assert restarted is not None
    lines = out.stdout.splitlines()
    assert (f"postgres was not running (pid {gone} gone): restarted as pid "
            f"{restarted.pids['postgres']}") in lines
    assert f"nats is running (pid {stack.pids['nats']}): reused" in lines

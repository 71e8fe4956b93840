"""bench.account: which component a process is billed to, and the apiserver's counters."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.account import (
    Background,
    component,
    kestrel_share,
    machine_busy,
    parse_api,
    settle,
    spent,
    take_cpu,
)


@pytest.mark.parametrize(("comm", "argv", "expected"), [
    ("kube-apiserver", ["/root/.cache/kestrel/bin/kube-apiserver-v1.34.4", "--etcd-servers=x"],
     "kube-apiserver"),
    # comm is cut to 15 characters; the binary's name is versioned.
    ("kube-controller", ["/c/bin/kube-controller-manager-v1.34.4"], "kube-controller-manager"),
    ("kueue-v0.19.2", ["/c/bin/kueue-v0.19.2", "--config=/x"], "kueue"),
    ("postgres", ["postgres: kestrel kestrel 127.0.0.1(5432) idle"], "postgres"),
    ("python", ["/r/.venv/bin/python", "-m", "services.placer"], "kestrel placer"),
    ("python", ["/r/.venv/bin/python", "-m", "bench.jobs", "--jobs", "10"], "bench.jobs"),
    ("bash", ["bash", "-c", "sleep 1"], "other"),
])
def test_a_process_is_billed_to_its_component(comm: str, argv: list[str],
                                               expected: str) -> None:
    assert component(comm, argv) == expected


def test_processes_are_summed_per_component_and_others_left_out(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")

    def proc(pid: int, comm: str, argv: list[str], utime: int, stime: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        # Field 14 and 15 of /proc/<pid>/stat are utime and stime; comm may hold spaces.
        rest = ["S", "1"] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 10
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
        (d / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")

    proc(10, "python", ["python", "-m", "services.meter"], tick, tick)
    proc(11, "python", ["python", "-m", "services.meter"], 0, tick)
    proc(12, "nats-server", ["nats-server", "-js"], 2 * tick, 0)
    proc(13, "my (odd) cmd", ["sh"], 5 * tick, 0)
    (tmp_path / "self").mkdir()
    assert take_cpu(tmp_path) == {"kestrel meter": 3.0, "nats-server": 2.0}


def test_the_apiserver_counters_sum_write_verbs_per_resource_and_watch_events() -> None:
    metrics = "\n".join([
        "# HELP apiserver_request_total Counter of apiserver requests",
        'apiserver_request_total{code="201",group="kueue.x-k8s.io",resource="workloads",'
        'subresource="",verb="POST",version="v1beta2"} 10',
        'apiserver_request_total{code="200",group="kueue.x-k8s.io",resource="workloads",'
        'subresource="status",verb="PATCH",version="v1beta2"} 7',
        'apiserver_request_total{code="409",group="kueue.x-k8s.io",resource="workloads",'
        'subresource="status",verb="PUT",version="v1beta2"} 2',
        'apiserver_request_total{code="200",group="kueue.x-k8s.io",resource="workloads",'
        'subresource="",verb="WATCH",version="v1beta2"} 99',
        'apiserver_request_total{code="200",group="",resource="pods",subresource="",'
        'verb="LIST",version="v1"} 5',
        'apiserver_watch_events_total{group="",resource="pods",version="v1"} 40',
        'apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} 12345',
    ])
    assert parse_api(metrics) == {"writes workloads": 19.0, "watch events pods": 40.0,
                                  "reads pods": 5.0, "reads all": 5.0,
                                  "watch bytes pods": 12345.0}


def test_spent_is_what_each_counter_gained_and_new_counters_count_whole() -> None:
    assert spent({"a": 1.0, "b": 2.0}, {"a": 3.5, "b": 2.0, "c": 4.0}) == {"a": 2.5, "c": 4.0}


def test_kestrels_share_is_its_services_and_stores_not_kubernetes_or_the_bench() -> None:
    cpu = {"kestrel admission": 1.0, "kestrel placer": 2.0, "postgres": 0.5,
           "nats-server": 0.25, "redis-server": 0.125, "kube-apiserver": 8.0, "kueue": 4.0,
           "etcd": 2.0, "bench.jobs": 16.0}
    assert kestrel_share(cpu) == 3.875
    assert kestrel_share({}) == 0.0


def test_the_machine_is_busy_for_all_but_its_idle_and_iowait_ticks(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(f"cpu  {3 * tick} 0 {tick} {50 * tick} {7 * tick} 0 {tick} 0 0 0\n"
                    f"cpu0 {tick} 0 0 0 0 0 0 0 0 0\n")
    assert machine_busy(stat) == 5.0


@pytest.mark.parametrize(("busy", "by", "expected"), [
    (0.04, {"kestrel meter": 0.01},
     "machine busy before the run: 0.04 of 2 cores (quiet)"),
    (0.62, {"kube-apiserver": 0.31, "kueue": 0.09, "etcd": 0.12, "kwok": 0.004},
     "machine busy before the run: 0.62 of 2 cores (kube-apiserver 0.31, etcd 0.12, "
     "kueue 0.09): NOT a quiet machine, so these figures are not comparable with a quiet "
     "run; stop what runs (make cluster-down) and run again"),
    (0.30, {}, "machine busy before the run: 0.30 of 2 cores (no known component): NOT a "
     "quiet machine, so these figures are not comparable with a quiet run; stop what runs "
     "(make cluster-down) and run again"),
])
def test_a_bench_says_whether_the_machine_was_quiet_before_it_and_who_was_not(
        busy: float, by: dict[str, float], expected: str) -> None:
    assert Background(busy, by, 2).note() == expected


class Machine:
    """A fake clock and CPU counter: busy for `busy_until` seconds at 1.5 cores, then
    at 0.05; sleeping advances the clock."""

    def __init__(self, busy_until: float) -> None:
        self.now = 0.0
        self.busy_until = busy_until

    def busy(self) -> float:
        hot = min(self.now, self.busy_until)
        return 1.5 * hot + 0.05 * (self.now - hot)

    async def sleep(self, s: float) -> None:
        self.now += s


@pytest.mark.parametrize(("busy_until", "max_s", "waited"), [
    (0.0, 30.0, 2.5),    # quiet at once: the minimum and one window
    (6.2, 30.0, 7.0),    # the first whole quiet window after the work ends
    (100.0, 10.0, 10.0),  # never quiet: gives up at the cap
], ids=["quiet-at-once", "waits-for-the-work-to-end", "gives-up-at-the-cap"])
async def test_settle_waits_until_a_whole_window_is_quiet(busy_until: float, max_s: float,
                                                          waited: float) -> None:
    m = Machine(busy_until)
    got, cores = await settle(max_s=max_s, busy=m.busy, clock=lambda: m.now, sleep=m.sleep)
    assert got == pytest.approx(waited)
    assert (cores < 0.2) == (busy_until < max_s)

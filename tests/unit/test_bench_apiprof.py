"""bench.apiprof: the apiserver's profile read into shares by kind of work."""
# ruff: noqa: E501  (TOP holds pprof lines as the tool prints them)

from __future__ import annotations

import pytest
from rich.console import Console

from bench.apiprof import KINDS, shares, table

# Lines of `go tool pprof -top -cum` over a profile the apiserver gave in a no-op
# check phase of bench-jobs (2026-12-05), cut down to a few.
TOP = """\
File: kube-apiserver-v1.34.4
Type: cpu
Duration: 40.04s, Total samples = 51.14s (127.71%)
Showing nodes accounting for 33.84s, 66.17% of 51.14s total
      flat  flat%   sum%        cum   cum%
     0.05s 0.098% 0.098%     19.37s 37.88%  k8s.io/apiserver/pkg/registry/generic/registry.(*Store).Update
     0.02s 0.039%  0.18%     14.80s 28.94%  k8s.io/apiserver/pkg/registry/generic/registry.(*Store).Update.func1
         0     0%  2.41%      7.54s 14.74%  runtime.gcBgMarkWorker
         0     0%  9.35%      5.30s 10.36%  k8s.io/apiserver/pkg/storage/etcd3.(*watchChan).transform
         0     0% 24.48%      1.96s  3.83%  k8s.io/apiserver/pkg/endpoints/handlers.(*WatchServer).HandleHTTP
     0.01s  0.02% 35.55%    620ms  1.21%  k8s.io/apiserver/pkg/registry/generic/registry.(*Store).Create
"""


def test_each_kind_is_the_cumulative_share_of_its_function_exactly() -> None:
    total, got = shares(TOP)
    assert total == pytest.approx(51.14)
    assert got["writes: update, patch"] == pytest.approx(0.3788)  # not Update.func1's
    assert got["serving watches (every watcher)"] == pytest.approx(0.0383)
    assert got["decoding etcd's events (once each)"] == pytest.approx(0.1036)
    assert got["GC: background mark workers"] == pytest.approx(0.1474)
    assert got["writes: create"] == pytest.approx(0.0121)  # a figure in ms reads too


def test_a_kind_the_phase_never_ran_is_zero_and_every_kind_is_reported() -> None:
    _, got = shares(TOP)
    assert got["writes: delete"] == 0.0
    assert set(got) == {kind for kind, _ in KINDS}


def test_a_total_in_milliseconds_is_read_as_such() -> None:
    total, _ = shares(TOP.replace("Total samples = 51.14s", "Total samples = 820ms"))
    assert total == pytest.approx(0.82)


def test_text_that_is_not_pprof_top_output_is_refused() -> None:
    with pytest.raises(ValueError, match="Total samples"):
        shares("go: unknown subcommand")


def test_the_table_turns_shares_into_cpu_ms_per_job_and_says_why_a_phase_has_none() -> None:
    console = Console(width=200, record=True)
    console.print(table({"no-op before": shares(TOP), "plane": "no profile"},
                        {"no-op before": 100.0, "plane": 110.0}))
    text = console.export_text()
    assert "37.9 (38%)" in text  # 0.3788 of 100 CPU-ms per job
    assert "3.8 (4%)" in text
    assert "no profile" in text

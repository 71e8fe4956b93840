"""bench/jobs.py's count of a run's Kubernetes Events, the breakdown read when a run's
`apiserver writes events` stands out."""

from __future__ import annotations

from typing import Any

from bench.jobs import count_events


def test_events_are_counted_by_writer_kind_and_reason_each_time_they_happened() -> None:
    items: list[dict[str, Any]] = [
        {"reportingComponent": "kueue-admission", "involvedObject": {"kind": "Workload"},
         "reason": "QuotaReserved"},
        {"reportingComponent": "kueue-admission", "involvedObject": {"kind": "Workload"},
         "reason": "QuotaReserved", "count": 1},
        {"reportingComponent": "kueue-admission", "involvedObject": {"kind": "Workload"},
         "reason": "Pending", "count": 7},
        # the core recorder of older components fills only source.component
        {"reportingComponent": "", "source": {"component": "job-controller"},
         "involvedObject": {"kind": "Job"}, "reason": "Completed"},
    ]
    assert count_events(items) == {
        ("kueue-admission", "Workload", "QuotaReserved"): 2,
        ("kueue-admission", "Workload", "Pending"): 7,
        ("job-controller", "Job", "Completed"): 1,
    }


def test_an_event_missing_its_fields_is_still_counted() -> None:
    assert count_events([{}]) == {("?", "?", "?"): 1}

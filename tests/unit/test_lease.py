"""Who may take the Lease (kestrel/lease.py decide): client-go's leaderelection rule."""

from __future__ import annotations

import pytest

from kestrel.lease import Seen, Step, decide

ME = "autoscaler-a"


@pytest.mark.parametrize(("name", "seen", "now", "want"), [
    ("no Lease yet: take it", None, 100.0, Step.TAKE),
    ("a Lease nobody holds (released on a clean stop): take it",
     Seen("", 90.0, 5), 100.0, Step.TAKE),
    ("ours: renew it", Seen(ME, 99.0, 5), 100.0, Step.RENEW),
    ("ours even when it expired: renew (nobody else wrote it)", Seen(ME, 50.0, 5), 100.0,
     Step.RENEW),
    ("another's, renewed within its duration: follow", Seen("b", 96.0, 5), 100.0,
     Step.FOLLOW),
    ("another's, exactly at its expiry: still follow", Seen("b", 95.0, 5), 100.0,
     Step.FOLLOW),
    ("another's, not renewed for longer than its duration: take it",
     Seen("b", 94.9, 5), 100.0, Step.TAKE),
    ("another's without a renew time: take it", Seen("b", None, 5), 100.0, Step.TAKE),
])
def test_decide(name: str, seen: Seen | None, now: float, want: Step) -> None:
    assert decide(seen, ME, now) is want, name

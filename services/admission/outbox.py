"""What admission announces after a commit, retried until it goes out.

A job's decision is committed before it is published (kestrel.jobs.state and, for
ADMITTED and HELD, the placer's subject). When the publish fails (nats-server
restarting: "no response from stream"), the job is decided but nobody hears of it;
before this, only an admission restart republished such jobs, so a job admitted during
a NATS restart waited in ADMITTED forever (found by bench/chaos.py). The outbox keeps
each failed announcement and retries it while the job is still in the state it
announces; a job that has moved on is dropped, since its newer state is published on
its own. Messages carry ids, so JetStream drops a retry of one that did go out.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from kestrel.jobs import JobRow, JobState

log = logging.getLogger("kestrel.admission")

Send = Callable[[JobRow, JobState | None], Awaitable[None]]
Read = Callable[[Sequence[str]], Awaitable[dict[str, JobRow]]]


class Outbox:
    def __init__(self, send: Send, read: Read) -> None:
        self.send = send
        self.read = read
        self.pending: dict[str, tuple[JobState, JobState | None]] = {}

    async def publish(self, row: JobRow, prev: JobState | None) -> None:
        """Announce `row` (its state, reached from `prev`); kept for retry on failure."""
        try:
            await self.send(row, prev)
        except Exception as exc:
            first = row.job_id not in self.pending
            self.pending[row.job_id] = (row.state, prev)
            if first:
                log.warning("publishing job %s (%s) failed: %s; retrying", row.job_id,
                            row.state.name, exc)
            return
        self.pending.pop(row.job_id, None)  # sent: it supersedes an older one still owed

    async def retry(self) -> int:
        """Retry every announcement still owed; returns how many are still owed."""
        if not self.pending:
            return 0
        rows = await self.read(sorted(self.pending))
        for job_id, (state, prev) in list(self.pending.items()):
            row = rows.get(job_id)
            if row is None or row.state is not state:
                self.pending.pop(job_id, None)  # moved on: its newer state went out itself
                continue
            await self.publish(row, prev)
        if not self.pending:
            log.info("every owed job announcement is out")
        return len(self.pending)

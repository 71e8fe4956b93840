"""What admission announces after a commit, retried until it goes out.

A job's decision is committed before it is published (kestrel.jobs.state and, for
ADMITTED and HELD, the placer's subject). When the publish fails (nats-server
restarting: "no response from stream"), the job is decided but nobody hears of it;
before this, only an admission restart republished such jobs, so a job admitted during
a NATS restart waited in ADMITTED forever (found by bench/chaos.py). The outbox records
each announcement as owed before sending it, settles it once it is out, and retries
what is still owed every second while the job is still in the state it announces; a
job that has moved on is dropped, since its newer state is published on its own.
Messages carry ids, so JetStream drops a retry of one that did go out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
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
        self.failing: set[str] = set()  # owed ones already warned about
        self.sending: Counter[str] = Counter()  # sends in flight per job: not owed yet

    async def publish(self, row: JobRow, prev: JobState | None) -> None:
        """Announce `row` (its state, reached from `prev`); owed until it goes out.

        Owed is recorded before the send: a send cut short stays owed. The RPC that made
        a decision awaits its announcement, and a client's deadline cancels it while
        NATS is away (a publish into a restarting server waits out its 5 s ack timeout):
        the job was committed ADMITTED, the retried submit found it by its idempotency
        key, and nothing ever announced it (chaos in CI, nats phase)."""
        entry = (row.state, prev)
        self.pending[row.job_id] = entry
        self.sending[row.job_id] += 1
        try:
            await self.send(row, prev)
        except asyncio.CancelledError:
            log.warning("announcing job %s (%s) was cut short; it goes out with the next "
                        "retry", row.job_id, row.state.name)
            raise
        except Exception as exc:
            if row.job_id in self.pending and row.job_id not in self.failing:
                self.failing.add(row.job_id)
                log.warning("publishing job %s (%s) failed: %s; retrying", row.job_id,
                            row.state.name, exc)
            return
        finally:
            self.sending[row.job_id] -= 1
            if self.sending[row.job_id] <= 0:
                del self.sending[row.job_id]
        if self.pending.get(row.job_id) == entry:  # not superseded while it was sent
            self._settle(row.job_id)

    def _settle(self, job_id: str) -> None:
        self.pending.pop(job_id, None)
        self.failing.discard(job_id)

    async def retry(self) -> int:
        """Retry every announcement still owed; returns how many are still owed."""
        owed = {j: e for j, e in self.pending.items() if j not in self.sending}
        if not owed:
            return len(self.pending)
        rows = await self.read(sorted(owed))
        retried = False
        for job_id, entry in owed.items():
            if self.pending.get(job_id) != entry or job_id in self.sending:
                continue  # announced again while we read: that announcement owns it
            row = rows.get(job_id)
            if row is None or row.state is not entry[0]:
                self._settle(job_id)  # moved on: its newer state went out itself
                continue
            await self.publish(row, entry[1])
            retried = True
        if retried and not self.pending:
            log.info("every owed job announcement is out")
        return len(self.pending)

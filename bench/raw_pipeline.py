"""The limit of this machine for the meter's path, as a separate process:
a bare durable pull consumer that fetches batches, decodes them, inserts them
into a plain table in one transaction per batch (COPY) and acknowledges them.

    python bench/raw_pipeline.py NATS_URL DSN EXPECTED BATCH
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg
import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig

from kestrel.v1 import events_pb2


async def main(url: str, dsn: str, expected: int, batch: int) -> None:
    conn = await asyncpg.connect(dsn)
    await conn.execute("""CREATE TABLE IF NOT EXISTS raw_events (
        event_id text PRIMARY KEY, tenant text, workload_id text, type smallint,
        time_us bigint, gpus int)""")
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe("kestrel.workload.>", durable="raw-baseline",
                                  stream="KESTREL_WORKLOADS",
                                  config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT,
                                                        max_ack_pending=50_000))
    done = 0
    while done < expected:
        try:
            msgs = await sub.fetch(batch, timeout=0.5)
        except (TimeoutError, NatsTimeout):
            continue
        records = []
        for m in msgs:
            e = events_pb2.WorkloadEvent.FromString(m.data)
            records.append((e.event_id, e.tenant, e.workload_id, e.type, e.time_us, e.gpus))
        async with conn.transaction():
            await conn.copy_records_to_table("raw_events", records=records)
        for m in msgs:
            await m.ack()
        done += len(msgs)
    await nc.flush()
    await nc.close()
    await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))

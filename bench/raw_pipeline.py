"""The limit of this machine for the meter's path, as a separate process:
a bare durable pull consumer that fetches batches, decodes them, inserts them
into a plain table in one transaction per batch (COPY) and acknowledges them.

    python bench/raw_pipeline.py NATS_URL DSN EXPECTED BATCH [nats-py|puller]

`nats-py` (the default) fetches with the stock client's PullSubscription.fetch;
`puller` with kestrel.bus.Puller, the pull the meter itself uses, into its own table
(raw_events_puller) under its own durable.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import asyncpg
import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig

from kestrel import bus
from kestrel_sdk.v1 import events_pb2


async def main(url: str, dsn: str, expected: int, batch: int, client: str) -> None:
    table = "raw_events" if client == "nats-py" else "raw_events_puller"
    conn = await asyncpg.connect(dsn)
    await conn.execute(f"""CREATE TABLE IF NOT EXISTS {table} (
        event_id text PRIMARY KEY, tenant text, workload_id text, type smallint,
        time_us bigint, gpus int)""")
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub: Any
    if client == "nats-py":
        sub = await js.pull_subscribe("kestrel.workload.>", durable="raw-baseline",
                                      stream="KESTREL_WORKLOADS",
                                      config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT,
                                                            max_ack_pending=50_000))
    else:
        sub = await bus.Puller.open(nc, bus.Durable(
            "KESTREL_WORKLOADS", "kestrel.workload.>", "raw-puller", batch,
            max_ack_pending=50_000))
    done = 0
    while done < expected:
        try:
            msgs = await sub.fetch(batch, timeout=0.5)
        except (TimeoutError, NatsTimeout):
            continue
        if not msgs:  # kestrel.bus.Puller's empty long poll (nats-py raises instead)
            continue
        records = []
        for m in msgs:
            e = events_pb2.WorkloadEvent.FromString(m.data)
            records.append((e.event_id, e.tenant, e.workload_id, e.type, e.time_us, e.gpus))
        async with conn.transaction():
            await conn.copy_records_to_table(table, records=records)
        for m in msgs:
            await m.ack()
        done += len(msgs)
    if client != "nats-py":
        await sub.close()
    await nc.flush()
    await nc.close()
    await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                     sys.argv[5] if len(sys.argv) > 5 else "nats-py"))

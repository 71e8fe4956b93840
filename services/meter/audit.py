"""Audit the ledger's hash chain: what a superuser or the owner rewrote shows here.

    python -m services.meter.audit [--dsn DSN] [--expect-head SEQ:HASH]

The services' roles cannot change a ledger row (no privilege, and the append-only
triggers besides). The tables' owner and a superuser can, by turning the triggers
off; this audit is how such a rewrite is seen afterwards. It reads the ledger in
chain order (migration 0006) and reports:

- a row whose hash does not match its columns: changed after it was written;
- a gap in chain_seq, or a row whose prev_hash is not the hash of the row before:
  rows deleted (or the chain re-ordered);
- rows without a place in the chain: inserted with the chain trigger off (replica
  mode, or the trigger disabled);
- the head (last chain_seq and its hash). Deleting the newest rows, or rewriting
  the chain from some row on with fresh hashes, leaves a chain that verifies by
  itself: only a head recorded earlier, kept outside the database, catches it
  (`--expect-head`: that row must still be there with that hash).

It needs only SELECT (kestrel_reader will do). The DSN defaults to
KESTREL_POSTGRES_READER_DSN, then KESTREL_POSTGRES_DSN. Exit status 0: intact;
1: findings.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

import asyncpg

GENESIS = bytes(32)
# The columns a row's hash covers, in order, each as Postgres prints it (::text).
HASHED = ("chain_seq", "row_id", "tenant", "workload_id", "flavor", "gpus", "start_us",
          "end_us", "gpu_us", "price", "cost", "cause_id", "kind", "recorded_us")


@dataclass(frozen=True)
class ChainRow:
    values: tuple[str | None, ...]  # HASHED, as text
    prev_hash: bytes | None
    row_hash: bytes | None

    @property
    def chain_seq(self) -> int | None:
        return None if self.values[0] is None else int(self.values[0])

    @property
    def row_id(self) -> int:
        return int(self.values[1] or 0)


def digest(prev: bytes, values: Sequence[str | None]) -> bytes:
    """sha256(prev || each value as '<length>:<value>'), as kestrel_ledger_digest."""
    text = "".join(f"{len(v)}:{v}" for v in values if v is not None)
    return hashlib.sha256(prev + text.encode()).digest()


@dataclass
class Report:
    rows: int = 0
    chained: int = 0
    head_seq: int = 0
    head_hash: bytes = GENESIS
    altered: list[int] = field(default_factory=list)  # chain_seq of rows changed
    gaps: list[tuple[int, int]] = field(default_factory=list)  # chain_seq ranges missing
    broken: list[int] = field(default_factory=list)  # chain_seq whose prev_hash is wrong
    unchained: list[int] = field(default_factory=list)  # row_id of rows outside the chain
    head_missing: str = ""  # --expect-head that is no longer in the chain

    @property
    def intact(self) -> bool:
        return not (self.altered or self.gaps or self.broken or self.unchained
                    or self.head_missing)

    def lines(self) -> list[str]:
        out = [f"ledger rows: {self.rows}, in the chain: {self.chained}",
               f"head: {self.head_seq}:{self.head_hash.hex()}"]
        out += [f"ALTERED: chain_seq {s}: its columns do not match its hash" for s in self.altered]
        out += [f"DELETED: chain_seq {a}..{b} missing" for a, b in self.gaps]
        out += [f"BROKEN: chain_seq {s}: prev_hash is not the hash of the row before"
                for s in self.broken]
        out += [f"UNCHAINED: row_id {r}: written with the chain trigger off"
                for r in self.unchained]
        if self.head_missing:
            out.append(f"HEAD: {self.head_missing}")
        out.append("intact" if self.intact else "NOT INTACT")
        return out


class Verifier:
    """Fed rows in chain order (rows outside the chain anywhere), one at a time."""

    def __init__(self, expect_head: tuple[int, bytes] | None = None) -> None:
        self.report = Report()
        self.expect_head = expect_head
        self.seen_expected = expect_head is None
        self.prev_seq, self.prev_hash = 0, GENESIS

    def feed(self, row: ChainRow) -> None:
        report = self.report
        report.rows += 1
        seq = row.chain_seq
        if seq is None or row.row_hash is None or row.prev_hash is None:
            report.unchained.append(row.row_id)
            return
        report.chained += 1
        if seq != self.prev_seq + 1:
            report.gaps.append((self.prev_seq + 1, seq - 1))
        elif row.prev_hash != self.prev_hash:
            report.broken.append(seq)
        if digest(row.prev_hash, row.values) != row.row_hash:
            report.altered.append(seq)
        if self.expect_head is not None and seq == self.expect_head[0]:
            self.seen_expected = row.row_hash == self.expect_head[1]
        self.prev_seq, self.prev_hash = seq, row.row_hash

    def finish(self) -> Report:
        report = self.report
        report.head_seq, report.head_hash = self.prev_seq, self.prev_hash
        if not self.seen_expected and self.expect_head is not None:
            seq, hash_ = self.expect_head
            report.head_missing = (f"{seq}:{hash_.hex()} recorded earlier is not in the "
                                   "chain: rows deleted or the chain rewritten")
        return report


def verify(rows: Iterable[ChainRow], expect_head: tuple[int, bytes] | None = None) -> Report:
    v = Verifier(expect_head)
    for row in rows:
        v.feed(row)
    return v.finish()


async def chain_rows(conn: asyncpg.Connection, batch: int = 10_000) -> AsyncIterator[ChainRow]:
    cols = ", ".join(f"{c}::text" for c in HASHED)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        async for r in conn.cursor(
                f"SELECT {cols}, prev_hash, row_hash FROM ledger "
                "ORDER BY ledger.chain_seq NULLS FIRST, ledger.row_id", prefetch=batch):
            yield ChainRow(tuple(r[i] for i in range(len(HASHED))), r["prev_hash"],
                           r["row_hash"])


async def audit(conn: asyncpg.Connection,
                expect_head: tuple[int, bytes] | None = None) -> Report:
    v = Verifier(expect_head)
    async for row in chain_rows(conn):
        v.feed(row)
    return v.finish()


def _head(text: str) -> tuple[int, bytes]:
    seq, _, hexhash = text.partition(":")
    try:
        return int(seq), bytes.fromhex(hexhash)
    except ValueError:
        raise argparse.ArgumentTypeError("expected SEQ:HASH as `head:` printed it") from None


async def _main(dsn: str, expect_head: tuple[int, bytes] | None) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        report = await audit(conn, expect_head)
    finally:
        await conn.close()
    print("\n".join(report.lines()))
    return 0 if report.intact else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.meter.audit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("KESTREL_POSTGRES_READER_DSN")
                    or os.environ.get("KESTREL_POSTGRES_DSN", ""))
    ap.add_argument("--expect-head", type=_head, metavar="SEQ:HASH",
                    help="a head printed by an earlier audit, kept outside the database")
    args = ap.parse_args(argv)
    if not args.dsn:
        ap.error("no DSN: pass --dsn or set KESTREL_POSTGRES_READER_DSN")
    return asyncio.run(_main(args.dsn, args.expect_head))


if __name__ == "__main__":
    sys.exit(main())

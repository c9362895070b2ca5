"""Host heartbeat: what one replica's beat costs PostgreSQL at fleet scale (issue 21).

N hosts (10,000 full) are written into a PostgreSQL store migrated to head, every one connected
through this replica, and every beat each of them has spoken since the last (the busiest beat:
every host's time and every stream's vouch are written). The beat is `hosts.heartbeat`, as the
replica runs it every `host_heartbeat_seconds`. Figures: wall time per beat (median and worst of
the rounds) and the WAL the beat wrote (median). A beat that waits on no lock is the common
path: this is the figure a change to how the heartbeat treats locked rows must not worsen.

    python -m bench.host_heartbeat [--smoke] [--hosts N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import time

from sqlalchemy import text
from sqlalchemy.orm import Session

from bench import resources
from bench.report import Section
from cloud.store import hosts
from cloud.store.database import Store
from cloud.store.engine import upgrade

REPLICA = "bench-replica"


async def _fleet(store: Store, count: int) -> list[str]:
    """`count` hosts whose streams this replica holds; their ids."""
    now = store.now()
    ids = [f"beat-{i:05d}" for i in range(count)]
    for start in range(0, count, 1000):
        record = [
            (h, hosts.HelloRecord([], "v1", 1, REPLICA, f"s-{h}"))
            for h in ids[start : start + 1000]
        ]

        def write(session: Session, record: list[tuple[str, hosts.HelloRecord]] = record) -> None:
            hosts.record_hellos(session, now, record)

        await store.write_on_loop(write)
    async with store.write() as session:
        await session.execute(text("ANALYZE hosts"))  # as autovacuum would, soon after
    return ids


async def _wal(store: Store) -> int:
    async with store.read() as session:
        return int(await session.scalar(text("SELECT pg_current_wal_insert_lsn() - '0/0'")) or 0)


async def _measure(count: int, rounds: int) -> tuple[list[float], list[int]]:
    """Per beat: wall ms, WAL bytes (one warm-up beat first, not counted)."""
    store = Store.from_url(resources.postgres_url())
    try:
        await upgrade(store.engine)
        ids = await _fleet(store, count)
        times: list[float] = []
        wal: list[int] = []
        for n in range(rounds + 1):
            spoke = store.now() - dt.timedelta(milliseconds=1)
            seen = {h: spoke for h in ids}
            before = await _wal(store)
            start = time.perf_counter()
            await hosts.heartbeat(store, REPLICA, seen)
            took = (time.perf_counter() - start) * 1000
            written = await _wal(store) - before
            if n:
                times.append(took)
                wal.append(written)
            await asyncio.sleep(0.05)
        return times, wal
    finally:
        await store.close()


def run(smoke: bool, count: int | None = None, rounds: int | None = None) -> Section:
    count = count or (300 if smoke else 10_000)
    rounds = rounds or (3 if smoke else 15)
    t0 = time.monotonic()
    section = Section(
        "host_heartbeat",
        "Host heartbeat: one replica's beat (PostgreSQL)",
        f"{count:,} connected hosts, all heard from each beat; {rounds} beats",
    )
    times, wal = asyncio.run(_measure(count, rounds))
    section.add("beat: time (median)", round(statistics.median(times), 1), "ms")
    section.add("beat: time (worst)", round(max(times), 1), "ms")
    section.add("beat: WAL (median)", round(statistics.median(wal) / 1e6, 2), "MB")
    section.notes.append(
        "One process, no gRPC: `hosts.heartbeat` on the store alone, every host's time and "
        "every stream's vouch written each beat, no row held elsewhere."
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--hosts", type=int)
    parser.add_argument("--rounds", type=int)
    args = parser.parse_args(argv)
    try:
        print(run(args.smoke, args.hosts, args.rounds).text())
    finally:
        resources.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

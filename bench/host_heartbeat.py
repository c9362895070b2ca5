"""Host heartbeat: what one replica's beat costs its store at fleet scale (issue 21).

N hosts (10,000 full) are written into a store migrated to head (PostgreSQL by default, or
SQLite), every one connected through this replica, and every beat each of them has spoken
since the last (the busiest beat: before migration 0032 every host's time and every stream's
vouch were written). The beat is `hosts.heartbeat`, as the replica runs it every
`host_heartbeat_seconds` (a build whose heartbeat still takes the hosts' times is given them,
so the same file measures both). Figures: wall time and this process's CPU per beat (median and
worst of the rounds) and, on PostgreSQL, the WAL the beat wrote (median). A beat that waits on
no lock is the common path: this is the figure a change to how the heartbeat treats locked rows
must not worsen.

The beat's other per-host work is timed too: its stream reconcile's reads (`reconcile`, which
asks the store, in chunks as `LeaseManager.reconcile` does, which of the held streams a newer
hello replaced elsewhere; none has here, the common case), `hosts.unvouched` and, where the
build has it, `hosts.forget_dead_replicas` (no dead replica here: its one small read). A build
without `hosts.replaced_streams` reads every held host's current stream and compares in Python,
as its reconcile did.

    python -m bench.host_heartbeat [--smoke] [--hosts N] [--rounds N] [--store SQLite]
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlalchemy import text

from bench import command, hello_rows, resources
from bench.report import Section
from cloud.store import hosts, idlists
from cloud.store.database import Store
from cloud.store.engine import upgrade

REPLICA = "bench-replica"
#: What a build before `hosts.replaced_streams` read every held host's stream with.
_OLD_READ = "current_streams"


async def _fleet(store: Store, count: int) -> list[str]:
    """`count` hosts whose streams this replica holds; their ids."""
    ids = [f"beat-{i:05d}" for i in range(count)]
    await hello_rows.record_hellos(store, ids, REPLICA)
    await hello_rows.analyze_hosts(store)
    return ids


async def _wal(store: Store) -> int:
    async with store.read() as session:
        return int(await session.scalar(text("SELECT pg_current_wal_insert_lsn() - '0/0'")) or 0)


async def _reconcile(store: Store, ids: list[str]) -> int:
    """The reads of one reconcile of every held stream (`LeaseManager.reconcile`); how many of
    them a newer stream replaced."""
    held = {h: f"s-{h}" for h in ids}
    replaced = 0
    for chunk in idlists.chunked(ids):
        if hasattr(hosts, "replaced_streams"):
            found = await hosts.replaced_streams(store, [(h, held[h]) for h in chunk])
            replaced += len(found)
        else:
            current = await vars(hosts)[_OLD_READ](store, chunk)
            for h in chunk:
                newest = current.get(h)
                if newest and newest.stream_id not in ("", held[h]):
                    replaced += 1
    return replaced


async def _timed(job: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """Wall and CPU ms of one `job()`."""
    start, start_cpu = time.perf_counter(), time.process_time()
    await job()
    return (time.perf_counter() - start) * 1000, (time.process_time() - start_cpu) * 1000


async def _measure(
    count: int, rounds: int, url: str
) -> tuple[list[float], list[float], list[int], dict[str, list[tuple[float, float]]]]:
    """Per beat: wall ms, CPU ms, WAL bytes (PostgreSQL; one warm-up beat first, not counted),
    and the wall and CPU ms of the beat's other reads (`reconcile`, `unvouched`)."""
    store = Store.from_url(url)
    takes_times = "seen" in inspect.signature(hosts.heartbeat).parameters
    try:
        await upgrade(store.engine)
        ids = await _fleet(store, count)
        times: list[float] = []
        cpu: list[float] = []
        wal: list[int] = []
        others: dict[str, list[tuple[float, float]]] = {"reconcile": [], "unvouched": []}
        for n in range(rounds + 1):
            spoke = store.now() - dt.timedelta(milliseconds=1)
            seen = {h: spoke for h in ids}
            before = await _wal(store) if store.is_postgres else 0
            start, start_cpu = time.perf_counter(), time.process_time()
            if takes_times:
                await hosts.heartbeat(store, REPLICA, seen)  # type: ignore[call-arg, unused-ignore]
            else:
                await hosts.heartbeat(store, REPLICA)
            took = (time.perf_counter() - start) * 1000
            took_cpu = (time.process_time() - start_cpu) * 1000
            written = await _wal(store) - before if store.is_postgres else 0
            if n:
                times.append(took)
                cpu.append(took_cpu)
                wal.append(written)
            reconciled = await _timed(lambda: _reconcile(store, ids))
            vouch = await _timed(lambda: hosts.unvouched(store, 10.0))
            if hasattr(hosts, "forget_dead_replicas"):
                forget = await _timed(lambda: hosts.forget_dead_replicas(store, 10.0))
            if n:
                others["reconcile"].append(reconciled)
                others["unvouched"].append(vouch)
                if hasattr(hosts, "forget_dead_replicas"):
                    others.setdefault("forget_dead_replicas", []).append(forget)
            await asyncio.sleep(0.05)
        return times, cpu, wal, others
    finally:
        await store.close()


def run(
    smoke: bool, count: int | None = None, rounds: int | None = None, store: str = "PostgreSQL"
) -> Section:
    count = count or (300 if smoke else 10_000)
    rounds = rounds or (3 if smoke else 15)
    t0 = time.monotonic()
    section = Section(
        "host_heartbeat",
        f"Host heartbeat: one replica's beat ({store})",
        f"{count:,} connected hosts, all heard from each beat; {rounds} beats",
    )
    with tempfile.TemporaryDirectory() as folder:
        url = (
            resources.postgres_url()
            if store == "PostgreSQL"
            else f"sqlite+aiosqlite:///{Path(folder) / 'beat.db'}"
        )
        times, cpu, wal, others = asyncio.run(_measure(count, rounds, url))
    section.add("beat: time (median)", round(statistics.median(times), 1), "ms")
    section.add("beat: time (worst)", round(max(times), 1), "ms")
    section.add("beat: CPU of this process (median)", round(statistics.median(cpu), 2), "ms")
    if store == "PostgreSQL":
        section.add("beat: WAL (median)", round(statistics.median(wal) / 1e3, 1), "kB")
    for name, taken in others.items():
        section.add(
            f"{name}: time (median)", round(statistics.median(t for t, _ in taken), 1), "ms"
        )
        section.add(f"{name}: CPU (median)", round(statistics.median(c for _, c in taken), 2), "ms")
    section.notes.append(
        "One process, no gRPC: `hosts.heartbeat` on the store alone (given every host's time "
        "where it still takes them), no row held elsewhere."
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = command.parser(__doc__)
    parser.add_argument("--hosts", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--store", choices=["SQLite", "PostgreSQL"], default="PostgreSQL")
    args = parser.parse_args(argv)
    return command.print_figures(lambda: run(args.smoke, args.hosts, args.rounds, args.store))


if __name__ == "__main__":
    raise SystemExit(main())

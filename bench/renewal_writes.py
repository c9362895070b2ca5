"""Renewal writes: what one written renewal costs the database, with the expiry moved or kept.

A renewal is written when it starts its attempt or brings new progress (decision 0070). Such a
write used to move the lease's expiry to a whole lease as well; since the amendment of 0070 a
write far from expiry keeps it, so the attempt's indexed columns stay as they were and
PostgreSQL can update the row in place (HOT; migration 0014 leaves room on the pages for it).
This benchmark writes the same renewals both ways, in the same run, through the store's own
write path (`leases.write_renewals`, no gRPC): N leases on one database without migration 0014's
room on the pages (its tables reset to the default fillfactor, as 0014's downgrade does) with
every write moving the expiry (the behaviour before: the baseline) and N on another at the head
with the replica's default `write_below`. Each round writes every lease once, in batches as the
replica's write stage makes them: first the attempts' starts (the fleet's start, where every
renewal is written), then rounds of new progress; the two databases alternate round by round.

Figures per written renewal: the database's CPU (PostgreSQL's processes, from /proc), WAL
bytes, wall time of the write batches, and the share of row updates PostgreSQL made HOT
(`pg_stat_user_tables`, read after the store's connections closed and flushed their counts).
SQLite has no HOT updates: its rows show the wall time of the same writes on two files.

    python -m bench.renewal_writes [--smoke] [--leases N] [--batch N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from bench import resources
from bench.procstat import cpu_seconds
from bench.report import Section
from cloud.settings import CloudSettings
from cloud.store import leases, tasks
from cloud.store.database import Store
from cloud.store.engine import upgrade

#: Migration 0014's tables, reset to the default fillfactor for the baseline (no room on the
#: pages for in-place updates). The baseline used to be a database downgraded to 0013, but the
#: store's code writes the columns later migrations add (0019's `tasks.unsent_attempts`), so
#: only 0014's effect is undone, at the head.
NO_ROOM = ("attempts", "tasks")
LEASE_S = 3600.0


@dataclass(slots=True)
class Sizes:
    leases: int
    batch: int
    rounds: int


FULL = Sizes(leases=2_000, batch=100, rounds=3)
SMOKE = Sizes(leases=60, batch=20, rounds=1)


@dataclass(slots=True)
class Way:
    """One way of writing, on its own database: the leases there and what their writes cost."""

    name: str
    url: str
    write_below: float
    #: Migration 0014's room on the pages (PostgreSQL's fillfactor 80), or the default.
    room: bool
    claimed: list[leases.Claimed] = field(default_factory=list)
    #: Per kind ("start", "progress"): renewals written, wall s, database CPU s, WAL bytes.
    cost: dict[str, list[float]] = field(default_factory=dict)
    #: Row updates of attempts and tasks over the whole run, and how many were HOT.
    updates: tuple[int, int] = (0, 0)
    #: Wall time per renewal of each round, in order.
    rounds: list[float] = field(default_factory=list)


async def _prepare(way: Way, n: int) -> None:
    """The database at the head (without 0014's room when `way.room` is false), `n` tasks
    queued and claimed by `n` hosts (ASSIGNED)."""
    store = Store.from_url(way.url)
    try:
        await upgrade(store.engine)
        if not way.room and store.is_postgres:
            async with store.engine.begin() as conn:
                for table in NO_ROOM:
                    await conn.exec_driver_sql(f"ALTER TABLE {table} RESET (fillfactor)")
        for _ in range(n):
            await tasks.submit(
                store,
                tasks.NewTask(
                    goal="g", max_attempts=3, lease_seconds=LEASE_S, timeout_seconds=86400
                ),
            )
        for i in range(n):
            claimed = await leases.claim(store, f"host-{i:05d}", ["phone"], 2)
            assert claimed is not None
            way.claimed.append(claimed)
    finally:
        await store.close()


def _dsn(url: str) -> str:
    """libpq's form of a SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _pg_wal(url: str) -> int:
    """The cluster's WAL position in bytes."""
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()
    assert row is not None
    return int(row[0])


def _pg_backends_cpu(url: str) -> float:
    """CPU seconds of the backends connected to `url`'s database (the way's store's own)."""
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        pids = conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        ).fetchall()
    return sum(cpu_seconds(int(pid)) for (pid,) in pids)


def _pg_updates(url: str) -> tuple[int, int]:
    """Row updates of attempts and tasks in `url`'s database so far, and how many were HOT."""
    with psycopg.connect(_dsn(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0) "
            "FROM pg_stat_user_tables WHERE relname IN ('attempts', 'tasks')"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def _round(way: Way, store: Store, kind: str, step: int, batch: int, pg: bool) -> None:
    """Write one renewal of every lease of `way` (its start, or new progress `step`)."""
    items = [
        leases.RenewalIn(
            f"host-{i:05d}",
            c.task_id,
            c.attempt,
            c.lease_id,
            None if kind == "start" else leases.ProgressIn(step, 2, f"step {step}"),
        )
        for i, c in enumerate(way.claimed)
    ]
    wal0 = _pg_wal(way.url) if pg else 0
    cpu0 = _pg_backends_cpu(way.url) if pg else 0.0
    wall = 0.0
    for at in range(0, len(items), batch):
        t0 = time.perf_counter()
        out = await leases.write_renewals(store, items[at : at + batch], way.write_below)
        wall += time.perf_counter() - t0
        assert all(o.written for o in out), "a renewal was refused"
    cpu = _pg_backends_cpu(way.url) - cpu0 if pg else 0.0
    wal = _pg_wal(way.url) - wal0 if pg else 0
    totals = way.cost.setdefault(kind, [0.0] * 4)
    for n, v in enumerate((len(items), wall, cpu, wal)):
        totals[n] += v
    way.rounds.append(wall / len(items))


async def measure(url: Callable[[], str], sizes: Sizes, pg: bool) -> tuple[Way, Way]:
    """The baseline (expiry moved, no room on the pages) and the new way, alternated round by
    round."""
    default = CloudSettings().renewal_write_below
    old = Way("expiry moved (before)", url(), leases.ALWAYS_WRITE, room=False)
    new = Way("expiry kept when far", url(), default, room=True)
    for way in (old, new):
        await _prepare(way, sizes.leases)
    if pg:
        await asyncio.sleep(1.0)  # the claims' counts, reported as their connections closed
        for way in (old, new):
            way.updates = _pg_updates(way.url)
    stores = {way.name: Store.from_url(way.url) for way in (old, new)}
    try:
        for n, (kind, step) in enumerate(
            [("start", 0)] + [("progress", s) for s in range(1, sizes.rounds + 1)]
        ):
            for way in (old, new) if n % 2 == 0 else (new, old):
                await _round(way, stores[way.name], kind, step, sizes.batch, pg)
    finally:
        for store in stores.values():
            await store.close()
    if pg:
        await asyncio.sleep(1.0)  # the closed connections' backends report their counts
        for way in (old, new):
            total, hot = _pg_updates(way.url)
            way.updates = (total - way.updates[0], hot - way.updates[1])
    return old, new


def _report(section: Section, store: str, old: Way, new: Way, pg: bool) -> None:
    for kind, what in (("start", "attempts' starts"), ("progress", "new progress")):
        o, n = old.cost[kind], new.cost[kind]
        section.add(
            f"{store}: {what}, wall per renewal",
            round(n[1] / n[0] * 1e6, 1),
            "us",
            baseline=round(o[1] / o[0] * 1e6, 1),
            baseline_name=old.name,
            note=f"{int(n[0]):,} renewals written each way"
            + (
                "; by round "
                + ", ".join(
                    f"x{a / b:.2f}" for a, b in zip(new.rounds[1:], old.rounds[1:], strict=True)
                )
                if kind == "progress"
                else ""
            ),
        )
        if not pg:
            continue
        # (column of `Way.cost`, row name, unit, scale): per renewal written.
        for col, name, unit, scale in ((2, "database CPU", "us", 1e6), (3, "WAL", "B", 1.0)):
            section.add(
                f"{store}: {what}, {name} per renewal",
                round(n[col] / n[0] * scale, 1),
                unit,
                baseline=round(o[col] / o[0] * scale, 1),
                baseline_name=old.name,
            )
    if pg:
        (ou, oh), (nu, nh) = old.updates, new.updates
        section.add(
            f"{store}: HOT updates (in place, no index entry)",
            f"{nh / max(1, nu):.0%}",
            "",
            note=f"of {nu:,} row updates of attempts and tasks over the run; before: "
            f"{oh / max(1, ou):.0%} of {ou:,}",
        )


def run(smoke: bool, lease_count: int | None = None, rounds: int | None = None) -> Section:
    sizes = SMOKE if smoke else FULL
    sizes = replace(sizes, leases=lease_count or sizes.leases, rounds=rounds or sizes.rounds)
    t0 = time.monotonic()
    section = Section(
        "renewal_writes",
        "Renewal writes (the expiry moved or kept)",
        f"{sizes.leases:,} leases per way, batches of {sizes.batch}, their starts then "
        f"{sizes.rounds} round(s) of new progress, the two ways alternated",
    )
    with tempfile.TemporaryDirectory(prefix="amc-bench-writes-") as tmp:
        files = iter(range(2))

        def sqlite_url() -> str:
            return f"sqlite+aiosqlite:///{Path(tmp) / f'cloud-{next(files)}.sqlite3'}"

        old, new = asyncio.run(measure(sqlite_url, sizes, pg=False))
        _report(section, "SQLite", old, new, pg=False)
    old, new = asyncio.run(measure(resources.postgres_url, sizes, pg=True))
    _report(section, "PostgreSQL", old, new, pg=True)
    section.notes.append(
        "In-process, through `leases.write_renewals` (the replica's write stage) with no gRPC: "
        "the cost of the write alone. Baseline: a database without migration 0014's room on "
        "the pages (its tables at the default fillfactor) with every write moving the expiry "
        "(`write_below` = 1), as before decision 0070's amendment; new: the "
        "head revision (fillfactor 80) with the replica's default `write_below`. Database CPU "
        "is that of the backends serving the way's own database (both stay connected through "
        "the run); WAL is the cluster's, written while only that way wrote."
    )
    section.seconds = time.monotonic() - t0
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--leases", type=int)
    parser.add_argument("--rounds", type=int)
    args = parser.parse_args(argv)
    print(run(args.smoke, args.leases, args.rounds).text())
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())

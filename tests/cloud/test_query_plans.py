"""The hot statements on live leases look up what they name, never walk the fleet (SQLite).

SQLite plans without statistics, so a plan is a property of the statement and the schema: it
took `ended_at IS NULL` to the live-expiry index and read every live attempt for a renewal batch
of ten (fixed by migration 0013 and the batch read's join order). These tests run the renewal
batch (its read, its write and the check after it) and the dispatcher's busy-phone lookup on a
real SQLite file with real leases, capture every statement the store sent, and ask SQLite how it
runs each one (EXPLAIN QUERY PLAN). PostgreSQL plans from its statistics (analysed tables), so
the same check there would test the row counts of the test, not the statement.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, inspect

from cloud.store import leases, tasks
from cloud.store.database import Store
from cloud.store.engine import downgrade, upgrade
from tests.cloud.sqlite_trace import trace

HOSTS = 6


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Path:
    return tmp_path / "cloud.sqlite3"


def _capture(store: Store) -> Callable[[], list[tuple[str, Any]]]:
    """What the store's engines send from now on: each statement with its first parameter set
    (the loop-thread engines' as SQLite ran them, parameters inlined)."""
    sent: list[tuple[str, Any]] = []
    ran: list[str] = []

    def seen(
        _conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, many: bool
    ) -> None:
        sent.append((statement, parameters[0] if many and parameters else parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    assert store.loop_connection is not None
    trace(store.loop_connection, ran)
    return lambda: [*sent, *((statement, ()) for statement in ran)]


def _walks_live_attempts(db: Path, statement: str, parameters: Any) -> list[str]:
    """The steps of the statement's plan that read attempts without naming them."""
    with sqlite3.connect(db) as conn:
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)]
    return [
        step
        for step in plan
        if step.startswith("SCAN attempts") or "ix_attempts_live_expiry" in step
    ]


async def _leases(store: Store) -> list[leases.Claimed]:
    out = []
    for i in range(HOSTS):
        await tasks.submit(
            store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
        )
        claimed = await leases.claim(store, f"h{i}", ["p"], 2)
        assert claimed is not None
        out.append(claimed)
    return out


async def test_renewal_batches_and_busy_phones_look_up_their_own_rows(sqlite_file: Path) -> None:
    store = Store.from_url(f"sqlite+aiosqlite:///{sqlite_file}")
    try:
        await upgrade(store.engine)
        claimed = await _leases(store)
        captured = _capture(store)
        items = [
            leases.RenewalIn(f"h{i}", c.task_id, c.attempt, c.lease_id, None)
            for i, c in enumerate(claimed)
        ]
        # Half a lease kept: the first renewal of each writes (RUNNING), the second is answered
        # from the read; a stale lease id is refused (and classified) after the write.
        stale = leases.RenewalIn("h0", claimed[0].task_id, claimed[0].attempt, "stale", None)
        first = await leases.renew_batch(store, [*items[1:], stale], 0.5)
        assert [o.written for o in first] == [True] * (HOSTS - 1) + [False]
        assert first[-1].revocation is not None
        assert all(o.expires_at is not None for o in await leases.renew_batch(store, items, 0.5))
        busy = await leases.live_serials_by_host(store, [f"h{i}" for i in range(HOSTS)])
        assert busy == {f"h{i}": {"p"} for i in range(HOSTS)}
    finally:
        await store.close()
    on_attempts = [(s, p) for s, p in captured() if "attempts" in s and not s.startswith("INSERT")]
    assert len(on_attempts) >= 4  # the read, the writes, the check after them, busy phones
    walks = {s: w for s, p in on_attempts if (w := _walks_live_attempts(sqlite_file, s, p))}
    assert not walks, walks


async def test_migration_0013_makes_the_live_expiry_index_partial_and_back(db_url: str) -> None:
    """Both backends: 0013 replaces the index, its downgrade restores the old one."""
    store = Store.from_url(db_url)

    def live_expiry(sync_conn: Any) -> list[str]:
        (index,) = [
            i for i in inspect(sync_conn).get_indexes("attempts")
            if i["name"] == "ix_attempts_live_expiry"
        ]  # fmt: skip
        return list(index["column_names"])

    try:
        await upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(live_expiry) == ["lease_expires_at"]
        await downgrade(store.engine, "0012")
        async with store.engine.connect() as conn:
            assert await conn.run_sync(live_expiry) == ["ended_at", "lease_expires_at"]
        await upgrade(store.engine)
        async with store.engine.connect() as conn:
            assert await conn.run_sync(live_expiry) == ["lease_expires_at"]
    finally:
        await store.close()

"""PostgreSQL: migrations build their indexes on tables a running fleet writes without holding
those writes (migrations/README.md), through `amc`'s own upgrade and downgrade path."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from cloud.store.database import Store
from cloud.store.engine import MIGRATION_LOCK_KEY, check, downgrade, upgrade
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.postgres


def _dsn(store: Store) -> str:
    return str(store.engine.url.set(drivername="postgresql").render_as_string(False))


async def _waiting_on_a_lock(watcher: psycopg.Connection[tuple[object, ...]], what: str) -> None:
    """Until a statement starting with `what` of this database waits for a lock (a deadline,
    not a timing: it is there at once on any machine)."""
    for _ in range(600):
        found = watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE %s AND wait_event_type = 'Lock'",
            (what + "%",),
        ).fetchone()
        if found and found[0]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {what} waits for a lock")


@pytest.mark.parametrize(
    ("table", "before", "after", "index"),
    [
        ("flows", "0025", "0026", "ix_flows_status_created_at"),
        ("hosts", "0026", "0027", "ix_hosts_host_id_c"),
        ("step_screenshots", "0027", "0028", "ix_step_screenshots_listing"),
        ("tasks", "0028", "0029", "ix_tasks_status_created_at_task_id"),
    ],
)
async def test_an_index_build_holds_no_write_to_its_table(
    postgres_server: PostgresServer, table: str, before: str, after: str, index: str
) -> None:
    """A write in progress when an upgrade reaches a migration's index (a host's hello, a flow
    learned) makes the build wait for it, whatever the build. A plain CREATE INDEX waits in
    the table's lock queue meanwhile, and every write that comes after queues behind it: the
    fleet's writes to that table stood still until the long one ended and the index was built.
    Built CONCURRENTLY, a later write takes its lock at once (NOWAIT: refused were it to wait),
    and the index is built, valid, once the first write ends. The downgrade drops it the same
    way."""
    store = Store.from_url(postgres_server.create_database())
    try:
        await upgrade(store.engine, before)
        with (
            psycopg.connect(_dsn(store)) as writer,
            psycopg.connect(_dsn(store)) as late,
            psycopg.connect(_dsn(store), autocommit=True) as watcher,
        ):
            writer.execute(f"LOCK TABLE {table} IN ROW EXCLUSIVE MODE")  # as its writes do
            migrating = asyncio.create_task(upgrade(store.engine, after))
            try:
                await _waiting_on_a_lock(watcher, "CREATE")
                late.execute(f"LOCK TABLE {table} IN ROW EXCLUSIVE MODE NOWAIT")
                late.rollback()
            finally:
                writer.rollback()
                await migrating
            valid = watcher.execute(
                "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (index,)
            ).fetchone()
            assert valid == (True,)
            await downgrade(store.engine, before)
            gone = watcher.execute("SELECT to_regclass(%s)", (index,)).fetchone()
            assert gone == (None,)
        await upgrade(store.engine)
        await check(store.engine)
    finally:
        await store.close()


async def test_an_index_a_failed_build_left_invalid_is_built_again(
    postgres_server: PostgresServer,
) -> None:
    """CREATE INDEX CONCURRENTLY that fails (cancelled, its connection lost) leaves the index
    behind, INVALID: never used, yet in the way of a second try (`already exists`, or skipped
    by IF NOT EXISTS). The upgrade run again drops it and builds the index it means."""
    store = Store.from_url(postgres_server.create_database())
    try:
        await upgrade(store.engine, "0026")
        with psycopg.connect(_dsn(store), autocommit=True) as conn:
            conn.execute("CREATE INDEX ix_hosts_host_id_c ON hosts (agent_version)")
            conn.execute(  # what the failed build leaves (the test cluster's user may do it)
                "UPDATE pg_index SET indisvalid = false"
                " WHERE indexrelid = to_regclass('ix_hosts_host_id_c')"
            )
            await upgrade(store.engine)
            made = conn.execute(
                "SELECT i.indisvalid, d.indexdef FROM pg_index i JOIN pg_indexes d"
                " ON d.indexname = 'ix_hosts_host_id_c'"
                " WHERE i.indexrelid = to_regclass('ix_hosts_host_id_c')"
            ).fetchone()
        assert made is not None and made[0] is True, made
        assert 'host_id COLLATE "C"' in str(made[1]), made
    finally:
        await store.close()


async def test_replicas_started_at_once_migrate_one_after_the_other(
    postgres_server: PostgresServer,
) -> None:
    """Three replicas upgrade one fresh database at once: one migrates (building indexes
    CONCURRENTLY, each file in a transaction of its own) while the others try the migration
    lock between no transactions (one blocked in pg_advisory_lock would hold a snapshot the
    CONCURRENTLY build waits for); each then finds the schema at head."""
    url = postgres_server.create_database()
    stores = [Store.from_url(url) for _ in range(3)]
    try:
        await asyncio.gather(*(upgrade(s.engine) for s in stores))
        await check(stores[0].engine)
    finally:
        for s in stores:
            await s.close()


async def test_a_replica_waiting_for_another_s_migration_says_so(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The migration lock is tried every 0.2 s with no end: a migration hung in another
    replica (an index build waiting for a long transaction) held this replica's start with
    nothing in its log. Now it warns at once and every 30 s, and migrates once the lock is
    free."""
    store = Store.from_url(postgres_server.create_database())
    try:
        with psycopg.connect(_dsn(store), autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
            caplog.set_level("WARNING", logger="cloud.store.engine")
            migrating = asyncio.create_task(upgrade(store.engine))
            for _ in range(600):
                if "another replica's migration" in caplog.text or migrating.done():
                    break
                await asyncio.sleep(0.05)
            assert not migrating.done()
            assert f"advisory lock {MIGRATION_LOCK_KEY}" in caplog.text
            other.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        await asyncio.wait_for(migrating, 120)
        await check(store.engine)
    finally:
        await store.close()

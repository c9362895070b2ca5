"""A write cancelled in the middle of a statement leaves the SQLite database writable.

A host killed while the cloud stored what it had just sent (its result, a screenshot, its
decisions) cancels that RPC's handler in the middle of a statement. SQLAlchemy then invalidates
the connection and closes it without a rollback; SQLite ends a closed connection's transaction
only once all its statements are finalized, and a cursor the cancelled call's frames still held
kept the database's write lock: every other write of the replica failed "database is locked"
until the process ended (a `.ci/run` saw a host's kept result refused for 90 s that way).

Real SQLite file, real aiosqlite through the store's engine. The cursor the cancelled frames
would hold is held by the test, so the garbage collector's timing does not decide the outcome.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import cloud.store.engine as engine_module
from cloud.store.database import Store

#: Long enough (seconds, on any machine) that the cancellation lands while it runs.
SLOW = (
    "WITH RECURSIVE c(x) AS (SELECT started() UNION ALL SELECT x + 1 FROM c WHERE x < 2000000)"
    " INSERT INTO t SELECT max(x) FROM c"
)


async def test_a_write_cancelled_mid_statement_leaves_the_database_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A short wait for SQLite's lock: the write that finds it held fails in a second, not ten.
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 1000)
    store = Store.from_url(f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}")
    held: list[sqlite3.Cursor] = []
    running = threading.Event()
    try:
        async with store.write() as session:
            await session.execute(text("CREATE TABLE t (x INTEGER)"))

        async def cancelled_write() -> None:
            async with store.write() as session:
                await session.execute(text("INSERT INTO t VALUES (1)"))
                raw: Any = (await session.connection()).sync_connection
                driver = raw.connection.driver_connection  # aiosqlite's connection

                def started() -> int:
                    running.set()
                    return 1

                def open_cursor() -> sqlite3.Cursor:
                    conn: sqlite3.Connection = driver._conn
                    conn.create_function("started", 0, started)
                    return conn.execute("SELECT x FROM t")

                held.append(await driver._execute(open_cursor))
                await session.execute(text(SLOW))

        write = asyncio.create_task(cancelled_write())
        assert await asyncio.to_thread(running.wait, 30), "the slow statement never started"
        write.cancel()
        with pytest.raises(asyncio.CancelledError):
            await write
        assert held, "the cancelled write's cursor is still alive"

        async with store.write() as session:
            await session.execute(text("INSERT INTO t VALUES (2)"))
        async with store.read() as session:
            rows = (await session.execute(text("SELECT x FROM t ORDER BY x"))).scalars().all()
        assert rows == [2], rows  # the cancelled write left nothing behind
    finally:
        held.clear()
        await store.close()

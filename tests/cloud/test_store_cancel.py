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
import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import cloud.store.engine as engine_module
from cloud import supervised
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


#: A statement that runs far longer than `supervised.stop` waits before it cancels again (1 s),
#: on any machine (minutes, unless interrupted).
ENDLESS = (
    "WITH RECURSIVE c(x) AS (SELECT started() UNION ALL SELECT x + 1 FROM c WHERE x < 2000000000)"
    " SELECT max(x) FROM c"
)


async def _stop_mid_statement(url: str, running: threading.Event) -> None:
    """A supervised job whose read is in the middle of `ENDLESS`, stopped as `CloudServer.stop`
    stops its jobs, and then the store closed."""
    store = Store.from_url(url)

    async def step() -> None:
        async with store.read() as session:
            raw: Any = (await session.connection()).sync_connection
            driver = raw.connection.driver_connection  # aiosqlite's connection

            def started() -> int:
                running.set()
                return 1

            await driver._execute(lambda: driver._conn.create_function("started", 0, started))
            await session.execute(text(ENDLESS))

    job = supervised.start("endless", step, interval=60.0)
    try:
        assert await asyncio.to_thread(running.wait, 30), "the statement never started"
    finally:
        await supervised.stop([job])
        await store.close()


def test_a_store_closed_after_a_statement_outlived_its_cancel_leaves_no_work_behind(
    tmp_path: Path,
) -> None:
    """A job cancelled in the middle of a statement makes SQLAlchemy close its connection
    gracefully, shielded, and that close waits for aiosqlite's thread to end the statement;
    `supervised.stop` cancels again after a second, and the connection is only told to stop.
    `engine.dispose()` closes the pooled connections only: that one's thread ran on after
    `Store.close()` (and after `CloudServer.stop()`), its statement to the end. Then it
    handed its results to the loop the stop had run on: closed by then (a test's, or `amc
    cloud`'s `asyncio.run` returning), "Event loop is closed" was raised in the thread (a run
    of tests/cloud saw it), or `asyncio.run` waited on the close for as long as the statement
    ran. Now `Store.close` interrupts what its connections still run and waits for their
    threads. In a loop of its own, in a thread, as `amc cloud`'s: its end is bounded here."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'cloud.sqlite3'}"
    running = threading.Event()
    raised: list[BaseException | None] = []
    before = set(threading.enumerate())
    hook = threading.excepthook
    threading.excepthook = lambda args: raised.append(args.exc_value)
    try:
        runner = threading.Thread(
            target=asyncio.run, args=(_stop_mid_statement(url, running),), daemon=True
        )
        runner.start()
        runner.join(60)
        assert not runner.is_alive(), "the loop did not end within 60 s of the stop"
        assert running.is_set()
        left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        assert left == [], f"the closed store's threads still run: {left}"
    finally:
        threading.excepthook = hook
    assert raised == [], raised


async def test_a_write_of_a_job_not_cancelled_still_running_at_close_is_let_finish(
    tmp_path: Path,
) -> None:
    """`Store.close` interrupted every connection's statement at once, a transaction of a job
    nobody cancelled included (found in review): its COMMIT was lost. A connection still out
    now gets a grace to be given back; only what still runs after it is interrupted. The
    statement waits inside a function of its own until the close has begun, so the order
    does not depend on the machine."""
    path = tmp_path / "cloud.sqlite3"
    store = Store.from_url(f"sqlite+aiosqlite:///{path}")
    started, release = threading.Event(), threading.Event()

    def gate() -> int:
        started.set()
        release.wait(30)
        return 7

    async with store.write() as session:
        await session.execute(text("CREATE TABLE t (x INTEGER)"))

    async def write() -> None:
        async with store.write() as session:
            raw: Any = (await session.connection()).sync_connection
            driver = raw.connection.driver_connection
            await driver._execute(lambda: driver._conn.create_function("gate", 0, gate))
            await session.execute(text("INSERT INTO t SELECT gate()"))

    job = asyncio.create_task(write())
    try:
        assert await asyncio.to_thread(started.wait, 30), "the statement never started"
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0.2)  # the close has begun: disposed, waiting for the connection
        release.set()
        await closing
        await job
    finally:
        release.set()
    with contextlib.closing(sqlite3.connect(path)) as plain:
        assert plain.execute("SELECT x FROM t").fetchall() == [(7,)]

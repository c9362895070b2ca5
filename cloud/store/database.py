"""The Store: one engine, sessions for reads and writes, and the clock every query uses."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from cloud.store.direct import DirectConnection
from cloud.store.engine import create_engine, sqlite_loop_connection
from cloud.store.pool import DEFAULT_POOL_SIZE
from cloud.store.sqlite_workers import SqliteWorkers

T = TypeVar("T")
#: A DB-API connection: sqlite3's own, or the one SQLAlchemy's pool hands out (aiosqlite's,
#: usable synchronously inside `AsyncSession.run_sync`).
DriverConnection = Any


#: How long the renewal write waits for a row lock before its statement fails (SQLSTATE 55P03)
#: instead of stalling its batch: a row held in an open transaction (an operator's psql
#: session, say) would otherwise hold up every lease written with it until they ran out.
#: The write's own row locks last well under a millisecond, and so do those of the other
#: fenced writers (results, sweeps, cancels); the shortest lease (5 s, renewed every 1.7 s)
#: outlasts a batch that times out and then writes its renewals one at a time
#: (`leases.renew._renew_batch_pg`).
RENEWAL_LOCK_TIMEOUT_MS = 250


def libpq_dsn(engine: AsyncEngine) -> str:
    """The engine's PostgreSQL URL as libpq takes it (no driver name in the scheme)."""
    url = make_url(engine.url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class Store:
    """Owns the async engine.

    On SQLite every write transaction runs under one in-process lock: SQLite allows one writer
    anyway, and serialising here avoids the lock-upgrade failures a read-then-write transaction can
    hit. PostgreSQL writes run concurrently and rely on row locks and conditional updates.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self.is_postgres = engine.dialect.name == "postgresql"
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        self._sessions = async_sessionmaker(engine, expire_on_commit=False, autoflush=False)
        #: SQLite: aiosqlite's threads, ended by `close` (`cloud.store.sqlite_workers`).
        self._workers = SqliteWorkers(engine) if self.is_sqlite else None
        #: SQLite file only: the renewal batch's read and its short write transactions
        #: (`write_on_loop`) on the loop's own thread (`engine.sqlite_loop_connection`).
        self.loop_connection: Engine | None = sqlite_loop_connection(engine)
        self._loop_sessions = (
            sessionmaker(self.loop_connection, expire_on_commit=False, autoflush=False)
            if self.loop_connection is not None
            else None
        )
        #: `loop_connection`'s one connection, checked out of its pool once (`loop_driver`).
        self._loop_held: tuple[Engine, Any] | None = None
        #: PostgreSQL only: the renewal batch's read and its write, each on a connection of
        #: its own (`cloud.store.direct`), so that neither waits for the other.
        self.direct_reads = DirectConnection(libpq_dsn(engine)) if self.is_postgres else None
        #: The writes' connection waits for a row lock `RENEWAL_LOCK_TIMEOUT_MS` at most.
        self.direct_writes = (
            DirectConnection(libpq_dsn(engine), f"-c lock_timeout={RENEWAL_LOCK_TIMEOUT_MS}")
            if self.is_postgres
            else None
        )
        #: PostgreSQL only: the event bus's NOTIFYs (`cloud.events`), a flush every few
        #: milliseconds while renewals change tasks.
        self.direct_notify = DirectConnection(libpq_dsn(engine)) if self.is_postgres else None

    def loop_driver(self) -> sqlite3.Connection:
        """`loop_connection`'s sqlite3 connection, checked out of its pool at the first call
        and kept: a checkout and check-in of the pool's one connection (its events, its
        reset-on-return rollback) cost the renewal batch's read and write ~70 us each on the
        loop's thread, against ~200 us for the read's statement (bench/renewal_path.py).
        Nothing is left open on it between two callers: a read runs its statement to the end
        (no transaction in autocommit's sense is begun by a SELECT) and a write transaction
        commits or rolls back before it returns (`_immediate`). Kept per engine, so a
        `loop_connection` replaced (the tests' broken file) is checked out anew; raises what the
        pool raises when it cannot connect."""
        engine = self.loop_connection
        assert engine is not None, "a loop connection exists only on a SQLite file"
        held = self._loop_held
        if held is None or held[0] is not engine:
            self._release_loop_driver()
            held = self._loop_held = (engine, engine.raw_connection())
        driver = held[1].driver_connection
        assert isinstance(driver, sqlite3.Connection)
        return driver

    def _release_loop_driver(self) -> None:
        held, self._loop_held = self._loop_held, None
        if held is not None:
            held[1].close()

    @classmethod
    def from_url(cls, url: str, pool_size: int = DEFAULT_POOL_SIZE) -> Store:
        """A store on a new engine for `url` (on PostgreSQL, `pool_size` pooled connections at
        most)."""
        return cls(create_engine(url, pool_size))

    @staticmethod
    def now() -> dt.datetime:
        """Current time, aware UTC. Replicas sharing a database need synchronised clocks."""
        return dt.datetime.now(dt.UTC)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A session in a transaction that commits on success and rolls back on error."""
        if self._write_lock is None:
            async with self._sessions.begin() as session:
                yield session
            return
        async with self._write_lock, self._sessions.begin() as session:
            yield session

    async def write_on_loop(self, work: Callable[[Session], T]) -> T:
        """`work` in a write transaction (committed if it returns, rolled back if it raises).

        On a SQLite file it runs on the loop's own thread (`engine.sqlite_loop_connection`), under
        the store's write lock: for short, hot transactions only (the loop stands still while
        it runs). Should SQLite refuse there (another process writing past the short timeout,
        any OperationalError), the transaction is rolled back and `work` runs again through
        the async engine, whose errors are the caller's. Elsewhere it always runs that way.
        """
        if self._loop_sessions is None or self._write_lock is None:
            async with self.write() as session:
                return await session.run_sync(work)
        async with self._write_lock:
            try:
                with self._loop_sessions.begin() as sync:
                    return work(sync)
            except (OperationalError, sqlite3.OperationalError):
                pass  # SQLAlchemy's or, from work that uses the driver directly, sqlite3's
            async with self._sessions.begin() as session:
                return await session.run_sync(work)

    async def write_driver_on_loop(self, work: Callable[[DriverConnection], T]) -> T:
        """`work` on the driver's own connection in a write transaction, as `write_on_loop`
        (on the loop's thread under the store's write lock on a SQLite file, else through the
        async engine) but without SQLAlchemy's session: for the renewal batch's write, whose
        session alone cost ~100 us of the loop's time per transaction, more than the UPDATE.

        On the loop's thread the transaction is `BEGIN IMMEDIATE` (SQLite's write lock taken
        before the first statement, so a read never has to be upgraded) and the driver's own
        commit; should SQLite refuse (another process writing past the short timeout), it is
        rolled back and `work` runs again through the async engine, whose errors are the
        caller's. `work` must not await: it runs to completion inside one callback.
        """
        if self.loop_connection is None or self._write_lock is None:
            async with self.write() as session:
                return await session.run_sync(lambda sync: work(sync.connection().connection))
        async with self._write_lock:
            try:
                return _immediate(self.loop_driver(), work)
            except (OperationalError, sqlite3.OperationalError):
                pass  # SQLAlchemy's (connecting) or sqlite3's: the usual way below
            async with self._sessions.begin() as session:
                return await session.run_sync(lambda sync: work(sync.connection().connection))

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A session for reads only."""
        async with self._sessions() as session:
            yield session

    async def checkpoint(self) -> None:
        """SQLite: copy the WAL's committed pages into the database file, so that the next write
        starts the WAL over instead of growing it (no connection checkpoints on its own:
        `engine._sqlite_checkpoint_policy`). PASSIVE waits for no reader or writer and none waits
        for it, so it runs outside the write lock, on a pooled connection whose thread syncs
        the file while the loop goes on. PostgreSQL: nothing to do."""
        if not self.is_sqlite:
            return
        async with self.engine.connect() as connection:
            await connection.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    async def close(self) -> None:
        """Dispose of the engine's pool, and on SQLite end aiosqlite's threads: a connection
        the pool no longer knew (closed by a task cancelled twice mid-statement) ran on after
        the stop, into a closed loop (`cloud.store.sqlite_workers`)."""
        self._release_loop_driver()
        if self.loop_connection is not None:
            self.loop_connection.dispose()
        for direct in (self.direct_reads, self.direct_writes, self.direct_notify):
            if direct is not None:
                await direct.close()
        await self.engine.dispose()
        if self._workers is not None:
            await self._workers.end()


def _immediate(conn: sqlite3.Connection, work: Callable[[DriverConnection], T]) -> T:
    """`work` in a `BEGIN IMMEDIATE` transaction on `conn`, committed if it returns, rolled
    back if it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        done = work(conn)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return done

"""The Store: one engine, sessions for reads and writes, and the clock every query uses."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Engine, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from cloud.store.engine import create_engine, sqlite_loop_reader, sqlite_loop_writer

T = TypeVar("T")


def _libpq_dsn(engine: AsyncEngine) -> str:
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
        #: SQLite file only: reads on the loop's own thread (`engine.sqlite_loop_reader`).
        self.loop_reader: Engine | None = sqlite_loop_reader(engine)
        #: SQLite file only: short writes on the loop's own thread (`write_on_loop`).
        self.loop_writer: Engine | None = sqlite_loop_writer(engine)
        self._loop_sessions = (
            sessionmaker(self.loop_writer, expire_on_commit=False, autoflush=False)
            if self.loop_writer is not None
            else None
        )
        #: PostgreSQL only: the connection of `read_direct`, opened on first use.
        self._direct: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._direct_lock = asyncio.Lock()
        self._direct_retry_at = 0.0

    @classmethod
    def from_url(cls, url: str) -> Store:
        """A store on a new engine for `url`."""
        return cls(create_engine(url))

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

        On a SQLite file it runs on the loop's own thread (`engine.sqlite_loop_writer`), under
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

    async def read_direct(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]] | None:
        """PostgreSQL only: the rows of one short read on the store's own autocommit connection,
        past SQLAlchemy and its pool, or None when that cannot be (another store, the connection
        busy with another read, or broken: it is reopened a second later); read the usual way
        then, which reports a real outage. For the renewal batch's read, hundreds a second:
        a pool checkout pings the server first, and SQLAlchemy's statement and row handling
        cost more CPU than the read itself (bench/lease_capacity.py)."""
        if not self.is_postgres or self._direct_lock.locked():
            return None
        if time.monotonic() < self._direct_retry_at:
            return None
        async with self._direct_lock:
            try:
                if self._direct is None or self._direct.closed:
                    self._direct = await psycopg.AsyncConnection.connect(
                        _libpq_dsn(self.engine),
                        autocommit=True,
                        connect_timeout=2,
                        options="-c TimeZone=UTC",
                    )
                cursor = await self._direct.execute(sql, params)
                return await cursor.fetchall()
            except psycopg.Error:
                await self._close_direct()
                self._direct_retry_at = time.monotonic() + 1.0
                return None

    async def _close_direct(self) -> None:
        direct, self._direct = self._direct, None
        if direct is not None:
            with contextlib.suppress(Exception):
                await direct.close()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A session for reads only."""
        async with self._sessions() as session:
            yield session

    async def close(self) -> None:
        """Dispose of the engine's pool."""
        for engine in (self.loop_reader, self.loop_writer):
            if engine is not None:
                engine.dispose()
        await self._close_direct()
        await self.engine.dispose()

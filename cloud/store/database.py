"""The Store: one engine, sessions for reads and writes, and the clock every query uses."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from cloud.store.engine import create_engine, sqlite_loop_reader


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

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A session for reads only."""
        async with self._sessions() as session:
            yield session

    async def close(self) -> None:
        """Dispose of the engine's pool."""
        if self.loop_reader is not None:
            self.loop_reader.dispose()
        await self.engine.dispose()

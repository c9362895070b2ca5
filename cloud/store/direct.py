"""A connection of the store's own, past SQLAlchemy and its pool, for the hottest statements.

PostgreSQL only. The renewal batch's read and write run hundreds of times a second. Through the
pool each checkout first pings the server, a write transaction adds its BEGIN and COMMIT, and
SQLAlchemy's statement and row handling cost more CPU than the statement itself; on a busy
machine every round trip waits for PostgreSQL to be scheduled, and the write stage's tail was
seconds (bench/lease_capacity.py, issue 21). One statement in autocommit on a dedicated
connection is one round trip. It is psycopg's asynchronous connection: its synchronous one
driven by a thread of its own cost no less per statement (the hand-off to and from the thread
is what the asynchronous waiting costs), and blocking the loop for a round trip to a server
would stand every stream still while it lasts (docs/decisions/0079). psycopg is imported where
the connection opens, not with the module: a cloud on SQLite never opens one (`pg_driver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

#: After a failure the connection is not tried again for this long (the pool is used).
RETRY_AFTER_S = 1.0


class DirectConnection:
    """One autocommit psycopg connection, one statement at a time, opened on first use."""

    def __init__(self, dsn: str, settings: str = "") -> None:
        self._dsn = dsn
        #: Server settings of this connection only, as libpq's `options` take them (e.g. the
        #: renewal write's `-c lock_timeout=...`), besides the UTC time zone every one has.
        self._options = f"-c TimeZone=UTC {settings}".strip()
        self._conn: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        #: One cursor for the connection's life: `AsyncConnection.execute` makes a new one per
        #: statement, ~20 us of the replica's CPU each (163 against 143 us per batch read, with
        #: the statement's own psycopg work; docs/benchmarks.md, twenty-first pass).
        self._cursor: psycopg.AsyncCursor[tuple[Any, ...]] | None = None
        self._lock = asyncio.Lock()
        self._retry_at = 0.0

    @property
    def backend_pid(self) -> int | None:
        """The server process of the open connection (None when none is open)."""
        return None if self._conn is None or self._conn.closed else self._conn.info.backend_pid

    async def run(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any], *, resend: bool
    ) -> list[tuple[Any, ...]] | None:
        """The rows of `sql`, or None when it was not run here: the connection is busy with
        another statement, cannot be opened, or failed recently; the caller goes through the
        pool then, which reports a real outage in the usual way.

        Should the statement fail once sent, the connection is closed and, with `resend` (a
        read, safe to run again), None is returned; otherwise (a write, which may have
        committed) the error is raised, as a failed commit through the pool would be. A
        statement that waited for a row lock past the connection's `lock_timeout` (SQLSTATE
        55P03) is raised as it is, the connection kept: the server rolled the statement back and
        the connection is idle, so nothing was written and the next statement may use it.
        """
        if self._lock.locked() or time.monotonic() < self._retry_at:
            return None
        import psycopg  # PostgreSQL only (module docstring); a dictionary look-up once loaded

        async with self._lock:
            if self._conn is None or self._conn.closed or self._cursor is None:
                try:
                    self._conn = await psycopg.AsyncConnection.connect(
                        self._dsn, autocommit=True, connect_timeout=2, options=self._options
                    )
                except psycopg.Error:
                    self._retry_at = time.monotonic() + RETRY_AFTER_S
                    return None
                self._cursor = self._conn.cursor()
            cursor = self._cursor
            try:
                await cursor.execute(sql, params)
                return await cursor.fetchall()
            except psycopg.errors.LockNotAvailable:
                raise
            except psycopg.Error:
                await self.close()
                self._retry_at = time.monotonic() + RETRY_AFTER_S
                if resend:
                    return None
                raise

    def retry_now(self) -> None:
        """Forget the last failure (tests)."""
        self._retry_at = 0.0

    async def close(self) -> None:
        """Close the connection (it is opened again on the next statement)."""
        conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

"""The threads aiosqlite runs a SQLite engine's statements in, ended before the store closes.

A task cancelled in the middle of a statement makes SQLAlchemy close its connection, shielded,
and that close waits for aiosqlite's thread to end the statement. Cancelled again meanwhile
(`supervised.stop` does after a second), SQLAlchemy only tells the connection to stop, and the
pool forgets it: `engine.dispose()` closes the pooled connections only. Its thread ran the
statement to the end after the store had closed and then handed the results to the loop the
stop ran on: closed by then (a test's, or `amc cloud`'s `asyncio.run` returning), "Event loop
is closed" was raised in the thread, or `asyncio.run` waited for as long as the statement ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from cloud.store.engine import SQLITE_BUSY_TIMEOUT_MS

log = logging.getLogger(__name__)

#: How long `SqliteWorkers.end` waits for the threads (seconds): an interrupted statement ends
#: at once, one waiting for another process's lock within SQLite's busy timeout.
END_WAIT_S = SQLITE_BUSY_TIMEOUT_MS / 1000 + 5.0
#: How long a connection still checked out at close may take to be given back before what it
#: runs is interrupted (seconds): a job that was not cancelled may be committing.
END_GRACE_S = 2.0


class SqliteWorkers:
    """aiosqlite's connections an engine opened, each with its thread (aiosqlite's own
    attributes: it names neither in its API), as the pool's `connect` event hands them over."""

    def __init__(self, engine: AsyncEngine) -> None:
        #: (thread, connection): the thread held while it runs, the connection weakly.
        self._opened: list[tuple[threading.Thread, weakref.ref[Any]]] = []
        opened = self._opened  # the listener holds the list, not this object nor the store

        def connected(_dbapi: Any, record: Any) -> None:
            conn = record.driver_connection
            thread = getattr(conn, "_thread", None)
            if isinstance(thread, threading.Thread):
                opened[:] = [(t, c) for t, c in opened if t.is_alive()]
                opened.append((thread, weakref.ref(conn)))

        event.listen(engine.sync_engine, "connect", connected)
        #: The pool's connections in use now (ids of their DBAPI connections): the pool's own
        #: count is reset when the engine is disposed, before `end` runs.
        self._out: set[int] = set()
        out = self._out

        def taken(dbapi: Any, _record: Any, _proxy: Any) -> None:
            out.add(id(dbapi))

        def given_back(dbapi: Any, *_: Any) -> None:
            out.discard(id(dbapi))

        event.listen(engine.sync_engine, "checkout", taken)
        for name in ("checkin", "close", "detach", "invalidate"):
            event.listen(engine.sync_engine, name, given_back)

    async def end(self, within: float = END_WAIT_S, grace: float = END_GRACE_S) -> None:
        """Give the connections still checked out of the pool `grace` seconds to be given back
        (a job nobody cancelled finishing its transaction: interrupted at once, its COMMIT was
        lost), then interrupt what the connections still run, tell each to stop (behind what it
        was given: a connection the pool closed has stopped already), and wait `within` seconds
        at most for their threads to end; a thread still running then is logged."""
        until = time.monotonic() + grace
        while self._out and time.monotonic() < until:  # noqa: ASYNC110 (the pool's events set no Event here)
            await asyncio.sleep(0.05)
        left = [(t, c()) for t, c in self._opened if t.is_alive()]
        self._opened.clear()
        for _, conn in left:
            if conn is None:
                continue
            driver = getattr(conn, "_connection", None)
            if isinstance(driver, sqlite3.Connection):
                with contextlib.suppress(sqlite3.Error):
                    driver.interrupt()
            with contextlib.suppress(Exception):
                conn.stop()
        threads = [t for t, _ in left]
        if threads and not await asyncio.to_thread(_joined, threads, within):
            log.warning(
                "a SQLite statement of the closed store still runs after %.0f s: its "
                "results go nowhere (a disk that hangs?)",
                within,
            )


def _joined(threads: list[threading.Thread], within: float) -> bool:
    """Whether every thread ended within `within` seconds."""
    end = time.monotonic() + within
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    return not any(t.is_alive() for t in threads)

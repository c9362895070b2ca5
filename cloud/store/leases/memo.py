"""The live leases' rows as the SQLite loop connection last read or wrote them, kept while
SQLite says nothing can have changed them (docs/decisions/0083-sqlite-lease-memo.md).

SQLite's `PRAGMA data_version` on a connection changes whenever another connection (this
process's async engine and pool, another process, the CLI) has committed to the file since the
connection last asked, and does not change for the connection's own commits. The renewal
batch's read and its writes run on one connection (`Store.loop_connection`, decision 0072), so
rows read or written on it stay what the file holds while its `data_version` is unchanged and it
has begun no write transaction of its own other than the renewal writes that report their rows
here (`Store.loop_writes` counts them all). A batch then costs one pragma instead of its read's
statement (~30 us per renewal, twenty-fourth pass); anything else drops the whole memo and the
batch reads as before. Only rows a read found live are kept, and every way a lease stops being
live is a write that drops the memo, so it holds at most the live leases.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from cloud.store.database import Store

RowT = TypeVar("RowT")


class LeaseMemo(Generic[RowT]):
    """Rows by task id, with what they were valid for: the loop connection they were read on,
    its `data_version`, and the store's count of loop write transactions."""

    __slots__ = ("_conn", "_version", "_writes", "rows")

    def __init__(self) -> None:
        self._conn: sqlite3.Connection | None = None
        self._version = -1
        self._writes = -1
        #: The rows still valid (`current` drops them all when they may not be).
        self.rows: dict[str, RowT] = {}

    def current(self, store: Store, conn: sqlite3.Connection) -> dict[str, RowT]:
        """The rows, after one `PRAGMA data_version` on `conn`: all dropped when another
        connection committed since the last call, when the store began a write transaction on
        `conn` that did not report its rows (`wrote`), or when `conn` is not the connection they
        were read on (a new connection's count starts over). Rows the caller then reads on
        `conn` and adds are valid for this call's state or a later one; a later one has a
        different `data_version`, so the next call drops them rather than trusting them."""
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if conn is not self._conn or version != self._version or store.loop_writes != self._writes:
            self.rows = {}
            self._conn, self._version, self._writes = conn, version, store.loop_writes
        return self.rows

    def wrote(self, store: Store, conn: object, writes: int, rows: dict[str, RowT]) -> None:
        """A write transaction committed `rows` (each task's row as it left it) on `conn`, as
        the store's loop write number `writes`. They are taken, and the transaction counted as
        known, only when it ran on the memo's connection and was the only one begun there since
        the memo was last valid; otherwise the memo stays as it is and `current` drops it.
        Call it after the commit only: a transaction rolled back changed nothing, and its
        count alone drops the memo."""
        if conn is self._conn and writes == self._writes + 1 == store.loop_writes:
            self._writes = writes
            self.rows.update(rows)

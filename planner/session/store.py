"""Where session items live between steps, restarts and attempts.

`SessionStore` is the port: the host's local store implements it (`SqliteSessionStore`, one
small table), and for the cloud transport the cloud implements it over its own database
(`cloud/store/ports.py`).
Items are stored one row each as the exact JSON of `planner.conversation.items`, so signatures and
encrypted reasoning come back byte for byte and a planner built after a restart continues the
very same conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from planner.conversation.items import SessionItem, dumps_item, item_type, loads_item
from planner.errors import PlannerError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS planner_session_items (
    task_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    item_type TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (task_id, attempt, seq)
)
"""


class SessionConflict(PlannerError):
    """Another call appended to the same conversation at the same position; this call's items
    were not kept. Retrying continues the conversation as it now stands."""


@runtime_checkable
class SessionStore(Protocol):
    """Append-only storage of a session's items per (task, attempt)."""

    async def load(self, task_id: str, attempt: int) -> list[SessionItem]:
        """Every item of this attempt, in the order appended (empty if none)."""
        ...

    async def append(self, task_id: str, attempt: int, items: Sequence[SessionItem]) -> None:
        """Add items after those already stored, atomically (all or none). A store shared by
        concurrent writers raises `SessionConflict` rather than interleave them."""
        ...

    async def latest_attempt(self, task_id: str, *, before: int) -> int | None:
        """The highest attempt below `before` that has items, so a new attempt can continue
        the conversation of the last one; None if there is none."""
        ...

    async def stored_at(self, task_id: str, attempt: int, seq: int) -> datetime | None:
        """When the item at `seq` of this attempt was first stored (UTC): the earliest attempt
        holding it, as a new attempt starts with a copy of the last one's conversation (the
        same item at the same position). None when there is no such item. A decision resumed
        from a kept answer says so (`ResumedFrom.answered_at`): when the answer was given."""
        ...


class SqliteSessionStore:
    """`SessionStore` on one SQLite file (WAL), usable beside the host's other tables.

    sqlite3 calls run in a worker thread so the event loop never blocks on disk; a lock keeps
    the sequence numbers of concurrent appends to one file gap-free and unique.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._path = str(path)
        self._lock = threading.Lock()
        self._failure_listeners: list[Callable[[BaseException, Path], None]] = []
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(_SCHEMA)

    def on_failure(self, listener: Callable[[BaseException, Path], None]) -> None:
        """Called (from the worker thread) with what a use of the file raised and the file:
        a host tells a disk fault from it (`host.timeline.storage_faults`, which the planner
        may not import) and pauses naming this file's folder, as for its timeline and outbox.
        Unreported, the pause it met later listed every folder of the host."""
        self._failure_listeners.append(listener)

    @contextlib.contextmanager
    def _told(self) -> Iterator[None]:
        """A failure inside is told (`on_failure`), then raised as it was."""
        try:
            yield
        except Exception as exc:
            for listener in self._failure_listeners:
                listener(exc, self.path)
            raise

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self._path, timeout=30)

    def _load(self, task_id: str, attempt: int) -> list[SessionItem]:
        with self._told(), self._lock, self._connect() as conn:
            rows = conn.execute(
                "SELECT body FROM planner_session_items WHERE task_id = ? AND attempt = ? "
                "ORDER BY seq",
                (task_id, attempt),
            ).fetchall()
        conn.close()
        return [loads_item(body) for (body,) in rows]

    def _append(self, task_id: str, attempt: int, items: Sequence[SessionItem]) -> None:
        if not items:
            return
        rows = [(item_type(i), dumps_item(i)) for i in items]
        with self._told(), self._lock:
            conn = self._connect()
            try:
                with conn:
                    (last,) = conn.execute(
                        "SELECT COALESCE(MAX(seq), -1) FROM planner_session_items "
                        "WHERE task_id = ? AND attempt = ?",
                        (task_id, attempt),
                    ).fetchone()
                    conn.executemany(
                        "INSERT INTO planner_session_items "
                        "(task_id, attempt, seq, item_type, body) VALUES (?, ?, ?, ?, ?)",
                        [
                            (task_id, attempt, last + 1 + n, kind, body)
                            for n, (kind, body) in enumerate(rows)
                        ],
                    )
            finally:
                conn.close()

    def _latest_attempt(self, task_id: str, before: int) -> int | None:
        with self._told(), self._lock, self._connect() as conn:
            (value,) = conn.execute(
                "SELECT MAX(attempt) FROM planner_session_items WHERE task_id = ? AND attempt < ?",
                (task_id, before),
            ).fetchone()
        conn.close()
        return None if value is None else int(value)

    def _stored_at(self, task_id: str, attempt: int, seq: int) -> datetime | None:
        with self._told(), self._lock, self._connect() as conn:
            (value,) = conn.execute(
                "SELECT MIN(o.created_at) FROM planner_session_items i "
                "JOIN planner_session_items o ON o.task_id = i.task_id AND o.seq = i.seq "
                "AND o.body = i.body AND o.attempt <= i.attempt "
                "WHERE i.task_id = ? AND i.attempt = ? AND i.seq = ?",
                (task_id, attempt, seq),
            ).fetchone()
        conn.close()
        # Written by SQLite's strftime('%Y-%m-%dT%H:%M:%fZ'): UTC, to the millisecond.
        return None if value is None else datetime.fromisoformat(value).astimezone(UTC)

    def _delete(self, task_id: str) -> int:
        with self._told(), self._lock:
            conn = self._connect()
            try:
                with conn:
                    cur = conn.execute(
                        "DELETE FROM planner_session_items WHERE task_id = ?", (task_id,)
                    )
                    return cur.rowcount
            finally:
                conn.close()

    async def load(self, task_id: str, attempt: int) -> list[SessionItem]:
        return await asyncio.to_thread(self._load, task_id, attempt)

    async def append(self, task_id: str, attempt: int, items: Sequence[SessionItem]) -> None:
        await asyncio.to_thread(self._append, task_id, attempt, list(items))

    async def latest_attempt(self, task_id: str, *, before: int) -> int | None:
        return await asyncio.to_thread(self._latest_attempt, task_id, before)

    async def stored_at(self, task_id: str, attempt: int, seq: int) -> datetime | None:
        return await asyncio.to_thread(self._stored_at, task_id, attempt, seq)

    async def delete(self, task_id: str) -> int:
        """Remove every item of a task (retention); returns how many rows went."""
        return await asyncio.to_thread(self._delete, task_id)

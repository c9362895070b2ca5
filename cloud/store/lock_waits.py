"""Bounded waits for row locks held elsewhere, for the background writers every lease needs.

On PostgreSQL a statement waits for a row lock as long as the holder keeps it: an operator's
`BEGIN; UPDATE tasks ...;` left open in psql held the expiry sweep (and with it the expiry of
every lease on every replica) for as long as the session stayed open. A writer that must keep
going sets `lock_timeout` for its transaction and, when it times out (SQLSTATE 55P03, the
transaction rolled back), leaves the locked rows for a later pass. SQLite has one writer and
no row locks: nothing to bound there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from cloud.store import pg_driver

#: How long a sweep waits for a row another transaction holds before it leaves that row for
#: its next pass. Far above the few milliseconds a renewal, result or cancel holds a row, so
#: only a lock held for no good reason is skipped; far below the sweep's one-second pace.
SWEEP_LOCK_TIMEOUT_MS = 250

T = TypeVar("T")


async def bound_lock_waits(session: AsyncSession, is_postgres: bool, ms: int) -> None:
    """Make every statement of `session`'s transaction wait `ms` at most for a row lock
    (`SET LOCAL`: the setting ends with the transaction, the pooled connection keeps none)."""
    if is_postgres:
        await session.execute(text(f"SET LOCAL lock_timeout = {int(ms)}"))


def bound_lock_waits_sync(session: Session, is_postgres: bool, ms: int) -> None:
    """`bound_lock_waits` for a synchronous session (`Store.write_on_loop`'s)."""
    if is_postgres:
        session.execute(text(f"SET LOCAL lock_timeout = {int(ms)}"))


class RowHeld(Exception):
    """A row a call needs stayed locked by another transaction past the call's bounded wait:
    the call wrote nothing, and its client is to retry later (`cloud.boundary` answers
    UNAVAILABLE with this message, which names the row, never the database's text)."""


def lock_timed_out(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is PostgreSQL's LockNotAvailable: a statement
    waited for a row lock past its `lock_timeout`."""
    pg = pg_driver.loaded()
    if pg is None:  # SQLite's store: psycopg was never loaded, so no error of its is in hand
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, pg.errors.LockNotAvailable):
            return True
        seen.add(id(current))
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


async def waiting_then_skipping(attempt: Callable[[bool], Awaitable[T]]) -> T:
    """`attempt(True)`, a transaction that waits (boundedly, `bound_lock_waits`) for every row
    it locks; should that wait time out, `attempt(False)`, the same transaction taking only the
    rows no other transaction holds now (SKIP LOCKED). Any other error is raised as it is."""
    try:
        return await attempt(True)
    except DBAPIError as exc:
        if not lock_timed_out(exc):
            raise
    return await attempt(False)

"""The rows of `dispatch_holds`: why every replica holds new tasks back (cloud/dispatch_holds.py).

A handful of rows at most (one per kind of hold), read whole.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from cloud.store.database import Store
from cloud.store.models import DispatchHoldRow

#: The model provider failed every call of a replica (`provider_down_after_failures` in a row).
PROVIDER_DOWN = "provider_down"
#: The model provider refused the cloud's credentials.
KEY_REFUSED = "key_refused"
#: The fleet's daily budget is spent.
DAILY_BUDGET = "daily_budget"
#: The holds a successful model call lifts.
PROVIDER = (PROVIDER_DOWN, KEY_REFUSED)


@dataclass(frozen=True, slots=True)
class Hold:
    """One row: what was seen, when, by which replica, and (for the provider) the next probe."""

    reason: str
    detail: str
    set_at: dt.datetime
    set_by: str
    next_probe_at: dt.datetime | None = None


def _hold(row: DispatchHoldRow) -> Hold:
    return Hold(row.reason, row.detail, row.set_at, row.set_by, row.next_probe_at)


async def load(store: Store) -> dict[str, Hold]:
    """Every hold, by reason."""
    async with store.read() as session:
        rows = (await session.scalars(select(DispatchHoldRow))).all()
    return {row.reason: _hold(row) for row in rows}


async def put(store: Store, hold: Hold, *, replacing: Iterable[str] = ()) -> None:
    """Record `hold` unless one of its reason is there already (the first finder keeps it: its
    time is when the hold began); the holds named in `replacing` go in the same transaction."""
    insert = pg_insert if store.is_postgres else sqlite_insert
    values = {
        "reason": hold.reason,
        "detail": hold.detail,
        "set_at": hold.set_at,
        "set_by": hold.set_by,
        "next_probe_at": hold.next_probe_at,
    }
    async with store.write() as session:
        gone = [r for r in replacing if r != hold.reason]
        if gone:
            await session.execute(delete(DispatchHoldRow).where(DispatchHoldRow.reason.in_(gone)))
        await session.execute(
            insert(DispatchHoldRow)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["reason"])
        )


async def lift(store: Store, reasons: Iterable[str]) -> bool:
    """Delete these holds; whether any was there."""
    async with store.write() as session:
        gone = await session.execute(
            delete(DispatchHoldRow)
            .where(DispatchHoldRow.reason.in_(list(reasons)))
            .returning(DispatchHoldRow.reason)
        )
        return bool(gone.all())


async def probed(store: Store, reasons: Iterable[str], next_probe_at: dt.datetime) -> None:
    """A probe failed: when the next one comes, for operators."""
    async with store.write() as session:
        await session.execute(
            update(DispatchHoldRow)
            .where(DispatchHoldRow.reason.in_(list(reasons)))
            .values(next_probe_at=next_probe_at)
        )

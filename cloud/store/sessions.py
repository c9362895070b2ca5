"""Session-mode conversations the cloud keeps for the cloud planner transport.

Rows are the exact JSON of `planner.conversation.items`, one per item, in order. Appends name the
position they expect to write at: the primary key (task, attempt, seq) refuses a second writer
of the same position on either backend, so two calls continuing one conversation at once (a
host retrying while its first call still runs, on this replica or another) cannot interleave
their turns: whichever writes second fails with `SessionConflict`, and its model turn is not
kept (an observation it wrote before calling the model may be).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import delete, func, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased

from cloud.store.database import Store
from cloud.store.models import SessionItemRow, TaskRow
from planner.session.store import SessionConflict


async def load(store: Store, task_id: str, attempt: int) -> list[str]:
    """The item bodies of one attempt's conversation, in order."""
    async with store.read() as session:
        rows = await session.scalars(
            select(SessionItemRow.body)
            .where(SessionItemRow.task_id == task_id, SessionItemRow.attempt == attempt)
            .order_by(SessionItemRow.seq)
        )
        return list(rows)


async def page(
    store: Store, task_id: str, attempt: int, start: int, limit: int
) -> list[tuple[int, str]]:
    """(seq, body) of up to `limit` items from position `start`, in order."""
    async with store.read() as session:
        rows = await session.execute(
            select(SessionItemRow.seq, SessionItemRow.body)
            .where(
                SessionItemRow.task_id == task_id,
                SessionItemRow.attempt == attempt,
                SessionItemRow.seq >= start,
            )
            .order_by(SessionItemRow.seq)
            .limit(limit)
        )
        return [(int(seq), str(body)) for seq, body in rows]


async def length(store: Store, task_id: str, attempt: int) -> int:
    """How many items one attempt's conversation has (the next append's position)."""
    async with store.read() as session:
        value = await session.scalar(
            select(func.count())
            .select_from(SessionItemRow)
            .where(SessionItemRow.task_id == task_id, SessionItemRow.attempt == attempt)
        )
        return int(value or 0)


async def append(
    store: Store, task_id: str, attempt: int, start: int, items: Sequence[tuple[str, str]]
) -> None:
    """Write `(item_type, body)` pairs at positions start, start+1, … in one transaction.

    Raises `SessionConflict` when any of those positions is already taken.
    """
    if not items:
        return
    now = store.now()
    try:
        async with store.write() as session:
            session.add_all(
                SessionItemRow(
                    task_id=task_id,
                    attempt=attempt,
                    seq=start + n,
                    item_type=kind,
                    body=body,
                    created_at=now,
                )
                for n, (kind, body) in enumerate(items)
            )
            await session.flush()
    except IntegrityError:
        raise SessionConflict(
            f"the conversation of task {task_id!r} attempt {attempt} was continued by another "
            "call at the same time; this call's model turn was not kept"
        ) from None


async def stored_at(store: Store, task_id: str, attempt: int, seq: int) -> dt.datetime | None:
    """When the item at `seq` of one attempt was first stored: the earliest attempt holding the
    same item at that position (a new attempt starts with a copy of the last one's), or None
    when there is no such item."""
    item, earlier = aliased(SessionItemRow), aliased(SessionItemRow)
    async with store.read() as session:
        value = await session.scalar(
            select(func.min(earlier.created_at))
            .select_from(item)
            .join(
                earlier,
                (earlier.task_id == item.task_id)
                & (earlier.seq == item.seq)
                & (earlier.body == item.body)
                & (earlier.attempt <= item.attempt),
            )
            .where(item.task_id == task_id, item.attempt == attempt, item.seq == seq)
        )
    return value


async def latest_attempt(store: Store, task_id: str, before: int) -> int | None:
    """The highest attempt below `before` with a stored conversation, if any."""
    async with store.read() as session:
        value = await session.scalar(
            select(func.max(SessionItemRow.attempt)).where(
                SessionItemRow.task_id == task_id, SessionItemRow.attempt < before
            )
        )
        return None if value is None else int(value)


async def prune(
    store: Store, older_than: dt.timedelta, batch_size: int = 1000, max_batches: int = 1000
) -> int:
    """Delete the conversations of tasks that ended before now - older_than (the decision log's
    retention), at most `batch_size` items per short transaction so writers (lease renewals on
    SQLite's single write lock) never wait long. Returns how many items went."""
    cutoff = store.now() - older_than
    total = 0
    key = tuple_(SessionItemRow.task_id, SessionItemRow.attempt, SessionItemRow.seq)
    for _ in range(max_batches):
        async with store.write() as session:
            rows = (
                await session.execute(
                    select(SessionItemRow.task_id, SessionItemRow.attempt, SessionItemRow.seq)
                    .join(TaskRow, TaskRow.task_id == SessionItemRow.task_id)
                    .where(TaskRow.finished_at.is_not(None), TaskRow.finished_at < cutoff)
                    .limit(batch_size)
                )
            ).all()
            if rows:
                await session.execute(
                    delete(SessionItemRow).where(key.in_([tuple(r) for r in rows]))
                )
        total += len(rows)
        if len(rows) < batch_size:
            break
    return total

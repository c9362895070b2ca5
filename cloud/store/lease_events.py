"""A task's lease history: what happened to each attempt's lease, one row per event.

Most events are written by the lease queries themselves (claim, results, sweeps, cancel), in
the transaction that made the change, with `new`; the lease manager records the two it learns
about outside those transactions (a held assignment resumed after a reconnect, recorded by
`leases.hellos`, and a lease the cloud refused, by `record_revoked`). Renewals are not events:
each attempt row counts them (`renewals`, first and last). Like the rest of `cloud/store/leases`,
this module speaks the store's own words (no protobuf); `cloud/store/convert.py` maps them.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store.database import Store
from cloud.store.lock_waits import bound_lock_waits
from cloud.store.models import AttemptRow, LeaseEventRow, TaskRow
from cloud.store.paging import FOREIGN, of_attempt, page_token, position, token_int

#: Longest reason kept with an event (a host's summary can be 2,000 characters).
REASON_LIMIT = 500


class EventKind(enum.StrEnum):
    """What happened (stored as these words)."""

    ASSIGNED = "assigned"
    RESUMED = "resumed"
    REVOKED = "revoked"
    EXPIRED = "expired"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    RESULT = "result"
    REQUEUED = "requeued"


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= REASON_LIMIT:
        return text
    return text[: REASON_LIMIT - 1] + "…"


def values(
    kind: EventKind,
    task_id: str,
    attempt: int,
    at: dt.datetime,
    *,
    host_id: str | None = None,
    device_serial: str | None = None,
    operator: str | None = None,
    reason: str | None = None,
    result_status: str | None = None,
    task_status: str | None = None,
) -> dict[str, Any]:
    """An event row's columns, for a Core INSERT in the transaction that makes the change (a
    claim, where the ORM's flush was a measurable share of the cost)."""
    return {
        "task_id": task_id,
        "attempt": attempt,
        "kind": kind.value,
        "at": at,
        "host_id": host_id or None,
        "device_serial": device_serial or None,
        "operator": operator or None,
        "reason": _clip(reason),
        "result_status": result_status,
        "task_status": task_status,
    }


def new(
    kind: EventKind, task_id: str, attempt: int, at: dt.datetime, **fields: str | None
) -> LeaseEventRow:
    """An event row to add to the session that makes the change it records (`fields`: the
    keyword arguments of `values`)."""
    return LeaseEventRow(**values(kind, task_id, attempt, at, **fields))


async def record_revoked(
    store: Store,
    host_id: str,
    task_id: str,
    attempt: int,
    reason: str,
    *,
    lock_wait_ms: int | None = None,
) -> bool:
    """The cloud refused `host_id`'s lease of (task, attempt) and told it to stop, for `reason`.

    Only a lease that was this host's is recorded (a stranger's message about another host's
    lease, or a lease the cloud never issued, says nothing about the task), and only once per
    reason in a row: a host that keeps sending for a lease it lost adds no rows. True when a
    row was added.

    `lock_wait_ms` (PostgreSQL): wait that long at most for the task's row, which the new
    row's foreign key locks (key share: an operator's `SELECT ... FOR UPDATE` holds it off),
    then raise the database's lock timeout (`lock_timed_out`) with nothing written.
    """
    now = store.now()
    async with store.write() as session:
        if lock_wait_ms is not None:
            await bound_lock_waits(session, store.is_postgres, lock_wait_ms)
        row = await session.scalar(
            select(AttemptRow).where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
        )
        if row is None or row.host_id != host_id:
            return False
        last = await _last_of_attempt(session, task_id, attempt)
        if last is not None and last.kind == EventKind.REVOKED and last.reason == _clip(reason):
            return False
        status = await session.scalar(select(TaskRow.status).where(TaskRow.task_id == task_id))
        session.add(
            new(
                EventKind.REVOKED,
                task_id,
                attempt,
                now,
                host_id=host_id,
                device_serial=row.device_serial,
                reason=reason,
                task_status=status,
            )
        )
        return True


async def _last_of_attempt(
    session: AsyncSession, task_id: str, attempt: int
) -> LeaseEventRow | None:
    return await session.scalar(
        select(LeaseEventRow)
        .where(LeaseEventRow.task_id == task_id, LeaseEventRow.attempt == attempt)
        .order_by(LeaseEventRow.id.desc())
        .limit(1)
    )


def _cursor(row: LeaseEventRow, attempt: int) -> str:
    return page_token(of_attempt(f"events/{row.task_id}", attempt), row.id)


def _decode(task_id: str, token: str, attempt: int) -> int:
    (event_id,) = position(of_attempt(f"events/{task_id}", attempt), token, 1)
    try:
        return token_int(event_id)
    except (TypeError, ValueError) as exc:
        raise ValueError(FOREIGN) from exc


async def list_page(
    store: Store, task_id: str, attempt: int, page_size: int, page_token: str
) -> tuple[list[LeaseEventRow], str]:
    """A task's events (of one attempt when `attempt` > 0), oldest first; ValueError for a
    foreign page token."""
    stmt = select(LeaseEventRow).where(LeaseEventRow.task_id == task_id)
    if attempt:
        stmt = stmt.where(LeaseEventRow.attempt == attempt)
    if page_token:
        stmt = stmt.where(LeaseEventRow.id > _decode(task_id, page_token, attempt))
    stmt = stmt.order_by(LeaseEventRow.id).limit(page_size + 1)
    async with store.read() as session:
        rows = list((await session.scalars(stmt)).all())
    more = len(rows) > page_size
    rows = rows[:page_size]
    return rows, (_cursor(rows[-1], attempt) if more and rows else "")

"""Claims: a queued task handed to an idle phone of a host as a fresh lease.

Replicas claim at once without handing a task out twice: on PostgreSQL the candidate is locked
with FOR UPDATE SKIP LOCKED, the UPDATE re-checks `status = QUEUED` either way, and a unique
index allows one live attempt per phone.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Select, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from cloud.store import lease_events, secrets, spend, states
from cloud.store.database import Store
from cloud.store.lease_events import EventKind
from cloud.store.models import AttemptRow, LeaseEventRow, TaskRow
from planner.decision import Usage


@dataclass(frozen=True, slots=True)
class Claimed:
    """A fresh lease: what the Assignment message needs."""

    task_id: str
    attempt: int
    lease_id: str
    device_serial: str
    goal: str
    lease_expires_at: dt.datetime
    lease_seconds: float
    deadline: dt.datetime
    last_progress: AttemptRow | None
    #: The task's secret parameters, name → sealed token (opened only for the Assignment).
    sealed_secrets: dict[str, str] = field(default_factory=dict)
    #: The task asked never to replay a learned flow.
    no_replay: bool = False
    #: When the task was queued for this attempt (None when not known: a re-sent assignment).
    queued_since: dt.datetime | None = None
    #: The task's caps (0 = none) and what its earlier attempts' decisions cost.
    max_tokens: int = 0
    max_cost_usd: float = 0.0
    spent: Usage = field(default_factory=Usage)


#: What an Assignment needs of its task, in `Claimed` field order.
_ASSIGNMENT_COLUMNS = (
    TaskRow.goal,
    TaskRow.lease_seconds,
    TaskRow.deadline,
    TaskRow.no_replay,
    TaskRow.max_tokens,
    TaskRow.max_cost_usd,
)


def _latest_progress_query(task_id: str) -> Select[AttemptRow]:
    return (
        select(AttemptRow)
        .where(AttemptRow.task_id == task_id, AttemptRow.progress_updated_at.is_not(None))
        .order_by(AttemptRow.attempt.desc())
        .limit(1)
    )


async def latest_progress(session: AsyncSession, task_id: str) -> AttemptRow | None:
    """The task's most recent attempt that reported progress (a new attempt starts from it)."""
    return await session.scalar(_latest_progress_query(task_id))


async def claim(
    store: Store, host_id: str, idle_serials: list[str], planner_transport: int
) -> Claimed | None:
    """Hand the oldest matching queued task to one of `idle_serials` of `host_id`, or None.

    On PostgreSQL the candidate row is locked with FOR UPDATE SKIP LOCKED, so replicas claiming at
    once pick different tasks; the UPDATE re-checks `status = QUEUED` either way, and a unique
    index allows one live attempt per phone. A device-targeted task only goes to that device.

    The transaction is one synchronous function (`_claim`) run by `Store.write_on_loop`: on a
    SQLite file on the loop's own thread, elsewhere through the async engine. Through aiosqlite
    a claim crossed to its worker thread and back about 50 times (each statement, cursor, fetch
    and the commit) and cost ~8 ms of CPU: a thousand hosts connecting at once waited seconds
    for their assignments behind one another (bench/dispatch_burst.py).
    """
    if not idle_serials:
        return None
    try:
        return await store.write_on_loop(
            lambda session: _claim(session, store.now, host_id, idle_serials, planner_transport)
        )
    except IntegrityError:
        # The phone already has a live attempt (another stream of this host got there first).
        return None


def _claim(
    session: Session,
    clock: Callable[[], dt.datetime],
    host_id: str,
    idle_serials: list[str],
    planner_transport: int,
) -> Claimed | None:
    """`claim`'s transaction. A claim that finds nothing has only read: SQLite takes its write
    lock at the first write, so the renewal batches' writes never wait on an empty claim.
    Core statements on the session's connection: the ORM's flush and its ORM-enabled UPDATE
    were ~40 % of a claim's CPU."""
    conn = session.connection()
    now = clock()
    matching = (
        TaskRow.status == states.QUEUED,
        TaskRow.cancel_requested.is_(False),
        TaskRow.deadline > now,
        (TaskRow.target_host_id.is_(None)) | (TaskRow.target_host_id == host_id),
        (TaskRow.target_device_serial.is_(None)) | (TaskRow.target_device_serial.in_(idle_serials)),
    )
    candidate = conn.execute(
        select(TaskRow.task_id, TaskRow.target_device_serial, TaskRow.updated_at)
        .where(*matching)
        .order_by(TaskRow.created_at, TaskRow.task_id)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).first()
    if candidate is None:
        return None
    task_id, target_serial, queued_since = candidate
    serial = target_serial or idle_serials[0]
    claimed = conn.execute(
        update(TaskRow)
        .where(TaskRow.task_id == task_id, TaskRow.status == states.QUEUED)
        .values(
            status=states.ASSIGNED,
            attempt=TaskRow.attempt + 1,
            host_id=host_id,
            device_serial=serial,
            updated_at=now,
        )
        .returning(TaskRow.attempt, *_ASSIGNMENT_COLUMNS)
    ).first()
    if claimed is None:
        return None
    attempt, goal, lease_seconds, deadline, no_replay, max_tokens, max_cost_usd = claimed
    # Read again now the task row is ours: `now` may predate a task submitted while this claim
    # was starting, and an attempt never starts before its task was created.
    now = clock()
    previous = session.scalar(_latest_progress_query(task_id)) if attempt > 1 else None
    spent = (
        spend.usage_of(conn.execute(spend.spent_query(task_id, attempt)).one())
        if attempt > 1
        else Usage()
    )
    expires = now + dt.timedelta(seconds=lease_seconds)
    lease_id = uuid.uuid4().hex
    conn.execute(
        insert(AttemptRow).values(
            task_id=task_id,
            attempt=attempt,
            host_id=host_id,
            device_serial=serial,
            lease_id=lease_id,
            lease_expires_at=expires,
            status=states.ASSIGNED,
            planner_transport=planner_transport,
            started_at=now,
        )
    )
    conn.execute(
        insert(LeaseEventRow).values(
            lease_events.values(
                EventKind.ASSIGNED,
                task_id,
                attempt,
                now,
                host_id=host_id,
                device_serial=serial,
                task_status=states.ASSIGNED,
            )
        )
    )
    sealed = {name: token for name, token in conn.execute(secrets.sealed_query(task_id)).all()}
    return Claimed(
        task_id=task_id,
        attempt=attempt,
        lease_id=lease_id,
        device_serial=serial,
        goal=goal,
        lease_expires_at=expires,
        lease_seconds=lease_seconds,
        deadline=deadline,
        last_progress=previous,
        sealed_secrets=sealed,
        no_replay=no_replay,
        queued_since=queued_since,
        max_tokens=max_tokens,
        max_cost_usd=max_cost_usd,
        spent=spent,
    )


async def live_attempts_on(store: Store, host_id: str, serials: set[str]) -> list[Claimed]:
    """Live leases of `host_id` on these phones, as assignments (to re-send after a claim whose
    commit outcome was unknown: the row may exist although the claim raised)."""
    if not serials:
        return []
    async with store.read() as session:
        rows = (
            await session.execute(
                select(AttemptRow, *_ASSIGNMENT_COLUMNS)
                .join(TaskRow, TaskRow.task_id == AttemptRow.task_id)
                .where(
                    AttemptRow.host_id == host_id,
                    AttemptRow.device_serial.in_(serials),
                    AttemptRow.ended_at.is_(None),
                    AttemptRow.lease_expires_at > store.now(),
                )
            )
        ).all()
        out = []
        for row, goal, lease_seconds, deadline, no_replay, max_tokens, max_cost_usd in rows:
            previous = await latest_progress(session, row.task_id) if row.attempt > 1 else None
            sealed = await secrets.sealed_for(session, row.task_id)
            spent = await spend.spent_in(session, row.task_id, row.attempt)
            out.append(
                Claimed(
                    task_id=row.task_id,
                    attempt=row.attempt,
                    lease_id=row.lease_id,
                    device_serial=row.device_serial,
                    goal=goal,
                    lease_expires_at=row.lease_expires_at,
                    lease_seconds=lease_seconds,
                    deadline=deadline,
                    last_progress=previous,
                    sealed_secrets=sealed,
                    no_replay=no_replay,
                    max_tokens=max_tokens,
                    max_cost_usd=max_cost_usd,
                    spent=spent,
                )
            )
        return out

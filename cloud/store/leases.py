"""Lease queries: claim, fenced renewal and result, expiry and deadline sweeps, liveness checks.

Every state change that a host may attempt with a stale lease is a single conditional UPDATE whose
WHERE clause is the fence (`task AND attempt AND lease_id AND host AND not ended AND expires_at >
now`): a stale host matches no row and changes nothing, whatever replica it talks to.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import TypeAlias, cast

from sqlalchemy import (
    ColumnElement,
    Integer,
    ScalarSelect,
    String,
    Table,
    Update,
    bindparam,
    case,
    column,
    exists,
    func,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.store import states
from cloud.store.database import Store
from cloud.store.models import AttemptRow, TaskRow, UTCDateTime

SUMMARY_LIMIT = 200
ELLIPSIS = "…"

RevokeReason: TypeAlias = lease_pb.RevokeReason.ValueType


def truncate_summary(text: str) -> str:
    """At most 200 characters; longer summaries end in an ellipsis (never rejected)."""
    if len(text) <= SUMMARY_LIMIT:
        return text
    return text[: SUMMARY_LIMIT - 1] + ELLIPSIS


@dataclass(frozen=True, slots=True)
class ProgressIn:
    """A progress snapshot as the host reported it (summary already truncated)."""

    step_index: int
    step_status: int
    summary: str
    max_steps: int | None = None

    @classmethod
    def from_proto(cls, p: types_pb2.Progress) -> ProgressIn:
        return cls(
            p.step_index, int(p.step_status), truncate_summary(p.summary), p.max_steps or None
        )


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


def _live_fence(
    host_id: str, task_id: str, attempt: int, lease_id: str, now: dt.datetime
) -> list[ColumnElement[bool]]:
    return [
        AttemptRow.task_id == task_id,
        AttemptRow.attempt == attempt,
        AttemptRow.lease_id == lease_id,
        AttemptRow.host_id == host_id,
        AttemptRow.ended_at.is_(None),
        AttemptRow.lease_expires_at > now,
    ]


def _cancel_reason(task_id: str) -> ScalarSelect[str | None]:
    """The operator's cancel reason of a task with a cancel requested (NULL otherwise)."""
    return (
        select(TaskRow.cancel_reason)
        .where(TaskRow.task_id == task_id, TaskRow.cancel_requested.is_(True))
        .scalar_subquery()
    )


async def _previous_progress(session: AsyncSession, task_id: str) -> AttemptRow | None:
    return await session.scalar(
        select(AttemptRow)
        .where(AttemptRow.task_id == task_id, AttemptRow.progress_updated_at.is_not(None))
        .order_by(AttemptRow.attempt.desc())
        .limit(1)
    )


async def claim(
    store: Store, host_id: str, idle_serials: list[str], planner_transport: int
) -> Claimed | None:
    """Hand the oldest matching queued task to one of `idle_serials` of `host_id`, or None.

    On PostgreSQL the candidate row is locked with FOR UPDATE SKIP LOCKED, so replicas claiming at
    once pick different tasks; the UPDATE re-checks `status = QUEUED` either way, and a unique
    index allows one live attempt per phone. A device-targeted task only goes to that device.
    """
    if not idle_serials:
        return None
    now = store.now()
    matching = (
        TaskRow.status == states.QUEUED,
        TaskRow.cancel_requested.is_(False),
        TaskRow.deadline > now,
        (TaskRow.target_host_id.is_(None)) | (TaskRow.target_host_id == host_id),
        (TaskRow.target_device_serial.is_(None)) | (TaskRow.target_device_serial.in_(idle_serials)),
    )
    # A plain read first: most claims that find nothing should not take a write transaction
    # (on SQLite that is the one writer slot every renewal batch also needs).
    async with store.read() as session:
        if await session.scalar(select(TaskRow.task_id).where(*matching).limit(1)) is None:
            return None
    try:
        async with store.write() as session:
            candidate = (
                await session.execute(
                    select(TaskRow.task_id, TaskRow.target_device_serial)
                    .where(*matching)
                    .order_by(TaskRow.created_at, TaskRow.task_id)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                )
            ).first()
            if candidate is None:
                return None
            task_id, target_serial = candidate
            serial = target_serial or idle_serials[0]
            claimed = (
                await session.execute(
                    update(TaskRow)
                    .where(TaskRow.task_id == task_id, TaskRow.status == states.QUEUED)
                    .values(
                        status=states.ASSIGNED,
                        attempt=TaskRow.attempt + 1,
                        host_id=host_id,
                        device_serial=serial,
                        updated_at=now,
                    )
                    .returning(
                        TaskRow.attempt, TaskRow.goal, TaskRow.lease_seconds, TaskRow.deadline
                    )
                )
            ).first()
            if claimed is None:
                return None
            attempt, goal, lease_seconds, deadline = claimed
            previous = await _previous_progress(session, task_id) if attempt > 1 else None
            expires = now + dt.timedelta(seconds=lease_seconds)
            lease_id = uuid.uuid4().hex
            session.add(
                AttemptRow(
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
            await session.flush()
    except IntegrityError:
        # The phone already has a live attempt (another stream of this host got there first).
        return None
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
    )


@dataclass(frozen=True, slots=True)
class RenewalIn:
    """One renewal to write."""

    host_id: str
    task_id: str
    attempt: int
    lease_id: str
    progress: ProgressIn | None


@dataclass(frozen=True, slots=True)
class RenewalOut:
    """Outcome: a new expiry, or the reason the lease is gone."""

    expires_at: dt.datetime | None
    revoke_reason: RevokeReason = lease_pb.REVOKE_REASON_UNSPECIFIED
    message: str = ""


def _renew_statement(with_progress: bool) -> Update:
    """The fenced renewal UPDATE, built once with bound parameters.

    Building an ORM UPDATE per renewal (and letting the ORM evaluate its WHERE clause against the
    session) cost about a millisecond of CPU per renewal, most of the cloud's per-renewal cost
    (bench/lease_capacity.py); this Core statement on the table is built once and only binds
    values per renewal, and a batch runs it as one executemany. The fence is the same WHERE clause
    as `_live_fence`, in the statement that writes.
    """
    values: dict[str, object] = {
        "lease_expires_at": bindparam("r_expires", type_=UTCDateTime()),
        "status": states.RUNNING,
    }
    if with_progress:
        values.update(
            step_index=bindparam("r_step_index", type_=Integer()),
            step_status=bindparam("r_step_status", type_=Integer()),
            summary=bindparam("r_summary", type_=String()),
            max_steps=bindparam("r_max_steps", type_=Integer()),
            progress_updated_at=bindparam("r_now", type_=UTCDateTime()),
        )
    attempts = cast(Table, AttemptRow.__table__)
    tasks = cast(Table, TaskRow.__table__)
    return (
        update(attempts)
        .where(
            attempts.c.task_id == bindparam("r_task", type_=String()),
            attempts.c.attempt == bindparam("r_attempt", type_=Integer()),
            attempts.c.lease_id == bindparam("r_lease", type_=String()),
            attempts.c.host_id == bindparam("r_host", type_=String()),
            attempts.c.ended_at.is_(None),
            attempts.c.lease_expires_at > bindparam("r_now", type_=UTCDateTime()),
            ~exists().where(
                tasks.c.task_id == attempts.c.task_id, tasks.c.cancel_requested.is_(True)
            ),
        )
        .values(**values)
    )


_RENEW = _renew_statement(with_progress=False)
_RENEW_WITH_PROGRESS = _renew_statement(with_progress=True)


async def renew_batch(store: Store, items: list[RenewalIn]) -> list[RenewalOut]:
    """Write many renewals in one transaction; each caller gets its own outcome, in order.

    On PostgreSQL the whole batch is one statement (`_renew_batch_pg`); on SQLite it is an
    executemany of the fenced UPDATE (`_renew_batch_sqlite`). Both apply the same fence.
    """
    if not items:
        return []
    if store.is_postgres:
        return await _renew_batch_pg(store, items)
    return await _renew_batch_sqlite(store, items)


async def _renew_batch_sqlite(store: Store, items: list[RenewalIn]) -> list[RenewalOut]:
    """Write many renewals in one transaction: one executemany of the fenced UPDATE.

    Which renewals took effect is read back in the same transaction: an accepted renewal left its
    attempt with exactly the expiry this batch computed (every batch has its own `now`, later than
    any expiry written before, so an old expiry never equals a new one). A renewal of a task whose
    cancel was requested is not extended (the host is revoked instead), so a cancelled task ends
    at the latest when its current lease runs out.
    """
    now = store.now()
    out: list[RenewalOut | None] = [None] * len(items)
    renewed_tasks: set[str] = set()
    async with store.write() as session:
        rows = await session.execute(
            select(TaskRow.task_id, TaskRow.lease_seconds).where(
                TaskRow.task_id.in_({i.task_id for i in items})
            )
        )
        lease_by_task: dict[str, float] = {task_id: seconds for task_id, seconds in rows}
        plain: list[dict[str, object]] = []
        with_progress: list[dict[str, object]] = []
        expected: dict[int, dt.datetime] = {}
        for n, item in enumerate(items):
            seconds = lease_by_task.get(item.task_id)
            if seconds is None:
                out[n] = RenewalOut(None, lease_pb.REVOKE_REASON_UNKNOWN, "unknown task")
                continue
            expires = now + dt.timedelta(seconds=seconds)
            expected[n] = expires
            params: dict[str, object] = {
                "r_task": item.task_id,
                "r_attempt": item.attempt,
                "r_lease": item.lease_id,
                "r_host": item.host_id,
                "r_now": now,
                "r_expires": expires,
            }
            if item.progress is None:
                plain.append(params)
            else:
                params.update(
                    r_step_index=item.progress.step_index,
                    r_step_status=item.progress.step_status,
                    r_summary=item.progress.summary,
                    r_max_steps=item.progress.max_steps,
                )
                with_progress.append(params)
        conn = await session.connection()
        if plain:
            await conn.execute(_RENEW, plain)
        if with_progress:
            await conn.execute(_RENEW_WITH_PROGRESS, with_progress)
        live: dict[tuple[str, int, str, str], dt.datetime] = {}
        if expected:
            found = await session.execute(
                select(
                    AttemptRow.task_id,
                    AttemptRow.attempt,
                    AttemptRow.lease_id,
                    AttemptRow.host_id,
                    AttemptRow.lease_expires_at,
                ).where(
                    AttemptRow.task_id.in_({items[n].task_id for n in expected}),
                    AttemptRow.ended_at.is_(None),
                )
            )
            live = {(t, a, lease, h): e for t, a, lease, h, e in found}
        for n, expires in expected.items():
            item = items[n]
            if live.get((item.task_id, item.attempt, item.lease_id, item.host_id)) == expires:
                out[n] = RenewalOut(expires)
                renewed_tasks.add(item.task_id)
            else:
                reason, message = await _classify(
                    session, item.host_id, item.task_id, item.attempt, item.lease_id, now
                )
                out[n] = RenewalOut(None, reason, message)
        if renewed_tasks:
            await session.execute(
                update(TaskRow)
                .where(TaskRow.task_id.in_(renewed_tasks))
                .values(
                    updated_at=now,
                    status=case(
                        (TaskRow.status == states.ASSIGNED, states.RUNNING),
                        else_=TaskRow.status,
                    ),
                )
                .execution_options(synchronize_session=False)
            )
    return [o for o in out if o is not None]


# One statement for a whole renewal batch on PostgreSQL. The batch arrives as parallel arrays
# (one bound parameter each, whatever the batch size, so the statement text never changes and
# is prepared once per connection). Each item finds its attempt through a LATERAL lookup on the
# unique (task_id, attempt) index with the full fence (lease, host, not ended, not expired; its
# task exists and has no cancel requested) and locks it FOR UPDATE, which re-checks the fence on
# the newest row version if a sweeper or result got there first. The LATERAL form makes every
# plan item-driven: a plain UPDATE ... FROM unnest(...) join was planned (generic plan, live
# attempts estimated at 1 row) as a nested loop over all live attempts rescanning the whole
# batch for each, ~60 ms per batch of 500 (pg_stat_statements, auto_explain). The UPDATE then
# writes the locked rows by primary key (`= ANY(ARRAY(...))` keeps that an index scan, not a
# hash join over the whole table) and RETURNs them: the authoritative list of accepted
# renewals, no read-back needed. `touched` updates the renewed tasks (updated_at, ASSIGNED ->
# RUNNING) by primary key after their attempts, the lock order every writer uses.
_RENEW_BATCH_PG = (
    text(
        """
WITH live AS (
    SELECT x.id, x.lease_seconds, i.has_progress, i.step_index, i.step_status, i.summary,
           i.max_steps
    FROM unnest(
        CAST(:task_ids AS varchar[]), CAST(:attempts AS integer[]),
        CAST(:lease_ids AS varchar[]), CAST(:host_ids AS varchar[]),
        CAST(:has_progress AS boolean[]), CAST(:step_indexes AS integer[]),
        CAST(:step_statuses AS integer[]), CAST(:summaries AS varchar[]),
        CAST(:max_steps AS integer[])
    ) AS i(task_id, attempt, lease_id, host_id, has_progress, step_index, step_status, summary,
           max_steps)
    CROSS JOIN LATERAL (
        SELECT attempts.id, tasks.lease_seconds
        FROM attempts JOIN tasks ON tasks.task_id = attempts.task_id
        WHERE attempts.task_id = i.task_id
          AND attempts.attempt = i.attempt
          AND attempts.lease_id = i.lease_id
          AND attempts.host_id = i.host_id
          AND attempts.ended_at IS NULL
          AND attempts.lease_expires_at > CAST(:now AS timestamptz)
          AND tasks.cancel_requested IS NOT TRUE
        FOR UPDATE OF attempts
    ) AS x
), renewed AS (
    UPDATE attempts AS a
    SET lease_expires_at = CAST(:now AS timestamptz) + make_interval(secs => l.lease_seconds),
        status = :running,
        step_index = CASE WHEN l.has_progress THEN l.step_index ELSE a.step_index END,
        step_status = CASE WHEN l.has_progress THEN l.step_status ELSE a.step_status END,
        summary = CASE WHEN l.has_progress THEN l.summary ELSE a.summary END,
        max_steps = CASE WHEN l.has_progress THEN l.max_steps ELSE a.max_steps END,
        progress_updated_at = CASE WHEN l.has_progress THEN CAST(:now AS timestamptz)
                                   ELSE a.progress_updated_at END
    FROM live AS l
    WHERE a.id = ANY(ARRAY(SELECT id FROM live)) AND a.id = l.id
    RETURNING a.task_id, a.attempt, a.lease_id, a.host_id, a.lease_expires_at
), touched AS (
    UPDATE tasks
    SET updated_at = CAST(:now AS timestamptz),
        status = CASE WHEN tasks.status = :assigned THEN :running ELSE tasks.status END
    WHERE tasks.task_id = ANY(ARRAY(SELECT task_id FROM renewed))
)
SELECT task_id, attempt, lease_id, host_id, lease_expires_at FROM renewed
"""
    )
    .bindparams(
        bindparam("now", type_=UTCDateTime()),
        bindparam("running", value=states.RUNNING, type_=String()),
        bindparam("assigned", value=states.ASSIGNED, type_=String()),
    )
    .columns(
        column("task_id", String()),
        column("attempt", Integer()),
        column("lease_id", String()),
        column("host_id", String()),
        column("lease_expires_at", UTCDateTime()),
    )
)


async def _renew_batch_pg(store: Store, items: list[RenewalIn]) -> list[RenewalOut]:
    """The batch as one round trip: `_RENEW_BATCH_PG` with the items as arrays.

    A renewal is accepted when the statement returned its (task, attempt, lease, host); every
    other one is classified (expired, revoked, superseded, cancelled, unknown...) in the same
    transaction, as on SQLite. The same lease twice in one batch is written once, with the last
    progress (as the executemany's second UPDATE would leave it), and both callers get the expiry.
    """
    now = store.now()
    last: dict[tuple[str, int, str, str], RenewalIn] = {}
    for item in items:
        last[(item.task_id, item.attempt, item.lease_id, item.host_id)] = item
    # Sorted, so concurrent batches (other replicas) lock shared rows in the same order.
    unique = [last[key] for key in sorted(last)]
    params: dict[str, object] = {
        "now": now,
        "task_ids": [i.task_id for i in unique],
        "attempts": [i.attempt for i in unique],
        "lease_ids": [i.lease_id for i in unique],
        "host_ids": [i.host_id for i in unique],
        "has_progress": [i.progress is not None for i in unique],
        "step_indexes": [None if i.progress is None else i.progress.step_index for i in unique],
        "step_statuses": [None if i.progress is None else i.progress.step_status for i in unique],
        "summaries": [None if i.progress is None else i.progress.summary for i in unique],
        "max_steps": [None if i.progress is None else i.progress.max_steps for i in unique],
    }
    async with store.write() as session:
        conn = await session.connection()
        renewed: dict[tuple[str, int, str, str], dt.datetime] = {
            (t, a, lease, h): e for t, a, lease, h, e in await conn.execute(_RENEW_BATCH_PG, params)
        }
        out: list[RenewalOut] = []
        for item in items:
            expires = renewed.get((item.task_id, item.attempt, item.lease_id, item.host_id))
            if expires is not None:
                out.append(RenewalOut(expires))
                continue
            reason, message = await _classify(
                session, item.host_id, item.task_id, item.attempt, item.lease_id, now
            )
            out.append(RenewalOut(None, reason, message))
    return out


async def _classify(
    session: AsyncSession,
    host_id: str,
    task_id: str,
    attempt: int,
    lease_id: str,
    now: dt.datetime,
) -> tuple[RevokeReason, str]:
    """Why (task, attempt, lease) is not the caller's live lease."""
    task = await session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
    if task is None:
        return lease_pb.REVOKE_REASON_UNKNOWN, "unknown task"
    row = await session.scalar(
        select(AttemptRow).where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
    )
    if row is None or row.lease_id != lease_id:
        if task.attempt > attempt:
            return lease_pb.REVOKE_REASON_SUPERSEDED, f"attempt {task.attempt} holds the task"
        return lease_pb.REVOKE_REASON_UNKNOWN, "unknown lease"
    if row.host_id != host_id:
        # Nothing about the other host's lease is revealed beyond "not yours".
        return lease_pb.REVOKE_REASON_PERMISSION_DENIED, "permission denied: not this host's lease"
    if task.cancel_requested or row.status == states.CANCELLED:
        return lease_pb.REVOKE_REASON_CANCELLED, task.cancel_reason or "cancelled"
    if row.ended_at is None:
        if row.lease_expires_at <= now:
            return lease_pb.REVOKE_REASON_EXPIRED, states.LEASE_EXPIRED
        return lease_pb.REVOKE_REASON_UNKNOWN, "lease not live"
    if task.attempt > attempt:
        return lease_pb.REVOKE_REASON_SUPERSEDED, f"attempt {task.attempt} holds the task"
    if row.failure_reason == states.LEASE_EXPIRED:
        return lease_pb.REVOKE_REASON_EXPIRED, states.LEASE_EXPIRED
    if row.failure_reason == states.DEADLINE_EXCEEDED:
        return lease_pb.REVOKE_REASON_DEADLINE_EXCEEDED, states.DEADLINE_EXCEEDED
    return lease_pb.REVOKE_REASON_FINISHED, f"attempt ended {row.status}"


@dataclass(frozen=True, slots=True)
class ResultOut:
    """Outcome of a result: recorded, a duplicate of a recorded one, or refused with a reason."""

    recorded: bool
    duplicate: bool
    task_status: str = ""
    device_serial: str = ""
    revoke_reason: RevokeReason = lease_pb.REVOKE_REASON_UNSPECIFIED
    message: str = ""


async def record_result(
    store: Store,
    host_id: str,
    task_id: str,
    attempt: int,
    lease_id: str,
    status: str,
    summary: str,
    final_progress: ProgressIn | None,
) -> ResultOut:
    """End an attempt with the host's result; idempotent for an identical retry."""
    now = store.now()
    async with store.write() as session:
        values: dict[str, object] = {
            "status": status,
            "result_status": status,
            "result_summary": summary,
            "ended_at": now,
        }
        if status != states.SUCCEEDED:
            values["failure_reason"] = summary or status.lower()
        if status == states.CANCELLED:
            # An operator's cancel: the record keeps the operator's reason, not the host's words.
            said = summary or "cancelled"
            values["failure_reason"] = func.coalesce(_cancel_reason(task_id), said)
        if final_progress is not None:
            values.update(
                step_index=final_progress.step_index,
                step_status=final_progress.step_status,
                summary=final_progress.summary,
                max_steps=final_progress.max_steps,
                progress_updated_at=now,
            )
        row = (
            await session.execute(
                update(AttemptRow)
                .where(*_live_fence(host_id, task_id, attempt, lease_id, now))
                .values(**values)
                .returning(AttemptRow.device_serial)
            )
        ).first()
        if row is not None:
            task = (
                await session.execute(
                    update(TaskRow)
                    .where(
                        TaskRow.task_id == task_id,
                        TaskRow.attempt == attempt,
                        TaskRow.status.in_(states.LIVE),
                    )
                    .values(
                        status=status,
                        result_summary=func.coalesce(_cancel_reason(task_id), summary)
                        if status == states.CANCELLED
                        else summary,
                        finished_at=now,
                        updated_at=now,
                    )
                    .returning(TaskRow.status)
                )
            ).first()
            return ResultOut(True, False, task[0] if task else status, row[0])
        existing = await session.scalar(
            select(AttemptRow).where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
        )
        if (
            existing is not None
            and existing.host_id == host_id
            and existing.lease_id == lease_id
            and existing.result_status == status
        ):
            task_status = await session.scalar(
                select(TaskRow.status).where(TaskRow.task_id == task_id)
            )
            return ResultOut(False, True, task_status or status, existing.device_serial)
        reason, message = await _classify(session, host_id, task_id, attempt, lease_id, now)
        return ResultOut(False, False, revoke_reason=reason, message=message)


@dataclass(frozen=True, slots=True)
class Ended:
    """An attempt the sweeper ended, and what became of its task."""

    task_id: str
    attempt: int
    host_id: str
    lease_id: str
    device_serial: str
    task_status: str
    reason: RevokeReason


async def sweep_expired(store: Store, limit: int = 500) -> list[Ended]:
    """End attempts whose lease ran out and requeue (or fail, or cancel) their tasks.

    Safe on every replica at once: rows are picked with SKIP LOCKED and ended by a conditional
    UPDATE, so each expired attempt is handled by exactly one sweeper.
    """
    now = store.now()
    ended: list[Ended] = []
    async with store.write() as session:
        ids = (
            await session.scalars(
                select(AttemptRow.id)
                .where(AttemptRow.ended_at.is_(None), AttemptRow.lease_expires_at <= now)
                .order_by(AttemptRow.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        ).all()
        if not ids:
            return []
        rows = (
            await session.execute(
                update(AttemptRow)
                .where(
                    AttemptRow.id.in_(ids),
                    AttemptRow.ended_at.is_(None),
                    AttemptRow.lease_expires_at <= now,
                )
                .values(status=states.FAILED, failure_reason=states.LEASE_EXPIRED, ended_at=now)
                .returning(
                    AttemptRow.task_id,
                    AttemptRow.attempt,
                    AttemptRow.host_id,
                    AttemptRow.lease_id,
                    AttemptRow.device_serial,
                )
            )
        ).all()
        for task_id, attempt, host_id, lease_id, serial in sorted(rows):
            task = await session.scalar(
                select(TaskRow).where(TaskRow.task_id == task_id).with_for_update()
            )
            if task is None or task.attempt != attempt or task.status not in states.LIVE:
                continue
            reason = lease_pb.REVOKE_REASON_EXPIRED
            if task.cancel_requested:
                task.status = states.CANCELLED
                task.result_summary = task.cancel_reason or "cancelled"
                task.finished_at = now
                reason = lease_pb.REVOKE_REASON_CANCELLED
                await session.execute(
                    update(AttemptRow)
                    .where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
                    .values(status=states.CANCELLED, failure_reason=task.result_summary)
                )
            elif task.attempt >= task.max_attempts:
                task.status = states.FAILED
                task.result_summary = states.LEASE_EXPIRED
                task.finished_at = now
            else:
                task.status = states.QUEUED
            task.updated_at = now
            ended.append(Ended(task_id, attempt, host_id, lease_id, serial, task.status, reason))
    return ended


async def sweep_deadlines(store: Store, limit: int = 500) -> list[Ended]:
    """Fail tasks whose absolute deadline passed, ending their live attempt if any.

    Attempts are locked before tasks, the same order renewals and results use, so a sweep never
    deadlocks with a renewal of the same task on PostgreSQL. Both updates are conditional, so
    sweepers on several replicas at once end each task once.
    """
    now = store.now()
    async with store.write() as session:
        due = list(
            (
                await session.scalars(
                    select(TaskRow.task_id)
                    .where(TaskRow.status.in_(states.ACTIVE), TaskRow.deadline <= now)
                    .order_by(TaskRow.task_id)
                    .limit(limit)
                )
            ).all()
        )
        if not due:
            return []
        live = {
            task_id: (attempt, host_id, lease_id, serial)
            for task_id, attempt, host_id, lease_id, serial in (
                await session.execute(
                    update(AttemptRow)
                    .where(AttemptRow.task_id.in_(due), AttemptRow.ended_at.is_(None))
                    .values(
                        status=states.FAILED,
                        failure_reason=states.DEADLINE_EXCEEDED,
                        ended_at=now,
                    )
                    .returning(
                        AttemptRow.task_id,
                        AttemptRow.attempt,
                        AttemptRow.host_id,
                        AttemptRow.lease_id,
                        AttemptRow.device_serial,
                    )
                    .execution_options(synchronize_session=False)
                )
            ).all()
        }
        failed = (
            await session.execute(
                update(TaskRow)
                .where(
                    TaskRow.task_id.in_(due),
                    TaskRow.status.in_(states.ACTIVE),
                    TaskRow.deadline <= now,
                )
                .values(
                    status=states.FAILED,
                    result_summary=states.DEADLINE_EXCEEDED,
                    finished_at=now,
                    updated_at=now,
                )
                .returning(TaskRow.task_id, TaskRow.attempt)
                .execution_options(synchronize_session=False)
            )
        ).all()
    ended: list[Ended] = []
    for task_id, task_attempt in failed:
        attempt, host_id, lease_id, serial = live.get(task_id, (task_attempt, "", "", ""))
        ended.append(
            Ended(
                task_id,
                attempt,
                host_id,
                lease_id,
                serial,
                states.FAILED,
                lease_pb.REVOKE_REASON_DEADLINE_EXCEEDED,
            )
        )
    return ended


@dataclass(frozen=True, slots=True)
class HeldCheck:
    """A held assignment after a reconnect: resumed (with its lease) or revoked (with a reason)."""

    held: lease_pb.HeldAssignment
    live: AttemptRow | None
    task: TaskRow | None
    revoke_reason: RevokeReason = lease_pb.REVOKE_REASON_UNSPECIFIED
    message: str = ""


async def check_held(
    store: Store, host_id: str, held: list[lease_pb.HeldAssignment]
) -> list[HeldCheck]:
    """Which re-announced assignments are still this host's live leases."""
    now = store.now()
    out: list[HeldCheck] = []
    async with store.read() as session:
        for h in held:
            row = await session.scalar(
                select(AttemptRow).where(
                    *_live_fence(host_id, h.task_id, h.attempt, h.lease_id, now)
                )
            )
            task = await session.scalar(select(TaskRow).where(TaskRow.task_id == h.task_id))
            if row is not None and task is not None and not task.cancel_requested:
                out.append(HeldCheck(h, row, task))
            else:
                reason, message = await _classify(
                    session, host_id, h.task_id, h.attempt, h.lease_id, now
                )
                out.append(HeldCheck(h, None, task, reason, message))
    return out


async def live_attempts_on(store: Store, host_id: str, serials: set[str]) -> list[Claimed]:
    """Live leases of `host_id` on these phones, as assignments (to re-send after a claim whose
    commit outcome was unknown: the row may exist although the claim raised)."""
    if not serials:
        return []
    async with store.read() as session:
        rows = (
            await session.execute(
                select(AttemptRow, TaskRow.goal, TaskRow.lease_seconds, TaskRow.deadline)
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
        for row, goal, lease_seconds, deadline in rows:
            previous = await _previous_progress(session, row.task_id) if row.attempt > 1 else None
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
                )
            )
        return out


async def live_serials(store: Store, host_id: str) -> set[str]:
    """Phones of `host_id` that have a live (not ended) attempt."""
    async with store.read() as session:
        rows = await session.scalars(
            select(AttemptRow.device_serial).where(
                AttemptRow.host_id == host_id, AttemptRow.ended_at.is_(None)
            )
        )
        return set(rows.all())


async def is_live(store: Store, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
    """Whether (task, attempt, lease) is `host_id`'s live lease right now."""
    now = store.now()
    async with store.read() as session:
        found = await session.scalar(
            select(AttemptRow.id).where(*_live_fence(host_id, task_id, attempt, lease_id, now))
        )
        return found is not None


async def lease_owner(store: Store, task_id: str, attempt: int, lease_id: str) -> str | None:
    """The host holding (or that held) this exact lease, None when there is no such lease."""
    async with store.read() as session:
        owner = await session.scalar(
            select(AttemptRow.host_id).where(
                AttemptRow.task_id == task_id,
                AttemptRow.attempt == attempt,
                AttemptRow.lease_id == lease_id,
            )
        )
        return None if owner is None else str(owner)


async def queued_by_target_host(store: Store) -> dict[str | None, int]:
    """Queued tasks counted by target host (None: any host). Lets a dispatch pass skip hosts."""
    async with store.read() as session:
        rows = await session.execute(
            select(TaskRow.target_host_id, func.count())
            .where(TaskRow.status == states.QUEUED)
            .group_by(TaskRow.target_host_id)
        )
        return {target: int(count) for target, count in rows}

"""Results: the host's outcome ends its attempt, fenced and idempotent for an identical retry.

A result that arrives after its lease ran out is still the truth about work the phone did: when
no other attempt has started yet (the task is queued again, or failed for that very expiry on
its last attempt), it is accepted and recorded as late, so finished work is not run again for a
lease that merely lapsed while the cloud or the network was away. Once another attempt has
started, the fence holds: the older attempt's result is refused (SUPERSEDED).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import ScalarSelect, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store import flows, states
from cloud.store.database import Store
from cloud.store.lease_events import EventKind, new
from cloud.store.leases.fence import Revocation, classify, live_fence
from cloud.store.leases.progress import ProgressIn
from cloud.store.leases.sweeps import used_attempts
from cloud.store.lock_waits import bound_lock_waits
from cloud.store.models import AttemptRow, TaskRow

#: Refusals of a task that cost it no attempt (TaskResult.refusal). A host that refuses the same
#: task again and again (it thinks a phone busy that the cloud's reads find idle) had it offered
#: after every busy resync until its deadline, each refusal free; past these, a refusal counts
#: like any retryable end, so the task's `max_attempts` bound it. The count is the task's
#: `unsent_attempts`, shared with assignments that were never sent: either way nothing ran.
FREE_REFUSALS = 3


@dataclass(frozen=True, slots=True)
class ResultOut:
    """Outcome of a result: recorded, a duplicate of a recorded one, or refused with a reason."""

    recorded: bool
    duplicate: bool
    #: The task's status after the result (or when it was refused: "" if not the caller's to know).
    task_status: str = ""
    device_serial: str = ""
    revocation: Revocation | None = None
    message: str = ""
    #: The lease had run out when the result arrived; it was accepted all the same.
    late: bool = False


@dataclass(frozen=True, slots=True)
class ReplayIn:
    """How a direct-transport host says its replay of a learned flow went (TaskResult.replay)."""

    flow_id: str
    steps_replayed: int
    diverged_at: int
    reason: str
    #: The replay ran to its end (None: a host from before `FlowReplayReport.completed`, whose
    #: learning loop infers it from the steps replayed and the lack of a divergence).
    completed: bool | None = None


def _cancel_reason(task_id: str) -> ScalarSelect[str | None]:
    """The operator's cancel reason of a task with a cancel requested (NULL otherwise)."""
    return (
        select(TaskRow.cancel_reason)
        .where(TaskRow.task_id == task_id, TaskRow.cancel_requested.is_(True))
        .scalar_subquery()
    )


async def record_result(
    store: Store,
    host_id: str,
    task_id: str,
    attempt: int,
    lease_id: str,
    status: str,
    summary: str,
    final_progress: ProgressIn | None,
    *,
    retryable: bool = False,
    refused: bool = False,
    replay: ReplayIn | None = None,
    lock_wait_ms: int | None = None,
) -> ResultOut:
    """End an attempt with the host's result; idempotent for an identical retry.

    A `retryable` FAILED result ended the attempt for a reason outside the task (planning stayed
    impossible until the deadline came near): like an expired lease, the task is queued for its
    next attempt if it has any left (cancelled if a cancel is pending, failed if none are left).
    A `refused` FAILED result is the host declining the assignment before touching the phone:
    requeued the same way, but nothing ran, so the attempt is not counted against the task's
    `max_attempts` (a task allowed one attempt failed for a phone that was merely busy), up to
    `FREE_REFUSALS`.

    `lock_wait_ms` (PostgreSQL): wait that long at most for the attempt's or the task's row
    another transaction holds, then raise the database's lock timeout (`lock_timed_out`) with
    nothing written (the host sends the result again).
    """
    now = store.now()
    async with store.write() as session:
        if lock_wait_ms is not None:
            await bound_lock_waits(session, store.is_postgres, lock_wait_ms)
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
        if replay is not None:  # in the same write: the learning loop reads it with the end
            values.update(replay_steps=replay.steps_replayed)
            if replay.completed is not None:
                values["replay_completed"] = replay.completed
            if replay.flow_id:
                values["flow_id"] = replay.flow_id
            if replay.diverged_at:
                values.update(
                    replay_diverged_step=replay.diverged_at, replay_divergence=replay.reason
                )
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
                .where(*live_fence(host_id, task_id, attempt, lease_id, now))
                .values(**values)
                .returning(AttemptRow.device_serial)
            )
        ).first()
        if row is not None and (retryable or refused) and status == states.FAILED:
            after, free = await _requeue(session, task_id, attempt, summary, now, refused=refused)
            _result_events(
                session, host_id, task_id, attempt, row[0], status, summary, after, now, free
            )
            return ResultOut(True, False, after, row[0])
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
                    .returning(TaskRow.status, TaskRow.cancel_requested)
                )
            ).first()
            after = task[0] if task else status
            said = summary
            if task is not None and task[1] and status == states.SUCCEEDED:
                said = f"{CANCEL_TOO_LATE}: {summary}" if summary else CANCEL_TOO_LATE
            _result_events(session, host_id, task_id, attempt, row[0], status, said, after, now)
            return ResultOut(True, False, after, row[0])
        if status in _LATE_STATUSES and not (retryable or refused):
            late = await _accept_late(
                session, host_id, task_id, attempt, lease_id, status, summary, values, now
            )
            if late is not None:
                return late
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
            return ResultOut(
                False,
                True,
                task_status or status,
                existing.device_serial,
                late=existing.late_result,
            )
        why = await classify(session, host_id, task_id, attempt, lease_id, now)
        return ResultOut(
            False, False, why.task_status, revocation=why.revocation, message=why.message
        )


#: Outcomes a late result may carry: the task's own end. (A cancel is the operator's, decided
#: when the lease was revoked; a retryable failure already left the task to its next attempt.)
_LATE_STATUSES = (states.SUCCEEDED, states.FAILED)


async def _accept_late(
    session: AsyncSession,
    host_id: str,
    task_id: str,
    attempt: int,
    lease_id: str,
    status: str,
    summary: str,
    values: dict[str, object],
    now: dt.datetime,
) -> ResultOut | None:
    """Record a result whose lease ran out, if no other attempt has started; None otherwise.
    An attempt the learning loop already looked at is handed back to it: the result may be a
    success to learn from and carry a replay report to count.

    The attempt row is locked before the task row (the order the sweeper and the fenced path
    use, so no deadlock with a concurrent sweep on PostgreSQL), and both are checked under their
    locks: a claim of the next attempt either committed first (the task's attempt moved on:
    refused) or waits and then finds the task finished.
    """
    row = await session.scalar(
        select(AttemptRow)
        .where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
        .with_for_update()
    )
    if (
        row is None
        or row.host_id != host_id
        or row.lease_id != lease_id
        or row.result_status is not None
    ):
        return None
    lapsed = (row.ended_at is None and row.lease_expires_at <= now) or (
        row.ended_at is not None
        and row.status == states.FAILED
        and row.failure_reason == states.LEASE_EXPIRED
    )
    if not lapsed:
        return None
    task = await session.scalar(select(TaskRow).where(TaskRow.task_id == task_id).with_for_update())
    if (
        task is None
        or task.attempt != attempt
        or task.cancel_requested
        or task.deadline <= now
        or not (
            task.status in states.ACTIVE
            or (task.status == states.FAILED and task.result_summary == states.LEASE_EXPIRED)
        )
    ):
        return None
    flows.hand_back(row)
    for name, value in values.items():
        setattr(row, name, value)
    if status == states.SUCCEEDED:
        row.failure_reason = None
    row.late_result = True
    task.status = status
    task.result_summary = summary
    task.finished_at = now
    task.updated_at = now
    _result_events(
        session, host_id, task_id, attempt, row.device_serial, status, summary, status, now
    )
    return ResultOut(True, False, status, row.device_serial, late=True)


#: The RESULT event's reason starts so when a SUCCEEDED result ended a task an operator had
#: asked to cancel: the result, live, wins (the work was done), and the task's history shows
#: the cancel was asked (its CANCEL_REQUESTED event) and why it did not end the task.
CANCEL_TOO_LATE = "a cancel was asked, too late: the attempt had succeeded"


def _result_events(
    session: AsyncSession,
    host_id: str,
    task_id: str,
    attempt: int,
    serial: str,
    status: str,
    summary: str,
    task_status: str,
    now: dt.datetime,
    free: bool = False,
) -> None:
    """The lease history of a recorded result: the result, and the requeue it caused (`free`:
    a refusal that cost no attempt)."""
    session.add(
        new(
            EventKind.RESULT,
            task_id,
            attempt,
            now,
            host_id=host_id,
            device_serial=serial,
            reason=summary,
            result_status=status,
            task_status=task_status,
        )
    )
    if task_status == states.QUEUED:
        session.add(
            new(
                EventKind.REQUEUED,
                task_id,
                attempt,
                now,
                reason=f"attempt {attempt} was refused by its host; not counted"
                if free
                else f"attempt {attempt} ended for a reason outside the task",
                task_status=task_status,
            )
        )


async def _requeue(
    session: AsyncSession,
    task_id: str,
    attempt: int,
    summary: str,
    now: dt.datetime,
    *,
    refused: bool = False,
) -> tuple[str, bool]:
    """The task after a retryable end of its attempt `attempt`: its next attempt queued, or
    cancelled (a cancel is pending) or failed (no attempts left); and whether the attempt went
    uncounted. A `refused` attempt never ran: like an assignment that never left the cloud, it
    is not one of the task's, while the task has had fewer than `FREE_REFUSALS` of those."""
    task = await session.scalar(
        select(TaskRow)
        .where(
            TaskRow.task_id == task_id,
            TaskRow.attempt == attempt,
            TaskRow.status.in_(states.LIVE),
        )
        .with_for_update()
    )
    if task is None:
        return states.FAILED, False
    free = refused and task.unsent_attempts < FREE_REFUSALS
    if free:
        task.unsent_attempts += 1
    if task.cancel_requested:
        task.status = states.CANCELLED
        task.result_summary = task.cancel_reason or "cancelled"
        task.finished_at = now
    elif used_attempts(task) >= task.max_attempts:
        task.status = states.FAILED
        task.result_summary = summary
        task.finished_at = now
    else:
        task.status = states.QUEUED
    task.updated_at = now
    return task.status, free

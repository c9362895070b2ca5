"""Results: the host's outcome ends its attempt, fenced and idempotent for an identical retry."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import ScalarSelect, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store import states
from cloud.store.database import Store
from cloud.store.lease_events import EventKind, new
from cloud.store.leases.fence import Revocation, classify, live_fence
from cloud.store.leases.progress import ProgressIn
from cloud.store.models import AttemptRow, TaskRow


@dataclass(frozen=True, slots=True)
class ResultOut:
    """Outcome of a result: recorded, a duplicate of a recorded one, or refused with a reason."""

    recorded: bool
    duplicate: bool
    task_status: str = ""
    device_serial: str = ""
    revocation: Revocation | None = None
    message: str = ""


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
) -> ResultOut:
    """End an attempt with the host's result; idempotent for an identical retry.

    A `retryable` FAILED result ended the attempt for a reason outside the task (planning stayed
    impossible until the deadline came near): like an expired lease, the task is queued for its
    next attempt if it has any left (cancelled if a cancel is pending, failed if none are left).
    """
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
                .where(*live_fence(host_id, task_id, attempt, lease_id, now))
                .values(**values)
                .returning(AttemptRow.device_serial)
            )
        ).first()
        if row is not None and retryable and status == states.FAILED:
            after = await _requeue(session, task_id, attempt, summary, now)
            _result_events(session, host_id, task_id, attempt, row[0], status, summary, after, now)
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
                    .returning(TaskRow.status)
                )
            ).first()
            after = task[0] if task else status
            _result_events(session, host_id, task_id, attempt, row[0], status, summary, after, now)
            return ResultOut(True, False, after, row[0])
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
        revocation, message = await classify(session, host_id, task_id, attempt, lease_id, now)
        return ResultOut(False, False, revocation=revocation, message=message)


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
) -> None:
    """The lease history of a recorded result: the result, and the requeue it caused."""
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
                reason=f"attempt {attempt} ended for a reason outside the task",
                task_status=task_status,
            )
        )


async def _requeue(
    session: AsyncSession, task_id: str, attempt: int, summary: str, now: dt.datetime
) -> str:
    """The task after a retryable end of its attempt `attempt`: its next attempt queued, or
    cancelled (a cancel is pending) or failed (no attempts left)."""
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
        return states.FAILED
    if task.cancel_requested:
        task.status = states.CANCELLED
        task.result_summary = task.cancel_reason or "cancelled"
        task.finished_at = now
    elif task.attempt >= task.max_attempts:
        task.status = states.FAILED
        task.result_summary = summary
        task.finished_at = now
    else:
        task.status = states.QUEUED
    task.updated_at = now
    return task.status

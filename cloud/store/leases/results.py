"""Results: the host's outcome ends its attempt, fenced and idempotent for an identical retry."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update

from cloud.store import states
from cloud.store.database import Store
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
        if final_progress is not None:
            values.update(
                step_index=final_progress.step_index,
                step_status=final_progress.step_status,
                summary=final_progress.summary,
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
                        result_summary=summary,
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
        revocation, message = await classify(session, host_id, task_id, attempt, lease_id, now)
        return ResultOut(False, False, revocation=revocation, message=message)

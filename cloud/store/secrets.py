"""Tasks' secret parameters at rest: sealed tokens in, sealed tokens out, gone when the task ends.

The store never sees a plain value: `cloud/secret_box.py` seals before `tasks.submit` and opens
after `leases.claim`. Rows live from submission until the task ends; the sweeper deletes the
rows of ended tasks on every pass (`forget_ended`), and they go with their task in any case
(ON DELETE CASCADE).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from sqlalchemy import Select, bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store import states
from cloud.store.database import Store
from cloud.store.models import TaskRow, TaskSecretRow


def add(session: AsyncSession, task_id: str, sealed: Mapping[str, str], now: dt.datetime) -> None:
    """Keep a new task's sealed secrets (in the transaction that creates the task)."""
    session.add_all(
        TaskSecretRow(task_id=task_id, name=name, value=token, created_at=now)
        for name, token in sealed.items()
    )


#: A task's secrets as stored, (name, sealed token) rows of the task bound as `task_id`: built
#: once, so every claim reuses its compiled form and cache key.
SEALED: Select[str, str] = select(TaskSecretRow.name, TaskSecretRow.value).where(
    TaskSecretRow.task_id == bindparam("task_id")
)


async def sealed_for(session: AsyncSession, task_id: str) -> dict[str, str]:
    """A task's secrets as stored (name → sealed token)."""
    rows = await session.execute(SEALED, {"task_id": task_id})
    return {name: token for name, token in rows.all()}


async def forget_ended(store: Store) -> int:
    """Delete the secrets of every task that has ended; how many rows went.

    A read first, so a pass that finds nothing takes no write transaction (on SQLite that is the
    writer slot every renewal batch needs)."""
    ended = select(TaskRow.task_id).where(TaskRow.status.in_(states.TERMINAL))
    async with store.read() as session:
        found = await session.scalar(
            select(TaskSecretRow.task_id).where(TaskSecretRow.task_id.in_(ended)).limit(1)
        )
    if found is None:
        return 0
    async with store.write() as session:
        result = await session.execute(
            delete(TaskSecretRow)
            .where(TaskSecretRow.task_id.in_(ended))
            .execution_options(synchronize_session=False)
        )
        return int(result.rowcount)  # type: ignore[attr-defined]

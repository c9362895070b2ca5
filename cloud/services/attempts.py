"""Checking that a read names a task and attempt the cloud knows, before it answers a page."""

from __future__ import annotations

from typing import Any

import grpc

from cloud.lease.validate import MAX_ID
from cloud.services.status import abort
from cloud.store import tasks
from cloud.store.database import Store


async def known_attempt(
    context: grpc.aio.ServicerContext[Any, Any], store: Store, task_id: str, attempt: int
) -> None:
    """Abort NOT_FOUND unless the task exists and, for `attempt` 1 or more, had that attempt:
    an empty answer for an attempt it never had read as a record (compact mode, the direct
    transport, pruned, no events, no screenshots). The task's reads all say it in these words."""
    had = await tasks.attempts_had(store, task_id[:MAX_ID])
    if had is None:
        await abort(context, grpc.StatusCode.NOT_FOUND, f"task {task_id} not found")
    if attempt > had:
        await abort(
            context,
            grpc.StatusCode.NOT_FOUND,
            f"task {task_id} has no attempt {attempt} (it has {had or 'none yet'})",
        )

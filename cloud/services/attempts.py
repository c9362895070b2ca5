"""Checking that a read names a task and attempt the cloud knows, before it answers a page."""

from __future__ import annotations

from typing import Any, Protocol

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


class StepPageRequest(Protocol):
    """The fields of a request for a page of one task's steps (ListDecisions,
    ListStepScreenshots)."""

    task_id: str
    attempt: int
    page_size: int
    after_step: int


async def known_step_page(
    context: grpc.aio.ServicerContext[Any, Any],
    store: Store,
    request: StepPageRequest,
    max_page_size: int,
) -> None:
    """Abort INVALID_ARGUMENT for fields out of range, else NOT_FOUND as `known_attempt` does:
    a live view reads a task's decisions and its screenshots after the same step, and both
    listings must refuse the same request in the same words."""
    if not request.task_id:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "task_id: required")
    if request.attempt < 0:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "attempt: must be >= 0")
    if not 0 <= request.page_size <= max_page_size:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"page_size: 0 to {max_page_size}")
    if request.after_step < 0 or (request.after_step and not request.attempt):
        await abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            "after_step: 0, or a step index with attempt set",
        )
    await known_attempt(context, store, request.task_id, request.attempt)

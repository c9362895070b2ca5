"""The fence: which (task, attempt, lease id, host) is a live lease, and why one is not.

Every state change that a host may attempt with a stale lease is a single conditional UPDATE
whose WHERE clause is the fence (`task AND attempt AND lease_id AND host AND not ended AND
expires_at > now`): a stale host matches no row and changes nothing, whatever replica it talks
to. When nothing matched, `classify` says why, in the store's own words (`Revocation`); the
lease service turns that into the protocol's RevokeReason.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import ColumnElement, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from cloud.store import states
from cloud.store.models import AttemptRow, TaskRow


class Revocation(enum.Enum):
    """Why an attempt's lease is not (or no longer) the caller's live lease."""

    #: No such task, no such lease, or a lease that is not live for another reason.
    UNKNOWN = "unknown"
    #: A later attempt holds the task.
    SUPERSEDED = "superseded"
    #: The lease is another host's (nothing more about it is revealed).
    NOT_YOURS = "not yours"
    #: The task's cancel was requested, or the attempt was cancelled.
    CANCELLED = "cancelled"
    #: The lease ran out before it was renewed.
    EXPIRED = "expired"
    #: The task's absolute deadline passed.
    DEADLINE_EXCEEDED = "deadline exceeded"
    #: The attempt already ended with a result.
    FINISHED = "finished"
    #: The attempt was released without a result: the host's process that held it was
    #: replaced (restarted, or superseded by another process with its certificate) or its
    #: certificate was revoked.
    RELEASED = "released"


class Refusal(NamedTuple):
    """Why a lease is not the caller's live lease: the reason, a message for the host, and the
    task's status then ("" when the caller may not know it: an unknown task or lease, or
    another host's)."""

    revocation: Revocation
    message: str
    task_status: str = ""


def live_fence(
    host_id: str, task_id: str, attempt: int, lease_id: str, now: dt.datetime
) -> list[ColumnElement[bool]]:
    """The WHERE clause of "this is `host_id`'s live lease right now"."""
    return [
        AttemptRow.task_id == task_id,
        AttemptRow.attempt == attempt,
        AttemptRow.lease_id == lease_id,
        AttemptRow.host_id == host_id,
        AttemptRow.ended_at.is_(None),
        AttemptRow.lease_expires_at > now,
    ]


def live_fences(
    leases: Sequence[tuple[str, int, str, str]], now: dt.datetime
) -> list[ColumnElement[bool]]:
    """`live_fence` for several leases in one WHERE clause: each of `leases` is (task id,
    attempt, lease id, host id); a row matches when it is one of them and live right now."""
    return [
        tuple_(AttemptRow.task_id, AttemptRow.attempt, AttemptRow.lease_id, AttemptRow.host_id).in_(
            leases
        ),
        AttemptRow.ended_at.is_(None),
        AttemptRow.lease_expires_at > now,
    ]


async def classify(
    session: AsyncSession,
    host_id: str,
    task_id: str,
    attempt: int,
    lease_id: str,
    now: dt.datetime,
) -> Refusal:
    """`classify_sync` in an async session."""
    return await session.run_sync(
        lambda sync: classify_sync(sync, host_id, task_id, attempt, lease_id, now)
    )


def classify_sync(
    session: Session,
    host_id: str,
    task_id: str,
    attempt: int,
    lease_id: str,
    now: dt.datetime,
) -> Refusal:
    """Why (task, attempt, lease) is not the caller's live lease, with a message for the host
    (in a synchronous session: the renewal batch's loop-thread write on SQLite)."""
    task = session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
    if task is None:
        return Refusal(Revocation.UNKNOWN, "unknown task")
    row = session.scalar(
        select(AttemptRow).where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
    )
    if row is None or row.lease_id != lease_id:
        if task.attempt > attempt:
            return Refusal(
                Revocation.SUPERSEDED, f"attempt {task.attempt} holds the task", task.status
            )
        return Refusal(Revocation.UNKNOWN, "unknown lease")
    if row.host_id != host_id:
        # Nothing about the other host's lease is revealed beyond "not yours".
        return Refusal(Revocation.NOT_YOURS, "permission denied: not this host's lease")
    if task.cancel_requested or row.status == states.CANCELLED:
        return Refusal(Revocation.CANCELLED, task.cancel_reason or "cancelled", task.status)
    if row.ended_at is None:
        if row.lease_expires_at <= now:
            return Refusal(Revocation.EXPIRED, states.LEASE_EXPIRED, task.status)
        return Refusal(Revocation.UNKNOWN, "lease not live")
    if task.attempt > attempt:
        return Refusal(Revocation.SUPERSEDED, f"attempt {task.attempt} holds the task", task.status)
    if row.failure_reason == states.LEASE_EXPIRED:
        return Refusal(Revocation.EXPIRED, states.LEASE_EXPIRED, task.status)
    if row.failure_reason == states.DEADLINE_EXCEEDED:
        return Refusal(Revocation.DEADLINE_EXCEEDED, states.DEADLINE_EXCEEDED, task.status)
    if row.failure_reason in states.RELEASED:
        return Refusal(Revocation.RELEASED, row.failure_reason, task.status)
    return Refusal(Revocation.FINISHED, f"attempt ended {row.status}", task.status)

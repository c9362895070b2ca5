"""Read-only lease questions: what a reconnecting host still holds, which phones are busy,
whether a lease is live and whose it is, where queued work is waiting."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select

from cloud.store.database import Store
from cloud.store.idlists import among
from cloud.store.leases.fence import Revocation, live_fence
from cloud.store.models import AttemptRow, TaskRow


@dataclass(frozen=True, slots=True)
class HeldLease:
    """An assignment a host says it still runs (re-announced after a reconnect)."""

    task_id: str
    attempt: int
    lease_id: str


@dataclass(frozen=True, slots=True)
class HeldCheck:
    """A held assignment after a reconnect: resumed (its live attempt, its task and the latest
    progress to resume from) or revoked (why, and a message for the host)."""

    held: HeldLease
    live: AttemptRow | None
    task: TaskRow | None
    revocation: Revocation | None = None
    message: str = ""
    last_progress: AttemptRow | None = None
    #: A revoked one's task status ("" when not the host's to know: `fence.Refusal`).
    task_status: str = ""


async def live_serials_by_host(store: Store, host_ids: Sequence[str]) -> dict[str, set[str]]:
    """`live_serials` of many hosts in one query (every host listed, possibly with none)."""
    busy: dict[str, set[str]] = {h: set() for h in host_ids}
    if not busy:
        return busy
    async with store.read() as session:
        rows = await session.execute(
            select(AttemptRow.host_id, AttemptRow.device_serial).where(
                among(store, AttemptRow.host_id, busy), AttemptRow.ended_at.is_(None)
            )
        )
        for host_id, serial in rows:
            busy[host_id].add(serial)
    return busy


@dataclass(frozen=True, slots=True)
class BusyPhone:
    """A phone with a live attempt: what the fleet shows as busy, with its task."""

    device_serial: str
    task_id: str
    attempt: int
    goal: str


async def busy_phones(store: Store, host_ids: Sequence[str] | None) -> dict[str, list[BusyPhone]]:
    """The phones with a live attempt, by host (of `host_ids`, or of every host when None),
    in serial order, in one query."""
    stmt = (
        select(AttemptRow.host_id, AttemptRow.device_serial, AttemptRow.task_id,
               AttemptRow.attempt, TaskRow.goal)
        .join(TaskRow, TaskRow.task_id == AttemptRow.task_id)
        .where(AttemptRow.ended_at.is_(None))
        .order_by(AttemptRow.host_id, AttemptRow.device_serial)
    )  # fmt: skip
    if host_ids is not None:
        if not host_ids:
            return {}
        stmt = stmt.where(AttemptRow.host_id.in_(host_ids))
    busy: dict[str, list[BusyPhone]] = {}
    async with store.read() as session:
        for host_id, serial, task_id, attempt, goal in await session.execute(stmt):
            busy.setdefault(host_id, []).append(BusyPhone(serial, task_id, attempt, goal))
    return busy


async def is_live(store: Store, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
    """Whether (task, attempt, lease) is `host_id`'s live lease right now, of a task no operator
    asked to cancel: such a lease stays until its host acknowledges the revoke or it runs out,
    but it is not renewed (`fence.classify_sync`: CANCELLED), and nothing more is planned on
    it for a host that has not heard the revoke yet."""
    now = store.now()
    async with store.read() as session:
        found = await session.scalar(
            select(AttemptRow.id)
            .join(TaskRow, TaskRow.task_id == AttemptRow.task_id)
            .where(
                *live_fence(host_id, task_id, attempt, lease_id, now),
                TaskRow.cancel_requested.is_not(True),
            )
        )
        return found is not None


async def lease_owner(
    store: Store, task_id: str, attempt: int, lease_id: str
) -> tuple[str, int] | None:
    """The host holding (or that held) this exact lease and how its attempt is planned
    (AttemptRow.planner_transport), None when there is no such lease."""
    async with store.read() as session:
        found = (
            await session.execute(
                select(AttemptRow.host_id, AttemptRow.planner_transport).where(
                    AttemptRow.task_id == task_id,
                    AttemptRow.attempt == attempt,
                    AttemptRow.lease_id == lease_id,
                )
            )
        ).first()
        return None if found is None else (str(found[0]), int(found[1] or 0))


@dataclass(frozen=True, slots=True)
class RecentLease:
    """Whether a host holds, or lately held, a lease: what it may still ship records for."""

    ok: bool
    #: The lease is another host's (nothing more about it is said).
    not_yours: bool = False
    message: str = ""
    #: How the attempt is planned (AttemptRow.planner_transport): a cloud-planned one's
    #: decisions are the cloud's own to log.
    planner_transport: int = 0


async def held_recently(
    store: Store, host_id: str, task_id: str, attempt: int, lease_id: str, window: dt.timedelta
) -> RecentLease:
    """Whether (task, attempt, lease id) was granted to `host_id` and has not ended, or ended
    less than `window` ago: the leases a host may still ship decisions and screenshots for."""
    now = store.now()
    async with store.read() as session:
        row = await session.scalar(
            select(AttemptRow).where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
        )
    where = f"lease {lease_id!r} of task {task_id!r} attempt {attempt}"
    if row is None or row.lease_id != lease_id:
        return RecentLease(False, message=f"{where} is unknown")
    if row.host_id != host_id:
        return RecentLease(False, not_yours=True, message=f"{where} belongs to another host")
    if row.ended_at is not None and row.ended_at <= now - window:
        return RecentLease(
            False,
            message=f"{where} ended at {row.ended_at:%Y-%m-%d %H:%M:%S} UTC, longer ago than the "
            f"shipping window ({window.total_seconds():.0f} s)",
        )
    return RecentLease(True, planner_transport=row.planner_transport)

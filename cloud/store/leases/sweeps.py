"""Sweeps: attempts whose lease ran out, and tasks whose deadline passed, are ended.

Safe on every replica at once: rows are picked with SKIP LOCKED or ended by conditional
UPDATEs, so each attempt and task is ended by exactly one sweeper.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store import states
from cloud.store.database import Store
from cloud.store.lease_events import EventKind, new
from cloud.store.leases.fence import Revocation
from cloud.store.lock_waits import (
    SWEEP_LOCK_TIMEOUT_MS,
    bound_lock_waits,
    waiting_then_skipping,
)
from cloud.store.models import AttemptRow, LeaseEventRow, TaskRow


@dataclass(frozen=True, slots=True)
class Ended:
    """An attempt the sweeper (or a release) ended, and what became of its task."""

    task_id: str
    attempt: int
    host_id: str
    lease_id: str
    device_serial: str
    task_status: str
    revocation: Revocation
    #: When the lease ran out (an expiry's end; None for other ends).
    expired_at: dt.datetime | None = None


@dataclass(slots=True)
class Skipped:
    """The tasks whose expired attempt row an expiry sweep skipped (SKIP LOCKED), when it
    could tell (`told`): on PostgreSQL, in a batch short of its limit. A full batch did not
    look past its last row, and SQLite has no row locks to skip."""

    task_ids: list[str] = field(default_factory=list)
    told: bool = False


def used_attempts(task: TaskRow) -> int:
    """The attempts a task has used of its `max_attempts` (those never sent do not count)."""
    return task.attempt - task.unsent_attempts


async def settle_task(
    session: AsyncSession,
    task_id: str,
    attempt: int,
    now: dt.datetime,
    failure: str,
    host_id: str,
    serial: str,
) -> tuple[str, Revocation] | None:
    """After `attempt` ended without a result (its lease ran out, or it was released): the task
    is requeued, or fails with `failure` when it has no attempt left, or is cancelled when a
    cancel was requested, and the lease history says so. None when the task had already moved
    on (nothing to do)."""
    task = await session.scalar(select(TaskRow).where(TaskRow.task_id == task_id).with_for_update())
    if task is None or task.attempt != attempt or task.status not in states.LIVE:
        return None
    revocation = Revocation.EXPIRED if failure == states.LEASE_EXPIRED else Revocation.RELEASED
    if failure == states.STREAM_LOST:
        # Its assignment was never sent: nothing ran, so the attempt is not one of the task's.
        task.unsent_attempts += 1
    if task.cancel_requested:
        task.status = states.CANCELLED
        task.result_summary = task.cancel_reason or "cancelled"
        task.finished_at = now
        revocation = Revocation.CANCELLED
        await session.execute(
            update(AttemptRow)
            .where(AttemptRow.task_id == task_id, AttemptRow.attempt == attempt)
            .values(status=states.CANCELLED, failure_reason=task.result_summary)
        )
    elif used_attempts(task) >= task.max_attempts:
        task.status = states.FAILED
        task.result_summary = failure
        task.finished_at = now
    else:
        task.status = states.QUEUED
    task.updated_at = now
    session.add_all(_end_events(task, host_id, serial, now, failure))
    return task.status, revocation


async def _any(store: Store, statement: Select[Any]) -> bool:
    """Whether `statement` finds a row, read outside the store's write lock.

    Every replica sweeps every second and nearly always finds nothing to end. Looked for inside
    a write transaction, that nothing held SQLite's write lock (the store's, taken for the
    transaction) across the read's round trips through the driver's thread: 5-90 ms a sweep on
    a replica answering 2,000 renewals a second, while every renewal with new progress waited
    to be written (docs/benchmarks.md, eighteenth pass). A read takes no lock; the write
    transaction looks again, as before, and ends only what is still due then."""
    async with store.read() as session:
        return (await session.scalar(statement.limit(1))) is not None


async def sweep_expired(
    store: Store,
    limit: int = 500,
    held: list[str] | None = None,
    skipped: Skipped | None = None,
) -> list[Ended]:
    """End attempts whose lease ran out and requeue (or fail, or cancel) their tasks.

    Safe on every replica at once: rows are picked with SKIP LOCKED and ended by a conditional
    UPDATE, so each expired attempt is handled by exactly one sweeper.

    A task row another transaction holds (an operator's `BEGIN; UPDATE tasks ...` left open in
    psql) is waited for `SWEEP_LOCK_TIMEOUT_MS` at most: the sweep then starts over taking
    only the task rows it can lock at once, ends the others and leaves that one for a later
    pass, its task id added to `held`. Before, the sweep waited on it for as long as the
    session stayed open, and no lease of the fleet expired meanwhile.

    An expired attempt row another transaction holds is skipped at once (SKIP LOCKED: it is
    most often another replica's sweeper ending it, or a renewal writing it for a moment); its
    task id is put in `skipped` (PostgreSQL, a batch short of `limit`), so the sweeper can
    name a row skipped on pass after pass: held elsewhere for no good reason, its lease
    outlives its term while the session stays open.
    """
    now = store.now()
    if not await _any(
        store,
        select(AttemptRow.id).where(
            AttemptRow.ended_at.is_(None), AttemptRow.lease_expires_at <= now
        ),
    ):
        if store.is_postgres and skipped is not None:
            # Nothing expired, so nothing was skipped: a pass that knows it ends every
            # stretch of skips (left "not told", an old stretch outlived a quiet hour and
            # named a row skipped once, milliseconds long, much later).
            skipped.task_ids, skipped.told = [], True
        return []
    return await waiting_then_skipping(
        lambda wait: _end_expired(store, now, limit, wait=wait, held=held, skipped=skipped)
    )


async def _expired_elsewhere(
    session: AsyncSession, now: dt.datetime, picked: Sequence[int]
) -> list[str]:
    """The tasks of the expired attempts, not ended, that the SKIP LOCKED pick left (those not
    among `picked`): their rows are held by another transaction now. A plain read, no lock."""
    return list(
        (
            await session.scalars(
                select(AttemptRow.task_id)
                .where(
                    AttemptRow.ended_at.is_(None),
                    AttemptRow.lease_expires_at <= now,
                    AttemptRow.id.not_in(picked),
                )
                .order_by(AttemptRow.id)
            )
        ).all()
    )


async def _lock_tasks(session: AsyncSession, task_ids: Sequence[str], *, wait: bool) -> set[str]:
    """Lock `task_ids`' rows in id order (the order every writer locks them in); with `wait`
    False only those no other transaction holds now (SKIP LOCKED). Returns those locked."""
    return set(
        (
            await session.scalars(
                select(TaskRow.task_id)
                .where(TaskRow.task_id.in_(task_ids))
                .order_by(TaskRow.task_id)
                .with_for_update(skip_locked=not wait)
            )
        ).all()
    )


async def _end_expired(
    store: Store,
    now: dt.datetime,
    limit: int,
    *,
    wait: bool,
    held: list[str] | None,
    skipped: Skipped | None = None,
) -> list[Ended]:
    """`sweep_expired`'s transaction: with `wait`, waiting (boundedly) for every task row;
    without, skipping the task rows held elsewhere."""
    ended: list[Ended] = []
    async with store.write() as session:
        await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
        due = (
            await session.execute(
                select(AttemptRow.id, AttemptRow.task_id)
                .where(AttemptRow.ended_at.is_(None), AttemptRow.lease_expires_at <= now)
                .order_by(AttemptRow.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        ).all()
        if store.is_postgres and skipped is not None and len(due) < limit:
            picked = [row_id for row_id, _ in due]
            skipped.task_ids, skipped.told = await _expired_elsewhere(session, now, picked), True
        if not due:
            return []
        task_ids = sorted({task_id for _, task_id in due})
        # Attempts before tasks, as renewals and results lock them. SQLite: no row locks.
        locked = await _lock_tasks(session, task_ids, wait=wait) if store.is_postgres else None
        if locked is not None and held is not None:
            held.extend(t for t in task_ids if t not in locked)
        ids = [row_id for row_id, task_id in due if locked is None or task_id in locked]
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
                    AttemptRow.lease_expires_at,
                )
            )
        ).all()
        for task_id, attempt, host_id, lease_id, serial, expired_at in sorted(rows):
            settled = await settle_task(
                session, task_id, attempt, now, states.LEASE_EXPIRED, host_id, serial
            )
            if settled is not None:
                status, revocation = settled
                ended.append(
                    Ended(
                        task_id, attempt, host_id, lease_id, serial, status, revocation, expired_at
                    )
                )
    return ended


def _end_events(
    task: TaskRow, host_id: str, serial: str, now: dt.datetime, failure: str
) -> list[LeaseEventRow]:
    """The lease history of a lease that ended without a result (it expired, or the cloud
    released it): that end, then the requeue or the cancel."""
    attempt = task.attempt
    events = [
        new(
            EventKind.EXPIRED if failure == states.LEASE_EXPIRED else EventKind.REVOKED,
            task.task_id,
            attempt,
            now,
            host_id=host_id,
            device_serial=serial,
            reason=failure
            if task.status != states.FAILED
            else f"{failure}; no attempts left ({task.max_attempts} allowed)",
            task_status=task.status,
        )
    ]
    if task.status == states.QUEUED:
        events.append(
            new(
                EventKind.REQUEUED,
                task.task_id,
                attempt,
                now,
                reason=f"attempt {used_attempts(task) + 1} of {task.max_attempts} waits for a "
                "phone",
                task_status=task.status,
            )
        )
    elif task.status == states.CANCELLED:
        events.append(
            new(
                EventKind.CANCELLED,
                task.task_id,
                attempt,
                now,
                operator=task.cancelled_by,
                reason=task.cancel_reason or "cancelled",
                task_status=task.status,
            )
        )
    return events


async def sweep_deadlines(
    store: Store, limit: int = 500, held: list[str] | None = None
) -> list[Ended]:
    """Fail tasks whose absolute deadline passed, ending their live attempt if any.

    Attempts are locked before tasks, the same order renewals and results use, so a sweep never
    deadlocks with a renewal of the same task on PostgreSQL. Both updates are conditional, so
    sweepers on several replicas at once end each task once. A row another transaction holds
    is waited for `SWEEP_LOCK_TIMEOUT_MS` at most, then left for a later pass (its task id
    added to `held`) while the other tasks are ended, as in `sweep_expired`.
    """
    now = store.now()
    if not await _any(
        store,
        select(TaskRow.task_id).where(TaskRow.status.in_(states.ACTIVE), TaskRow.deadline <= now),
    ):
        return []
    return await waiting_then_skipping(
        lambda wait: _end_overdue(store, now, limit, wait=wait, held=held)
    )


async def _lock_overdue(session: AsyncSession, due: list[str], *, wait: bool) -> list[str]:
    """Lock the live attempts, then the rows, of the `due` tasks (PostgreSQL); with `wait`
    False only of those whose rows no other transaction holds now. Returns the tasks locked."""
    live = select(AttemptRow.task_id).where(
        AttemptRow.task_id.in_(due), AttemptRow.ended_at.is_(None)
    )
    got = set(
        (
            await session.scalars(
                live.order_by(AttemptRow.id).with_for_update(skip_locked=not wait)
            )
        ).all()
    )
    blocked = set() if wait else set((await session.scalars(live)).all()) - got
    return sorted(await _lock_tasks(session, [t for t in due if t not in blocked], wait=wait))


async def _end_overdue(
    store: Store, now: dt.datetime, limit: int, *, wait: bool, held: list[str] | None
) -> list[Ended]:
    """`sweep_deadlines`'s transaction: with `wait`, waiting (boundedly) for every row;
    without, skipping the tasks whose rows are held elsewhere."""
    async with store.write() as session:
        await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
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
        if due and store.is_postgres:
            locked = await _lock_overdue(session, due, wait=wait)
            if held is not None:
                held.extend(sorted(set(due) - set(locked)))
            due = locked
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
        for task_id, task_attempt in failed:
            _, host_id, _, serial = live.get(task_id, (task_attempt, None, None, None))
            session.add(
                new(
                    EventKind.DEADLINE_EXCEEDED,
                    task_id,
                    task_attempt,
                    now,
                    host_id=host_id,
                    device_serial=serial,
                    reason=states.DEADLINE_EXCEEDED,
                    task_status=states.FAILED,
                )
            )
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
                Revocation.DEADLINE_EXCEEDED,
            )
        )
    return ended


async def extend_after_outage(store: Store) -> int:
    """Give every live lease a full term from now (never shortening one); returns how many got
    one. Called by a replica that starts while no other is alive: while the whole cloud was
    down no host could renew, so leases ran out for nothing, and the first sweep would requeue
    work that hosts kept doing (on the direct transport they may even have finished it, and a
    result that arrives after another attempt started is refused: the work runs twice). With a
    new term, hosts reconnect, renew and deliver; a host that really died is swept one term
    later. Fencing is untouched: lease ids, ended attempts and cancellations stay as they are.

    Every renewal batch waits for it (`ClockWatch.settled`), so an attempt row held in another
    transaction is waited for `SWEEP_LOCK_TIMEOUT_MS` at most, then left as it is (`_live_rows`):
    no sweep can end it while it is held either.
    """
    now = store.now()

    async def extend(session: AsyncSession, wait: bool) -> list[dict[str, Any]]:
        live = await _live_rows(
            session,
            select(AttemptRow.id, AttemptRow.lease_expires_at, TaskRow.lease_seconds)
            .join(TaskRow, TaskRow.task_id == AttemptRow.task_id)
            .where(AttemptRow.ended_at.is_(None)),
            wait=wait,
        )
        return [
            {"id": row_id, "lease_expires_at": now + dt.timedelta(seconds=seconds)}
            for row_id, expires, seconds in live
            if expires is None or expires < now + dt.timedelta(seconds=seconds)
        ]

    return await _move_live(store, extend)


async def keep_time_left(store: Store, stepped_back: dt.timedelta) -> int:
    """Bring every live lease's expiry `stepped_back` earlier; returns how many moved. Called
    by a replica alone on its database whose wall clock stepped back: the expiries were written
    by the clock before the step, so each lease had that much more time by the new clock (a
    renewal kept the far expiry and told its host so, and a host that died held its task that
    much longer). Afterwards each has the time it had left before the step. An attempt row held
    elsewhere is left as it is, as in `extend_after_outage`."""

    async def move(session: AsyncSession, wait: bool) -> list[dict[str, Any]]:
        live = await _live_rows(
            session,
            select(AttemptRow.id, AttemptRow.lease_expires_at).where(
                AttemptRow.ended_at.is_(None), AttemptRow.lease_expires_at.is_not(None)
            ),
            wait=wait,
        )
        return [
            {"id": row_id, "lease_expires_at": expires - stepped_back} for row_id, expires in live
        ]

    return await _move_live(store, move)


async def _live_rows(
    session: AsyncSession, query: Select[*tuple[Any, ...]], *, wait: bool
) -> list[Any]:
    """`query`'s rows with their attempt rows locked (PostgreSQL): waiting for each as long as
    the transaction's `lock_timeout`, or, without `wait`, only those no one else holds now."""
    locked = query.with_for_update(of=AttemptRow, skip_locked=not wait)
    return list((await session.execute(locked)).all())


async def _move_live(
    store: Store, moves: Callable[[AsyncSession, bool], Awaitable[list[dict[str, Any]]]]
) -> int:
    """Write the expiries `moves` computes from the live attempts it locked, in one transaction
    with a bounded lock wait; should it time out, once more skipping the rows held elsewhere."""

    async def move(wait: bool) -> int:
        async with store.write() as session:
            await bound_lock_waits(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
            terms = await moves(session, wait)
            if terms:
                await session.execute(update(AttemptRow), terms)
        return len(terms)

    return await waiting_then_skipping(move)

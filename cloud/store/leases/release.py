"""Releases: a host's live attempts ended at once, without a result, and their tasks requeued.

A lease normally ends with a result or runs out. When the cloud knows nobody will ever finish
an attempt — the host process that held it was replaced by a new one (which does not hold it),
its stream closed before the assignment was sent, its certificate was revoked — waiting for the
lease to run out would only leave a phone idle and a task waiting. Each attempt is ended by a
conditional UPDATE (`ended_at IS NULL`), so a release racing a sweep or a result ends it once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

from sqlalchemy import select, update

from cloud.store import states
from cloud.store.database import Store
from cloud.store.leases.queries import HeldLease
from cloud.store.leases.sweeps import Ended, settle_task
from cloud.store.lock_waits import bound_lock_waits
from cloud.store.models import AttemptRow


async def release(
    store: Store,
    host_id: str,
    reason: str,
    *,
    keep: Collection[HeldLease] = (),
    only: Collection[HeldLease] | None = None,
    started_before: dt.datetime | None = None,
    lock_wait_ms: int | None = None,
) -> list[Ended]:
    """End `host_id`'s live attempts — all but `keep`, or just those in `only`, and with
    `started_before` only those that started before it — with `reason` (one of
    `states.RELEASED`) and requeue their tasks (or fail them with `reason` when no attempt is
    left, or cancel them when a cancel was requested).

    `lock_wait_ms` (PostgreSQL): wait that long at most for a row another transaction holds,
    then raise the database's lock timeout (`lock_timed_out`) with nothing released: a
    restarted host's hello waits for this before its Welcome (`LeaseManager.open`)."""
    if only is not None and not only:
        return []
    now = store.now()
    kept = {(h.task_id, h.attempt, h.lease_id) for h in keep}
    wanted = None if only is None else {(h.task_id, h.attempt, h.lease_id) for h in only}
    ended: list[Ended] = []
    async with store.write() as session:
        if lock_wait_ms is not None:
            await bound_lock_waits(session, store.is_postgres, lock_wait_ms)
        live = (
            await session.execute(
                select(
                    AttemptRow.id,
                    AttemptRow.task_id,
                    AttemptRow.attempt,
                    AttemptRow.lease_id,
                    AttemptRow.device_serial,
                )
                .where(
                    AttemptRow.host_id == host_id,
                    AttemptRow.ended_at.is_(None),
                    *(() if started_before is None else (AttemptRow.started_at < started_before,)),
                )
                .order_by(AttemptRow.task_id)
            )
        ).all()
        for row_id, task_id, attempt, lease_id, serial in live:
            key = (task_id, attempt, lease_id)
            if key in kept or (wanted is not None and key not in wanted):
                continue
            done = (
                await session.execute(
                    update(AttemptRow)
                    .where(AttemptRow.id == row_id, AttemptRow.ended_at.is_(None))
                    .values(status=states.FAILED, failure_reason=reason, ended_at=now)
                    .returning(AttemptRow.id)
                )
            ).first()
            if done is None:
                continue
            settled = await settle_task(session, task_id, attempt, now, reason, host_id, serial)
            if settled is not None:
                status, revocation = settled
                ended.append(Ended(task_id, attempt, host_id, lease_id, serial, status, revocation))
    return ended

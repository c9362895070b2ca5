"""A host's hello, settled in one transaction: its row, the leases it re-announces, its busy
phones.

When a replica restarts, every one of its hosts says hello within seconds, each naming the
lease it still holds, and each lease must be confirmed before the host's own clock runs it
out (it stops its task then: `host.lease_client`). Settled as four transactions through the
async engine (the host's row, a read of the held leases, their RESUMED events, a read of its
busy phones), 2,000 hosts reconnecting to a SQLite replica took it 30 s of CPU, most of it
SQLAlchemy's sessions and aiosqlite's thread hops, and most leases ran out
(bench/replica_restart.py). Here it is one transaction in a synchronous session, on the loop's
own thread on SQLite (`Store.write_on_loop`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from cloud.store import hosts, lease_events
from cloud.store.database import Store
from cloud.store.lease_events import EventKind
from cloud.store.leases.claim import LATEST_PROGRESS
from cloud.store.leases.fence import classify_sync, live_fence
from cloud.store.leases.queries import HeldCheck, HeldLease
from cloud.store.models import AttemptRow, TaskRow

_LIVE_SERIALS = select(AttemptRow.device_serial).where(
    AttemptRow.host_id == bindparam("host"), AttemptRow.ended_at.is_(None)
)
_TASK = select(TaskRow).where(TaskRow.task_id == bindparam("task"))


@dataclass(frozen=True, slots=True)
class Settled:
    """What a hello settled."""

    #: The process id recorded at the host's previous hello (None: none known).
    previous_process: str | None
    #: Each held lease, resumed or refused (None: a new process, whose predecessor's leases
    #: must be released first: then `resume`).
    checks: list[HeldCheck] | None
    #: The host's phones with a live attempt.
    busy: set[str]


def _new_process(previous: str | None, process_id: str) -> bool:
    return bool(process_id and previous and previous != process_id)


async def hello(
    store: Store, host_id: str, record: hosts.HelloRecord, held: Sequence[HeldLease]
) -> Settled:
    """Record a hello (`hosts.record_hello`) and, unless it comes from a new process, settle
    its held leases in the same transaction (`resume`)."""
    now = store.now()

    def work(session: Session) -> Settled:
        previous = hosts.record_hello(session, now, host_id, record)
        if _new_process(previous, record.process_id):
            return Settled(previous, None, set())
        checks, busy = _resume(session, host_id, held, now)
        return Settled(previous, checks, busy)

    return await store.write_on_loop(work)


async def resume(store: Store, host_id: str, held: Sequence[HeldLease]) -> Settled:
    """Settle held leases on their own (after a new process's release)."""
    now = store.now()

    def work(session: Session) -> Settled:
        checks, busy = _resume(session, host_id, held, now)
        return Settled(None, checks, busy)

    return await store.write_on_loop(work)


def _resume(
    session: Session, host_id: str, held: Sequence[HeldLease], now: dt.datetime
) -> tuple[list[HeldCheck], set[str]]:
    """Which re-announced leases are still the host's live leases (each resumed one recorded
    as a RESUMED event), and the host's busy phones."""
    out: list[HeldCheck] = []
    for h in held:
        found = session.execute(
            select(AttemptRow, TaskRow)
            .join(TaskRow, TaskRow.task_id == AttemptRow.task_id)
            .where(*live_fence(host_id, h.task_id, h.attempt, h.lease_id, now))
        ).first()
        row, task = found if found is not None else (None, None)
        if row is not None and task is not None and not task.cancel_requested:
            # The live attempt is the task's newest: its own progress, if any, is the latest.
            last = (
                row
                if row.progress_updated_at is not None
                else session.scalar(LATEST_PROGRESS, {"task_id": h.task_id})
            )
            out.append(HeldCheck(h, row, task, last_progress=last))
            session.add(
                lease_events.new(
                    EventKind.RESUMED,
                    row.task_id,
                    row.attempt,
                    now,
                    host_id=host_id,
                    device_serial=row.device_serial,
                    task_status=task.status,
                )
            )
        else:
            revocation, message = classify_sync(
                session, host_id, h.task_id, h.attempt, h.lease_id, now
            )
            task = session.scalar(_TASK, {"task": h.task_id})
            out.append(HeldCheck(h, None, task, revocation, message))
    busy = set(session.scalars(_LIVE_SERIALS, {"host": host_id}).all())
    return out, busy

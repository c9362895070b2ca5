"""Hosts' hellos, settled in one transaction per batch: their rows, the leases they
re-announce, their busy phones.

When a replica restarts, every one of its hosts says hello within seconds, each naming the
lease it still holds, and each lease must be confirmed before the host's own clock runs it
out (it stops its task then: `host.lease_client`). Settled as four transactions through the
async engine (the host's row, a read of the held leases, their RESUMED events, a read of its
busy phones), 2,000 hosts reconnecting to a SQLite replica took it 30 s of CPU, most of it
SQLAlchemy's sessions and aiosqlite's thread hops, and most leases ran out
(bench/replica_restart.py). One transaction per hello halved that (decision 0074); on
PostgreSQL a hello still cost ~6 ms of statements. A batch of hellos (`cloud.lease.hellos`)
is one transaction with one statement of each kind for all of them (decision 0075), in a
synchronous session, on the loop's own thread on SQLite (`Store.write_on_loop`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, insert, select
from sqlalchemy.orm import Session

from cloud.store import flows, hosts, lease_events, states
from cloud.store.database import Store
from cloud.store.lease_events import EventKind
from cloud.store.leases.fence import classify_sync, live_fences
from cloud.store.leases.queries import HeldCheck, HeldLease
from cloud.store.lock_waits import (
    SWEEP_LOCK_TIMEOUT_MS,
    RowHeld,
    bound_lock_waits_sync,
    waiting_then_skipping,
)
from cloud.store.models import AttemptRow, LeaseEventRow, TaskRow

_TASK = select(TaskRow).where(TaskRow.task_id == bindparam("task"))


@dataclass(frozen=True, slots=True)
class HelloIn:
    """One hello to settle: the host, what its row records, the leases it re-announces."""

    host_id: str
    record: hosts.HelloRecord
    held: Sequence[HeldLease]


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


async def hellos(store: Store, items: Sequence[HelloIn]) -> list[Settled]:
    """`settle_hellos` for hellos none of whose host rows is held elsewhere (tests, benches):
    a held one raises its `RowHeld` (the others were recorded all the same)."""
    out = await settle_hellos(store, items)
    for one in out:
        if isinstance(one, RowHeld):
            raise one
    return [one for one in out if isinstance(one, Settled)]


async def settle_hellos(store: Store, items: Sequence[HelloIn]) -> list[Settled | RowHeld]:
    """Record each hello (`hosts.record_hellos`) and, for each that does not come from a new
    process, settle its held leases, all in one transaction; one `Settled` per item, in order.
    Should the transaction fail, none of it happened.

    On PostgreSQL every row lock is waited for `SWEEP_LOCK_TIMEOUT_MS` at most: a host row
    another transaction holds (an operator's `SELECT ... FOR UPDATE` left open in psql, a stuck
    migration) held up every hello of the batch as long as it stayed held, and none of those
    hosts could connect. Once the wait times out the transaction runs again skipping the held
    host rows (`waiting_then_skipping`): the other hellos are settled, and each held one is a
    `RowHeld` in its place (the host's stream ends UNAVAILABLE saying so, and the host
    reconnects with its backoff). A lock held elsewhere on a lease's attempt or task row the
    hello re-announces times out the same way, twice: the batch fails and the batcher settles
    each of its hellos alone (`cloud.lease.hellos`), so it fails only its own host's."""

    def work(session: Session, now: dt.datetime, wait: bool) -> list[Settled | RowHeld]:
        bound_lock_waits_sync(session, store.is_postgres, SWEEP_LOCK_TIMEOUT_MS)
        held: set[str] | None = None if wait else set()
        previous = hosts.record_hellos(session, now, [(i.host_id, i.record) for i in items], held)
        settling = [
            (i, p) for i, p in zip(items, previous, strict=True) if i.host_id not in (held or ())
        ]
        resuming = [i for i, p in settling if not _new_process(p, i.record.process_id)]
        checks = iter(_resume(session, [(i.host_id, i.held) for i in resuming], now))
        busy = _busy(session, {i.host_id for i in resuming})
        return [
            RowHeld(_held_message(i.host_id))
            if i.host_id in (held or ())
            else Settled(p, None, set())
            if _new_process(p, i.record.process_id)
            else Settled(p, next(checks), set(busy.get(i.host_id, ())))
            for i, p in zip(items, previous, strict=True)
        ]

    async def attempt(wait: bool) -> list[Settled | RowHeld]:
        now = store.now()
        return await store.write_on_loop(lambda session: work(session, now, wait))

    return await waiting_then_skipping(attempt)


def _held_message(host_id: str) -> str:
    """What a host whose row is held elsewhere is told (and the cloud logs)."""
    return (
        f"host {host_id}'s row in the cloud's database is locked by another transaction"
        f" (waited {SWEEP_LOCK_TIMEOUT_MS} ms; an open psql session or a stuck migration? see"
        " pg_locks): the hello was not recorded; reconnect later"
    )


async def resume(
    store: Store, host_id: str, held: Sequence[HeldLease], lock_wait_ms: int | None = None
) -> Settled:
    """Settle held leases on their own (after a new process's release). `lock_wait_ms`
    (PostgreSQL): wait that long at most for a row another transaction holds, then raise the
    database's lock timeout (`lock_timed_out`) with nothing settled."""
    now = store.now()

    def work(session: Session) -> Settled:
        if lock_wait_ms is not None:
            bound_lock_waits_sync(session, store.is_postgres, lock_wait_ms)
        (checks,) = _resume(session, [(host_id, held)], now)
        busy = _busy(session, {host_id})
        return Settled(None, checks, busy.get(host_id, set()))

    return await store.write_on_loop(work)


#: Held leases per statement (a host may hold one per phone, up to 256).
_LEASES_PER_READ = 500


def _resume(
    session: Session, items: Sequence[tuple[str, Sequence[HeldLease]]], now: dt.datetime
) -> list[list[HeldCheck]]:
    """For each (host, held leases), which of those are still (or again: `_revive`) the host's
    live leases (each resumed one recorded as a RESUMED event): one read for all of them; each
    refused one is asked why on its own (`classify_sync`: rare, and never in a restart's
    storm)."""
    wanted = [(h.task_id, h.attempt, h.lease_id, host_id) for host_id, held in items for h in held]
    live: dict[tuple[str, int, str, str], tuple[AttemptRow, TaskRow]] = {}
    for at in range(0, len(wanted), _LEASES_PER_READ):
        rows = session.execute(
            select(AttemptRow, TaskRow)
            .join(TaskRow, TaskRow.task_id == AttemptRow.task_id)
            .where(*live_fences(wanted[at : at + _LEASES_PER_READ], now))
        )
        for found_row, found_task in rows:
            key = (found_row.task_id, found_row.attempt, found_row.lease_id, found_row.host_id)
            live[key] = (found_row, found_task)
    revived: set[tuple[str, int, str, str]] = set()
    for host_id, held in items:
        for h in held:
            key = (h.task_id, h.attempt, h.lease_id, host_id)
            if key not in live and (again := _revive(session, host_id, h, now)) is not None:
                live[key] = again
                revived.add(key)
    # The live attempt is the task's newest: its own progress, if any, is the latest; for a
    # live attempt without any yet, an earlier attempt's (one read for all of them).
    earlier = _latest_progress(
        session, {row.task_id for row, _ in live.values() if row.progress_updated_at is None}
    )
    out: list[list[HeldCheck]] = []
    resumed: list[dict[str, Any]] = []
    for host_id, held in items:
        checks: list[HeldCheck] = []
        for h in held:
            key = (h.task_id, h.attempt, h.lease_id, host_id)
            found = live.get(key)
            if found is not None and not found[1].cancel_requested:
                row, task = found
                last = row if row.progress_updated_at is not None else earlier.get(row.task_id)
                checks.append(HeldCheck(h, row, task, last_progress=last))
                resumed.append(
                    lease_events.values(
                        EventKind.RESUMED,
                        row.task_id,
                        row.attempt,
                        now,
                        host_id=host_id,
                        device_serial=row.device_serial,
                        reason=_REVIVED if key in revived else None,
                        task_status=task.status,
                    )
                )
            else:
                why = classify_sync(session, host_id, h.task_id, h.attempt, h.lease_id, now)
                known = session.scalar(_TASK, {"task": h.task_id})
                checks.append(
                    HeldCheck(
                        h, None, known, why.revocation, why.message, task_status=why.task_status
                    )
                )
        out.append(checks)
    if resumed:  # one executemany (the ORM would insert row by row to learn each new id)
        session.execute(insert(LeaseEventRow), resumed)
    return out


#: The RESUMED event's reason for a lease `_revive` gave a new term.
_REVIVED = "the lease had run out while the host was away; no other attempt had started"


def _revive(
    session: Session, host_id: str, held: HeldLease, now: dt.datetime
) -> tuple[AttemptRow, TaskRow] | None:
    """Give a held lease that merely lapsed a new term, if nobody took its task meanwhile: its
    attempt row and task, live again; None otherwise (the hello then refuses it as before).

    A host that comes back holding an attempt whose lease ran out while it was away (a result
    its previous process kept, or a task it still runs) sends the result right after its hello.
    The task was requeued by then, and the hello's own dispatch claimed its next attempt before
    that result was read (often for this very phone): the result was refused as superseded and
    the task ran again. Revived here, in the hello's transaction, the lease is the host's live
    lease before any dispatch can see the task; the result then ends it like any other.

    Exact under concurrent claims: the attempt row is locked, then the task (the sweeper's and
    the late result's order), and the task must still wait for its next attempt with this one
    as its latest (`attempt` is only raised by a claim, which takes a QUEUED task). A claim
    that committed first leaves nothing to revive: the lease is refused, and so is its result
    (SUPERSEDED), as before. An expiry that failed the task on its last attempt is left to the
    late-result path: nobody can claim that task. A cancel, a passed deadline or a phone with
    another live attempt leaves the lease refused."""
    row = session.scalar(
        select(AttemptRow)
        .where(
            AttemptRow.task_id == held.task_id,
            AttemptRow.attempt == held.attempt,
            AttemptRow.lease_id == held.lease_id,
            AttemptRow.host_id == host_id,
            AttemptRow.result_status.is_(None),
        )
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if row is None:
        return None
    if row.ended_at is None:
        waiting: tuple[str, ...] = states.LIVE  # lapsed, not yet swept
        if row.lease_expires_at > now:
            return None
    elif row.status == states.FAILED and row.failure_reason == states.LEASE_EXPIRED:
        waiting = (states.QUEUED,)
        other = session.scalar(
            select(AttemptRow.id).where(
                AttemptRow.host_id == host_id,
                AttemptRow.device_serial == row.device_serial,
                AttemptRow.ended_at.is_(None),
            )
        )
        if other is not None:
            return None
    else:
        return None
    task = session.scalar(
        select(TaskRow)
        .where(TaskRow.task_id == held.task_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if (
        task is None
        or task.attempt != held.attempt
        or task.status not in waiting
        or task.cancel_requested
        or task.deadline <= now
    ):
        return None
    flows.hand_back(row)  # the result that ends it is the learning loop's to look at
    status = states.RUNNING if row.renewals else states.ASSIGNED
    row.status = status
    row.failure_reason = None
    row.ended_at = None
    row.lease_expires_at = now + dt.timedelta(seconds=task.lease_seconds)
    task.status = status
    task.host_id = host_id
    task.device_serial = row.device_serial
    task.updated_at = now
    session.flush()
    return row, task


def _latest_progress(session: Session, task_ids: set[str]) -> dict[str, AttemptRow]:
    """Each task's most recent attempt that reported progress (`claim.LATEST_PROGRESS` for
    several tasks at once)."""
    latest: dict[str, AttemptRow] = {}
    if task_ids:
        rows = session.scalars(
            select(AttemptRow).where(
                AttemptRow.task_id.in_(sorted(task_ids)),
                AttemptRow.progress_updated_at.is_not(None),
            )
        )
        for row in rows:
            if row.task_id not in latest or row.attempt > latest[row.task_id].attempt:
                latest[row.task_id] = row
    return latest


def _busy(session: Session, host_ids: set[str]) -> dict[str, set[str]]:
    """The phones of `host_ids` with a live attempt, by host."""
    busy: dict[str, set[str]] = {}
    if host_ids:
        rows = session.execute(
            select(AttemptRow.host_id, AttemptRow.device_serial).where(
                AttemptRow.host_id.in_(sorted(host_ids)), AttemptRow.ended_at.is_(None)
            )
        )
        for host_id, serial in rows:
            busy.setdefault(host_id, set()).add(serial)
    return busy

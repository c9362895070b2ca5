"""Fenced renewals, in batches: one read for many hosts' renewals, a write only where needed.

A batch is first read (`_read_live`: one statement, no transaction to commit, no lock): a renewal
whose lease the read finds live, far from expiry (at least `write_below` of its length left),
already running and with the progress it carries already stored is acknowledged with the stored
expiry and writes nothing (docs/decisions/0070-renewals-without-writes.md). Every other renewal is
written, fenced: on PostgreSQL one statement for the batch (`_renew_batch_pg`), on SQLite an
executemany of the fenced UPDATE (`_renew_batch_sqlite`). Both apply the same fence
(`fence.live_fence`) to each renewal on its own, so a stale one is refused (and classified)
without failing the others in its batch.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Container
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    Row,
    String,
    Table,
    Update,
    bindparam,
    case,
    column,
    exists,
    func,
    select,
    text,
    update,
)
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from cloud.store import states
from cloud.store.database import Store
from cloud.store.leases.fence import Revocation, classify, classify_sync
from cloud.store.leases.progress import ProgressIn
from cloud.store.models import AttemptRow, TaskRow, UTCDateTime


@dataclass(frozen=True, slots=True)
class RenewalIn:
    """One renewal to write."""

    host_id: str
    task_id: str
    attempt: int
    lease_id: str
    progress: ProgressIn | None
    #: Renewals this write stands for in the attempt's count (`renewals`): itself and those of
    #: its lease answered from a read since its last write (decision 0070).
    counts: int = 1


@dataclass(frozen=True, slots=True)
class RenewalOut:
    """Outcome: a new expiry, or why the lease is gone (with a message for the host)."""

    expires_at: dt.datetime | None
    revocation: Revocation | None = None
    message: str = ""
    #: The renewal changed the stored attempt (expiry, progress or status): watchers may care.
    written: bool = False


def _renew_statement(with_progress: bool) -> Update:
    """The fenced renewal UPDATE, built once with bound parameters.

    Building an ORM UPDATE per renewal (and letting the ORM evaluate its WHERE clause against the
    session) cost about a millisecond of CPU per renewal, most of the cloud's per-renewal cost
    (bench/lease_capacity.py); this Core statement on the table is built once and only binds
    values per renewal, and a batch runs it as one executemany. The fence is the same WHERE clause
    as `fence.live_fence`, in the statement that writes.
    """
    attempts = cast(Table, AttemptRow.__table__)
    tasks = cast(Table, TaskRow.__table__)
    values: dict[str, object] = {
        "lease_expires_at": bindparam("r_expires", type_=UTCDateTime()),
        "status": states.RUNNING,
        # The renewal summary (renewals are counted, not recorded one by one).
        "renewals": attempts.c.renewals + bindparam("r_counts", type_=Integer()),
        "first_renewed_at": func.coalesce(
            attempts.c.first_renewed_at, bindparam("r_now", type_=UTCDateTime())
        ),
        "last_renewed_at": bindparam("r_now", type_=UTCDateTime()),
    }
    if with_progress:
        values.update(
            step_index=bindparam("r_step_index", type_=Integer()),
            step_status=bindparam("r_step_status", type_=Integer()),
            summary=bindparam("r_summary", type_=String()),
            max_steps=bindparam("r_max_steps", type_=Integer()),
            progress_updated_at=bindparam("r_now", type_=UTCDateTime()),
        )
    return (
        update(attempts)
        .where(
            attempts.c.task_id == bindparam("r_task", type_=String()),
            attempts.c.attempt == bindparam("r_attempt", type_=Integer()),
            attempts.c.lease_id == bindparam("r_lease", type_=String()),
            attempts.c.host_id == bindparam("r_host", type_=String()),
            attempts.c.ended_at.is_(None),
            attempts.c.lease_expires_at > bindparam("r_now", type_=UTCDateTime()),
            ~exists().where(
                tasks.c.task_id == attempts.c.task_id, tasks.c.cancel_requested.is_(True)
            ),
        )
        .values(**values)
    )


_RENEW = _renew_statement(with_progress=False)
_RENEW_WITH_PROGRESS = _renew_statement(with_progress=True)


#: Every renewal writes (the behaviour before decision 0070): a `write_below` of 1.0 never finds
#: a lease with more than its whole length left.
ALWAYS_WRITE = 1.0

# The live attempts of a batch's tasks with what a renewal is compared against, in one statement
# of constant text (the task ids are one parameter: a JSON array on SQLite, an array on
# PostgreSQL), so it is prepared once and its compiled form cached.
_LIVE_COLUMNS = (
    column("task_id", String()),
    column("attempt", Integer()),
    column("lease_id", String()),
    column("host_id", String()),
    column("lease_expires_at", UTCDateTime()),
    column("status", String()),
    column("step_index", Integer()),
    column("step_status", Integer()),
    column("summary", String()),
    column("max_steps", Integer()),
    column("lease_seconds", Float()),
    column("cancel_requested", Boolean()),
)
_LIVE_SELECT = """
SELECT a.task_id, a.attempt, a.lease_id, a.host_id, a.lease_expires_at, a.status, a.step_index,
       a.step_status, a.summary, a.max_steps, t.lease_seconds, t.cancel_requested
"""
# SQLite: the batch's ids drive the join (the left side of a CROSS JOIN is SQLite's outer loop).
# Left to itself, SQLite's planner (no statistics) took `ended_at IS NULL` to the live-expiry
# index and read every live attempt of the fleet for each batch: 23 us per renewal at 2,000
# live leases, growing with the fleet, against 3 us this way (bench/lease_capacity.py).
_LIVE_SQLITE = text(
    _LIVE_SELECT
    + """FROM json_each(:task_ids) AS batch
CROSS JOIN attempts AS a ON a.task_id = batch.value
JOIN tasks AS t ON t.task_id = a.task_id
WHERE a.ended_at IS NULL
"""
).columns(*_LIVE_COLUMNS)
_LIVE_PG = text(
    _LIVE_SELECT
    + """FROM attempts AS a JOIN tasks AS t ON t.task_id = a.task_id
WHERE a.ended_at IS NULL AND a.task_id = ANY(CAST(:task_ids AS varchar[]))
"""
).columns(*_LIVE_COLUMNS)

_Key = tuple[str, int, str, str]


async def _read_live(store: Store, task_ids: list[str]) -> dict[str, Row[Any]]:
    """The live attempt of each of `task_ids` (at most one per task), as one committed snapshot.

    Not a write transaction: on SQLite it does not wait for the store's write lock (WAL readers
    never block the writer) and runs on the loop's own thread (`Store.loop_reader`), on
    PostgreSQL it runs in autocommit (no BEGIN/COMMIT round trips)."""
    if store.loop_reader is not None:
        # Busy for a moment (OperationalError): read the usual way below.
        with contextlib.suppress(OperationalError), store.loop_reader.connect() as sync:
            found = sync.execute(_LIVE_SQLITE, {"task_ids": json.dumps(task_ids)})
            return {row.task_id: row for row in found}
    async with store.engine.connect() as conn:
        if store.is_postgres:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            rows = await conn.execute(_LIVE_PG, {"task_ids": task_ids})
        else:
            rows = await conn.execute(_LIVE_SQLITE, {"task_ids": json.dumps(task_ids)})
        return {row.task_id: row for row in rows}


def _unchanged(row: Row[Any], item: RenewalIn, now: dt.datetime, write_below: float) -> bool:
    """True when acknowledging `item` needs no write: `row` is its live lease (the full fence:
    lease, host, not ended, not expired, no cancel requested), already RUNNING, with at least
    `write_below` of its length left, and the progress the renewal carries is the one stored."""
    if (
        row.attempt != item.attempt
        or row.lease_id != item.lease_id
        or row.host_id != item.host_id
        or row.cancel_requested
        or row.status != states.RUNNING
        or (row.lease_expires_at - now).total_seconds() < write_below * row.lease_seconds
    ):
        return False
    p = item.progress
    return p is None or (
        (row.step_index, row.step_status, row.summary, row.max_steps)
        == (p.step_index, p.step_status, p.summary, p.max_steps)
    )


def lease_key(item: RenewalIn) -> tuple[str, int, str, str]:
    """Which lease a renewal is for: (task, attempt, lease id, host)."""
    return (item.task_id, item.attempt, item.lease_id, item.host_id)


async def answer_from_read(
    store: Store,
    items: list[RenewalIn],
    write_below: float,
    pending: Container[tuple[str, int, str, str]] = (),
) -> list[RenewalOut | None]:
    """Read the batch's live attempts once; each renewal's outcome if it needs no write
    (`_unchanged`: the stored expiry, nothing written), None if it must be written.

    A renewal of a lease in `pending` (renewals of it queued for writing) or of a lease that
    another renewal in this batch must write is written too: a lease's renewals are written in
    the order they came, so the last progress acknowledged is the one stored.
    """
    if not items:
        return []
    now = store.now()
    live = await _read_live(store, sorted({i.task_id for i in items}))
    must: set[_Key] = set()
    kept: dict[int, dt.datetime] = {}
    for n, item in enumerate(items):
        row = live.get(item.task_id)
        key = lease_key(item)
        if key not in pending and row is not None and _unchanged(row, item, now, write_below):
            kept[n] = row.lease_expires_at
        else:
            must.add(key)
    return [
        RenewalOut(kept[n]) if n in kept and lease_key(item) not in must else None
        for n, item in enumerate(items)
    ]


async def write_renewals(store: Store, items: list[RenewalIn]) -> list[RenewalOut]:
    """Write many renewals in one transaction, each fenced on its own; outcomes in order.

    On PostgreSQL one statement (`_renew_batch_pg`), on SQLite an executemany of the fenced
    UPDATE (`_renew_batch_sqlite`). Both apply the same fence; a refused renewal is classified.
    """
    if not items:
        return []
    if store.is_postgres:
        return await _renew_batch_pg(store, items)
    return await _renew_batch_sqlite(store, items)


async def renew_batch(
    store: Store, items: list[RenewalIn], write_below: float = ALWAYS_WRITE
) -> list[RenewalOut]:
    """Renew many leases; each caller gets its own outcome, in order.

    With `write_below` < 1 the batch is read first (`answer_from_read`) and only the renewals
    that must be written are (`write_renewals`); with 1 every renewal is written. The lease
    service does the same in two stages (`cloud.lease.batcher`), so that reads never wait
    behind writes.
    """
    if not items:
        return []
    out: list[RenewalOut | None] = [None] * len(items)
    if write_below < ALWAYS_WRITE:
        out = await answer_from_read(store, items, write_below)
    to_write = [n for n, o in enumerate(out) if o is None]
    written = await write_renewals(store, [items[n] for n in to_write])
    for n, o in zip(to_write, written, strict=True):
        out[n] = o
    return [o for o in out if o is not None]


async def _renew_batch_sqlite(store: Store, items: list[RenewalIn]) -> list[RenewalOut]:
    """`_renew_sqlite` in one write transaction, on the loop's own thread when it can
    (`Store.write_on_loop`)."""
    now = store.now()
    return await store.write_on_loop(lambda session: _renew_sqlite(session, items, now))


def _renew_sqlite(session: Session, items: list[RenewalIn], now: dt.datetime) -> list[RenewalOut]:
    """Write many renewals in one transaction: one executemany of the fenced UPDATE.

    Which renewals took effect is read back in the same transaction: an accepted renewal left its
    attempt with exactly the expiry this batch computed (every batch has its own `now`, later than
    any expiry written before, so an old expiry never equals a new one). A renewal of a task whose
    cancel was requested is not extended (the host is revoked instead), so a cancelled task ends
    at the latest when its current lease runs out.
    """
    out: list[RenewalOut | None] = [None] * len(items)
    renewed_tasks: set[str] = set()
    rows = session.execute(
        select(TaskRow.task_id, TaskRow.lease_seconds).where(
            TaskRow.task_id.in_({i.task_id for i in items})
        )
    )
    lease_by_task: dict[str, float] = {task_id: seconds for task_id, seconds in rows}
    plain: list[dict[str, object]] = []
    with_progress: list[dict[str, object]] = []
    expected: dict[int, dt.datetime] = {}
    for n, item in enumerate(items):
        seconds = lease_by_task.get(item.task_id)
        if seconds is None:
            out[n] = RenewalOut(None, Revocation.UNKNOWN, "unknown task")
            continue
        expires = now + dt.timedelta(seconds=seconds)
        expected[n] = expires
        params: dict[str, object] = {
            "r_task": item.task_id,
            "r_attempt": item.attempt,
            "r_lease": item.lease_id,
            "r_host": item.host_id,
            "r_now": now,
            "r_expires": expires,
            "r_counts": item.counts,
        }
        if item.progress is None:
            plain.append(params)
        else:
            params.update(
                r_step_index=item.progress.step_index,
                r_step_status=item.progress.step_status,
                r_summary=item.progress.summary,
                r_max_steps=item.progress.max_steps,
            )
            with_progress.append(params)
    conn = session.connection()
    if plain:
        conn.execute(_RENEW, plain)
    if with_progress:
        conn.execute(_RENEW_WITH_PROGRESS, with_progress)
    live: dict[tuple[str, int, str, str], dt.datetime] = {}
    if expected:
        found = session.execute(
            select(
                AttemptRow.task_id,
                AttemptRow.attempt,
                AttemptRow.lease_id,
                AttemptRow.host_id,
                AttemptRow.lease_expires_at,
            ).where(
                AttemptRow.task_id.in_({items[n].task_id for n in expected}),
                AttemptRow.ended_at.is_(None),
            )
        )
        live = {(t, a, lease, h): e for t, a, lease, h, e in found}
    for n, expires in expected.items():
        item = items[n]
        if live.get((item.task_id, item.attempt, item.lease_id, item.host_id)) == expires:
            out[n] = RenewalOut(expires, written=True)
            renewed_tasks.add(item.task_id)
        else:
            reason, message = classify_sync(
                session, item.host_id, item.task_id, item.attempt, item.lease_id, now
            )
            out[n] = RenewalOut(None, reason, message)
    if renewed_tasks:
        session.execute(
            update(TaskRow)
            .where(TaskRow.task_id.in_(renewed_tasks))
            .values(
                updated_at=now,
                status=case(
                    (TaskRow.status == states.ASSIGNED, states.RUNNING),
                    else_=TaskRow.status,
                ),
            )
            .execution_options(synchronize_session=False)
        )
    return [o for o in out if o is not None]


# One statement for a whole renewal batch on PostgreSQL. The batch arrives as parallel arrays
# (one bound parameter each, whatever the batch size, so the statement text never changes and
# is prepared once per connection). Each item finds its attempt through a LATERAL lookup on the
# unique (task_id, attempt) index with the full fence (lease, host, not ended, not expired; its
# task exists and has no cancel requested) and locks it FOR UPDATE, which re-checks the fence on
# the newest row version if a sweeper or result got there first. The LATERAL form makes every
# plan item-driven: a plain UPDATE ... FROM unnest(...) join was planned (generic plan, live
# attempts estimated at 1 row) as a nested loop over all live attempts rescanning the whole
# batch for each, ~60 ms per batch of 500 (pg_stat_statements, auto_explain). The UPDATE then
# writes the locked rows by primary key (`= ANY(ARRAY(...))` keeps that an index scan, not a
# hash join over the whole table) and RETURNs them: the authoritative list of accepted
# renewals, no read-back needed. `touched` updates the renewed tasks (updated_at, ASSIGNED ->
# RUNNING) by primary key after their attempts, the lock order every writer uses.
_RENEW_BATCH_PG = (
    text(
        """
WITH live AS (
    SELECT x.id, x.lease_seconds, i.has_progress, i.step_index, i.step_status, i.summary,
           i.max_steps, i.counts
    FROM unnest(
        CAST(:task_ids AS varchar[]), CAST(:attempts AS integer[]),
        CAST(:lease_ids AS varchar[]), CAST(:host_ids AS varchar[]),
        CAST(:has_progress AS boolean[]), CAST(:step_indexes AS integer[]),
        CAST(:step_statuses AS integer[]), CAST(:summaries AS varchar[]),
        CAST(:max_steps AS integer[]), CAST(:counts AS integer[])
    ) AS i(task_id, attempt, lease_id, host_id, has_progress, step_index, step_status, summary,
           max_steps, counts)
    CROSS JOIN LATERAL (
        SELECT attempts.id, tasks.lease_seconds
        FROM attempts JOIN tasks ON tasks.task_id = attempts.task_id
        WHERE attempts.task_id = i.task_id
          AND attempts.attempt = i.attempt
          AND attempts.lease_id = i.lease_id
          AND attempts.host_id = i.host_id
          AND attempts.ended_at IS NULL
          AND attempts.lease_expires_at > CAST(:now AS timestamptz)
          AND tasks.cancel_requested IS NOT TRUE
        FOR UPDATE OF attempts
    ) AS x
), renewed AS (
    UPDATE attempts AS a
    SET lease_expires_at = CAST(:now AS timestamptz) + make_interval(secs => l.lease_seconds),
        status = :running,
        renewals = a.renewals + l.counts,
        first_renewed_at = COALESCE(a.first_renewed_at, CAST(:now AS timestamptz)),
        last_renewed_at = CAST(:now AS timestamptz),
        step_index = CASE WHEN l.has_progress THEN l.step_index ELSE a.step_index END,
        step_status = CASE WHEN l.has_progress THEN l.step_status ELSE a.step_status END,
        summary = CASE WHEN l.has_progress THEN l.summary ELSE a.summary END,
        max_steps = CASE WHEN l.has_progress THEN l.max_steps ELSE a.max_steps END,
        progress_updated_at = CASE WHEN l.has_progress THEN CAST(:now AS timestamptz)
                                   ELSE a.progress_updated_at END
    FROM live AS l
    WHERE a.id = ANY(ARRAY(SELECT id FROM live)) AND a.id = l.id
    RETURNING a.task_id, a.attempt, a.lease_id, a.host_id, a.lease_expires_at
), touched AS (
    UPDATE tasks
    SET updated_at = CAST(:now AS timestamptz),
        status = CASE WHEN tasks.status = :assigned THEN :running ELSE tasks.status END
    WHERE tasks.task_id = ANY(ARRAY(SELECT task_id FROM renewed))
)
SELECT task_id, attempt, lease_id, host_id, lease_expires_at FROM renewed
"""
    )
    .bindparams(
        bindparam("now", type_=UTCDateTime()),
        bindparam("running", value=states.RUNNING, type_=String()),
        bindparam("assigned", value=states.ASSIGNED, type_=String()),
    )
    .columns(
        column("task_id", String()),
        column("attempt", Integer()),
        column("lease_id", String()),
        column("host_id", String()),
        column("lease_expires_at", UTCDateTime()),
    )
)


async def _renew_batch_pg(store: Store, items: list[RenewalIn]) -> list[RenewalOut]:
    """The batch as one round trip: `_RENEW_BATCH_PG` with the items as arrays.

    A renewal is accepted when the statement returned its (task, attempt, lease, host); every
    other one is classified (expired, revoked, superseded, cancelled, unknown...) in the same
    transaction, as on SQLite. The same lease twice in one batch is written once, with the last
    progress (as the executemany's second UPDATE would leave it) and both renewals counted, and
    both callers get the expiry.
    """
    now = store.now()
    last: dict[tuple[str, int, str, str], RenewalIn] = {}
    counts: dict[tuple[str, int, str, str], int] = {}
    for item in items:
        key = lease_key(item)
        last[key] = item
        counts[key] = counts.get(key, 0) + item.counts
    # Sorted, so concurrent batches (other replicas) lock shared rows in the same order.
    unique = [last[key] for key in sorted(last)]
    params: dict[str, object] = {
        "now": now,
        "task_ids": [i.task_id for i in unique],
        "attempts": [i.attempt for i in unique],
        "lease_ids": [i.lease_id for i in unique],
        "host_ids": [i.host_id for i in unique],
        "has_progress": [i.progress is not None for i in unique],
        "step_indexes": [None if i.progress is None else i.progress.step_index for i in unique],
        "step_statuses": [None if i.progress is None else i.progress.step_status for i in unique],
        "summaries": [None if i.progress is None else i.progress.summary for i in unique],
        "max_steps": [None if i.progress is None else i.progress.max_steps for i in unique],
        "counts": [counts[lease_key(i)] for i in unique],
    }
    async with store.write() as session:
        conn = await session.connection()
        renewed: dict[tuple[str, int, str, str], dt.datetime] = {
            (t, a, lease, h): e for t, a, lease, h, e in await conn.execute(_RENEW_BATCH_PG, params)
        }
        out: list[RenewalOut] = []
        for item in items:
            expires = renewed.get((item.task_id, item.attempt, item.lease_id, item.host_id))
            if expires is not None:
                out.append(RenewalOut(expires, written=True))
                continue
            reason, message = await classify(
                session, item.host_id, item.task_id, item.attempt, item.lease_id, now
            )
            out.append(RenewalOut(None, reason, message))
    return out

"""Fenced renewals, in batches: one read for many hosts' renewals, a write only where needed.

A batch is first read (`_read_live`: one statement, no transaction to commit, no lock): a renewal
whose lease the read finds live, far from expiry (at least `write_below` of its length left),
already running and with the progress it carries already stored is acknowledged with the stored
expiry and writes nothing (docs/decisions/0070-renewals-without-writes.md). Every other renewal is
written, fenced: on PostgreSQL one statement for the batch (`_renew_batch_pg`), on SQLite one
fenced UPDATE per renewal in one transaction (`_renew_batch_sqlite`), both in the driver's own
terms on connections of the store's own (decision 0073). Both apply the same fence
(`fence.live_fence`) to each renewal on its own, so a stale one is refused (and classified)
without failing the others in its batch. The read also says whether a write only extends the
lease (`Must.EXTEND`), only brings new progress (`Must.PROGRESS`) or starts the attempt
(`Must.START`), which watchers are told without reloading the task. A written renewal far from
expiry keeps its stored expiry (`write_renewals`), so only a lease near expiry moves its row in
the expiry index.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import functools
import json
import sqlite3
from collections.abc import Container
from typing import Any, NamedTuple

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    Row,
    String,
    column,
    text,
)
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from cloud.store import states
from cloud.store.database import RENEWAL_LOCK_TIMEOUT_MS, DriverConnection, Store
from cloud.store.leases.fence import Revocation, classify
from cloud.store.leases.progress import ProgressIn
from cloud.store.lock_waits import lock_timed_out
from cloud.store.models import UTCDateTime, sqlite_text


class Must(enum.Enum):
    """Why a renewal must be written (`answer_from_read`)."""

    #: Something else may change, or the read cannot tell (a write of its lease is pending, or
    #: its lease renews twice in the batch with news): watchers reload the task.
    NEWS = "news"
    #: The first renewal of its attempt: the attempt and its task turn RUNNING, its progress
    #: (if it carries any) and expiry move; watchers are told all of it, nothing to reload.
    START = "start"
    #: Only its progress and its lease's expiry move: watchers are told both, nothing to reload.
    PROGRESS = "progress"
    #: Only its lease's expiry moves: watchers are told the new expiry, nothing to reload.
    EXTEND = "extend"


class RenewalIn(NamedTuple):
    """One renewal to write. NamedTuples, this and `RenewalOut`, not frozen dataclasses: each
    renewal builds one of each, and a frozen dataclass's `__init__` (one `object.__setattr__`
    per field) cost 4-5 us against 1.3 (docs/benchmarks.md, twenty-fourth pass)."""

    host_id: str
    task_id: str
    attempt: int
    lease_id: str
    progress: ProgressIn | None
    #: Renewals this write stands for in the attempt's count (`renewals`): itself and those of
    #: its lease answered from a read since its last write (decision 0070).
    counts: int = 1
    #: Why it is written (`answer_from_read`): what watchers are told of it.
    must: Must = Must.NEWS


class RenewalOut(NamedTuple):
    """Outcome: a new expiry, or why the lease is gone (with a message for the host)."""

    expires_at: dt.datetime | None
    revocation: Revocation | None = None
    message: str = ""
    #: The task's status when refused ("" when not the caller's to know: `fence.Refusal`).
    task_status: str = ""
    #: The renewal changed the stored attempt (expiry, progress or status): watchers may care.
    written: bool = False
    #: When a written renewal was written (the task's `updated_at`).
    renewed_at: dt.datetime | None = None
    #: Neither renewed nor refused: its lease's rows stayed locked past the write's lock
    #: timeout (PostgreSQL's LockNotAvailable). The caller raises it: the host is told to
    #: retry (UNAVAILABLE), its lease untouched.
    error: Exception | None = None


# SQLite's renewal write in the driver's own SQL, each statement prepared once by sqlite3 and
# bound in C. Through SQLAlchemy (statements built and compiled per batch, parameters processed
# in Python, ORM result rows) a batch of four written renewals cost ~1 ms of CPU on the loop's
# thread for ~0.25 ms of SQLite work (bench/lease_capacity.py). The fence is `fence.live_fence`
# plus "no cancel requested", in the statement that writes.
#
# SQLite rewrites an index entry whenever an UPDATE assigns one of its columns, even to the value
# it had: the index's pages are written to the WAL like any changed page. A renewal that keeps its
# expiry is therefore written without assigning it (`_SQLITE_RENEW_KEEP`, so the live-expiry index
# is left alone), and only a task that is still ASSIGNED has its status set. Assigning both every
# time wrote 19.5 WAL pages per transaction of four renewals instead of 7.9, and took 306 instead
# of 209 us (docs/benchmarks.md, nineteenth pass). What each renewal needs is read first, inside
# the write transaction (`BEGIN IMMEDIATE`: no other writer can change it before the commit).
_SQLITE_BATCH_STATE = """
SELECT t.task_id, t.lease_seconds, t.status, a.lease_expires_at
FROM json_each(?) AS b CROSS JOIN tasks AS t ON t.task_id = b.value
LEFT JOIN attempts AS a ON a.task_id = t.task_id AND a.ended_at IS NULL
"""
_SQLITE_RENEW_SET = f"""
    status = '{states.RUNNING}', renewals = renewals + :counts,
    first_renewed_at = coalesce(first_renewed_at, :now), last_renewed_at = :now,
    step_index = CASE WHEN :progress THEN :step_index ELSE step_index END,
    step_status = CASE WHEN :progress THEN :step_status ELSE step_status END,
    summary = CASE WHEN :progress THEN :summary ELSE summary END,
    max_steps = CASE WHEN :progress THEN :max_steps ELSE max_steps END,
    progress_updated_at = CASE WHEN :progress THEN :now ELSE progress_updated_at END
"""
_SQLITE_RENEW_FENCE = """
WHERE task_id = :task AND attempt = :attempt AND lease_id = :lease AND host_id = :host
  AND ended_at IS NULL AND lease_expires_at > :now
  AND NOT EXISTS (
    SELECT 1 FROM tasks WHERE tasks.task_id = attempts.task_id AND tasks.cancel_requested IS 1
  )
"""
_SQLITE_RENEW = f"""
UPDATE attempts
SET lease_expires_at = CASE WHEN lease_expires_at >= :keep_until THEN lease_expires_at
                            ELSE :expires END,
{_SQLITE_RENEW_SET}{_SQLITE_RENEW_FENCE}RETURNING lease_expires_at
"""
#: `_SQLITE_RENEW` for a lease far enough from expiry that its expiry is kept: the same row
#: written, the expiry not assigned (no row when it is not that far after all).
_SQLITE_RENEW_KEEP = f"""
UPDATE attempts SET
{_SQLITE_RENEW_SET}{_SQLITE_RENEW_FENCE}  AND lease_expires_at >= :keep_until
RETURNING lease_expires_at
"""
_SQLITE_TOUCH_TASKS = (
    "UPDATE tasks SET updated_at = ? WHERE task_id IN (SELECT value FROM json_each(?))"
)
#: For the renewed tasks `_SQLITE_BATCH_STATE` found ASSIGNED. The CASE still guards the change
#: (should the read have run outside the transaction: the async engine's fallback begins at the
#: first write); as a condition, `status = 'ASSIGNED'` took SQLite's planner to the status index,
#: every ASSIGNED task of the fleet read for each batch while a fleet starts.
_SQLITE_START_TASKS = f"""
UPDATE tasks
SET status = CASE WHEN status = '{states.ASSIGNED}' THEN '{states.RUNNING}' ELSE status END
WHERE task_id IN (SELECT value FROM json_each(?))
"""
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
    column("task_status", String()),
)
_LIVE_SELECT = """
SELECT a.task_id, a.attempt, a.lease_id, a.host_id, a.lease_expires_at, a.status, a.step_index,
       a.step_status, a.summary, a.max_steps, t.lease_seconds, t.cancel_requested,
       t.status AS task_status
"""
# SQLite: the batch's ids drive the join (the left side of a CROSS JOIN is SQLite's outer loop).
# Left to itself, SQLite's planner (no statistics) took `ended_at IS NULL` to the live-expiry
# index and read every live attempt of the fleet for each batch: 23 us per renewal at 2,000
# live leases, growing with the fleet, against 3 us this way (bench/lease_capacity.py).
_LIVE_SQLITE_FROM = """FROM json_each({ids}) AS batch
CROSS JOIN attempts AS a ON a.task_id = batch.value
JOIN tasks AS t ON t.task_id = a.task_id
WHERE a.ended_at IS NULL
"""
_LIVE_SQLITE = text(_LIVE_SELECT + _LIVE_SQLITE_FROM.format(ids=":task_ids")).columns(
    *_LIVE_COLUMNS
)
_LIVE_SQLITE_TEXT = _LIVE_SELECT + _LIVE_SQLITE_FROM.format(ids="?")
# PostgreSQL: the ids as one comma-joined text, split by the server; "not ended" in a form no
# partial index of live attempts answers (see `_RENEW_BATCH_PG`). As an array parameter
# psycopg dumped each id in Python: 4 % of a 10,000-host replica's CPU for batches of five
# (bench/fleet_scale.py). An id with a comma in it (none is ever stored) is looked up in
# pieces and found under no id of the batch, so its renewal is written, fenced, as unknown.
# Each id drives a lookup of its own (a LATERAL subquery, kept one by `OFFSET 0`), so the plan
# is a key lookup per renewal whatever the statistics say. As `task_id = ANY(...)` the generic
# plan of a connection that first ran it before the tables were analysed (a new deployment, a
# fleet that just grew) scanned every attempt for each batch: 2.8-3.7 ms per batch of ten at
# 2,000 leases against 0.19-0.21 after an ANALYZE; this way 0.23-0.34 before and 0.20-0.23
# after (docs/benchmarks.md, eighteenth pass).
_LIVE_PG_FROM = """FROM unnest(string_to_array(CAST({ids} AS text), ',')) AS batch(id)
CROSS JOIN LATERAL (
    SELECT task_id, attempt, lease_id, host_id, lease_expires_at, status, step_index,
           step_status, summary, max_steps
    FROM attempts WHERE attempts.task_id = batch.id AND (attempts.ended_at IS NULL) IS TRUE
    OFFSET 0
) AS a
JOIN tasks AS t ON t.task_id = a.task_id
"""
_LIVE_PG = text(_LIVE_SELECT + _LIVE_PG_FROM.format(ids=":task_ids")).columns(*_LIVE_COLUMNS)
_LIVE_PG_TEXT = _LIVE_SELECT + _LIVE_PG_FROM.format(ids="%s")

_Key = tuple[str, int, str, str]


class _Live(NamedTuple):
    """A live attempt as `_LIVE_SELECT` reads it (the fields of its SQLAlchemy row)."""

    task_id: str
    attempt: int
    lease_id: str
    host_id: str
    lease_expires_at: dt.datetime
    status: str
    step_index: int | None
    step_status: int | None
    summary: str | None
    max_steps: int | None
    lease_seconds: float
    cancel_requested: bool
    task_status: str


@functools.lru_cache(maxsize=32_768)
def _stored_expiry(stored: str) -> dt.datetime:
    """A lease's expiry as SQLite stores it (`models.sqlite_text`), parsed once per value: most
    renewals keep their lease's stored expiry (decision 0070), so each batch read finds the
    same texts again, and parsing one cost ~4 us against ~0.5 for the cache (timeit, twenty-
    fifth pass). The size holds a large fleet's live expiries; datetimes are immutable, so
    handing one out twice is safe."""
    return dt.datetime.fromisoformat(stored).replace(tzinfo=dt.UTC)


def _live_from_sqlite(row: tuple[Any, ...]) -> _Live:
    """A driver row of `_LIVE_SQLITE` with SQLite's text and integers made the columns' types."""
    return _Live(
        row[0],
        row[1],
        row[2],
        row[3],
        _stored_expiry(row[4]),
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        bool(row[11]),  # cancel_requested
        row[12],
    )


async def _read_live(store: Store, task_ids: list[str]) -> dict[str, _Live | Row[Any]]:
    """The live attempt of each of `task_ids` (at most one per task), as one committed snapshot.

    Not a write transaction: on SQLite it does not wait for the store's write lock (WAL readers
    never block the writer) and runs on the loop's own thread (`Store.loop_connection`), on
    PostgreSQL in autocommit on the store's own connection (`Store.direct_reads`); both in the
    driver's own terms (SQLAlchemy's statement and row handling cost more than the read)."""
    if store.direct_reads is not None:
        found = await store.direct_reads.run(_LIVE_PG_TEXT, (",".join(task_ids),), resend=True)
        if found is not None:
            return {row[0]: _Live._make(row) for row in found}
    ids = json.dumps(task_ids)
    if store.loop_connection is not None:
        # Busy for a moment (OperationalError): read the usual way below.
        with contextlib.suppress(OperationalError, sqlite3.OperationalError):
            cursor = store.loop_driver().cursor()
            try:
                cursor.execute(_LIVE_SQLITE_TEXT, (ids,))
                return {row[0]: _live_from_sqlite(row) for row in cursor.fetchall()}
            finally:
                cursor.close()  # the statement reset: no read left open on the connection
    async with store.engine.connect() as conn:
        if store.is_postgres:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            rows = await conn.execute(_LIVE_PG, {"task_ids": ",".join(task_ids)})
        else:
            rows = await conn.execute(_LIVE_SQLITE, {"task_ids": ids})
        return {row.task_id: row for row in rows}


def _mine(row: _Live | Row[Any], item: RenewalIn) -> bool:
    """True when `row` is `item`'s live lease (lease, host, not ended, no cancel requested; the
    read found it unexpired)."""
    return (
        row.attempt == item.attempt
        and row.lease_id == item.lease_id
        and row.host_id == item.host_id
        and not row.cancel_requested
    )


def _starts(row: _Live | Row[Any]) -> bool:
    """The lease's first renewal: its attempt and task are still ASSIGNED (both turn RUNNING)."""
    return row.status == states.ASSIGNED and row.task_status == states.ASSIGNED


def _same_progress(row: _Live | Row[Any], item: RenewalIn) -> bool:
    """The progress the renewal carries (if any) is the one stored."""
    p = item.progress
    return p is None or (
        (row.step_index, row.step_status, row.summary, row.max_steps)
        == (p.step_index, p.step_status, p.summary, p.max_steps)
    )


def _far(row: _Live | Row[Any], now: dt.datetime, write_below: float) -> bool:
    """At least `write_below` of the lease's length is left."""
    return (row.lease_expires_at - now).total_seconds() >= write_below * row.lease_seconds


def lease_key(item: RenewalIn) -> tuple[str, int, str, str]:
    """Which lease a renewal is for: (task, attempt, lease id, host)."""
    return (item.task_id, item.attempt, item.lease_id, item.host_id)


async def answer_from_read(
    store: Store,
    items: list[RenewalIn],
    write_below: float,
    pending: Container[tuple[str, int, str, str]] = (),
) -> list[RenewalOut | Must]:
    """Read the batch's live attempts once; each renewal's outcome if it needs no write
    (`_mine`, RUNNING, `_same_progress` and `_far`: the stored expiry, nothing written), else
    why it must be written: `Must.EXTEND` when only its expiry is near, `Must.PROGRESS` when its
    progress is new and nothing else changes, `Must.START` when it is its attempt's first,
    `Must.NEWS` otherwise.

    A renewal of a lease in `pending` (renewals of it queued for writing) or of a lease that
    another renewal in this batch must write is written too: a lease's renewals are written in
    the order they came, so the last progress acknowledged is the one stored. Such a renewal is
    news if a pending write may change the row this read saw, or if its lease starts or has new
    progress and more than one renewal in the batch (which of them a watcher last hears of would
    then depend on the order of the events, not of the writes); otherwise it is a start or a
    progress change if any renewal of its lease in the batch is one, else an extension.
    """
    if not items:
        return []
    now = store.now()
    live = await _read_live(store, sorted({i.task_id for i in items}))
    extend: set[_Key] = set()
    progress: set[_Key] = set()
    start: set[_Key] = set()
    news: set[_Key] = set()
    kept: dict[int, dt.datetime] = {}
    seen: set[_Key] = set()
    twice: set[_Key] = set()
    for n, item in enumerate(items):
        row = live.get(item.task_id)
        key = lease_key(item)
        if key in seen:
            twice.add(key)
        seen.add(key)
        if key in pending or row is None or not _mine(row, item):
            news.add(key)
        elif _starts(row):
            start.add(key)
        elif row.status != states.RUNNING:
            news.add(key)
        elif not _same_progress(row, item):
            progress.add(key)
        elif _far(row, now, write_below):
            kept[n] = row.lease_expires_at
        else:
            extend.add(key)
    news |= (start | progress) & twice
    out: list[RenewalOut | Must] = []
    for n, item in enumerate(items):
        key = lease_key(item)
        if key in news:
            out.append(Must.NEWS)
        elif key in start:
            out.append(Must.START)
        elif key in progress:
            out.append(Must.PROGRESS)
        elif key in extend:
            out.append(Must.EXTEND)
        else:
            out.append(RenewalOut(kept[n]))
    return out


async def write_renewals(
    store: Store, items: list[RenewalIn], write_below: float = ALWAYS_WRITE
) -> list[RenewalOut]:
    """Write many renewals in one transaction, each fenced on its own; outcomes in order.

    On PostgreSQL one statement (`_renew_batch_pg`), on SQLite one fenced UPDATE per renewal
    (`_renew_batch_sqlite`). Both apply the same fence; a refused renewal is classified.

    A written renewal whose lease still has at least `write_below` of its length left keeps
    its stored expiry, as a renewal answered from a read would (decision 0070): a start or new
    progress far from expiry is written without moving the expiry, so the write leaves every
    indexed column of the attempt as it was. On PostgreSQL that makes it a HOT update (the
    new row version on the same page, no index touched; migration 0014 leaves room on the
    pages for it) instead of a new entry in each of the attempt's five indexes.
    """
    if not items:
        return []
    if store.is_postgres:
        return await _renew_batch_pg(store, items, write_below)
    return await _renew_batch_sqlite(store, items, write_below)


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
    out: list[RenewalOut | Must] = [Must.NEWS] * len(items)
    if write_below < ALWAYS_WRITE:
        out = await answer_from_read(store, items, write_below)
    to_write = [n for n, o in enumerate(out) if isinstance(o, Must)]
    written = await write_renewals(store, [items[n] for n in to_write], write_below)
    for n, o in zip(to_write, written, strict=True):
        out[n] = o
    return [o for o in out if isinstance(o, RenewalOut)]


async def _renew_batch_sqlite(
    store: Store, items: list[RenewalIn], write_below: float
) -> list[RenewalOut]:
    """`_renew_sqlite` in one write transaction on the driver's connection, on the loop's own
    thread when it can (`Store.write_driver_on_loop`); a refused renewal is classified after
    the commit, in a read of its own (as on PostgreSQL: refusals are rare, the write is hot)."""
    now = store.now()
    written = await store.write_driver_on_loop(
        lambda conn: _renew_sqlite(conn, items, now, write_below)
    )
    return await _classified(store, items, written, now)


async def _classified(
    store: Store, items: list[RenewalIn], written: list[RenewalOut | None], now: dt.datetime
) -> list[RenewalOut]:
    """Each refused renewal (None) classified in a read of its own; a batch with none refused
    (nearly every batch) opens no session: an empty one cost the batch ~0.2 ms of the loop."""
    if all(out is not None for out in written):
        return [out for out in written if out is not None]
    async with store.read() as session:
        return await _why_refused(session, items, written, now)


async def _why_refused(
    session: AsyncSession,
    items: list[RenewalIn],
    written: list[RenewalOut | None],
    now: dt.datetime,
) -> list[RenewalOut]:
    """`written`, each refused renewal (None) replaced by why its lease is not live
    (`classify`, in `session`)."""
    outcomes: list[RenewalOut] = []
    for item, out in zip(items, written, strict=True):
        if out is None:
            why = await classify(
                session, item.host_id, item.task_id, item.attempt, item.lease_id, now
            )
            out = RenewalOut(None, why.revocation, why.message, why.task_status)
        outcomes.append(out)
    return outcomes


def _renew_sqlite(
    conn: DriverConnection, items: list[RenewalIn], now: dt.datetime, write_below: float
) -> list[RenewalOut | None]:
    """Write many renewals in one transaction, each fenced on its own (`_SQLITE_RENEW`), in
    the order they came: a renewal took effect when its UPDATE changed its attempt's row, and
    its expiry is the one the UPDATE left (moved, or kept when far: `write_renewals`). None for
    a renewal that was refused (not yet classified), or an unknown task's outcome.

    A renewal of a task whose cancel was requested is not extended (the host is revoked
    instead), so a cancelled task ends at the latest when its current lease runs out.

    A lease the transaction's first read finds far from expiry is written by
    `_SQLITE_RENEW_KEEP` (its condition re-checks that; if it finds no row, `_SQLITE_RENEW`
    decides, as for every other renewal), and only tasks that read found ASSIGNED are set
    RUNNING: the outcome of `_SQLITE_RENEW` and the old status CASE, without the index writes.
    """
    cursor = conn.cursor()
    try:
        cursor.execute(_SQLITE_BATCH_STATE, (json.dumps(sorted({i.task_id for i in items})),))
        state = {row[0]: row[1:] for row in cursor.fetchall()}
        now_text = sqlite_text(now)
        # By lease length (usually one): the new expiry, and the stored expiry at or after which
        # it is kept.
        expiry: dict[float, tuple[dt.datetime, str, str]] = {}
        out: list[RenewalOut | None] = [None] * len(items)
        renewed: set[str] = set()
        starting: set[str] = set()
        for n, item in enumerate(items):
            found = state.get(item.task_id)
            if found is None:
                out[n] = RenewalOut(None, Revocation.UNKNOWN, "unknown task")
                continue
            seconds, task_status, stored_expiry = found
            if seconds not in expiry:
                expires = now + dt.timedelta(seconds=seconds)
                keep = now + dt.timedelta(seconds=seconds * write_below)
                expiry[seconds] = (expires, sqlite_text(expires), sqlite_text(keep))
            expires, expires_text, keep_text = expiry[seconds]
            p = item.progress
            params = {
                "task": item.task_id,
                "attempt": item.attempt,
                "lease": item.lease_id,
                "host": item.host_id,
                "now": now_text,
                "expires": expires_text,
                "keep_until": keep_text,
                "counts": item.counts,
                "progress": p is not None,
                "step_index": None if p is None else p.step_index,
                "step_status": None if p is None else p.step_status,
                "summary": None if p is None else p.summary,
                "max_steps": None if p is None else p.max_steps,
            }
            stored = None
            if stored_expiry is not None and stored_expiry >= keep_text:
                cursor.execute(_SQLITE_RENEW_KEEP, params)
                stored = cursor.fetchone()
            if stored is None:
                cursor.execute(_SQLITE_RENEW, params)
                stored = cursor.fetchone()
            if stored is not None:
                at = (
                    expires
                    if stored[0] == expires_text
                    else dt.datetime.fromisoformat(stored[0]).replace(tzinfo=dt.UTC)
                )
                out[n] = RenewalOut(at, written=True, renewed_at=now)
                renewed.add(item.task_id)
                if task_status == states.ASSIGNED:
                    starting.add(item.task_id)
        if renewed:
            cursor.execute(_SQLITE_TOUCH_TASKS, (now_text, json.dumps(sorted(renewed))))
        if starting:
            cursor.execute(_SQLITE_START_TASKS, (json.dumps(sorted(starting)),))
    finally:
        cursor.close()
    return out


# One statement for a whole renewal batch on PostgreSQL. The batch arrives as one JSON array of
# items (one bound parameter whatever the batch size, so the statement text never changes and is
# prepared once per connection; as ten array parameters psycopg dumped every element in Python,
# for each batch). Each item finds its attempt through
# a LATERAL lookup on the unique (task_id, attempt) index with the full fence (lease, host, not
# ended, not expired; its task exists and has no cancel requested) and locks it FOR UPDATE, which
# re-checks the fence on the newest row version if a sweeper or result got there first. The
# LATERAL form makes every plan item-driven: a plain UPDATE ... FROM unnest(...) join was planned
# (generic plan, live attempts estimated at 1 row) as a nested loop over all live attempts
# rescanning the whole batch for each, ~60 ms per batch of 500 (pg_stat_statements, auto_explain).
# "Not ended" and "not expired" are tested as `(...) IS TRUE`, which neither a partial index of
# live attempts nor a range scan can answer, so each item is found by its (task_id, attempt)
# key. As plain conditions, the generic plan of a connection that first ran the statement on
# unanalysed tables (a new deployment's first minute) looked each item up through the
# live-expiry index, built on the empty table and so believed empty: every live lease read for
# each item, 400-570 us per written renewal at 2,000 leases instead of 65-105
# (tests/cloud/test_query_plans.py, docs/benchmarks.md ninth pass).
# The UPDATE then writes the locked rows by primary key (`= ANY(ARRAY(...))` keeps that an index
# scan, not a hash join over the whole table) and RETURNs them: the authoritative list of accepted
# renewals with the expiry each now has (moved, or kept when far: `write_renewals`), no
# read-back needed. `touched` updates the renewed tasks (updated_at, ASSIGNED ->
# RUNNING) by primary key after their attempts, the lock order every writer uses.
# In psycopg's placeholders: the same text runs on the store's own connection
# (`Store.direct_writes`: in autocommit one round trip, its own transaction) or, when that cannot
# be used, through the pool in a transaction (`exec_driver_sql`), with a `lock_timeout`
# (`RENEWAL_LOCK_TIMEOUT_MS`) either way: one row held in another open transaction would
# otherwise stall the whole batch. A batch that times out is written again one item at a time
# with this same text (`_one_by_one`), and only a lease whose rows stay locked is told to retry.
_RENEW_BATCH_PG = """
WITH live AS (
    SELECT x.id, x.lease_seconds, i.has_progress, i.step_index, i.step_status, i.summary,
           i.max_steps, i.counts
    FROM json_to_recordset(CAST(%(items)s AS json)) AS i(
        task_id varchar, attempt integer, lease_id varchar, host_id varchar,
        has_progress boolean, step_index integer, step_status integer, summary varchar,
        max_steps integer, counts integer
    )
    CROSS JOIN LATERAL (
        SELECT attempts.id, tasks.lease_seconds
        FROM attempts JOIN tasks ON tasks.task_id = attempts.task_id
        WHERE attempts.task_id = i.task_id
          AND attempts.attempt = i.attempt
          AND attempts.lease_id = i.lease_id
          AND attempts.host_id = i.host_id
          AND (attempts.ended_at IS NULL) IS TRUE
          AND (attempts.lease_expires_at > CAST(%(now)s AS timestamptz)) IS TRUE
          AND tasks.cancel_requested IS NOT TRUE
        FOR UPDATE OF attempts
    ) AS x
), renewed AS (
    UPDATE attempts AS a
    SET lease_expires_at = CASE
            WHEN a.lease_expires_at >= CAST(%(now)s AS timestamptz)
                                       + make_interval(secs => %(keep)s * l.lease_seconds)
            THEN a.lease_expires_at
            ELSE CAST(%(now)s AS timestamptz) + make_interval(secs => l.lease_seconds)
        END,
        status = %(running)s,
        renewals = a.renewals + l.counts,
        first_renewed_at = COALESCE(a.first_renewed_at, CAST(%(now)s AS timestamptz)),
        last_renewed_at = CAST(%(now)s AS timestamptz),
        step_index = CASE WHEN l.has_progress THEN l.step_index ELSE a.step_index END,
        step_status = CASE WHEN l.has_progress THEN l.step_status ELSE a.step_status END,
        summary = CASE WHEN l.has_progress THEN l.summary ELSE a.summary END,
        max_steps = CASE WHEN l.has_progress THEN l.max_steps ELSE a.max_steps END,
        progress_updated_at = CASE WHEN l.has_progress THEN CAST(%(now)s AS timestamptz)
                                   ELSE a.progress_updated_at END
    FROM live AS l
    WHERE a.id = ANY(ARRAY(SELECT id FROM live)) AND a.id = l.id
    RETURNING a.task_id, a.attempt, a.lease_id, a.host_id, a.lease_expires_at
), touched AS (
    UPDATE tasks
    SET updated_at = CAST(%(now)s AS timestamptz),
        status = CASE WHEN tasks.status = %(assigned)s THEN %(running)s ELSE tasks.status END
    WHERE tasks.task_id = ANY(ARRAY(SELECT task_id FROM renewed))
)
SELECT task_id, attempt, lease_id, host_id, lease_expires_at FROM renewed
"""


async def _renew_batch_pg(
    store: Store, items: list[RenewalIn], write_below: float
) -> list[RenewalOut]:
    """The batch as one statement: `_RENEW_BATCH_PG` with the items as arrays, on the store's
    own connection when it can (one round trip), else through the pool.

    A renewal is accepted when the statement returned its (task, attempt, lease, host); every
    other one is classified (expired, revoked, superseded, cancelled, unknown...) afterwards,
    in the pool's transaction or (on the store's own connection, where the statement committed
    by itself) in a read of its own, opened only when one was refused. The same lease twice
    in one batch is written once, with the last progress (as SQLite's second UPDATE would
    leave it) and both renewals counted, and both callers get the expiry.
    """
    import psycopg  # PostgreSQL's path only: a cloud on SQLite never loads it (`pg_driver`)

    now = store.now()
    last: dict[tuple[str, int, str, str], RenewalIn] = {}
    counts: dict[tuple[str, int, str, str], int] = {}
    for item in items:
        key = lease_key(item)
        last[key] = item
        counts[key] = counts.get(key, 0) + item.counts
    # Sorted, so concurrent batches (other replicas) lock shared rows in the same order.
    unique = [last[key] for key in sorted(last)]
    rows: list[dict[str, object]] = []
    for i in unique:
        p = i.progress
        rows.append(
            {
                "task_id": i.task_id,
                "attempt": i.attempt,
                "lease_id": i.lease_id,
                "host_id": i.host_id,
                "has_progress": p is not None,
                "step_index": None if p is None else p.step_index,
                "step_status": None if p is None else p.step_status,
                "summary": None if p is None else p.summary,
                "max_steps": None if p is None else p.max_steps,
                "counts": counts[lease_key(i)],
            }
        )
    params: dict[str, object] = {
        "now": now,
        "items": _items_json(rows),
        "keep": write_below,
        "running": states.RUNNING,
        "assigned": states.ASSIGNED,
    }
    try:
        done = await _run_renew_pg(store, params)
    except (OperationalError, psycopg.errors.LockNotAvailable) as exc:
        if not lock_timed_out(exc):
            raise
        return await _one_by_one(store, items, list(zip(unique, rows, strict=True)), params)
    return await _classified(store, items, _renewed(items, done, now), now)


def _items_json(rows: list[dict[str, object]]) -> str:
    """`_RENEW_BATCH_PG`'s items parameter: one JSON array."""
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"))


async def _run_renew_pg(store: Store, params: dict[str, object]) -> list[tuple[Any, ...]]:
    """`_RENEW_BATCH_PG`'s rows, committed: on the store's own connection (its
    `lock_timeout` set when it connects) when it can, else through the pool in a transaction
    with the same `lock_timeout` (`SET LOCAL`: a round trip more, on this rare path only).
    A row locked past it fails the statement with LockNotAvailable (through the pool wrapped
    in SQLAlchemy's OperationalError), nothing of it written."""
    direct = store.direct_writes
    done = None if direct is None else await direct.run(_RENEW_BATCH_PG, params, resend=False)
    if done is not None:
        return done
    async with store.write() as session:
        conn = await session.connection()
        await conn.exec_driver_sql(f"SET LOCAL lock_timeout = {RENEWAL_LOCK_TIMEOUT_MS}")
        found = (await conn.exec_driver_sql(_RENEW_BATCH_PG, params)).all()
        return [tuple(row) for row in found]


async def _one_by_one(
    store: Store,
    items: list[RenewalIn],
    rows: list[tuple[RenewalIn, dict[str, object]]],
    params: dict[str, object],
) -> list[RenewalOut]:
    """The batch whose statement timed out on a row lock, written again one lease at a time
    (the same statement and plan, one item each, the same lock timeout), so that only the
    renewals of a lease whose rows stay locked fail: each of those is answered with the
    LockNotAvailable (the lease service's UNAVAILABLE, "retry"; the host keeps its lease and
    renews again), never refused, since nothing says its lease is gone. Every other renewal is
    written or refused and classified as in the batch. Each write is fenced at its own `now`
    (the batch's is a lock timeout old by then: a lease that ran out meanwhile is refused, as
    it would be in the next batch). A lease's renewals are one item, so its count and last
    progress are written together or not at all."""
    import psycopg  # PostgreSQL's path only (`_renew_batch_pg`)

    outcome: dict[_Key, RenewalOut] = {}
    for lease, row in rows:
        now = store.now()
        try:
            found = await _run_renew_pg(store, {**params, "now": now, "items": _items_json([row])})
        except (OperationalError, psycopg.errors.LockNotAvailable) as exc:
            if not lock_timed_out(exc):
                raise
            outcome[lease_key(lease)] = RenewalOut(None, error=exc)
            continue
        for t, a, lease_id, h, expires in found:
            at = expires.astimezone(dt.UTC)
            outcome[(t, a, lease_id, h)] = RenewalOut(at, written=True, renewed_at=now)
    written = [outcome.get(lease_key(item)) for item in items]
    return await _classified(store, items, written, store.now())


def _renewed(
    items: list[RenewalIn], rows: list[tuple[Any, ...]], now: dt.datetime
) -> list[RenewalOut | None]:
    """Each item's outcome from the rows `_RENEW_BATCH_PG` returned: the new expiry, or None
    when its renewal was refused (not yet classified)."""
    renewed = {(t, a, lease, h): e.astimezone(dt.UTC) for t, a, lease, h, e in rows}
    out: list[RenewalOut | None] = []
    for item in items:
        expires = renewed.get((item.task_id, item.attempt, item.lease_id, item.host_id))
        out.append(None if expires is None else RenewalOut(expires, written=True, renewed_at=now))
    return out

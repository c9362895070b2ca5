"""Renewals that write nothing (decision 0070): one test per invariant, on both backends.

A renewal whose lease is live, far from expiry, already running and whose progress is already
stored is answered from a read. Each test below states the invariant it holds, and drives
`leases.renew_batch` with `write_below` set as the replica sets it, so the read path is the one
deciding. "Another replica" is a second Store on the same database: its own engine and pool,
as a second cloud process on the same PostgreSQL (or SQLite file) has.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from sqlalchemy import create_engine, event, select, text, update
from sqlalchemy.ext.asyncio import create_async_engine

from cloud import metrics
from cloud.boundary import status_for
from cloud.events import EventBus
from cloud.lease.batcher import RenewalBatcher
from cloud.settings import CloudSettings
from cloud.store import convert, leases, states, tasks
from cloud.store.database import Store, libpq_dsn
from cloud.store.engine import sqlite_loop_connection
from cloud.store.models import AttemptRow, TaskRow
from tests.cloud.sqlite_trace import trace

#: Write when less than half the lease is left (the tests set the margin themselves).
HALF = 0.5
LEASE_S = 30.0


@pytest.fixture
async def other(store: Store, db_url: str) -> AsyncIterator[Store]:
    """Another replica's store on the same database."""
    s = Store.from_url(db_url)
    try:
        yield s
    finally:
        await s.close()


async def _lease(store: Store, host_id: str = "h1", serial: str = "p") -> leases.Claimed:
    """A submitted task claimed by `host_id`, its first renewal written (status RUNNING)."""
    await tasks.submit(
        store,
        tasks.NewTask(goal="g", max_attempts=3, lease_seconds=LEASE_S, timeout_seconds=3600),
    )
    claimed = await leases.claim(store, host_id, [serial], 2)
    assert claimed is not None
    (first,) = await leases.renew_batch(store, [_item(claimed, host_id)], HALF)
    assert first.expires_at is not None and first.written
    return claimed


def _item(
    c: leases.Claimed,
    host_id: str = "h1",
    progress: leases.ProgressIn | None = None,
    lease_id: str | None = None,
) -> leases.RenewalIn:
    return leases.RenewalIn(
        host_id, c.task_id, c.attempt, c.lease_id if lease_id is None else lease_id, progress
    )


async def _row(store: Store, task_id: str) -> AttemptRow:
    async with store.read() as db:
        row = await db.scalar(
            select(AttemptRow).where(AttemptRow.task_id == task_id).order_by(AttemptRow.attempt)
        )
    assert row is not None
    return row


async def _set_expiry(store: Store, task_id: str, left_s: float) -> dt.datetime:
    at = store.now() + dt.timedelta(seconds=left_s)
    async with store.write() as db:
        await db.execute(
            update(AttemptRow).where(AttemptRow.task_id == task_id).values(lease_expires_at=at)
        )
    return at


async def test_an_unchanged_renewal_far_from_expiry_writes_nothing(store: Store) -> None:
    """The point of it: no write, and the stored rows keep every column as they were."""
    c = await _lease(store, "h1")
    p = leases.ProgressIn(1, 2, "step 1")
    (written,) = await leases.renew_batch(store, [_item(c, progress=p)], HALF)
    assert written.written
    before = await _row(store, c.task_id)
    async with store.read() as db:
        touched = await db.scalar(select(TaskRow.updated_at).where(TaskRow.task_id == c.task_id))
    (out,) = await leases.renew_batch(store, [_item(c, progress=p)], HALF)
    assert out.expires_at is not None and not out.written
    after = await _row(store, c.task_id)
    assert (after.lease_expires_at, after.progress_updated_at) == (
        before.lease_expires_at,
        before.progress_updated_at,
    )
    async with store.read() as db:
        assert (
            await db.scalar(select(TaskRow.updated_at).where(TaskRow.task_id == c.task_id))
            == touched
        )


async def test_the_acknowledged_expiry_is_the_stored_one(store: Store) -> None:
    """Invariant 1: a renewal answered without a write is told the expiry the database holds
    (which every replica's sweeper goes by), never a later one."""
    c = await _lease(store)
    (out,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert not out.written
    assert out.expires_at == (await _row(store, c.task_id)).lease_expires_at


async def test_a_lease_near_expiry_is_written(store: Store) -> None:
    """Invariant 2: a lease with less than `write_below` of its length left is extended in the
    database before the renewal is acknowledged."""
    c = await _lease(store)
    near = await _set_expiry(store, c.task_id, LEASE_S * HALF - 1)
    (out,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert out.written and out.expires_at is not None and out.expires_at > near
    assert (await _row(store, c.task_id)).lease_expires_at == out.expires_at


async def test_changed_progress_is_stored_before_the_ack(store: Store, other: Store) -> None:
    """Invariant 3: no acknowledged progress is lost. Progress that differs from the stored
    one is written, whichever replica wrote the stored one; the same lease twice in a batch
    stores the later progress even when the later one equals what was stored."""
    c = await _lease(store)
    first, second = leases.ProgressIn(1, 2, "first"), leases.ProgressIn(2, 2, "second")
    (a,) = await leases.renew_batch(store, [_item(c, progress=first)], HALF)
    assert a.written
    # The host moved to another replica, which stored newer progress ...
    (b,) = await leases.renew_batch(other, [_item(c, progress=second)], HALF)
    assert b.written
    # ... and came back reporting `first` again (a new report): it must not be taken as stored.
    (again,) = await leases.renew_batch(store, [_item(c, progress=first)], HALF)
    assert again.written
    assert (await _row(store, c.task_id)).summary == "first"
    # In one batch: a change and then a return to the stored progress: the later one is kept.
    outs = await leases.renew_batch(
        store, [_item(c, progress=second), _item(c, progress=first)], HALF
    )
    assert all(o.expires_at is not None for o in outs)
    assert (await _row(store, c.task_id)).summary == "first"
    # max_steps is part of the progress too.
    capped = leases.ProgressIn(1, 2, "first", max_steps=40)
    (d,) = await leases.renew_batch(store, [_item(c, progress=capped)], HALF)
    assert d.written and (await _row(store, c.task_id)).max_steps == 40


async def test_a_write_far_from_expiry_keeps_the_stored_expiry(store: Store, other: Store) -> None:
    """Invariant 7: a renewal written for its news alone (its attempt's start, new progress)
    while at least `write_below` of its lease is left stores the news and keeps the stored
    expiry, as an answer from the read would; near expiry the same write moves it. The write
    decides from the row it locks, not from the batch's read: a lease another replica brought
    near expiry meanwhile is extended."""
    await tasks.submit(
        store,
        tasks.NewTask(goal="g", max_attempts=3, lease_seconds=LEASE_S, timeout_seconds=3600),
    )
    c = await leases.claim(store, "h1", ["p"], 2)
    assert c is not None
    claimed = (await _row(store, c.task_id)).lease_expires_at
    (start,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert start.written and start.expires_at == claimed
    row = await _row(store, c.task_id)
    assert (row.status, row.lease_expires_at) == (states.RUNNING, claimed)
    (moved,) = await leases.renew_batch(store, [_item(c, progress=leases.ProgressIn(1, 2, "a"))])
    assert moved.written and moved.expires_at is not None and moved.expires_at > claimed
    stored = (await _row(store, c.task_id)).lease_expires_at
    assert stored == moved.expires_at
    (kept,) = await leases.write_renewals(
        store, [_item(c, progress=leases.ProgressIn(2, 2, "b"))], HALF
    )
    assert kept.written and kept.expires_at == stored
    row = await _row(store, c.task_id)
    assert (row.summary, row.lease_expires_at) == ("b", stored)
    # Another replica brings the lease near expiry after this one's read: the write extends.
    near = await _set_expiry(other, c.task_id, LEASE_S * HALF - 1)
    (late,) = await leases.write_renewals(
        store, [_item(c, progress=leases.ProgressIn(3, 2, "c"))], HALF
    )
    assert late.expires_at is not None and late.expires_at > near
    assert (await _row(store, c.task_id)).lease_expires_at == late.expires_at


async def test_the_read_tells_a_mere_extension_from_news(store: Store) -> None:
    """What watchers are told rests on this: a renewal whose write only moves the expiry is
    `Must.EXTEND`; one that only brings new progress is `Must.PROGRESS` (far from expiry too);
    an attempt's first renewal (it and its task turn RUNNING) is `Must.START`; one whose lease
    has a write pending or news elsewhere in the batch, or whose lease has new progress or
    starts and renews twice in the batch, is `Must.NEWS`."""
    fresh = await tasks.submit(
        store,
        tasks.NewTask(goal="g", max_attempts=3, lease_seconds=LEASE_S, timeout_seconds=3600),
    )
    assigned = await leases.claim(store, "h2", ["q"], 2)  # never renewed: still ASSIGNED
    assert assigned is not None and assigned.task_id == fresh[0].task.task_id
    c = await _lease(store)
    p = leases.ProgressIn(1, 2, "one")
    await leases.renew_batch(store, [_item(c, progress=p)], HALF)
    await _set_expiry(store, c.task_id, LEASE_S * HALF - 1)
    same, moved = _item(c, progress=p), _item(c, progress=leases.ProgressIn(2, 2, "two"))
    read = leases.answer_from_read
    assert await read(store, [same], HALF) == [leases.Must.EXTEND]
    assert await read(store, [_item(c)], HALF) == [leases.Must.EXTEND]  # no progress: as stored
    assert await read(store, [moved], HALF) == [leases.Must.PROGRESS]
    assert await read(store, [moved], 0.1) == [leases.Must.PROGRESS]  # far from expiry too
    assert await read(store, [same, moved], HALF) == [leases.Must.NEWS] * 2
    assert await read(store, [moved, moved], HALF) == [leases.Must.NEWS] * 2
    assert await read(store, [moved], HALF, {leases.lease_key(moved)}) == [leases.Must.NEWS]
    assert await read(store, [same], HALF, {leases.lease_key(same)}) == [leases.Must.NEWS]
    first = _item(assigned, "h2")
    assert await read(store, [first], HALF) == [leases.Must.START]
    assert await read(store, [first, first], HALF) == [leases.Must.NEWS] * 2
    assert await read(store, [_item(c, lease_id="stale")], HALF) == [leases.Must.NEWS]
    (far,) = await read(store, [same], 0.1)
    assert isinstance(far, leases.RenewalOut) and not far.written


async def test_a_written_renewal_without_progress_keeps_the_stored_progress(store: Store) -> None:
    """A renewal that carries no progress extends the lease and counts itself, and leaves every
    progress column as the last report stored it."""
    c = await _lease(store)
    p = leases.ProgressIn(3, 2, "third", max_steps=9)
    (a,) = await leases.renew_batch(store, [_item(c, progress=p)], HALF)
    before = await _row(store, c.task_id)
    await _set_expiry(store, c.task_id, LEASE_S * HALF - 1)
    (b,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert a.written and b.written and b.expires_at is not None
    after = await _row(store, c.task_id)
    progress = ("step_index", "step_status", "summary", "max_steps", "progress_updated_at")
    assert [getattr(after, f) for f in progress] == [getattr(before, f) for f in progress]
    assert (after.lease_expires_at, after.renewals) == (b.expires_at, before.renewals + 1)
    assert before.last_renewed_at is not None and after.last_renewed_at is not None
    assert after.last_renewed_at > before.last_renewed_at


async def test_a_lease_with_a_write_queued_is_not_answered_from_the_read(store: Store) -> None:
    """Invariant 3, across batches: while a renewal of a lease waits to be written (the
    replica's write stage), a later renewal of it is written too, after it, never answered from
    a read of the row the pending write is about to change."""
    c = await _lease(store)
    p = leases.ProgressIn(1, 2, "stored")
    (stored,) = await leases.renew_batch(store, [_item(c, progress=p)], HALF)
    assert stored.written
    (free,) = await leases.answer_from_read(store, [_item(c, progress=p)], HALF)
    assert isinstance(free, leases.RenewalOut) and free.expires_at is not None
    pending = {leases.lease_key(_item(c))}
    (held,) = await leases.answer_from_read(store, [_item(c, progress=p)], HALF, pending)
    assert held is leases.Must.NEWS


async def test_the_first_renewal_makes_the_attempt_running(store: Store) -> None:
    """Invariant 4: an attempt not yet RUNNING (just assigned) is always written, so the task
    leaves ASSIGNED at its first renewal however far its expiry is."""
    await tasks.submit(
        store,
        tasks.NewTask(goal="g", max_attempts=3, lease_seconds=LEASE_S, timeout_seconds=3600),
    )
    c = await leases.claim(store, "h1", ["p"], 2)
    assert c is not None
    (out,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert out.written
    assert (await _row(store, c.task_id)).status == states.RUNNING
    view = await tasks.get(store, c.task_id)
    assert view is not None and view.task.status == states.RUNNING


async def test_a_cancel_on_another_replica_is_refused_at_once(store: Store, other: Store) -> None:
    """Invariant 5 (fencing, across replicas): a renewal of a lease whose cancel was requested
    anywhere is refused as CANCELLED, though its expiry is far and nothing else changed."""
    c = await _lease(store)
    (ok,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert ok.expires_at is not None and not ok.written
    await tasks.cancel(other, c.task_id, "stop it")
    (out,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert out.expires_at is None and out.revocation is leases.Revocation.CANCELLED


async def test_an_expired_lease_is_refused(store: Store, other: Store) -> None:
    """Invariant 5: an expired lease is refused, whether or not a sweeper (on any replica)
    ended it yet; the lease is not revived."""
    c = await _lease(store)
    await _set_expiry(store, c.task_id, -1)
    (out,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert out.expires_at is None and out.revocation is leases.Revocation.EXPIRED
    assert await leases.sweep_expired(other)
    (swept,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert swept.expires_at is None and swept.revocation is leases.Revocation.EXPIRED


async def test_a_superseded_or_finished_lease_is_refused(store: Store, other: Store) -> None:
    """Invariant 5: once another replica ended the attempt (a result; the lease ran out and a
    later attempt holds the task), its renewals are refused, never answered from a read."""
    c = await _lease(store)
    await _set_expiry(store, c.task_id, -1)
    assert await leases.sweep_expired(other)
    again = await leases.claim(other, "h2", ["q"], 2)
    assert again is not None and again.task_id == c.task_id and again.attempt == 2
    (out,) = await leases.renew_batch(store, [_item(c)], HALF)
    assert out.expires_at is None and out.revocation is leases.Revocation.SUPERSEDED
    # The new attempt's host finishes it on the other replica: its renewal is refused here.
    (run,) = await leases.renew_batch(store, [_item(again, "h2")], HALF)
    assert run.expires_at is not None
    done = await leases.record_result(
        other, "h2", again.task_id, 2, again.lease_id, states.SUCCEEDED, "ok", None
    )
    assert done.recorded
    (late,) = await leases.renew_batch(store, [_item(again, "h2")], HALF)
    assert late.expires_at is None and late.revocation is leases.Revocation.FINISHED


async def test_another_hosts_or_a_stale_lease_is_refused(store: Store) -> None:
    """Invariant 5: the read compares the whole fence: another host presenting the lease, or
    the right host with another lease id, is refused as before (and writes nothing)."""
    c = await _lease(store)
    before = await _row(store, c.task_id)
    stolen, stale = await leases.renew_batch(
        store, [_item(c, host_id="h2"), _item(c, lease_id="stale")], HALF
    )
    assert stolen.expires_at is None and stolen.revocation is leases.Revocation.NOT_YOURS
    assert stale.expires_at is None and stale.revocation is leases.Revocation.UNKNOWN
    assert (await _row(store, c.task_id)).lease_expires_at == before.lease_expires_at


async def test_always_write_keeps_the_old_behaviour(store: Store) -> None:
    """`write_below` = 1 (ALWAYS_WRITE): every accepted renewal is written, as before 0070."""
    c = await _lease(store)
    (out,) = await leases.renew_batch(store, [_item(c)], leases.ALWAYS_WRITE)
    assert out.written
    (again,) = await leases.renew_batch(store, [_item(c)], leases.ALWAYS_WRITE)
    assert again.written and again.expires_at is not None and out.expires_at is not None
    assert again.expires_at > out.expires_at


def test_the_default_keeps_half_a_lease_after_a_missed_renewal() -> None:
    """Decision 0070's margin: after a renewal answered from the read, the lease outlives the
    next renewal interval (a third of the lease) by more than half a lease, as after a written
    renewal — the time a database restart (tests/faults/test_restarts.py) has."""
    interval = convert.renew_interval(LEASE_S).ToTimedelta().total_seconds()
    left_at_ack = CloudSettings().renewal_write_below * LEASE_S
    assert left_at_ack - interval > LEASE_S / 2


async def test_renewals_answered_from_the_read_are_counted_at_the_next_write(store: Store) -> None:
    """Invariant 6: the attempt's renewal count (`renewals`) includes the renewals answered
    from a read: the replica carries them to the lease's next write (`RenewalIn.counts`),
    summed when one batch holds the same lease twice."""
    c = await _lease(store)  # one written renewal
    batcher = RenewalBatcher(store, EventBus(store), 0.0, 500, HALF)
    batcher.start()
    try:
        same = leases.ProgressIn(1, 2, "same")
        first = await batcher.renew(_item(c, progress=same))
        assert first.written
        for _ in range(3):
            out = await batcher.renew(_item(c, progress=same))
            assert out.expires_at is not None and not out.written
        assert (await _row(store, c.task_id)).renewals == 2  # the three are not written yet
        changed = await batcher.renew(_item(c, progress=leases.ProgressIn(2, 2, "next")))
        assert changed.written
        assert (await _row(store, c.task_id)).renewals == 6
    finally:
        await batcher.stop()
    # The same lease twice in one written batch: both counted, with what each carries.
    twice = [
        _item(c, progress=leases.ProgressIn(3, 2, "a")),
        leases.RenewalIn("h1", c.task_id, c.attempt, c.lease_id, None, counts=2),
    ]
    outs = await leases.write_renewals(store, twice)
    assert all(o.written for o in outs)
    assert (await _row(store, c.task_id)).renewals == 9


async def test_the_batcher_counts_each_acknowledged_renewal_once(store: Store) -> None:
    """The "acked" outcome of `amc_cloud_lease_renewals_total` is counted by the batcher, once
    per batch stage with the stage's count (twenty-fifth pass): a renewal written, renewals
    answered from the read, and none for a refused one (the manager counts it by its reason)."""
    c = await _lease(store)
    acked = metrics.current().renewals.labels(outcome="acked")
    before = acked._value.get()
    batcher = RenewalBatcher(store, EventBus(store), 0.0, 500, HALF)
    batcher.start()
    try:
        written = await batcher.renew(_item(c, progress=leases.ProgressIn(1, 2, "new")))
        assert written.written
        assert acked._value.get() == before + 1
        read = await asyncio.gather(*(batcher.renew(_item(c)) for _ in range(3)))
        assert all(o.expires_at is not None and not o.written for o in read)
        assert acked._value.get() == before + 4
        refused = await batcher.renew(_item(c, lease_id="stale"))
        assert refused.expires_at is None
        assert acked._value.get() == before + 4
    finally:
        await batcher.stop()


async def test_sqlite_reads_on_the_loop_thread_and_falls_back_when_it_cannot(
    store: Store, tmp_path: Path
) -> None:
    """On a SQLite file the batch's read runs on the loop's own thread (`Store.loop_connection`);
    when that connection cannot read (here: its file cannot be opened, a real SQLite error),
    the read goes through the async engine and the answer is the same. PostgreSQL has none."""
    if store.is_postgres:
        assert store.loop_connection is None
        return
    assert store.loop_connection is not None
    c = await _lease(store)
    (direct,) = await leases.answer_from_read(store, [_item(c)], HALF)
    assert isinstance(direct, leases.RenewalOut)
    assert direct.expires_at == (await _row(store, c.task_id)).lease_expires_at
    working, store.loop_connection = store.loop_connection, create_engine(f"sqlite:///{tmp_path}")
    try:
        (fallback,) = await leases.answer_from_read(store, [_item(c)], HALF)
    finally:
        store.loop_connection.dispose()
        store.loop_connection = working
    assert fallback == direct


async def _terminate(store: Store, backend: int) -> None:
    """End a server process of the store's database, as a server restart would."""
    async with store.write() as db:
        await db.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})


async def test_postgres_reads_on_its_own_connection_and_falls_back_when_it_cannot(
    store: Store,
) -> None:
    """On PostgreSQL the batch's read runs on the store's own connection
    (`Store.direct_reads`); when that connection breaks (its backend is terminated, as a server
    restart would), the read goes through the pool with the same outcome, and the connection is
    opened again later. SQLite has none."""
    if store.direct_reads is None:
        assert not store.is_postgres
        return
    c = await _lease(store)
    (direct,) = await leases.answer_from_read(store, [_item(c)], HALF)
    assert isinstance(direct, leases.RenewalOut)
    assert direct.expires_at == (await _row(store, c.task_id)).lease_expires_at
    backend = store.direct_reads.backend_pid
    assert backend is not None
    await _terminate(store, backend)
    (fallback,) = await leases.answer_from_read(store, [_item(c)], HALF)
    assert fallback == direct
    assert store.direct_reads.backend_pid is None  # closed, not retried at once
    store.direct_reads.retry_now()
    assert await store.direct_reads.run("SELECT 1", (), resend=True) == [(1,)]
    assert store.direct_reads.backend_pid not in (None, backend)


async def test_postgres_writes_on_its_own_connection_and_fails_loudly_when_it_breaks(
    store: Store,
) -> None:
    """On PostgreSQL the batch's write is one statement on the store's own connection
    (`Store.direct_writes`), committed by itself. When that connection breaks the batch fails
    with the driver's OperationalError (the write may have committed: it is not sent again;
    the lease service answers UNAVAILABLE and the hosts renew again), the next batch goes
    through the pool, and a refused renewal is still classified either way."""
    if store.direct_writes is None:
        assert not store.is_postgres
        return
    c = await _lease(store)
    (first,) = await leases.write_renewals(store, [_item(c)])
    assert first.written and first.expires_at == (await _row(store, c.task_id)).lease_expires_at
    backend = store.direct_writes.backend_pid
    assert backend is not None
    await _terminate(store, backend)
    with pytest.raises(psycopg.OperationalError):
        await leases.write_renewals(store, [_item(c)])
    pooled, stale = await leases.write_renewals(store, [_item(c), _item(c, lease_id="stale")])
    assert store.direct_writes.backend_pid is None
    assert pooled.written and pooled.expires_at is not None and first.expires_at is not None
    assert pooled.expires_at > first.expires_at
    assert pooled.expires_at == (await _row(store, c.task_id)).lease_expires_at
    assert stale.expires_at is None and stale.revocation == leases.Revocation.UNKNOWN
    store.direct_writes.retry_now()
    (again,) = await leases.write_renewals(store, [_item(c, lease_id="stale")])
    assert again.revocation == leases.Revocation.UNKNOWN
    assert store.direct_writes.backend_pid not in (None, backend)


def test_an_in_memory_sqlite_database_has_no_loop_connection() -> None:
    """A second connection would see another (empty) in-memory database: no loop connection."""
    assert sqlite_loop_connection(create_async_engine("sqlite+aiosqlite://")) is None


async def test_sqlite_writes_renewals_on_the_loop_thread_and_falls_back_when_it_cannot(
    store: Store, tmp_path: Path
) -> None:
    """On a SQLite file the renewal batch's write transaction runs on the loop's own thread,
    on the driver's connection in a `BEGIN IMMEDIATE` transaction (`Store.write_driver_on_loop`);
    when that connection cannot write (here: its file cannot be opened, a real SQLite error),
    the transaction runs through the async engine instead, with the same outcome. PostgreSQL
    has no loop connection."""
    if store.is_postgres:
        assert store.loop_connection is None
        return
    assert store.loop_connection is not None
    sent: list[str] = []
    trace(store.loop_connection, sent)
    c = await _lease(store)
    assert any(s.startswith("UPDATE attempts") for s in sent)
    sent.clear()
    (on_loop,) = await leases.write_renewals(store, [_item(c)])
    assert on_loop.written and on_loop.expires_at == (await _row(store, c.task_id)).lease_expires_at
    assert sent[0] == "BEGIN IMMEDIATE" and sent[-1] == "COMMIT"
    assert any(s.startswith("UPDATE attempts") for s in sent)
    sent.clear()
    working = store.loop_connection
    broken = create_engine(f"sqlite:///{tmp_path}")  # a directory: SQLite cannot open it
    store.loop_connection = broken
    try:
        (fallback,) = await leases.write_renewals(store, [_item(c)])
        (stale,) = await leases.write_renewals(store, [_item(c, lease_id="stale")])
    finally:
        broken.dispose()
        store.loop_connection = working
    assert not sent
    assert fallback.written and fallback.expires_at is not None
    assert fallback.expires_at > on_loop.expires_at
    assert fallback.expires_at == (await _row(store, c.task_id)).lease_expires_at
    assert stale.expires_at is None and stale.revocation == leases.Revocation.UNKNOWN


def _wal_frames(db_path: str) -> int:
    """Pages appended to the SQLite write-ahead log since it last started over."""
    size = Path(db_path + "-wal").stat().st_size
    return 0 if size == 0 else (size - 32) // (24 + 4096)


async def test_a_sqlite_write_that_keeps_the_expiry_leaves_the_indexes_alone(
    store: Store, db_url: str
) -> None:
    """SQLite rewrites an index entry whenever an UPDATE assigns one of its columns, even to the
    value it had, and each such page goes to the write-ahead log. New progress on a lease far
    from expiry, whose task is already RUNNING, changes the attempt's row and the task's
    `updated_at` only: two pages (the expiry and the task's status assigned as well wrote the
    live-expiry and status indexes' pages too: five). Near expiry the same write moves the
    expiry, and a task's first renewal still turns it RUNNING (tests above)."""
    if store.is_postgres:
        pytest.skip("SQLite's page accounting (PostgreSQL updates such rows in place: HOT)")
    path = db_url.split("///", 1)[1]
    c = await _lease(store)
    view = await tasks.get(store, c.task_id)
    assert view is not None and view.task.status == states.RUNNING
    async with store.write() as db:
        await db.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    assert _wal_frames(path) == 0
    before = (await _row(store, c.task_id)).lease_expires_at
    (kept,) = await leases.write_renewals(
        store, [_item(c, progress=leases.ProgressIn(1, 2, "new"))], HALF
    )
    assert kept.written and kept.expires_at == before
    assert _wal_frames(path) == 2
    row = await _row(store, c.task_id)
    assert (row.summary, row.lease_expires_at) == ("new", before)


async def test_a_written_batch_with_nothing_refused_opens_no_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused renewal is classified after the batch's write, in a read of its own. On
    PostgreSQL (the write on the store's own connection) that read session was opened after
    every batch, refused or not (~0.2 ms of the loop each, no statement); SQLite skipped it.
    Now neither opens one unless a renewal was refused, and fencing stays exact: the pool runs
    no statement for an accepted batch, and a stale lease in a batch is still classified."""
    c = await _lease(store)
    opened: list[int] = []
    real_read = store.read

    def counted_read() -> Any:
        opened.append(1)
        return real_read()

    monkeypatch.setattr(store, "read", counted_read)
    sent: list[str] = []

    def on_statement(*args: object) -> None:
        sent.append(str(args[2]))

    engine = store.engine.sync_engine
    event.listen(engine, "before_cursor_execute", on_statement)
    try:
        (ok,) = await leases.write_renewals(store, [_item(c)])
        accepted = (len(opened), list(sent))
        ok2, stale = await leases.write_renewals(store, [_item(c), _item(c, lease_id="stale")])
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
    assert ok.written and ok2.written
    assert accepted == (0, [] if store.is_postgres else accepted[1])
    assert stale.expires_at is None and stale.revocation == leases.Revocation.UNKNOWN
    assert len(opened) == 1


@pytest.mark.parametrize("path", ["direct", "pool"])
async def test_a_row_locked_elsewhere_holds_up_only_its_own_renewal(
    store: Store, path: str
) -> None:
    """A task row held in another open transaction (an operator's `BEGIN; UPDATE tasks ...`
    left open in psql) stalled the whole PostgreSQL batch written with it, so every lease in
    it could run out. Now the batch's statement gives up on the lock (`lock_timeout`), its
    renewals are written one by one: the others are renewed, the blocked one is neither
    renewed nor refused but fails with LockNotAvailable, which the host hears as UNAVAILABLE
    ("retry"; it keeps its lease), and once the lock is gone it renews. SQLite has one writer
    and no row locks to wait for. Both ways the write goes: on the store's own connection and,
    when that cannot be used, through the pool."""
    direct = store.direct_writes
    if direct is None:
        assert not store.is_postgres
        return
    if path == "pool":
        store.direct_writes = None
    a, b, c = [await _lease(store, f"h{n}", f"p{n}") for n in range(3)]
    hosts = {a.task_id: "h0", b.task_id: "h1", c.task_id: "h2"}
    before = {t: (await _row(store, t)).renewals for t in hosts}
    batcher = RenewalBatcher(store, EventBus(store), 0.01, 500)
    batcher.start()
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute("UPDATE tasks SET goal = goal WHERE task_id = %s", (a.task_id,))
        renewals = [batcher.renew(_item(x, hosts[x.task_id])) for x in (a, b, c)]
        blocked, out_b, out_c = await asyncio.wait_for(
            asyncio.gather(*renewals, return_exceptions=True), timeout=8
        )
        assert isinstance(blocked, Exception), blocked
        driver = getattr(blocked, "orig", blocked)  # through the pool: SQLAlchemy's wrapper
        assert isinstance(driver, psycopg.errors.LockNotAvailable), blocked
        assert status_for(blocked)[0] == grpc.StatusCode.UNAVAILABLE
        for t, out in ((b.task_id, out_b), (c.task_id, out_c)):
            assert isinstance(out, leases.RenewalOut) and out.written, out
            row = await _row(store, t)
            assert out.expires_at == row.lease_expires_at
            assert row.renewals == before[t] + 1
        assert (await _row(store, a.task_id)).renewals == before[a.task_id]
        await holder.rollback()
        again = await asyncio.wait_for(batcher.renew(_item(a, "h0")), timeout=8)
        assert again.written and again.expires_at is not None
        assert (await _row(store, a.task_id)).lease_expires_at == again.expires_at
    finally:
        await holder.close()
        await batcher.stop()
        store.direct_writes = direct

"""A row another transaction holds costs the sweeps that row only, not the fleet's expiries.

On PostgreSQL a sweep waited for a locked row as long as its holder kept it: an operator's
`BEGIN; UPDATE tasks ...;` left open in psql stalled the expiry sweep of every replica, and no
lease of the fleet ran out (nor any deadline passed) until the session ended. Now a sweep waits
`SWEEP_LOCK_TIMEOUT_MS` at most, ends everything else, leaves the held task for a later pass,
says so once in the log, and ends it once the lock is gone. Real PostgreSQL, the lock held
from a connection of its own; SQLite has one writer and no row locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import select

from cloud.events import EventBus
from cloud.lease import sweeper as sweeper_module
from cloud.lease.sweeper import Sweeper
from cloud.store import leases, states
from cloud.store.database import Store, libpq_dsn
from cloud.store.models import AttemptRow, TaskRow
from tests.cloud.cloud_harness import due, lapse
from tests.cloud.test_sweeps import _claimed

pytestmark = pytest.mark.postgres

#: Far beyond a bounded wait and its second pass; a sweep that blocks never gets there.
WITHIN_S = 15.0


async def _statuses(store: Store, task_id: str) -> tuple[str, str]:
    async with store.read() as db:
        task = await db.get(TaskRow, task_id)
        attempt = await db.scalar(
            AttemptRow.__table__.select()
            .with_only_columns(AttemptRow.status)
            .where(AttemptRow.task_id == task_id)
        )
    assert task is not None and attempt is not None
    return task.status, attempt


def _paced(store: Store) -> Sweeper:
    """A sweeper whose passes are a sweep interval apart, as the sweep loop runs them: its
    monotonic clock moves one interval at each pass."""
    ticks = itertools.count()
    return Sweeper(store, EventBus(store), interval=1.0, monotonic=lambda: float(next(ticks)))


def _clocked(store: Store) -> tuple[Sweeper, list[float]]:
    """A sweeper whose monotonic clock reads what the test sets in the list beside it."""
    at = [0.0]
    return Sweeper(store, EventBus(store), interval=1.0, monotonic=lambda: at[0]), at


async def _lapsed(store: Store, count: int) -> list[leases.Claimed]:
    """`count` tasks claimed by hosts h0, h1, …, each lease run out."""
    claimed = [await _claimed(store, f"h{n}") for n in range(count)]
    for x in claimed:
        await lapse(store, x.task_id)
    return claimed


async def _pass(sweeper: Sweeper) -> int:
    """One sweep pass, bounded: a pass that waits for a held row fails the test."""
    return await asyncio.wait_for(sweeper.sweep_once(), WITHIN_S)


@contextlib.asynccontextmanager
async def _holder(store: Store) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of its own, as an operator's psql session: whatever it holds is let go
    however the test ends."""
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        yield holder
    finally:
        await holder.rollback()
        await holder.close()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "cloud.lease.sweeper" and "left for a later pass" in r.getMessage()
    ]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("ending", ["expiry", "deadline"])
@pytest.mark.parametrize("table", ["tasks", "attempts"])
async def test_a_row_locked_elsewhere_holds_up_only_its_own_task(
    store: Store, caplog: pytest.LogCaptureFixture, ending: str, table: str
) -> None:
    a, b, c = [await _claimed(store, f"h{n}") for n in range(3)]
    for x in (a, b, c):
        await (lapse(store, x.task_id) if ending == "expiry" else due(store, x.task_id))
    swept = states.QUEUED if ending == "expiry" else states.FAILED
    sweeper = _paced(store)
    async with _holder(store) as holder:
        # The operator's open transaction in psql, holding b's row.
        await holder.execute(f"UPDATE {table} SET status = status WHERE task_id = %s", (b.task_id,))
        caplog.set_level(logging.WARNING, logger="cloud.lease.sweeper")
        first = await _pass(sweeper)
        second = await _pass(sweeper)
        # An expired attempt row held elsewhere is skipped at once (SKIP LOCKED: another
        # replica's sweeper may be ending it), and named once skipped on passes a sweep
        # interval apart; before, nothing was said about it while its lease outlived its term.
        third = await _pass(sweeper)
        assert (first, second, third) == (2, 0, 0)
        (said,) = _warnings(caplog)  # once, not every pass
        assert b.task_id in said and "locked by another transaction" in said, said
        assert sweeper.held == {b.task_id}
        for x in (a, c):
            assert (await _statuses(store, x.task_id))[0] == swept
        assert await _statuses(store, b.task_id) == (states.ASSIGNED, states.ASSIGNED)
        await holder.rollback()
        assert await _pass(sweeper) == 1
        assert (await _statuses(store, b.task_id))[0] == swept
        assert sweeper.held == set()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_held_row_is_named_again_once_it_was_free(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning is said once per stretch of being held: a task freed and held again (by a
    new session) is named again, so the log shows each stall."""
    a, b = [await _claimed(store, f"h{n}") for n in range(2)]
    sweeper = Sweeper(store, EventBus(store))
    async with _holder(store) as holder:
        with caplog.at_level(logging.WARNING, logger="cloud.lease.sweeper"):
            for x in (a, b):
                await lapse(store, x.task_id)
                await holder.execute(
                    "UPDATE tasks SET status = status WHERE task_id = %s", (x.task_id,)
                )
                assert await _pass(sweeper) == 0
                assert await _pass(sweeper) == 0
                await holder.rollback()
                assert await _pass(sweeper) == 1
        said = _warnings(caplog)
        assert len(said) == 2 and a.task_id in said[0] and b.task_id in said[1], said
    assert await leases.sweep_expired(store) == []


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_an_attempt_row_held_for_one_pass_only_is_not_named(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """An expired attempt row skipped on one pass and free on the next is what another
    replica's sweeper ending it looks like: nothing is said about it."""
    _, b = await _lapsed(store, 2)
    sweeper = _paced(store)
    async with _holder(store) as holder:
        caplog.set_level(logging.WARNING, logger="cloud.lease.sweeper")
        await holder.execute("SELECT 1 FROM attempts WHERE task_id = %s FOR UPDATE", (b.task_id,))
        assert await _pass(sweeper) == 1
        await holder.rollback()
        assert await _pass(sweeper) == 1
        assert (_warnings(caplog), sweeper.held) == ([], set())


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_an_attempt_row_is_named_once_skipped_for_a_sweep_interval(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Passes that follow one another within milliseconds (a pass that ended a full batch
    runs the next at once) may all find another replica's sweeper ending the row: skipped on
    two such passes, it was named as held elsewhere. It is named once every pass has skipped
    it for a sweep interval, and once only."""
    _, b = await _lapsed(store, 2)
    sweeper, at = _clocked(store)
    async with _holder(store) as holder:
        caplog.set_level(logging.WARNING, logger="cloud.lease.sweeper")
        await holder.execute("SELECT 1 FROM attempts WHERE task_id = %s FOR UPDATE", (b.task_id,))
        assert await _pass(sweeper) == 1
        for at[0] in (0.004, 0.5, 0.999):  # passes straight after it: no word yet
            assert await _pass(sweeper) == 0
            assert (_warnings(caplog), sweeper.held) == ([], set())
        for at[0] in (1.0, 1.001, 2.0):  # skipped for an interval: named, once
            assert await _pass(sweeper) == 0
        (said,) = _warnings(caplog)
        assert b.task_id in said and "locked by another transaction" in said, said
        assert sweeper.held == {b.task_id}
        await holder.rollback()
        assert await _pass(sweeper) == 1
        assert sweeper.held == set()


async def _expiry(store: Store, task_id: str) -> dt.datetime | None:
    async with store.read() as db:
        return await db.scalar(
            select(AttemptRow.lease_expires_at).where(AttemptRow.task_id == task_id)
        )


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("move", ["extend_after_outage", "keep_time_left"])
async def test_a_held_attempt_row_does_not_hold_up_the_other_leases_new_terms(
    store: Store, move: str
) -> None:
    """After a gap in the replica's time, live leases get a new term (or give back a clock's
    step back) while every renewal batch waits for it (`ClockWatch.settled`): an attempt row
    held elsewhere stalled that, and with it every renewal of the replica. Now the others are
    moved and the held one is left as it is (no sweep can end it while it is held)."""
    a, b = [await _claimed(store, f"h{n}") for n in range(2)]
    before = {x.task_id: await _expiry(store, x.task_id) for x in (a, b)}

    async def moved() -> int:
        if move == "extend_after_outage":
            return await leases.extend_after_outage(store)
        return await leases.keep_time_left(store, dt.timedelta(minutes=1))

    async with _holder(store) as holder:
        await holder.execute("UPDATE attempts SET status = status WHERE task_id = %s", (b.task_id,))
        assert await asyncio.wait_for(moved(), WITHIN_S) == 1
        assert await _expiry(store, a.task_id) != before[a.task_id]
        assert await _expiry(store, b.task_id) == before[b.task_id]
        await holder.rollback()
        assert await asyncio.wait_for(moved(), WITHIN_S) >= 1
        assert await _expiry(store, b.task_id) != before[b.task_id]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_full_batch_neither_starts_a_stretch_over_nor_names_it_again(
    store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that ends a full batch does not look past its last row, so it cannot tell
    whether the held attempt row was skipped: taken for "not skipped", it started the row's
    stretch over (named an interval later than due) and, once named, the row was named again."""
    monkeypatch.setattr(sweeper_module, "SWEEP_BATCH", 2)
    a, b, c, d, e, f = [await _claimed(store, f"h{n}") for n in range(6)]
    for x in (a, b):
        await lapse(store, x.task_id)
    sweeper, at = _clocked(store)
    async with _holder(store) as holder:
        caplog.set_level(logging.WARNING, logger="cloud.lease.sweeper")
        await holder.execute("SELECT 1 FROM attempts WHERE task_id = %s FOR UPDATE", (b.task_id,))
        assert await _pass(sweeper) == 1  # b skipped at 0
        for x in (c, d):
            await lapse(store, x.task_id)
        at[0] = 0.5
        assert await _pass(sweeper) == 2  # full: untold
        at[0] = 1.0
        assert await _pass(sweeper) == 0  # b, since 0
        (said,) = _warnings(caplog)
        assert b.task_id in said, said
        for x in (e, f):
            await lapse(store, x.task_id)
        at[0] = 1.5
        assert await _pass(sweeper) == 2  # full: untold
        at[0] = 2.0
        assert await _pass(sweeper) == 0
        assert len(_warnings(caplog)) == 1 and sweeper.held == {b.task_id}


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_quiet_pass_ends_a_stretch_of_skips(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A row skipped once (another replica's sweeper ending it), then passes that find nothing
    expired at all: those passes end the stretch. Taken for "could not tell", they kept it, and
    the same task's next attempt, skipped once for a few milliseconds an interval later, was
    named as held for no good reason."""
    a, b = await _lapsed(store, 2)
    sweeper, at = _clocked(store)
    other = _paced(store)  # another replica's
    held_attempt = "SELECT 1 FROM attempts WHERE task_id = %s AND ended_at IS NULL FOR UPDATE"
    async with _holder(store) as holder:
        caplog.set_level(logging.WARNING, logger="cloud.lease.sweeper")
        await holder.execute(held_attempt, (b.task_id,))
        assert await _pass(sweeper) == 1
        await holder.rollback()
        assert await _pass(other) == 1  # ends b's attempt
        at[0] = 5.0
        assert await _pass(sweeper) == 0  # nothing expired
        # Both tasks were requeued (a's first): the second claim takes b's next attempt.
        claims = [await leases.claim(store, h, ["p1"], 0) for h in ("h8", "h9")]
        assert [c.task_id for c in claims if c] == [a.task_id, b.task_id]
        await lapse(store, b.task_id)
        await holder.execute(held_attempt, (b.task_id,))
        at[0] = 5.001
        assert await _pass(sweeper) == 0
        assert (_warnings(caplog), sweeper.held) == ([], set())

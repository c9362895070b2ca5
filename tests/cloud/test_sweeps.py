"""Sweeps that find nothing to end take no write lock, and a pass reads once, on both backends.

Every replica sweeps every second and nearly always finds nothing. The sweeps used to look inside
a write transaction, which on SQLite holds the store's write lock across the read: renewals with
new progress waited behind it (docs/benchmarks.md, eighteenth pass). Now each sweep reads first
and opens a write transaction only when something is due; what is due is still ended. A pass
of the sweep loop asks whether anything is due in one read (three reads, each its own session,
were a third of an idle replica's CPU: docs/benchmarks.md, twenty-seventh pass).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select

from cloud.events import EventBus
from cloud.lease.sweeper import Sweeper
from cloud.store import leases, states, tasks
from cloud.store.database import Store
from cloud.store.models import TaskRow, TaskSecretRow
from tests.cloud.cloud_harness import due, lapse


async def _claimed(store: Store, host: str, secret: bool = False) -> leases.Claimed:
    await tasks.submit(
        store,
        tasks.NewTask(
            goal="g",
            max_attempts=3,
            lease_seconds=30,
            timeout_seconds=3600,
            sealed_secrets={"pin": "sealed"} if secret else {},
        ),
    )
    claimed = await leases.claim(store, host, ["p1"], 0)
    assert claimed is not None
    return claimed


@pytest.fixture
def writes(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Write transactions opened on `store` from now on (one entry each)."""
    opened: list[int] = []
    write = store.write

    @contextlib.asynccontextmanager
    async def counted() -> AsyncIterator[object]:
        opened.append(1)
        async with write() as session:
            yield session

    monkeypatch.setattr(store, "write", counted)
    return opened


@pytest.fixture
def reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Read sessions opened on `store` from now on (one entry each)."""
    opened: list[int] = []
    read = store.read

    @contextlib.asynccontextmanager
    async def counted() -> AsyncIterator[object]:
        opened.append(1)
        async with read() as session:
            yield session

    monkeypatch.setattr(store, "read", counted)
    return opened


async def _secrets_of(store: Store, task_id: str) -> list[str]:
    async with store.read() as session:
        rows = await session.scalars(
            select(TaskSecretRow.name).where(TaskSecretRow.task_id == task_id)
        )
        return list(rows)


async def test_a_pass_with_nothing_due_reads_once_and_writes_nothing(
    store: Store, reads: list[int], writes: list[int]
) -> None:
    """Before, the pass read three times: the expiries, the deadlines, the ended secrets."""
    await _claimed(store, "h1", secret=True)
    reads.clear()
    writes.clear()
    await Sweeper(store, EventBus(store)).sweep()
    assert (len(reads), writes) == (1, [])


async def test_a_pass_ends_what_is_due_and_forgets_the_secrets_of_what_it_ended(
    store: Store,
) -> None:
    """The one read found no ended task's secrets, but the pass ended two tasks: their secrets
    go in this pass, not the next (the deadline's task failed; the expired lease's task is
    queued again and keeps them)."""
    expired = await _claimed(store, "h1", secret=True)
    overdue = await _claimed(store, "h2", secret=True)
    await lapse(store, expired.task_id)
    await due(store, overdue.task_id)
    await Sweeper(store, EventBus(store)).sweep()
    async with store.read() as session:
        rows = await session.execute(select(TaskRow.task_id, TaskRow.status))
        status = {task_id: task_status for task_id, task_status in rows.all()}
    assert status == {expired.task_id: states.QUEUED, overdue.task_id: states.FAILED}
    assert await _secrets_of(store, overdue.task_id) == []
    assert await _secrets_of(store, expired.task_id) == ["pin"]
    assert await leases.sweep_due(store) == leases.Due(ends=False, secrets=False)


async def test_sweeps_with_nothing_due_open_no_write_transaction(
    store: Store, writes: list[int]
) -> None:
    await _claimed(store, "h1")
    writes.clear()
    assert await leases.sweep_expired(store) == []
    assert await leases.sweep_deadlines(store) == []
    assert writes == []


async def test_what_is_due_is_still_ended(store: Store, writes: list[int]) -> None:
    expired = await _claimed(store, "h1")
    overdue = await _claimed(store, "h2")
    await lapse(store, expired.task_id)
    await due(store, overdue.task_id)
    writes.clear()
    (lapsed,) = await leases.sweep_expired(store)
    (late,) = await leases.sweep_deadlines(store)
    assert (lapsed.task_id, lapsed.revocation) == (expired.task_id, leases.Revocation.EXPIRED)
    assert (late.task_id, late.task_status) == (overdue.task_id, states.FAILED)
    assert len(writes) == 2
    assert await leases.sweep_expired(store) == []
    assert await leases.sweep_deadlines(store) == []
    assert len(writes) == 2

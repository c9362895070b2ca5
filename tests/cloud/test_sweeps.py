"""Sweeps that find nothing to end take no write lock, on both backends.

Every replica sweeps every second and nearly always finds nothing. The sweeps used to look inside
a write transaction, which on SQLite holds the store's write lock across the read: renewals with
new progress waited behind it (docs/benchmarks.md, eighteenth pass). Now each sweep reads first
and opens a write transaction only when something is due; what is due is still ended.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from cloud.store import leases, states, tasks
from cloud.store.database import Store
from tests.cloud.cloud_harness import due, lapse


async def _claimed(store: Store, host: str) -> leases.Claimed:
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
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

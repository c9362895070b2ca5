"""The SQLite loop connection is checked out of its pool once (`Store.loop_driver`), and what is
kept checked out never holds a snapshot: a renewal read after another replica's commit sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event

from cloud.store import leases, tasks
from cloud.store.database import Store

HALF = 0.5


@pytest.fixture
async def other(store: Store, db_url: str) -> AsyncIterator[Store]:
    """Another replica's store on the same database."""
    s = Store.from_url(db_url)
    try:
        yield s
    finally:
        await s.close()


async def _claimed(store: Store) -> leases.RenewalIn:
    """A claimed task's renewal, its first renewal written (RUNNING)."""
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30.0, timeout_seconds=3600)
    )
    c = await leases.claim(store, "h1", ["p"], 2)
    assert c is not None
    item = leases.RenewalIn("h1", c.task_id, c.attempt, c.lease_id, None)
    (first,) = await leases.renew_batch(store, [item], HALF)
    assert first.written
    return item


async def test_the_renewal_path_checks_the_loop_connection_out_once(store: Store) -> None:
    """Reads and writes of renewal batches reuse one checkout of the loop connection's pool
    (each used to check it out and in again: its events and reset cost the batch ~70 us)."""
    if store.loop_connection is None:
        pytest.skip("PostgreSQL has no loop connection")
    item = await _claimed(store)
    checkouts: list[Any] = []
    event.listen(store.loop_connection, "checkout", lambda *args: checkouts.append(args))
    for _ in range(3):
        (read,) = await leases.answer_from_read(store, [item], HALF)
        assert isinstance(read, leases.RenewalOut)
        (written,) = await leases.write_renewals(store, [item], HALF)
        assert written.written
    assert len(checkouts) == 0


async def test_the_kept_connection_sees_another_replicas_commit(store: Store, other: Store) -> None:
    """Nothing stays open on the kept connection between batches: after a read and a write on
    it, a cancel committed by another replica refuses the next renewal (decision 0070,
    invariant 5)."""
    item = await _claimed(store)
    (read,) = await leases.answer_from_read(store, [item], HALF)
    assert isinstance(read, leases.RenewalOut)
    await tasks.cancel(other, item.task_id, "stop it")
    (again,) = await leases.answer_from_read(store, [item], HALF)
    assert again is leases.Must.NEWS
    (refused,) = await leases.write_renewals(store, [item], HALF)
    assert refused.expires_at is None and refused.revocation is leases.Revocation.CANCELLED

"""A row another transaction holds never stalls the replica's heartbeat.

On PostgreSQL the heartbeat's UPDATEs of host rows waited for a `hosts` row locked elsewhere as
long as its holder kept it: an operator's `SELECT … FOR UPDATE` (or an UPDATE) left open in psql
stalled the beat of every host of the replica, and after three beats other replicas counted all
its streams as gone. The beat then waited `SWEEP_LOCK_TIMEOUT_MS` at most and left the held row
for a later beat. Now the beat writes the replica's own row only (migration 0032): a held host
row does not touch it, and the replica's own row held elsewhere costs that beat (waited for
boundedly, then left for the next one). Real PostgreSQL, the lock held from a connection of its
own; SQLite has one writer and no row locks (the heartbeat's own tests cover it there).
"""

from __future__ import annotations

import asyncio
import datetime as dt

import psycopg
import pytest
from sqlalchemy import select, update

from cloud.store import hosts
from cloud.store.database import Store, libpq_dsn
from cloud.store.models import HostRow, ReplicaRow

pytestmark = pytest.mark.postgres

#: Far beyond a bounded wait and its second try; a heartbeat that blocks never gets there.
WITHIN_S = 15.0

HOLDS = {
    "select for update": "SELECT 1 FROM {table} WHERE {key} = %s FOR UPDATE",
    "update": "UPDATE {table} SET {key} = {key} WHERE {key} = %s",
}


async def _vouched(store: Store) -> dt.datetime | None:
    async with store.read() as db:
        return await db.scalar(select(ReplicaRow.vouched_at))


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("hold", sorted(HOLDS))
async def test_a_host_row_locked_elsewhere_holds_up_no_beat(store: Store, hold: str) -> None:
    """The held host counts as connected through the beat like the others."""
    ids = ["h1", "h2", "held"]
    for h in ids:
        await hosts.upsert_hello(store, h, [], "v", 0, "r1", f"s-{h}", "p")
    old = store.now() - dt.timedelta(hours=1)
    async with store.write() as db:
        await db.execute(update(HostRow).values(stream_alive_at=old, last_seen_at=old))
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(HOLDS[hold].format(table="hosts", key="host_id"), ("held",))
        before = store.now()
        await asyncio.wait_for(hosts.heartbeat(store, "r1"), WITHIN_S)
        vouched = await _vouched(store)
        assert vouched is not None and vouched >= before
        assert await hosts.unvouched(store, 10.0) == set()
    finally:
        await holder.rollback()
        await holder.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("hold", sorted(HOLDS))
async def test_the_replicas_row_locked_elsewhere_costs_that_beat_only(
    store: Store, hold: str
) -> None:
    """The beat waits boundedly for its own row, then leaves it; the first beat after the
    lock is gone writes it."""
    await hosts.heartbeat(store, "r1")
    first = await _vouched(store)
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(HOLDS[hold].format(table="replicas", key="replica_id"), ("r1",))
        await asyncio.wait_for(hosts.heartbeat(store, "r1"), WITHIN_S)
        assert await _vouched(store) == first
        await holder.rollback()
        before = store.now()
        await asyncio.wait_for(hosts.heartbeat(store, "r1"), WITHIN_S)
        vouched = await _vouched(store)
        assert vouched is not None and vouched >= before
    finally:
        await holder.rollback()
        await holder.close()

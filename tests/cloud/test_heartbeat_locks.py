"""A host row another transaction holds costs the heartbeat that row only, not the replica's beat.

On PostgreSQL the heartbeat's UPDATEs waited for a `hosts` row locked elsewhere as long as its
holder kept it: an operator's `SELECT … FOR UPDATE` (or an UPDATE) left open in psql stalled
the beat of every host of the replica, and after three beats other replicas counted all its
streams as gone. Now the heartbeat waits `SWEEP_LOCK_TIMEOUT_MS` at most, writes every other
host, and leaves the held row for a later beat. Real PostgreSQL, the lock held from a connection
of its own; SQLite has one writer and no row locks (the heartbeat's own tests cover it there).
"""

from __future__ import annotations

import asyncio
import datetime as dt

import psycopg
import pytest
from sqlalchemy import select, update

from cloud.store import hosts
from cloud.store.database import Store, libpq_dsn
from cloud.store.models import HostRow

pytestmark = pytest.mark.postgres

#: Far beyond a bounded wait and its second try; a heartbeat that blocks never gets there.
WITHIN_S = 15.0

HOLDS = {
    "select for update": "SELECT host_id FROM hosts WHERE host_id = %s FOR UPDATE",
    "update": "UPDATE hosts SET agent_version = agent_version WHERE host_id = %s",
}


async def _rows(store: Store) -> dict[str, tuple[dt.datetime | None, dt.datetime | None]]:
    """Each host's (stream vouched for at, last seen at)."""
    async with store.read() as db:
        found = await db.execute(
            select(HostRow.host_id, HostRow.stream_alive_at, HostRow.last_seen_at)
        )
        return {h: (alive, seen) for h, alive, seen in found}


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("hold", sorted(HOLDS))
@pytest.mark.parametrize("held", ["spoke", "silent"])
async def test_a_host_row_locked_elsewhere_holds_up_only_its_own_beat(
    store: Store, hold: str, held: str
) -> None:
    """The held host is one that spoke (its time and vouch in one write, among others in its
    slice) or a silent one (the vouch after the slices): either way the others are written at
    once and the held one at the first beat after its lock is gone."""
    ids = ["spoke", "spoke-2", "spoke-3", "silent", "silent-2"]
    for h in ids:
        await hosts.upsert_hello(store, h, [], "v", 0, "r1", f"s-{h}", "p")
    old = store.now() - dt.timedelta(hours=1)
    async with store.write() as db:
        await db.execute(update(HostRow).values(stream_alive_at=old, last_seen_at=old))
    later = store.now() + dt.timedelta(minutes=1)
    seen = {h: later for h in ids if h.startswith("spoke")}
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(HOLDS[hold], (held,))
        before = store.now()
        await asyncio.wait_for(hosts.heartbeat(store, "r1", seen, chunk=2), WITHIN_S)
        rows = await _rows(store)
        assert rows[held] == (old, old)
        for h in ids:
            if h != held:
                alive, last = rows[h]
                assert alive is not None and alive >= before, h
                assert last == seen.get(h, old), h
        assert await hosts.unvouched(store, 10.0) == {held}

        await holder.rollback()
        await asyncio.wait_for(hosts.heartbeat(store, "r1", seen, chunk=2), WITHIN_S)
        alive, last = (await _rows(store))[held]
        assert alive is not None and alive >= before
        assert last == seen.get(held, old)
        assert await hosts.unvouched(store, 10.0) == set()
    finally:
        await holder.rollback()
        await holder.close()

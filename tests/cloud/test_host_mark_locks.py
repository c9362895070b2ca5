"""A host row another transaction holds no longer holds up a replica's start or stop.

A replica that stops marks its hosts disconnected (`hosts.replica_gone`), and one that starts
with no other alive marks the dead cloud's hosts so (`hosts.none_connected`). On PostgreSQL
both UPDATEs waited for a `hosts` row locked elsewhere as long as its holder kept it: an
operator's `SELECT … FOR UPDATE` (or an UPDATE) left open in psql hung the replica's start, and
its stop went on past its grace. Now each waits `SWEEP_LOCK_TIMEOUT_MS` at most, marks every
other host, leaves the held one as it is and names it in a warning. Real PostgreSQL, the lock
held from a connection of its own; SQLite has one writer and no row locks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import psycopg
import pytest
from sqlalchemy import select, update

from cloud.events import EventBus
from cloud.lease.manager import LeaseManager
from cloud.lease.session import HostSession
from cloud.server import build_server
from cloud.store import hosts
from cloud.store.database import Store, libpq_dsn
from cloud.store.models import HostRow, ReplicaRow
from tests.cloud.conftest import SettingsFactory

pytestmark = pytest.mark.postgres

#: Far beyond a bounded wait and its second try; a write that blocks never gets there.
WITHIN_S = 15.0

HOLDS = {
    "select for update": "SELECT host_id FROM hosts WHERE host_id = %s FOR UPDATE",
    "update": "UPDATE hosts SET agent_version = agent_version WHERE host_id = %s",
}


async def _connected(store: Store) -> set[str]:
    async with store.read() as db:
        found = await db.scalars(select(HostRow.host_id).where(HostRow.connected.is_(True)))
        return set(found.all())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "cloud.store.hosts" and "left marked connected" in r.getMessage()
    ]


async def _hellos(store: Store, replica_id: str, ids: list[str], *, vouched_ago: float) -> None:
    for h in ids:
        await hosts.upsert_hello(store, h, [], "v", 0, replica_id, f"s-{h}", "p")
    old = store.now() - dt.timedelta(seconds=vouched_ago)
    async with store.write() as db:
        await db.execute(
            update(HostRow)
            .where(HostRow.host_id.in_(ids))
            .values(stream_alive_at=old, last_seen_at=old)
        )


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("hold", sorted(HOLDS))
@pytest.mark.parametrize("mark", ["replica_gone", "none_connected"])
async def test_a_host_row_locked_elsewhere_is_left_and_named(
    store: Store, caplog: pytest.LogCaptureFixture, hold: str, mark: str
) -> None:
    """The others are marked at once, the held one is left connected and named, and marked
    by the same call once its lock is gone."""
    ids = ["h1", "h2", "h3"]
    await _hellos(store, "r1", ids, vouched_ago=3600)
    before = store.now()

    async def marking() -> list[str]:
        if mark == "replica_gone":
            return await hosts.replica_gone(store, "r1")
        return await hosts.none_connected(store, before)

    caplog.set_level(logging.WARNING, logger="cloud.store.hosts")
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(HOLDS[hold], ("h2",))
        assert sorted(await asyncio.wait_for(marking(), WITHIN_S)) == ["h1", "h3"]
        assert await _connected(store) == {"h2"}
        (said,) = _warnings(caplog)
        assert "h2" in said and "locked by another transaction" in said, said
        await holder.rollback()
        assert await asyncio.wait_for(marking(), WITHIN_S) == ["h2"]
        assert await _connected(store) == set()
        assert len(_warnings(caplog)) == 1
    finally:
        await holder.rollback()
        await holder.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("when", ["start", "stop"])
async def test_a_replica_starts_and_stops_past_a_held_host_row(
    store: Store, make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    """A replica that starts alone after an outage, or that stops, with one of the hosts it
    marks held in psql: the start serves and the stop finishes; the held host is named."""
    caplog.set_level(logging.WARNING, logger="cloud.store.hosts")
    server = await build_server(make_settings())
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        if when == "start":
            # Hosts of a replica that died with the cloud, one of them held.
            await _hellos(store, "dead", ["h1", "h2"], vouched_ago=60)
            await holder.execute(HOLDS["select for update"], ("h2",))
            await asyncio.wait_for(server.start(), WITHIN_S)
        else:
            await server.start()
            await _hellos(store, server.bus.replica_id, ["h1", "h2"], vouched_ago=0)
            await holder.execute(HOLDS["select for update"], ("h2",))
            await asyncio.wait_for(server.stop(0.5), WITHIN_S)
        assert await _connected(store) == {"h2"}
        (said,) = _warnings(caplog)
        assert "h2" in said, said
    finally:
        await holder.rollback()
        await holder.close()
        await server.stop(0.5)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_stream_end_waiting_on_a_held_row_does_not_hold_up_the_stop(
    store: Store, make_settings: SettingsFactory
) -> None:
    """A host's stream ended just before the stop, and the write of its end waits for the
    host's row, held in psql: the stop waited for that write as long as the row was held."""
    manager = LeaseManager(store, EventBus(store), make_settings())
    session = HostSession(host_id="h1", planner_transport=0, process_id="p")
    await hosts.upsert_hello(
        store, "h1", [], "v", 0, manager.bus.replica_id, session.stream_id, "p"
    )
    manager.sessions["h1"] = session
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(HOLDS["select for update"], ("h1",))
        handler = asyncio.create_task(manager.closed(session))  # the Lease handler's finally
        await asyncio.sleep(0)  # its first step starts the write of the end
        assert manager._closings
        handler.cancel()  # the server cancels its handlers as it stops
        await asyncio.wait_for(manager.stop(), WITHIN_S)
        assert not manager._closings
        assert await _connected(store) == {"h1"}  # left, named by the goodbye's warning
    finally:
        await holder.rollback()
        await holder.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("mark", ["replica_gone", "none_connected"])
async def test_a_replicas_row_locked_elsewhere_holds_up_neither_the_marks_nor_their_return(
    store: Store, mark: str
) -> None:
    """The vouch row of the replica (migration 0032) is deleted after its hosts are marked: held
    in psql, it is left to go stale, and the hosts marked are still returned (for the fleet
    watchers). A plain DELETE waited for it as long as it was held."""
    await _hellos(store, "r1", ["h1", "h2"], vouched_ago=3600)
    await hosts.heartbeat(store, "r1")
    async with store.write() as db:  # the vouch an hour old, as a dead replica's is
        await db.execute(
            update(ReplicaRow).values(vouched_at=store.now() - dt.timedelta(seconds=3600))
        )
    before = store.now()

    async def marking() -> list[str]:
        if mark == "replica_gone":
            return await hosts.replica_gone(store, "r1")
        return await hosts.none_connected(store, before)

    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute("SELECT replica_id FROM replicas WHERE replica_id = 'r1' FOR UPDATE")
        assert sorted(await asyncio.wait_for(marking(), WITHIN_S)) == ["h1", "h2"]
        assert await _connected(store) == set()
        await holder.rollback()
        assert await asyncio.wait_for(marking(), WITHIN_S) == []
        async with store.read() as db:
            assert (await db.scalars(select(ReplicaRow.replica_id))).all() == []
    finally:
        await holder.rollback()
        await holder.close()

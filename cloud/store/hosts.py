"""Host rows: hello and device updates, which replica holds the stream, and the fleet list."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from sqlalchemy import String, Table, bindparam, select, text, update

from cloud.store.database import Store
from cloud.store.models import HostRow, UTCDateTime

# A replica vouches for its streams every host_heartbeat_seconds; after this many missed beats
# its hosts stop counting as connected (the replica probably died).
STALE_AFTER_BEATS = 3


async def upsert_hello(
    store: Store,
    host_id: str,
    devices: list[dict[str, Any]],
    agent_version: str,
    planner_transport: int,
    replica_id: str,
    stream_id: str,
) -> None:
    """Record a hello: the host is connected through `stream_id` on `replica_id`."""
    now = store.now()
    async with store.write() as session:
        row = await session.get(HostRow, host_id)
        if row is None:
            row = HostRow(host_id=host_id)
            session.add(row)
        row.devices = devices
        row.agent_version = agent_version
        row.planner_transport = planner_transport
        row.connected = True
        row.replica_id = replica_id
        row.stream_id = stream_id
        row.stream_alive_at = now
        row.last_seen_at = now


async def update_devices(store: Store, host_id: str, devices: list[dict[str, Any]]) -> None:
    """Replace the host's phone list."""
    now = store.now()
    async with store.write() as session:
        await session.execute(
            update(HostRow)
            .where(HostRow.host_id == host_id)
            .values(devices=devices, last_seen_at=now)
        )


async def disconnected(store: Store, host_id: str, stream_id: str) -> None:
    """The stream ended; only the stream that is still recorded may mark the host disconnected."""
    now = store.now()
    async with store.write() as session:
        await session.execute(
            update(HostRow)
            .where(HostRow.host_id == host_id, HostRow.stream_id == stream_id)
            .values(connected=False, last_seen_at=now)
        )


async def replica_gone(store: Store, replica_id: str) -> None:
    """A replica shuts down: none of its streams is open any more."""
    now = store.now()
    async with store.write() as session:
        await session.execute(
            update(HostRow)
            .where(HostRow.replica_id == replica_id, HostRow.connected.is_(True))
            .values(connected=False, last_seen_at=now)
        )


async def heartbeat(store: Store, replica_id: str, seen: dict[str, dt.datetime]) -> None:
    """The replica vouches for the streams it holds, and records when each host last spoke."""
    now = store.now()
    async with store.write() as session:
        await session.execute(
            update(HostRow)
            .where(HostRow.replica_id == replica_id, HostRow.connected.is_(True))
            .values(stream_alive_at=now)
        )
        if seen:
            conn = await session.connection()
            if store.is_postgres:
                await conn.execute(_TOUCH_PG, {"h_ids": list(seen), "h_ats": list(seen.values())})
            else:
                await conn.execute(
                    _TOUCH, [{"h_id": host_id, "h_at": at} for host_id, at in seen.items()]
                )


_HOSTS = cast(Table, HostRow.__table__)
# One statement for every host of a heartbeat (executemany), not one UPDATE built per host.
_TOUCH = (
    update(_HOSTS)
    .where(_HOSTS.c.host_id == bindparam("h_id", type_=String()))
    .values(last_seen_at=bindparam("h_at", type_=UTCDateTime()))
)
# On PostgreSQL the same update as one statement over two arrays: one round trip and one bound
# parameter per array instead of an executemany of thousands of rows (each bound and converted
# in Python while the event loop serves the host streams). `= ANY` keeps it on the primary key.
_TOUCH_PG = text(
    """
UPDATE hosts SET last_seen_at = v.at
FROM unnest(CAST(:h_ids AS varchar[]), CAST(:h_ats AS timestamptz[])) AS v(host_id, at)
WHERE hosts.host_id = ANY(CAST(:h_ids AS varchar[])) AND hosts.host_id = v.host_id
"""
)


async def list_hosts(store: Store, heartbeat_seconds: float) -> list[tuple[HostRow, bool]]:
    """Every host with whether a stream is open now: connected first, then by id."""
    now = store.now()
    stale = now - dt.timedelta(seconds=heartbeat_seconds * STALE_AFTER_BEATS)
    async with store.read() as session:
        rows = (await session.scalars(select(HostRow))).all()
    out = [
        (r, bool(r.connected and r.stream_alive_at is not None and r.stream_alive_at > stale))
        for r in rows
    ]
    out.sort(key=lambda pair: (not pair[1], pair[0].host_id))
    return out

"""The host heartbeat costs one row a beat, not one per connected host (issue 21).

A replica vouches for the streams it holds with its own row (`replicas`, migration 0032); a
host row that names it and says connected counts as connected while that row is fresh. A
connected host's "last seen" is its replica's last vouch; a host's own `last_seen_at` is written
when its stream opens and ends. Fleet watchers hear of connects, disconnects and the fields they
show, not of every host every beat. Real stores (SQLite and PostgreSQL), a real replica.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from amc.v1 import fleet_service_pb2, fleet_service_pb2_grpc, types_pb2
from cloud.lease.manager import FORGET_EVERY_BEATS
from cloud.server import CloudServer
from cloud.store import hosts
from cloud.store.database import Store
from cloud.store.engine import check, downgrade, upgrade
from cloud.store.models import HostRow, ReplicaRow
from tests.cloud.cloud_harness import ScriptedHost, channel, hello, table_names
from tests.cloud.test_fleet_watch import WAIT_S

FLEET = 200


async def _host_rows(store: Store) -> list[tuple[Any, ...]]:
    """Every host row, every column, in id order."""
    columns = [c for c in HostRow.__table__.columns]
    async with store.read() as db:
        found = await db.execute(select(*columns).order_by(HostRow.host_id))
        return [tuple(r) for r in found]


async def test_a_beat_of_many_renewing_hosts_writes_no_host_row_and_tells_no_watcher(
    cloud: CloudServer,
) -> None:
    """200 streams open on the replica, every host heard from since the last beat (as a
    renewal marks it): the beat leaves every host row as it was and publishes no host to the
    fleet watchers, and every host still counts as connected. Before, the beat wrote every
    such host's row (its last message time) and published all of them to every watcher (the
    cost at 2,000 and 10,000 hosts is measured in bench/host_heartbeat.py; 2,000 streams here
    took 95 s of a loaded CI run)."""
    manager = cloud.leases
    ids = [f"beat-{i:04d}" for i in range(FLEET)]
    request = hello(["p"]).hello
    sessions = []
    for start in range(0, FLEET, 200):
        sessions += await asyncio.gather(
            *(manager.open(h, request) for h in ids[start : start + 200])
        )
    await manager._beat()  # whatever the hellos left to tell
    before = await _host_rows(cloud.store)
    watcher = cloud.bus.subscribe_hosts()
    try:
        for session in sessions:
            manager.touch(session)  # what each renewal does
        await manager._beat()
        assert await _host_rows(cloud.store) == before
        cloud.bus.hosts_changed(["sentinel"])  # delivered at once, after whatever the beat sent
        assert await watcher.next() == {"sentinel"}
    finally:
        watcher.close()
    listed = await hosts.list_hosts(cloud.store, cloud.settings.host_heartbeat_seconds)
    assert sorted(row.host_id for row, connected in listed if connected) == ids


async def test_connected_follows_the_replicas_own_vouch(store: Store) -> None:
    """Both backends: a host whose hello is long past counts as connected while its replica's
    row is fresh, in every view (ListHosts' rows, its connection filters, the unvouched set),
    and shows that vouch as last seen; once its replica stops beating it is disconnected
    everywhere, last seen when its replica last vouched. A host of another replica, which
    never beat, and a host that disconnected are not vouched for by this replica's row."""
    for h, replica in (("mine", "r1"), ("elsewhere", "r2"), ("gone", "r1")):
        await hosts.upsert_hello(store, h, [], "v", 0, replica, f"s-{h}", "p")
    assert await hosts.disconnected(store, "gone", "s-gone")
    long_ago = store.now() - dt.timedelta(hours=1)
    async with store.write() as db:  # the hellos (and the stream's end) were long ago
        await db.execute(update(HostRow).values(stream_alive_at=long_ago, last_seen_at=long_ago))
    before = store.now()
    await hosts.heartbeat(store, "r1")
    async with store.read() as db:
        vouched = await db.scalar(select(ReplicaRow.vouched_at))
    assert vouched is not None and vouched >= before

    async def views() -> dict[str, Any]:
        listed = await hosts.list_hosts(store, 10.0)
        on, _ = await hosts.hosts_page(store, 10.0, hosts.HostFilter(hosts.CONNECTED), 10)
        off, _ = await hosts.hosts_page(store, 10.0, hosts.HostFilter(hosts.DISCONNECTED), 10)
        return {
            "connected": sorted(r.host_id for r, c in listed if c),
            "seen": {r.host_id: r.last_seen_at for r, _ in listed},
            "page on": [r.host_id for r, _ in on],
            "page off": [r.host_id for r, _ in off],
            "unvouched": await hosts.unvouched(store, 10.0),
        }

    now = await views()
    assert now["connected"] == now["page on"] == ["mine"]
    assert now["page off"] == ["elsewhere", "gone"]
    assert now["unvouched"] == {"elsewhere"}
    assert now["seen"] == {"mine": vouched, "elsewhere": long_ago, "gone": long_ago}

    async with store.write() as db:  # r1 stopped beating (it died) three beats ago
        await db.execute(update(ReplicaRow).values(vouched_at=long_ago + dt.timedelta(minutes=1)))
    later = await views()
    assert later["connected"] == later["page on"] == []
    assert later["page off"] == ["elsewhere", "gone", "mine"]
    assert later["unvouched"] == {"elsewhere", "mine"}
    assert later["seen"]["mine"] == long_ago + dt.timedelta(minutes=1)


async def test_a_replica_that_stops_takes_its_vouch_with_it(store: Store) -> None:
    """Both backends: a replica's end marks its hosts disconnected and deletes its row; a
    replica started after an outage of the whole cloud marks the dead replicas' hosts
    disconnected, last seen at their replica's last vouch, and deletes those rows."""
    await hosts.upsert_hello(store, "a", [], "v", 0, "r1", "s-a", "p")
    await hosts.upsert_hello(store, "b", [], "v", 0, "r2", "s-b", "p")
    long_ago = store.now() - dt.timedelta(hours=1)
    async with store.write() as db:
        await db.execute(update(HostRow).values(stream_alive_at=long_ago, last_seen_at=long_ago))
    await hosts.heartbeat(store, "r1")
    await hosts.heartbeat(store, "r2")
    assert await hosts.replica_gone(store, "r1") == ["a"]
    async with store.read() as db:
        assert list(await db.scalars(select(ReplicaRow.replica_id))) == ["r2"]
        r2 = await db.scalar(select(ReplicaRow.vouched_at))
    assert r2 is not None
    assert await hosts.none_connected(store, store.now()) == ["b"]
    async with store.read() as db:
        assert list(await db.scalars(select(ReplicaRow.replica_id))) == []
        seen = await db.scalar(select(HostRow.last_seen_at).where(HostRow.host_id == "b"))
    assert seen == r2


async def test_a_replicas_beat_deletes_the_rows_of_replicas_long_dead(cloud: CloudServer) -> None:
    """Both backends: a live replica's beat deletes the row of a replica that crashed (no clean
    stop) while others stayed up, once that row is `FORGET_AFTER_WINDOWS` staleness windows old
    and no host row saying connected names it. A row still named by a connected host (its last
    vouch, shown as its last seen) stays, as does one stale for less than that. Before, such a
    row stayed until the whole cloud restarted."""
    store = cloud.store
    window = cloud.settings.host_heartbeat_seconds * hosts.STALE_AFTER_BEATS
    now = store.now()
    long_dead = now - dt.timedelta(seconds=window * hosts.FORGET_AFTER_WINDOWS + 60)
    recently = now - dt.timedelta(seconds=window * (hosts.FORGET_AFTER_WINDOWS - 1))
    for h, replica in (("stuck", "r-stuck"), ("left", "r-dead")):
        await hosts.upsert_hello(store, h, [], "v", 0, replica, f"s-{h}", "p")
    assert await hosts.disconnected(store, "left", "s-left")  # names r-dead, not connected
    async with store.write() as db:
        hello = long_dead - dt.timedelta(hours=1)
        await db.execute(update(HostRow).values(stream_alive_at=hello, last_seen_at=hello))
        for replica, at in (("r-dead", long_dead), ("r-stuck", long_dead), ("r-late", recently)):
            db.add(ReplicaRow(replica_id=replica, vouched_at=at))
    for _ in range(FORGET_EVERY_BEATS):  # it looks once every so many beats
        await cloud.leases._beat()
    async with store.read() as db:
        left = sorted(await db.scalars(select(ReplicaRow.replica_id)))
    assert left == sorted(["r-late", "r-stuck", cloud.bus.replica_id])
    listed = {r.host_id: r for r, _ in await hosts.list_hosts(store, 10.0)}
    assert listed["stuck"].last_seen_at == long_dead


async def test_replaced_streams_names_only_the_hosts_whose_stream_differs(store: Store) -> None:
    """Both backends: of the (host, held stream) pairs, only the hosts whose row records
    another, known stream come back, with that stream's process and held leases; a host whose
    row records the held stream, none, or that has no row does not."""
    await hosts.upsert_hello(store, "same", [], "v", 0, "r1", "s-same", "p1")
    await hosts.upsert_hello(store, "newer", [], "v", 0, "r2", "s-newer-2", "p2")
    await hosts.upsert_hello(store, "blank", [], "v", 0, "r1", "s-blank", "p3")
    async with store.write() as db:
        await db.execute(
            update(HostRow).where(HostRow.host_id == "newer").values(held_leases=[["t1", 2, "l-1"]])
        )
        await db.execute(update(HostRow).where(HostRow.host_id == "blank").values(stream_id=None))
    held = [("same", "s-same"), ("newer", "s-newer-1"), ("blank", "s-blank"), ("none", "s")]
    assert await hosts.replaced_streams(store, held) == {
        "newer": hosts.CurrentStream("s-newer-2", "p2", [("t1", 2, "l-1")])
    }
    assert await hosts.replaced_streams(store, []) == {}


async def test_an_idle_connected_host_is_shown_seen_at_its_replicas_last_vouch(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """A host whose stream is open but that sends nothing is heard from through that stream
    (keepalives): ListHosts shows it last seen when its replica last vouched for the stream,
    which moves every heartbeat, not at its last message. Before, its `last_seen_at` stood at
    its hello for as long as it sent nothing. Once the stream ends, the end's time stays."""
    ch = channel(cloud.address, pki_dir, "operator-ops")
    fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ch)
    host = ScriptedHost(cloud.address, pki_dir, "h7")

    async def shown() -> types_pb2.Host:
        listed: fleet_service_pb2.ListHostsResponse = await fleet.ListHosts(
            fleet_service_pb2.ListHostsRequest()
        )
        (found,) = [h for h in listed.hosts if h.host_id == "h7"]
        return found

    try:
        await host.connect(["p1"])
        first = await shown()
        assert first.connected
        loop = asyncio.get_running_loop()
        end = loop.time() + WAIT_S
        while (await shown()).last_seen_at.ToDatetime() <= first.last_seen_at.ToDatetime():
            assert loop.time() < end, "an idle connected host's last_seen_at never moved"
            await asyncio.sleep(0.1)
        await host.close()
        end = loop.time() + WAIT_S
        while (gone := await shown()).connected:
            assert loop.time() < end, "the host never showed disconnected"
            await asyncio.sleep(0.05)
        ended = gone.last_seen_at
        assert ended.ToDatetime() > first.last_seen_at.ToDatetime()
        await asyncio.sleep(cloud.settings.host_heartbeat_seconds * 1.5)  # a beat or two later
        assert (await shown()).last_seen_at == ended
    finally:
        await host.close()
        await ch.close()


async def test_migration_0032_adds_the_replicas_and_back(db_url: str) -> None:
    """Both backends: 0032 adds the table `replicas` and nothing else; a host connected before
    it (its hello's vouch) still counts after it; its downgrade drops the table; the schema
    matches the models again after the upgrade."""
    s = Store.from_url(db_url)
    try:
        await upgrade(s.engine)
        # Written at the head (the store names columns later migrations add, 0034's), kept
        # through the downgrade: a host connected before 0032.
        await hosts.upsert_hello(s, "h1", [], "v", 0, "r-old", "s-1", "p")
        await downgrade(s.engine, "0031")
        before = await table_names(s)
        await upgrade(s.engine, "0032")
        assert await table_names(s) - before == {"replicas"}
        await upgrade(s.engine)  # the store reads them too
        assert [c for _, c in await hosts.list_hosts(s, 10.0)] == [True]
        await hosts.heartbeat(s, "r-new")
        await downgrade(s.engine, "0031")
        assert await table_names(s) == before
        await upgrade(s.engine)
        await check(s.engine)
    finally:
        await s.close()

"""A replica that starts while no other is alive gives live leases a new term, on both
backends: while the whole cloud was down no host could renew, so the first sweep would otherwise
requeue work hosts kept doing (and, on the direct transport, may have finished: its result is
refused once another attempt started, and the work runs twice)."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select, text, update

from cloud.server import build_server
from cloud.settings import CloudSettings
from cloud.store import hosts, leases, states, tasks
from cloud.store.database import Store
from cloud.store.engine import upgrade
from cloud.store.models import AttemptRow
from cloud.store.replicas import NAMESPACE, Presence
from tests.cloud.test_late_results import _claimed, _lapse, _result
from tests.support.postgres import PostgresServer


async def _expiry(store: Store, c: leases.Claimed) -> dt.datetime:
    async with store.read() as session:
        value = await session.scalar(
            select(AttemptRow.lease_expires_at).where(
                AttemptRow.task_id == c.task_id, AttemptRow.attempt == c.attempt
            )
        )
    assert value is not None
    return value


async def test_live_leases_get_a_new_term_and_none_is_shortened(store: Store) -> None:
    lapsed = await _claimed(store, serial="p1")
    await _lapse(store, lapsed)
    long = await _claimed(store, serial="p2")
    far = store.now() + dt.timedelta(hours=1)
    async with store.write() as session:
        await session.execute(
            update(AttemptRow)
            .where(AttemptRow.task_id == long.task_id)
            .values(lease_expires_at=far)
        )
    ended = await _claimed(store, serial="p3")
    assert (await _result(store, ended)).recorded

    before = store.now()
    assert await leases.extend_after_outage(store) == 1
    assert await _expiry(store, lapsed) >= before + dt.timedelta(seconds=30)  # its lease_seconds
    assert await _expiry(store, long) == far
    assert await leases.sweep_expired(store) == []
    # The host renews as if nothing happened, and its result is on time, not late.
    out = await _result(store, lapsed)
    assert (out.recorded, out.late) == (True, False)
    view = await tasks.get(store, ended.task_id)
    assert view is not None and view.task.status == states.SUCCEEDED


async def test_only_a_replica_alone_gives_the_new_term(store: Store) -> None:
    """On SQLite a replica is always alone; on PostgreSQL another replica holding its presence
    lock means the cloud was not down (that replica sweeps as usual), and one that let go of it
    is gone at once, however recently it vouched for its hosts."""
    a, b = Presence(store, "replica-a"), Presence(store, "replica-b")
    assert not await a.others_alive()
    await b.hold()
    try:
        await hosts.upsert_hello(store, "h9", [], "v", 0, "replica-b", "stream-1", "proc-1")
        await hosts.heartbeat(store, "replica-b")
        assert await a.others_alive() == store.is_postgres
        assert not await b.others_alive()  # its own lock is not another replica
    finally:
        await b.release()
    assert not await a.others_alive()  # its rows still look vouched for; the lock says gone


@pytest.mark.postgres
async def test_a_killed_replica_stops_counting_as_alive_at_once(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """SIGKILL leaves no chance to let go: the server ends the lock with the dead process's
    connection. Replicas of another database on the same server never count."""
    url = postgres_server.create_database()
    other = postgres_server.create_database()
    holder = tmp_path / "hold.py"
    holder.write_text(
        "import asyncio, sys\n"
        "from cloud.store.database import Store\n"
        "from cloud.store.replicas import Presence\n"
        "async def main():\n"
        "    p = Presence(Store.from_url(sys.argv[1]), 'doomed')\n"
        "    await p.hold()\n"
        "    print('held', flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(holder), url, stdout=asyncio.subprocess.PIPE
    )
    store, elsewhere = Store.from_url(url), Store.from_url(other)
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"held"
        me = Presence(store, "survivor")
        assert await me.others_alive()
        assert not await Presence(elsewhere, "neighbour").others_alive()
        proc.kill()
        await proc.wait()
        deadline = time.monotonic() + 10
        while await me.others_alive():
            assert time.monotonic() < deadline, "a killed replica's lock outlived it by 10 s"
            await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await store.close()
        await elsewhere.close()


async def test_the_presence_lock_comes_back_after_its_connection_broke(store: Store) -> None:
    """A database restart or a broken network ends the lock with its connection; the replica's
    next heartbeat takes it again."""
    a, b = Presence(store, "replica-a"), Presence(store, "replica-b")
    await b.hold()
    try:
        if store.is_postgres:
            async with store.engine.connect() as conn:
                await conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks "
                        "WHERE locktype = 'advisory' AND classid = CAST(:ns AS oid) "
                        "AND objid = CAST(:key AS oid)"
                    ),
                    {"ns": NAMESPACE, "key": b.key},
                )
            deadline = time.monotonic() + 10
            while await a.others_alive():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        await b.keep()
        assert b.held
        assert await a.others_alive() == store.is_postgres
    finally:
        await b.release()


async def test_a_replica_started_after_an_outage_does_not_sweep_what_hosts_kept(
    db_url: str, pki_dir: Path
) -> None:
    settings = CloudSettings(
        database_url=db_url,
        listen_address="127.0.0.1:0",
        pki_dir=pki_dir,
        sweep_interval_seconds=0.05,
    )
    # The first replica never sweeps: the lease lapses after it is gone, as in an outage.
    first = await build_server(settings.model_copy(update={"sweep_interval_seconds": 3600.0}))
    await first.start()
    try:
        c = await _claimed(first.store)
        await _lapse(first.store, c)  # the cloud was down for longer than the lease
    finally:
        await first.stop(0)
    again = await build_server(settings)
    await again.start()
    try:
        await again.leases.sweeper.sweep()  # what its first sweep would do
        view = await tasks.get(again.store, c.task_id)
        assert view is not None
        assert view.task.status == states.ASSIGNED and view.attempts[0].ended_at is None
    finally:
        await again.stop(0)


async def test_a_replica_started_after_an_outage_lists_no_host_of_the_dead_cloud_connected(
    db_url: str, pki_dir: Path
) -> None:
    """Hosts whose streams a crashed replica held (SIGKILL: it never marked them disconnected)
    are not connected to a replica that starts with none other alive, until they say hello.
    Before, a host that died with the cloud read "connected · last seen now" in `amc host list`
    and the fleet view for three heartbeats (30 s by default) after the cloud came back; its
    last vouched-for moment is kept as when it was last seen."""
    settings = CloudSettings(database_url=db_url, listen_address="127.0.0.1:0", pki_dir=pki_dir)
    store = Store.from_url(db_url)
    await upgrade(store.engine)
    try:  # what a replica killed mid-heartbeat leaves: a stream it vouched for a moment ago
        await hosts.upsert_hello(store, "gone", [], "v", 0, "killed-replica", "stream-1", "p1")
        vouched = store.now()
        await hosts.heartbeat(store, "killed-replica")
        assert [c for _, c in await hosts.list_hosts(store, 10.0)] == [True]
    finally:
        await store.close()
    again = await build_server(settings)
    await again.start()
    try:
        [(row, connected)] = await hosts.list_hosts(again.store, 10.0)
        assert not connected and not row.connected
        assert row.last_seen_at is not None and row.last_seen_at >= vouched
    finally:
        await again.stop(0)

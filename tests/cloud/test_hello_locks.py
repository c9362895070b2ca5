"""A host row another transaction holds fails its own host's hello only, never its batch's.

Hellos are settled in batches (`cloud.lease.hellos`), one transaction locking every host row
of the batch. On PostgreSQL that lock waited for a row held elsewhere (an operator's
`SELECT … FOR UPDATE` or UPDATE left open in psql) as long as its holder kept it: no host of
the batch could connect meanwhile, nor any hello queued behind it. Now the batch waits
`SWEEP_LOCK_TIMEOUT_MS` at most, settles every hello whose row is free, and the held host's
stream ends UNAVAILABLE saying why (the host reconnects with its backoff). Real PostgreSQL,
the lock held from a connection of its own; SQLite has one writer and no row locks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from pathlib import Path

import grpc
import psycopg
import pytest
from sqlalchemy import select, update

from cloud.lease.hellos import HelloBatcher
from cloud.server import CloudServer
from cloud.store import hosts, leases, tasks
from cloud.store.database import Store, libpq_dsn
from cloud.store.lock_waits import RowHeld, lock_timed_out
from cloud.store.models import AttemptRow, HostRow
from tests.cloud.cloud_harness import ScriptedHost

pytestmark = pytest.mark.postgres

#: Far beyond a bounded wait and its second try; a hello that blocks never gets there.
WITHIN_S = 15.0

HOLDS = {
    "select for update": "SELECT host_id FROM hosts WHERE host_id = %s FOR UPDATE",
    "update": "UPDATE hosts SET agent_version = agent_version WHERE host_id = %s",
}


def _hello(host_id: str, stream_id: str) -> leases.HelloIn:
    return leases.HelloIn(host_id, hosts.HelloRecord([], "v2", 0, "r1", stream_id, "p"), [])


async def _streams(store: Store, ids: list[str]) -> dict[str, str | None]:
    """The stream each host's row records now (its latest recorded hello's)."""
    async with store.read() as db:
        rows = await db.execute(
            select(HostRow.host_id, HostRow.stream_id).where(HostRow.host_id.in_(ids))
        )
        return {h: s for h, s in rows.all()}


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("hold", sorted(HOLDS))
async def test_a_held_host_row_fails_its_own_hello_and_the_batch_is_settled(
    store: Store, hold: str
) -> None:
    """One batch of three hellos, the middle host's row held: the other two are recorded in
    that batch, the held one fails naming its row and is recorded once the lock is gone."""
    ids = ["h1", "h2", "h3"]
    for h in ids:
        await hosts.upsert_hello(store, h, [], "v", 0, "r1", f"old-{h}", "p")
    batcher = HelloBatcher(store, 0.01)
    batcher.start()
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(HOLDS[hold], ("h2",))
        pending = [batcher.submit(_hello(h, f"new-{h}")) for h in ids]
        outs = await asyncio.wait_for(
            asyncio.gather(*(asyncio.shield(p) for p in pending), return_exceptions=True),
            WITHIN_S,
        )
        assert isinstance(outs[0], leases.Settled) and outs[0].previous_process == "p"
        assert isinstance(outs[2], leases.Settled) and outs[2].previous_process == "p"
        assert isinstance(outs[1], RowHeld), outs[1]
        assert "host h2's row" in str(outs[1]) and "locked by another transaction" in str(outs[1])
        assert batcher.batches == 1  # settled as one batch, not each hello alone
        assert await _streams(store, ids) == {
            "h1": "new-h1",
            "h2": "old-h2",
            "h3": "new-h3",
        }
        await holder.rollback()
        again = await asyncio.wait_for(asyncio.shield(batcher.submit(_hello("h2", "new-h2"))), 15)
        assert again.previous_process == "p"
        assert await _streams(store, ["h2"]) == {"h2": "new-h2"}
    finally:
        await holder.rollback()
        await holder.close()
        await batcher.stop()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_hosts_connect_while_another_hosts_row_is_held(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """Real streams: with h2's row held, h1 and h3 are welcomed and h2's stream ends
    UNAVAILABLE telling it why; once the lock is gone h2 connects."""
    for h in ("h1", "h2", "h3"):
        async with ScriptedHost(cloud.address, pki_dir, h) as first:
            await first.connect(["p"], process_id="p1")
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(cloud.store.engine))
    streams = [ScriptedHost(cloud.address, pki_dir, h) for h in ("h1", "h2", "h3")]
    try:
        await holder.execute(HOLDS["select for update"], ("h2",))
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                *(s.connect(["p"], process_id="p1") for s in streams), return_exceptions=True
            ),
            WITHIN_S,
        )
        welcomed = [o.host_id for o in outcomes if not isinstance(o, BaseException)]
        assert welcomed == ["h1", "h3"], outcomes
        assert isinstance(outcomes[1], AssertionError), outcomes[1]  # the stream ended
        ended = streams[1].error
        assert ended is not None and ended.code() == grpc.StatusCode.UNAVAILABLE
        assert "host h2's row" in (ended.details() or ""), ended.details()
        await holder.rollback()
        async with ScriptedHost(cloud.address, pki_dir, "h2") as retry:
            assert (await retry.connect(["p"], process_id="p1")).host_id == "h2"
    finally:
        await holder.rollback()
        await holder.close()
        for s in streams:
            await s.close()


async def _outbox_items(store: Store, host_id: str) -> int | None:
    async with store.read() as db:
        return await db.scalar(select(HostRow.outbox_items).where(HostRow.host_id == host_id))


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("hold", sorted(HOLDS))
async def test_an_outbox_report_on_a_held_row_is_dropped_not_waited_for(
    store: Store, caplog: pytest.LogCaptureFixture, hold: str
) -> None:
    """The host's handler goes on (its Welcome, its renewals); the report is named in a
    warning, and the next one after the lock is gone is recorded."""
    await hosts.upsert_hello(store, "h1", [], "v", 0, "r1", "s-h1", "p")
    caplog.set_level(logging.WARNING, logger="cloud.store.hosts")
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(HOLDS[hold], ("h1",))
        report = hosts.Backlog(items=3, decisions=1, refused=0, oldest_at=None)
        await asyncio.wait_for(hosts.update_outbox(store, "h1", report), WITHIN_S)
        assert not await _outbox_items(store, "h1")
        said = [r.getMessage() for r in caplog.records if "outbox backlog" in r.getMessage()]
        assert len(said) == 1 and "h1" in said[0] and "locked by another transaction" in said[0]
        await holder.rollback()
        await asyncio.wait_for(hosts.update_outbox(store, "h1", report), WITHIN_S)
        assert await _outbox_items(store, "h1") == 3
    finally:
        await holder.rollback()
        await holder.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_held_task_row_a_hello_re_announces_fails_that_hello_only(store: Store) -> None:
    """h1 re-announces a lease that ran out while it was away (the hello revives it, locking
    its attempt and task rows) and the task's row is held in psql: h2 and h3 of the same batch
    are settled, h1's hello fails on the lock timeout, and settles once the lock is gone."""
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
    )
    await hosts.upsert_hello(store, "h1", [], "v", 0, "r1", "old-h1", "p")
    claimed = await leases.claim(store, "h1", ["p1"], 0)
    assert claimed is not None
    async with store.write() as db:
        await db.execute(
            update(AttemptRow)
            .where(AttemptRow.task_id == claimed.task_id)
            .values(lease_expires_at=store.now() - dt.timedelta(seconds=1))
        )
    held = leases.HeldLease(claimed.task_id, claimed.attempt, claimed.lease_id)

    def h1_hello() -> leases.HelloIn:
        return leases.HelloIn("h1", hosts.HelloRecord([], "v2", 0, "r1", "new-h1", "p"), [held])

    batcher = HelloBatcher(store, 0.01)
    batcher.start()
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(
            "SELECT 1 FROM tasks WHERE task_id = %s FOR UPDATE", (claimed.task_id,)
        )
        pending = [
            batcher.submit(h1_hello()),
            batcher.submit(_hello("h2", "new-h2")),
            batcher.submit(_hello("h3", "new-h3")),
        ]
        outs = await asyncio.wait_for(
            asyncio.gather(*(asyncio.shield(p) for p in pending), return_exceptions=True),
            WITHIN_S,
        )
        # Named as a held row, not "the cloud's database is unavailable" (the database answers).
        assert isinstance(outs[0], RowHeld) and lock_timed_out(outs[0]), outs[0]
        assert "host h1's hello" in str(outs[0]) and "locked by another" in str(outs[0])
        assert all(isinstance(o, leases.Settled) for o in outs[1:]), outs
        await holder.rollback()
        again = await asyncio.wait_for(asyncio.shield(batcher.submit(h1_hello())), WITHIN_S)
        assert again.checks is not None and again.checks[0].live is not None  # revived
    finally:
        await holder.rollback()
        await holder.close()
        await batcher.stop()

"""A stopping replica ends the work it shielded from its callers, rather than leave it running.

Two pieces of work run under `asyncio.shield`, so that one caller's cancellation does not end
them for the others: the new term after a gap in the replica's time (`ClockWatch.settled`:
every renewal batch, result and sweep waits for it) and a fleet watcher's re-read after a
LISTEN gap (`_Rereads`: shared by every watcher of the replica). A stop cancels the callers,
and nothing cancelled or awaited the shielded work: it ran on into the closed store, or was
destroyed pending with the loop. Now `LeaseManager.stop` gives the new term a bounded time and
then cancels it, and the server's stop cancels the watchers' reads before the store closes.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import psycopg
import pytest

from cloud.events import EventBus
from cloud.lease.manager import LeaseManager
from cloud.server import build_server
from cloud.store.database import Store, libpq_dsn
from tests.cloud.conftest import SettingsFactory


async def test_a_stopping_lease_manager_ends_a_new_term_under_way(
    store: Store, make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock stepped an hour forward; the new term waits on the presence check (another
    replica alive?) when the replica stops and its caller, a renewal batch, is cancelled."""
    asked = asyncio.Event()
    answer = asyncio.Event()  # never set: the check is still under way at the stop

    async def others_alive() -> bool:
        asked.set()
        await answer.wait()
        return False

    manager = LeaseManager(store, EventBus(store), make_settings(), others_alive=others_alive)
    real = Store.now
    monkeypatch.setattr(store, "now", lambda: real() + dt.timedelta(hours=1))
    caller = asyncio.create_task(manager.clock.settled())
    await asyncio.wait_for(asked.wait(), 30)
    settling = manager.clock._pending
    assert settling is not None and not settling.done()
    caller.cancel()
    try:
        await manager.stop()
        assert settling.done(), "the new term was left running after the stop"
    finally:
        answer.set()
        await asyncio.gather(settling, caller, return_exceptions=True)


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_stopping_replica_ends_its_watchers_shared_read(
    store: Store, make_settings: SettingsFactory
) -> None:
    """A watcher's re-read waits on the tasks table (an operator's `LOCK TABLE` in psql, or
    just a slow read) when the replica stops and the watcher's handler is cancelled."""
    server = await build_server(make_settings())
    await server.start()
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE")
        rereads = server._progress._rereads
        watcher = asyncio.create_task(rereads.read(None))
        await asyncio.sleep(0)  # the watcher asked: the shared read is made
        (read,) = rereads._reads
        watcher.cancel()
        await asyncio.wait_for(server.stop(0.5), 30)
        assert read.done(), "the watchers' read was left running after the stop"
    finally:
        await holder.rollback()
        await holder.close()
        await server.stop(0.5)

"""A stream's phone list is said written, and its host shown changed, only when it was.

`hosts.update_devices` writes a stream's list only while that stream is the one the host's row
names: a newer stream's hello (on this replica or another) overtakes an older stream's list on
its way, and the newer stream's own phones stand. `PhoneLists` read its answer nowhere: the
older stream's list, written now or retried once its held row was free, was said recorded and
the host's watchers told it changed, though nothing was written. Real SQLite and PostgreSQL,
the row held from a connection of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import psycopg
import pytest
from sqlalchemy import delete, select

from cloud.lease.held_rows import PhoneLists
from cloud.lease.session import HostSession
from cloud.store import hosts
from cloud.store.database import Store, libpq_dsn
from cloud.store.models import HostRow

#: Far beyond a bounded wait and its retries.
WITHIN_S = 15.0

HOLD_HOST = "SELECT 1 FROM hosts WHERE host_id = %s FOR UPDATE"
NEWER_HELLO = "UPDATE hosts SET stream_id = 'newer' WHERE host_id = %s"


class _Replica:
    """What owns `PhoneLists` in a replica, in small: it runs the background retries and
    hears which hosts' lists were written (the manager tells the hosts' watchers)."""

    def __init__(self, store: Store) -> None:
        self.written: list[str] = []
        self.retries: list[asyncio.Task[None]] = []
        self.lists = PhoneLists(store, self.written.append, self.spawn)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.retries.append(asyncio.ensure_future(coro))


async def _serials(store: Store, host_id: str) -> list[str]:
    async with store.read() as db:
        row = await db.scalar(select(HostRow).where(HostRow.host_id == host_id))
        assert row is not None
        return [d["serial"] for d in row.devices or []]


def _recorded(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "phone list is recorded" in r.getMessage()]


async def test_a_list_of_a_stream_no_longer_the_hosts_is_not_said_written(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """h1's row names a newer stream than the one a phone list comes on: the list is not
    written, and `write` says so (False: its host is not shown changed). Before, it answered
    True, and the manager told h1's watchers it changed."""
    caplog.set_level(logging.INFO, logger="cloud.lease")
    await hosts.upsert_hello(store, "h1", [{"serial": "p1"}], "v", 0, "r1", "newer", "p")
    replica = _Replica(store)
    older = HostSession(host_id="h1", planner_transport=0, stream_id="older")
    assert not await replica.lists.write(older, [{"serial": "p1"}, {"serial": "p2"}])
    assert await _serials(store, "h1") == ["p1"]
    assert replica.lists.kept("h1") is None and not replica.retries
    said = [r.getMessage() for r in caplog.records if "h1" in r.getMessage()]
    assert any("not written" in m and "newer stream" in m for m in said), said


async def test_a_list_for_a_host_whose_row_is_gone_says_so_not_a_newer_stream(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """h1's row was deleted (by an operator, in SQL) while its stream was open: its phone list
    is not written, and the log says the row is gone. Before, it said a newer stream of the
    host was recorded, and sent the operator looking for a second host process."""
    caplog.set_level(logging.INFO, logger="cloud.lease")
    await hosts.upsert_hello(store, "h1", [{"serial": "p1"}], "v", 0, "r1", "s1", "p")
    async with store.write() as db:
        await db.execute(delete(HostRow).where(HostRow.host_id == "h1"))
    replica = _Replica(store)
    stream = HostSession(host_id="h1", planner_transport=0, stream_id="s1")
    assert await hosts.update_devices(store, "h1", [], stream_id="s1") is hosts.ListWrite.NO_ROW
    assert not await replica.lists.write(stream, [{"serial": "p1"}, {"serial": "p2"}])
    assert replica.lists.kept("h1") is None and not replica.retries and not replica.written
    said = [r.getMessage() for r in caplog.records if "h1" in r.getMessage()]
    assert any("no row in the database" in m for m in said), said
    assert not any("newer stream" in m for m in said), said


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_kept_list_a_newer_stream_overtook_is_not_said_recorded(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """h1's new phone list waits for h1's row (held in psql) and is retried in the background;
    meanwhile a newer stream's hello is recorded in that row (as on another replica). The
    retry then writes nothing, and says so: no "recorded" line, no word to h1's watchers.
    Before, both came, for a list that never reached the row."""
    caplog.set_level(logging.INFO, logger="cloud.lease")
    await hosts.upsert_hello(store, "h1", [{"serial": "p1"}], "v", 0, "r1", "older", "p")
    replica = _Replica(store)
    older = HostSession(host_id="h1", planner_transport=0, stream_id="older")
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(store.engine))
    try:
        await holder.execute(HOLD_HOST, ("h1",))
        assert not await replica.lists.write(older, [{"serial": "p1"}, {"serial": "p2"}])
        assert replica.lists.kept("h1") is not None and len(replica.retries) == 1
        await holder.execute(NEWER_HELLO, ("h1",))
        await holder.commit()
        await asyncio.wait_for(replica.retries[0], WITHIN_S)
    finally:
        await holder.rollback()
        await holder.close()
    assert replica.lists.kept("h1") is None
    assert await _serials(store, "h1") == ["p1"]
    assert replica.written == []
    assert _recorded(caplog) == []
    said = [r.getMessage() for r in caplog.records if "h1" in r.getMessage()]
    assert any("not written" in m and "newer stream" in m for m in said), said

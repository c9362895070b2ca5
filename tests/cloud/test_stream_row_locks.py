"""Rows held elsewhere no longer stall a host's open stream, its restart, or its end.

A host's stream writes its row when its phones change (`hosts.update_devices`, in the stream's
reader, ahead of every renewal behind it) and when it ends (`hosts.disconnected`); a restarted
host's hello releases its previous process's leases before its Welcome. On PostgreSQL each
waited for a row another transaction held (an operator's `SELECT … FOR UPDATE` left open in
psql) as long as its holder kept it: renewals went unanswered until the host's leases ran out,
the restarted host never got its Welcome, the stream's handler never ended. Real PostgreSQL,
real Lease streams, the lock held from a connection of its own; SQLite has one writer and no
row locks.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from sqlalchemy import select

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.lease import manager as manager_module
from cloud.server import CloudServer
from cloud.store import states
from cloud.store.database import Store, libpq_dsn
from cloud.store.models import AttemptRow, HostRow
from tests.cloud.cloud_harness import ScriptedHost, device, renewal, submit
from tests.support.waiting import until

pytestmark = pytest.mark.postgres

#: Far beyond a bounded wait and its retries; a write that blocks never gets there.
WITHIN_S = 15.0

HOLD_HOST = "SELECT host_id FROM hosts WHERE host_id = %s FOR UPDATE"


async def _row(store: Store, host_id: str) -> HostRow:
    async with store.read() as db:
        row = await db.scalar(select(HostRow).where(HostRow.host_id == host_id))
        assert row is not None
        return row


def _serials(row: HostRow) -> list[str]:
    return sorted(d["serial"] for d in row.devices or [])


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_renewals_flow_while_a_phone_list_waits_for_its_held_row(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """With h1's row held, a DeviceUpdate does not hold up the renewals behind it on that
    stream; the new phone list is written once the lock is gone."""
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(cloud.store.engine))
    try:
        async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
            await host.connect(["p1"])
            await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
            a = (await host.next("assignment")).assignment
            await holder.execute(HOLD_HOST, ("h1",))
            await host.send(
                lease_pb.LeaseRequest(
                    device_update=lease_pb.DeviceUpdate(devices=[device("p1"), device("p2")])
                )
            )
            for step in (1, 2, 3):
                await host.send(renewal(a, step))
                renewed = (await host.next("renewed", wait=WITHIN_S)).renewed
                assert renewed.task_id == a.task_id
            assert _serials(await _row(cloud.store, "h1")) == ["p1"]  # still held
            assert cloud.leases.phone_lists.kept("h1") is not None
            await holder.rollback()

            async def landed() -> bool:
                # The retry drops its kept list after its commit returns: both, not one.
                written = _serials(await _row(cloud.store, "h1")) == ["p1", "p2"]
                return written and cloud.leases.phone_lists.kept("h1") is None

            await until(landed, WITHIN_S, "h1's new phone list written and no longer kept")
            await host.send(renewal(a, 4))  # the stream goes on
            assert (await host.next("renewed")).renewed.task_id == a.task_id
    finally:
        await holder.rollback()
        await holder.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("announced", [False, True], ids=["released", "re-announced"])
async def test_a_restart_whose_old_lease_rows_are_held_is_told_and_retries(
    cloud: CloudServer, ops: Any, pki_dir: Path, announced: bool
) -> None:
    """h1 restarts (a new process) while its old lease's task row is held: its stream ends
    UNAVAILABLE naming the rows, h2 connects meanwhile; once the lock is gone the same new
    process reconnects and is welcomed. Its predecessor's lease is then released, or, when the
    new process re-announces it (a result it took over), resumed: the hold stalled the release
    in one case, the resume's RESUMED event in the other."""
    async with ScriptedHost(cloud.address, pki_dir, "h1") as old:
        await old.connect(["p1"], process_id="old")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = (await old.next("assignment")).assignment
    held = [lease_pb.HeldAssignment(task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id)]
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(cloud.store.engine))
    restarted = ScriptedHost(cloud.address, pki_dir, "h1")
    other = ScriptedHost(cloud.address, pki_dir, "h2")
    try:
        await holder.execute("SELECT 1 FROM tasks WHERE task_id = %s FOR UPDATE", (a.task_id,))
        outcomes = await asyncio.wait_for(
            asyncio.gather(
                restarted.connect(["p1"], held if announced else None, process_id="new"),
                other.connect(["q1"], process_id="q"),
                return_exceptions=True,
            ),
            WITHIN_S,
        )
        assert isinstance(outcomes[1], lease_pb.Welcome), outcomes[1]
        assert isinstance(outcomes[0], AssertionError), outcomes[0]  # the stream ended
        ended = restarted.error
        assert ended is not None and ended.code() == grpc.StatusCode.UNAVAILABLE
        assert "host h1's restart" in (ended.details() or ""), ended.details()
        assert "locked by another transaction" in (ended.details() or "")
        await holder.rollback()
        async with ScriptedHost(cloud.address, pki_dir, "h1") as again:
            welcome = await again.connect(["p1"], held if announced else None, process_id="new")
            assert welcome.host_id == "h1"
            if announced:
                back = (await again.next("assignment")).assignment
                assert back.resumed and back.task_id == a.task_id
        async with cloud.store.read() as db:
            first = await db.scalar(
                select(AttemptRow).where(
                    AttemptRow.task_id == a.task_id, AttemptRow.attempt == a.attempt
                )
            )
        assert first is not None
        if announced:
            assert first.failure_reason is None, first.failure_reason
        else:
            assert first.failure_reason == states.HOST_RESTARTED
    finally:
        await holder.rollback()
        await holder.close()
        await restarted.close()
        await other.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_stream_end_on_a_held_row_is_recorded_once_the_row_is_free(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """h1 ends its stream (half-closes it) while its row is held: the cloud's handler ends
    the call anyway, and the row (which names this replica's stream, vouched for by its
    heartbeat) is marked disconnected once the lock is gone, without another stream of h1."""
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(cloud.store.engine))
    try:
        async with ScriptedHost(cloud.address, pki_dir, "h1") as host:
            await host.connect(["p1"], process_id="p")
            await holder.execute(HOLD_HOST, ("h1",))
            await host.call.done_writing()
            assert await host.ended(WITHIN_S) is None  # OK: the handler ended
        assert (await _row(cloud.store, "h1")).connected  # still held
        await holder.rollback()

        async def marked() -> bool:
            return not (await _row(cloud.store, "h1")).connected

        await until(marked, WITHIN_S, "h1 marked disconnected")
    finally:
        await holder.rollback()
        await holder.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_restart_cancelled_while_its_old_lease_rows_are_held_leaves_no_session(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1 restarts while its old lease's task row is held and goes again (its call cancelled)
    while the release waits: the cancellation passed the restart's guard, and the session
    stayed in the replica's sessions for as long as it ran, its row "connected", taking
    assignments nobody read. The wait is lengthened so the cancel lands inside it."""
    monkeypatch.setattr(manager_module, "SWEEP_LOCK_TIMEOUT_MS", 30_000)
    async with ScriptedHost(cloud.address, pki_dir, "h1") as old:
        await old.connect(["p1"], process_id="old")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = (await old.next("assignment")).assignment
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(cloud.store.engine))
    restarted = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await holder.execute("SELECT 1 FROM tasks WHERE task_id = %s FOR UPDATE", (a.task_id,))
        connecting = asyncio.ensure_future(restarted.connect(["p1"], process_id="new"))

        def waiting() -> bool:
            session = cloud.leases.sessions.get("h1")
            return session is not None and session.process_id == "new" and session.recorded

        await until(waiting, WITHIN_S, "the restart's hello recorded, its release waiting")
        assert restarted.call is not None
        restarted.call.cancel()
        with contextlib.suppress(BaseException):
            await connecting
        await until(
            lambda: "h1" not in cloud.leases.sessions, WITHIN_S, "the cancelled session dropped"
        )
    finally:
        await holder.rollback()
        await holder.close()
        await restarted.close()

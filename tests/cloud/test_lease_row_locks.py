"""A task, attempt or host row held elsewhere no longer stalls a host's lease stream.

An operator's open psql session (`SELECT … FOR UPDATE` left open) may hold a `tasks`,
`attempts` or `hosts` row. On PostgreSQL the stream waited for it as long as its holder kept
it in several places: a refused held lease's history row (its insert takes a key-share lock
on the task row) before the Welcome went out; a result, recorded on the stream's reader ahead
of every renewal behind it (the host's other leases ran out); the host's row written for a
hold or a stop, and the background release of a superseded process's leases, each waiting
with no bound and no word. Real PostgreSQL, real Lease streams, the lock held from a
connection of its own; SQLite has one writer and no row locks.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import select

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.server import CloudServer
from cloud.store.database import Store, libpq_dsn
from cloud.store.lease_events import EventKind
from cloud.store.models import AttemptRow, LeaseEventRow
from tests.cloud.cloud_harness import ScriptedHost, result, submit
from tests.support.waiting import until

pytestmark = pytest.mark.postgres

#: Far beyond a bounded wait and its retries; a write that blocks never gets there.
WITHIN_S = 15.0

HOLD_TASK = "SELECT 1 FROM tasks WHERE task_id = %s FOR UPDATE"
HOLD_HOST = "SELECT 1 FROM hosts WHERE host_id = %s FOR UPDATE"


def _held(a: lease_pb.Assignment) -> list[lease_pb.HeldAssignment]:
    return [lease_pb.HeldAssignment(task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id)]


async def _events(store: Store, task_id: str, kind: EventKind) -> int:
    async with store.read() as db:
        rows = await db.scalars(
            select(LeaseEventRow.id).where(
                LeaseEventRow.task_id == task_id, LeaseEventRow.kind == kind
            )
        )
        return len(rows.all())


async def _attempt(store: Store, a: lease_pb.Assignment) -> AttemptRow:
    async with store.read() as db:
        row = await db.scalar(
            select(AttemptRow).where(
                AttemptRow.task_id == a.task_id, AttemptRow.attempt == a.attempt
            )
        )
        assert row is not None
        return row


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_refused_held_lease_with_its_task_row_held_gets_its_welcome(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """h1 finished its attempt, then reconnects naming that lease again while the task's row
    is held: its Welcome and the lease's refusal come at once (the refusal's history row
    waited for the lock before the Welcome went out), and the history row is written once
    the lock is gone."""
    async with ScriptedHost(cloud.address, pki_dir, "h1") as first:
        await first.connect(["p1"], process_id="p")
        await submit(ops, target=types_pb2.TaskTarget(host_id="h1"))
        a = (await first.next("assignment")).assignment
        await first.send(result(a))
        assert (await first.next("result_ack")).result_ack.task_id == a.task_id
    holder = await psycopg.AsyncConnection.connect(libpq_dsn(cloud.store.engine))
    try:
        await holder.execute(HOLD_TASK, (a.task_id,))
        with caplog.at_level(logging.WARNING, logger="cloud.lease"):
            async with ScriptedHost(cloud.address, pki_dir, "h1") as again:
                welcome = await asyncio.wait_for(
                    again.connect(["p1"], _held(a), process_id="p"), WITHIN_S
                )
                assert welcome.host_id == "h1"
                refused = (await again.next("revoked", wait=WITHIN_S)).revoked
                assert refused.task_id == a.task_id
                assert refused.reason == lease_pb.REVOKE_REASON_FINISHED, refused
                assert await _events(cloud.store, a.task_id, EventKind.REVOKED) == 0  # held
                assert f"task {a.task_id}'s row" in caplog.text, caplog.text
                await holder.rollback()

                async def recorded() -> bool:
                    return await _events(cloud.store, a.task_id, EventKind.REVOKED) == 1

                await until(recorded, WITHIN_S, "the refusal's history row written")
    finally:
        await holder.rollback()
        await holder.close()

"""One live stream per host identity, and what becomes of a replaced process's leases.

Over real mTLS gRPC, on SQLite and PostgreSQL (and across two replicas on PostgreSQL): a newer
process of the same host supersedes the older stream (which is told why: `Superseded`, then
ABORTED) and the assignment the older one held is handed out again at once — well within its
lease — so nothing is lost in a takeover; a restarted host's hello releases its dead process's
leases at once; a reconnect of the *same* process keeps them, so a result it finished while
disconnected is still accepted; the heartbeat ends an older stream on another replica even if
the "new stream" event was lost. Two real host lease clients of one identity: the older stops
by itself (no reconnect loop) and the task it was running finishes on the newer.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import select

from amc.v1 import lease_service_pb2 as lease_pb
from amc.v1 import types_pb2
from cloud.server import CloudServer, build_server
from cloud.store import leases, states
from cloud.store.models import AttemptRow
from host.agent.loop import TaskOutcome, TaskSpec
from host.agent.progress import ProgressHolder
from host.lease_client import LeaseClient, LeaseClientConfig
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    result,
    start_replicas,
    submit,
    tasks_stub,
    wait_status,
)
from tests.cloud.conftest import SettingsFactory
from tests.host.test_lease_client import StaticDevices
from tests.support.postgres import PostgresServer

#: Far longer than any wait below: an attempt handed out again came from a release, not expiry.
LONG_LEASE = 120.0


@pytest.fixture
async def cloud(make_settings: SettingsFactory) -> AsyncIterator[CloudServer]:
    """This module's cloud (for the conftest's `ops` too): leases long enough that only a
    takeover or a release ends one."""
    server = await build_server(make_settings(default_lease_seconds=LONG_LEASE))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(0.5)


async def _attempts(cloud: CloudServer, task_id: str) -> list[AttemptRow]:
    async with cloud.store.read() as session:
        rows = await session.scalars(
            select(AttemptRow).where(AttemptRow.task_id == task_id).order_by(AttemptRow.attempt)
        )
        return list(rows.all())


async def test_a_newer_process_supersedes_the_older_and_gets_its_assignment(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    old = ScriptedHost(cloud.address, pki_dir, "h1")
    new = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await old.connect(["phone"], process_id="process-1")
        task = (await submit(ops)).task
        first = (await old.next("assignment")).assignment
        assert first.attempt == 1  # in flight: the old process never reports it

        await new.connect(["phone"], process_id="process-2")
        told = (await old.next("superseded")).superseded
        assert "superseded by a newer process of host h1" in told.message
        ended = await old.ended()
        assert ended is not None and ended.code() == grpc.StatusCode.ABORTED
        assert ended.details() == told.message

        second = (await new.next("assignment", wait=30)).assignment
        assert (second.task_id, second.attempt) == (task.task_id, 2)
        await new.send(result(second))
        await new.next("result_ack")
        await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        rows = await _attempts(cloud, task.task_id)
        assert [(r.attempt, r.failure_reason) for r in rows] == [
            (1, states.HOST_RESTARTED),
            (2, None),
        ]
    finally:
        await old.close()
        await new.close()


async def test_a_restarted_host_releases_its_dead_process_leases_at_once(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    dead = ScriptedHost(cloud.address, pki_dir, "h1")
    restarted = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await dead.connect(["p1", "p2"], process_id="boot-1")
        one = (await submit(ops, goal="one")).task
        two = (await submit(ops, goal="two")).task
        await dead.next("assignment")
        await dead.next("assignment")
        await dead.close()  # SIGKILL: nothing more from this process

        await restarted.connect(["p1", "p2"], process_id="boot-2")  # holds nothing
        again = [(await restarted.next("assignment", wait=30)).assignment for _ in range(2)]
        assert {(a.task_id, a.attempt) for a in again} == {(one.task_id, 2), (two.task_id, 2)}
    finally:
        await restarted.close()


async def test_a_reconnect_of_the_same_process_keeps_its_leases(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    first = ScriptedHost(cloud.address, pki_dir, "h1")
    again = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await first.connect(["phone"], process_id="same")
        task = (await submit(ops)).task
        a = (await first.next("assignment")).assignment
        await first.close()  # the link dropped; the process finished the task meanwhile
        await again.connect(["phone"], process_id="same")  # nothing held: it is done
        await again.send(result(a, summary="finished while disconnected"))
        ack = (await again.next("result_ack")).result_ack
        assert (ack.task_id, ack.attempt, ack.duplicate) == (task.task_id, 1, False)
        done = await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        assert done.result_summary == "finished while disconnected"
    finally:
        await again.close()


async def test_an_agent_without_process_id_keeps_the_old_rule(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """An older host agent (no process id) is treated as a reconnect: nothing is released and
    its older stream is replaced quietly (ABORTED, no Superseded)."""
    old = ScriptedHost(cloud.address, pki_dir, "h1")
    new = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await old.connect(["phone"])
        task = (await submit(ops)).task
        a = (await old.next("assignment")).assignment
        await new.connect(["phone"])
        ended = await old.ended()
        assert ended is not None and ended.code() == grpc.StatusCode.ABORTED
        assert ended.details() == "replaced by a newer stream of this host"
        assert await leases.is_live(cloud.store, "h1", task.task_id, 1, a.lease_id)
    finally:
        await old.close()
        await new.close()


async def test_release_requeues_fails_at_the_last_attempt_and_respects_keep(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await host.connect(["p1", "p2", "p3"], process_id="x")
        last = (await submit(ops, goal="last chance", max_attempts=1)).task
        kept = (await submit(ops, goal="kept")).task
        requeued = (await submit(ops, goal="requeued")).task
        got = {}
        for _ in range(3):
            a = (await host.next("assignment")).assignment
            got[a.task_id] = a
        k = got[kept.task_id]
        ended = await leases.release(
            cloud.store,
            "h1",
            states.HOST_RESTARTED,
            keep=[leases.HeldLease(k.task_id, k.attempt, k.lease_id)],
        )
        outcome = {e.task_id: e.task_status for e in ended}
        assert outcome == {last.task_id: states.FAILED, requeued.task_id: states.QUEUED}
        failed = await wait_status(ops, last.task_id, types_pb2.TASK_STATUS_FAILED)
        assert failed.result_summary == states.HOST_RESTARTED
        assert await leases.is_live(cloud.store, "h1", kept.task_id, 1, k.lease_id)
        # A second release finds nothing more to end (each attempt ends once).
        again = await leases.release(cloud.store, "h1", states.HOST_RESTARTED, only=set())
        assert again == []
        # A result for a released lease changes nothing and is refused as superseded.
        r = got[requeued.task_id]
        await host.send(result(r))
        while (msg := await host.next()).WhichOneof("kind") != "revoked":
            pass  # the requeued task may be handed out again first
        assert (msg.revoked.task_id, msg.revoked.attempt) == (r.task_id, 1)
        assert msg.revoked.reason == lease_pb.REVOKE_REASON_SUPERSEDED
    finally:
        await host.close()


# ---- two real lease clients of one identity ----------------------------------------------


class Blocking:
    """A task body that runs until it is cancelled (or `finish` is set)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.specs: list[TaskSpec] = []
        self.finish = asyncio.Event()

    async def __call__(
        self, spec: TaskSpec, progress: ProgressHolder, cancel: asyncio.Event
    ) -> TaskOutcome:
        self.specs.append(spec)
        self.started.set()
        progress.update(1, types_pb2.STEP_STATUS_ACTING, "working")
        done = asyncio.ensure_future(self.finish.wait())
        stopped = asyncio.ensure_future(cancel.wait())
        await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        stopped.cancel()
        if cancel.is_set():
            return TaskOutcome("cancelled", "stopped", 1)
        return TaskOutcome("succeeded", "done by the newer process", 1)


def _client(cloud: CloudServer, pki_dir: Path, body: Blocking) -> LeaseClient:
    return LeaseClient(
        lambda: channel(cloud.address, pki_dir, "host-h1"),
        StaticDevices("phone"),
        body,
        LeaseClientConfig(reconnect_initial_s=0.05, reconnect_max_s=0.3),
        rng=random.Random(1),
    )


async def test_two_host_processes_of_one_identity_do_not_fight(
    cloud: CloudServer, ops: Any, pki_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    older_body, newer_body = Blocking(), Blocking()
    older, newer = _client(cloud, pki_dir, older_body), _client(cloud, pki_dir, newer_body)
    stop_older, stop_newer = asyncio.Event(), asyncio.Event()
    older_run = asyncio.create_task(older.run(stop_older))
    newer_run: asyncio.Task[None] | None = None
    try:
        await older.wait_connected()
        task = (await submit(ops)).task
        await asyncio.wait_for(older_body.started.wait(), 10)

        newer_run = asyncio.create_task(newer.run(stop_newer))
        # The older client ends by itself: superseded, no reconnect, its task stopped.
        await asyncio.wait_for(older_run, 30)
        assert older.superseded and "superseded by a newer process" in older.superseded
        assert older.connects == 1
        assert any("does not reconnect" in r.getMessage() for r in caplog.records)

        await asyncio.wait_for(newer_body.started.wait(), 30)
        assert (newer_body.specs[0].task_id, newer_body.specs[0].attempt) == (task.task_id, 2)
        newer_body.finish.set()
        await wait_status(ops, task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        assert newer.connects == 1  # never pushed out either
    finally:
        stop_older.set()
        stop_newer.set()
        for run in (older_run, newer_run):
            if run is not None:
                await asyncio.wait_for(run, 30)


# ---- across replicas ------------------------------------------------------------------------


@pytest.fixture
async def replicas(
    postgres_server: PostgresServer, pki_dir: Path, migrated_postgres: str
) -> AsyncIterator[list[CloudServer]]:
    async with start_replicas(
        postgres_server.create_database(template=migrated_postgres),
        pki_dir,
        default_lease_seconds=LONG_LEASE,
        host_heartbeat_seconds=0.5,
    ) as servers:
        yield servers


async def _takeover(replicas: list[CloudServer], pki_dir: Path) -> None:
    a, b = replicas
    ch = channel(a.address, pki_dir, "operator-ops")
    ops: Any = tasks_stub(ch)
    old = ScriptedHost(a.address, pki_dir, "h2")
    new = ScriptedHost(b.address, pki_dir, "h2")
    try:
        await old.connect(["phone"], process_id="on-a")
        task = (await submit(ops)).task
        assert (await old.next("assignment")).assignment.attempt == 1
        await new.connect(["phone"], process_id="on-b")
        assert "superseded" in (await old.next("superseded", wait=30)).superseded.message
        second = (await new.next("assignment", wait=30)).assignment
        assert (second.task_id, second.attempt) == (task.task_id, 2)
        assert "h2" not in a.leases.sessions
    finally:
        await old.close()
        await new.close()
        await ch.close()


@pytest.mark.postgres
async def test_a_newer_process_on_another_replica_supersedes_the_older(
    replicas: list[CloudServer], pki_dir: Path
) -> None:
    await _takeover(replicas, pki_dir)


@pytest.mark.postgres
async def test_the_heartbeat_supersedes_when_the_new_stream_event_is_lost(
    replicas: list[CloudServer], pki_dir: Path
) -> None:
    replicas[0].bus.on_new_stream.clear()  # replica A never hears of B's new stream
    await _takeover(replicas, pki_dir)

"""Several cloud replicas sharing one PostgreSQL: no task is handed out twice, progress crosses."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from amc.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from amc.v1 import lease_service_pb2 as lease_pb
from cloud.server import CloudServer
from cloud.store.models import AttemptRow
from tests.cloud.cloud_harness import (
    AutoHost,
    ScriptedHost,
    channel,
    count_reloads,
    lapse,
    renewal,
    result,
    start_replicas,
    submit,
    tasks_stub,
    wait_status,
)
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.postgres

#: SubmitTask calls in flight at once in the 500-task test.
SUBMITTING = 20


@pytest.fixture
async def replicas(
    postgres_server: PostgresServer, pki_dir: Path, migrated_postgres: str
) -> AsyncIterator[list[CloudServer]]:
    """Two replicas on one PostgreSQL."""
    async with start_replicas(
        postgres_server.create_database(template=migrated_postgres),
        pki_dir,
        default_lease_seconds=30,
    ) as servers:
        yield servers


async def test_two_replicas_twenty_hosts_500_tasks_each_done_once(
    replicas: list[CloudServer], pki_dir: Path
) -> None:
    done: Counter[str] = Counter()
    attempts_seen: Counter[tuple[str, int]] = Counter()
    all_done = asyncio.Event()
    total = 500

    def on_done(host_id: str, task_id: str, attempt: int) -> None:
        done[task_id] += 1
        attempts_seen[(task_id, attempt)] += 1
        if len(done) >= total:
            all_done.set()

    hosts = [
        AutoHost(replicas[i % 2].address, pki_dir, f"h{i}", [f"h{i}-p1", f"h{i}-p2"], on_done)
        for i in range(20)
    ]
    channels = [channel(r.address, pki_dir, "operator-ops") for r in replicas]
    try:
        await asyncio.gather(*(h.start() for h in hosts))
        stubs = [tasks_stub(ch) for ch in channels]
        # At most SUBMITTING calls in flight: gRPC core cancels a call that waits over 30 s for
        # its server to take it (grpc.server_max_unrequested_time_in_server), and 500 at once
        # on a loaded machine, into replicas sharing this process's loop, came back CANCELLED.
        # The replicas still take submissions, claims and results all at once.
        gate = asyncio.Semaphore(SUBMITTING)

        async def submit_one(i: int) -> task_service_pb2.SubmitTaskResponse:
            async with gate:
                return await submit(stubs[i % 2], goal=f"task {i}")

        submitted = await asyncio.gather(*(submit_one(i) for i in range(total)))
        ids = {s.task.task_id for s in submitted}
        assert len(ids) == total
        await asyncio.wait_for(all_done.wait(), 120)
        assert set(done) == ids
        assert max(done.values()) == 1  # every task completed exactly once
        async with replicas[0].store.read() as session:
            per_task = (
                await session.execute(
                    select(AttemptRow.task_id, func.count()).group_by(AttemptRow.task_id)
                )
            ).all()
        assert len(per_task) == total
        assert all(count == 1 for _, count in per_task)  # never handed out twice
        listed = await stubs[1].ListTasks(
            task_service_pb2.ListTasksRequest(
                page_size=500, statuses=[types_pb2.TASK_STATUS_SUCCEEDED]
            )
        )
        assert len(listed.tasks) == total
    finally:
        await asyncio.gather(*(h.stop() for h in hosts))
        for ch in channels:
            await ch.close()


async def test_watch_on_one_replica_sees_progress_from_another(
    replicas: list[CloudServer], pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal on one replica reaches a watcher on the other as the extension itself (the
    task turned RUNNING with its progress and expiry, as GetTask says), without a reload.
    (`load_views` is wrapped only to count the reloads: every call still reads the store.)"""
    a, b = replicas
    ch_a = channel(a.address, pki_dir, "operator-ops")
    ch_b = channel(b.address, pki_dir, "operator-ops")
    host = ScriptedHost(a.address, pki_dir, "h20")
    try:
        await host.connect(["p"])
        task = (await submit(tasks_stub(ch_a))).task
        assignment = (await host.next("assignment")).assignment
        watcher: Any = progress_service_pb2_grpc.ProgressServiceStub(ch_b)
        fleet_watch = watcher.WatchProgress(progress_service_pb2.WatchProgressRequest())
        while True:  # the snapshot holds the task
            msg = await asyncio.wait_for(fleet_watch.read(), 10)
            if msg.task.task_id == task.task_id:
                break
        reloads = count_reloads(monkeypatch)
        await host.send(renewal(assignment, 5, "seen across replicas"))
        renewed = (await host.next("renewed")).renewed
        while True:
            msg = await asyncio.wait_for(fleet_watch.read(), 5)  # well within a second in practice
            if msg.task.progress.summary == "seen across replicas":
                assert not msg.snapshot
                break
        assert reloads == []
        got = (
            await tasks_stub(ch_b).GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))
        ).task
        shown = msg.task
        assert shown.status == got.status == types_pb2.TASK_STATUS_RUNNING
        assert shown.progress == got.progress
        assert shown.lease_expires_at == got.lease_expires_at == renewed.lease_expires_at
        assert shown.updated_at == got.updated_at
        fleet_watch.cancel()
    finally:
        await host.close()
        await ch_a.close()
        await ch_b.close()


async def test_cancel_on_one_replica_revokes_host_on_another(
    replicas: list[CloudServer], pki_dir: Path
) -> None:
    a, b = replicas
    ch_b = channel(b.address, pki_dir, "operator-ops")
    host = ScriptedHost(a.address, pki_dir, "h21")
    try:
        await host.connect(["p"])
        stub = tasks_stub(ch_b)
        task = (await submit(stub)).task
        await host.next("assignment")
        await stub.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task.task_id))
        revoked = (await host.next("revoked")).revoked
        assert revoked.task_id == task.task_id
    finally:
        await host.close()
        await ch_b.close()


async def test_a_new_process_on_another_replica_keeps_the_lease_it_names(
    replicas: list[CloudServer], pki_dir: Path
) -> None:
    """The host's previous process died without its stream on replica A ending (a half-open
    connection), and its next process connects to replica B naming the lease it kept a result
    for. A finds its stream superseded (`reconcile`) and releases the leases granted on it:
    it used to release this one too, not knowing what B's hello held, and the result was
    refused and the task ran again."""
    a, b = replicas
    ops = channel(a.address, pki_dir, "operator-ops")
    old = ScriptedHost(a.address, pki_dir, "h21")
    new = ScriptedHost(b.address, pki_dir, "h21")
    try:
        await old.connect(["p1"], process_id="run-1")
        task = (await submit(tasks_stub(ops))).task
        given = (await old.next("assignment")).assignment
        held = lease_pb.HeldAssignment(
            task_id=given.task_id,
            attempt=given.attempt,
            lease_id=given.lease_id,
            device_serial="p1",
        )
        await new.connect(["p1"], held=[held], process_id="run-2")
        assert (await new.next("assignment")).assignment.resumed
        await old.next("superseded")  # A found the newer stream and released what it granted
        await asyncio.gather(*a.leases._closings)  # that release, done
        await new.send(result(given, summary="dark theme is on"))
        ack = (await new.next("result_ack")).result_ack
        assert ack.task_status == types_pb2.TASK_STATUS_SUCCEEDED
        done = await wait_status(tasks_stub(ops), task.task_id, types_pb2.TASK_STATUS_SUCCEEDED)
        assert [x.attempt for x in done.attempts] == [1]
    finally:
        await old.close()
        await new.close()
        await ops.close()


async def test_a_hold_set_by_another_replicas_sweep_is_shown_everywhere_and_spares_a_live_host(
    postgres_server: PostgresServer, pki_dir: Path, migrated_postgres: str
) -> None:
    """Replica b ends the lease of a host whose stream replica a holds: its revoke (NOTIFY)
    holds the silent host back, and b's fleet view says so; a host heard from after its lease
    ran out (a late renewal) is not held back, wherever the sweep ran."""
    url = postgres_server.create_database(template=migrated_postgres)
    async with start_replicas(url, pki_dir, sweep_interval_seconds=3600) as (a, b):
        ch_b = channel(b.address, pki_dir, "operator-ops")
        fleet_b: Any = fleet_service_pb2_grpc.FleetServiceStub(ch_b)
        silent = ScriptedHost(a.address, pki_dir, "h22")
        late = ScriptedHost(a.address, pki_dir, "h23")
        try:
            stub = tasks_stub(ch_b)
            await silent.connect(["p"])
            first = (await submit(stub, target=types_pb2.TaskTarget(host_id="h22"))).task
            await silent.next("assignment")
            await lapse(b.store, first.task_id, ago=0)
            assert await b.leases.sweeper.sweep_once() == 1
            assert (await silent.next("revoked")).revoked.reason == lease_pb.REVOKE_REASON_EXPIRED
            for _ in range(400):
                page = await fleet_b.ListHosts(fleet_service_pb2.ListHostsRequest())
                shown = next(h for h in page.hosts if h.host_id == "h22")
                if shown.HasField("held_back"):
                    break
                await asyncio.sleep(0.025)
            assert (shown.held_back.task_id, shown.held_back.attempt) == (first.task_id, 1)

            await late.connect(["q"])
            second = (await submit(stub, target=types_pb2.TaskTarget(host_id="h23"))).task
            a1 = (await late.next("assignment")).assignment
            await lapse(b.store, second.task_id)
            await late.send(renewal(a1, 2, "late"))
            assert (await late.next("revoked")).revoked.reason == lease_pb.REVOKE_REASON_EXPIRED
            assert await b.leases.sweeper.sweep_once() == 1
            assert (await late.next("revoked")).revoked.reason == lease_pb.REVOKE_REASON_EXPIRED
            assert (await late.next("assignment")).assignment.attempt == 2
        finally:
            await silent.close()
            await late.close()
            await ch_b.close()

"""WatchProgress: snapshot first, then changes; a watch of an ended task ends at once."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from sqlalchemy import event, text, update

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    types_pb2,
)
from cloud.events import EventBus, Extension, Subscription
from cloud.server import CloudServer
from cloud.services.progress_service import KEPT, _Shown
from cloud.store import convert, leases, tasks
from cloud.store.database import Store
from cloud.store.models import AttemptRow
from console import formatting, watching
from console.client import OperatorClient, watch_progress
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    count_reloads,
    lapse,
    renewal,
    start_replicas,
    submit,
)
from tests.support.postgres import PostgresServer


async def _drain(call: Any) -> list[Any]:
    out = []
    while (msg := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
        out.append(msg)
    return out


async def test_fleet_snapshot_then_changes_and_ended_task_watch(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = progress_service_pb2_grpc.ProgressServiceStub(ch)
        live = (await submit(ops, goal="stays queued")).task
        ended = (await submit(ops, goal="cancelled at once")).task
        await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=ended.task_id))

        fleet = stub.WatchProgress(progress_service_pb2.WatchProgressRequest())
        first = await asyncio.wait_for(fleet.read(), 10)
        assert first.snapshot
        assert first.task.task_id == live.task_id  # ended tasks are not in the fleet snapshot

        newer = (await submit(ops, goal="arrives later")).task
        change = await asyncio.wait_for(fleet.read(), 10)
        assert not change.snapshot
        assert change.task.task_id == newer.task_id
        fleet.cancel()

        one = stub.WatchProgress(progress_service_pb2.WatchProgressRequest(task_id=ended.task_id))
        msgs = await _drain(one)
        assert [m.task.status for m in msgs] == [types_pb2.TASK_STATUS_CANCELLED]
        assert msgs[0].snapshot

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(stub.WatchProgress(progress_service_pb2.WatchProgressRequest(task_id="x")))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await ch.close()


def _timeless(task: types_pb2.Task) -> types_pb2.Task:
    """`task` without its wall time (the time since it was created, as of when it was read)."""
    out = types_pb2.Task()
    out.CopyFrom(task)
    out.totals.ClearField("wall_time")
    return out


async def test_a_batched_watcher_gets_the_same_tasks_in_fewer_messages(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """With `batched` the snapshot comes in chunks of 200 tasks and the tasks of one burst of
    changes in one message (`tasks`, `task` unset), the same tasks an unbatched watcher gets one
    message each."""
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = progress_service_pb2_grpc.ProgressServiceStub(ch)
        ids = [(await submit(ops, goal=f"queued {n}")).task.task_id for n in range(203)]
        batched = stub.WatchProgress(progress_service_pb2.WatchProgressRequest(batched=True))
        single = stub.WatchProgress(progress_service_pb2.WatchProgressRequest())
        chunks = [await asyncio.wait_for(batched.read(), 10) for _ in range(2)]
        assert [len(m.tasks) for m in chunks] == [200, 3]
        assert all(m.snapshot and not m.HasField("task") for m in chunks)
        one_each = [await asyncio.wait_for(single.read(), 10) for _ in ids]
        assert all(m.snapshot and not m.tasks for m in one_each)
        assert [_timeless(t) for m in chunks for t in m.tasks] == [
            _timeless(m.task) for m in one_each
        ]

        burst = ids[:3]
        cloud.bus.tasks_changed(burst)
        change = await asyncio.wait_for(batched.read(), 10)
        assert not change.snapshot and not change.HasField("task")
        assert [t.task_id for t in change.tasks] == sorted(burst)
        each = [(await asyncio.wait_for(single.read(), 10)).task for _ in burst]
        assert [_timeless(t) for t in change.tasks] == [_timeless(t) for t in each]
        batched.cancel()
        single.cancel()
    finally:
        await ch.close()


async def test_the_operators_watch_takes_batches_and_yields_one_task_per_message(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """`console.client.watch_progress` (the CLI's `task watch`, the embedded console and the
    gateway) asks for batches and hands each task on as a message of its own, the snapshot flag
    kept; closing it ends the call on the replica."""
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = progress_service_pb2_grpc.ProgressServiceStub(ch)
        ids = [(await submit(ops, goal=f"queued {n}")).task.task_id for n in range(203)]
        changes = watch_progress(stub)
        snapshot = [await asyncio.wait_for(anext(changes), 10) for _ in ids]
        assert all(m.snapshot and m.HasField("task") and not m.tasks for m in snapshot)
        assert sorted(m.task.task_id for m in snapshot) == sorted(ids)
        cloud.bus.tasks_changed(ids[:3])
        burst = [await asyncio.wait_for(anext(changes), 10) for _ in range(3)]
        assert [m.task.task_id for m in burst] == sorted(ids[:3])
        assert not any(m.snapshot for m in burst)
        await changes.aclose()
        for _ in range(100):  # the cancellation reaches the replica's handler
            if cloud.bus.watchers() == 0:
                break
            await asyncio.sleep(0.05)
        assert cloud.bus.watchers() == 0
    finally:
        await ch.close()


async def test_a_watcher_that_skips_the_snapshot_gets_the_changes_after_its_headers_only(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """`skip_snapshot`: the replica read every unfinished task before it sent the headers, for
    watchers that threw the snapshot away (the console's tasks page, `amc task watch` back from
    an outage); now the headers come without that read and the first message is the first
    change. A watch of one task still says NOT_FOUND, and ends at once when its task ended."""
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = progress_service_pb2_grpc.ProgressServiceStub(ch)
        queued = (await submit(ops, goal="stays queued")).task
        ended = (await submit(ops, goal="cancelled at once")).task
        await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=ended.task_id))
        headers = asyncio.Event()
        changes = watch_progress(stub, snapshot=False, watching=headers.set)
        first = asyncio.ensure_future(anext(changes))
        await asyncio.wait_for(headers.wait(), 10)
        newer = (await submit(ops, goal="arrives later")).task
        change = await asyncio.wait_for(first, 10)
        assert (change.task.task_id, change.snapshot) == (newer.task_id, False)
        await changes.aclose()

        one = stub.WatchProgress(
            progress_service_pb2.WatchProgressRequest(task_id=ended.task_id, skip_snapshot=True)
        )
        assert await _drain(one) == []
        live = stub.WatchProgress(
            progress_service_pb2.WatchProgressRequest(task_id=queued.task_id, skip_snapshot=True)
        )
        await asyncio.wait_for(live.initial_metadata(), 10)
        await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=queued.task_id))
        (last,) = await _drain(live)
        assert last.task.status == types_pb2.TASK_STATUS_CANCELLED and not last.snapshot
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(
                stub.WatchProgress(
                    progress_service_pb2.WatchProgressRequest(task_id="nope", skip_snapshot=True)
                )
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await ch.close()


async def test_a_watch_through_restarts_shows_a_task_resent_unchanged_once(
    cloud: CloudServer, pki_dir: Path
) -> None:
    """The replica sends a task again unchanged whenever it was told it may have changed (a
    LISTEN connection back after a drop re-reads every unfinished task; a task a fleet watch
    back from an outage read itself and that then ended is sent by its new stream too):
    `amc task watch` printed the same line again. A task is shown again only once its
    updated_at moved."""
    client = OperatorClient.over(channel(cloud.address, pki_dir, "operator-ops"))
    changes = watching.watch_through_restarts(client)
    try:
        queued = (await submit(client.tasks, goal="stays queued")).task
        first = await asyncio.wait_for(anext(changes), 10)
        assert first.task.task_id == queued.task_id
        cloud.bus.tasks_changed([queued.task_id])  # as after a LISTEN drop: re-read, resent
        newer = (await submit(client.tasks, goal="arrives later")).task
        second = await asyncio.wait_for(anext(changes), 10)
        assert second.task.task_id == newer.task_id, second
    finally:
        await changes.aclose()
        await client.close()


async def test_decision_log_arguments(cloud: CloudServer, pki_dir: Path) -> None:
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await log.ListDecisions(decision_log_service_pb2.ListDecisionsRequest())
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith("task_id")
        # An unknown task is NOT_FOUND, as GetConversation says; a known one without decisions
        # is an empty list.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await log.ListDecisions(decision_log_service_pb2.ListDecisionsRequest(task_id="t"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "task t not found"
        tasks: Any = task_service_pb2_grpc.TaskServiceStub(ch)
        task = (await submit(tasks, "g")).task
        empty = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task.task_id)
        )
        assert list(empty.decisions) == []
        assert empty.next_page_token == ""
    finally:
        await ch.close()


@pytest.fixture
async def two_buses(
    postgres_server: PostgresServer,
) -> AsyncIterator[tuple[list[Store], list[EventBus]]]:
    """Two replicas' stores and event buses on one PostgreSQL database, listening."""
    url = postgres_server.create_database()
    stores = [Store.from_url(url), Store.from_url(url)]
    buses = [EventBus(s) for s in stores]
    for bus in buses:
        await bus.start()
    try:
        yield stores, buses
    finally:
        for bus in buses:
            await bus.stop()
        for s in stores:
            await s.close()


@pytest.mark.postgres
async def test_watchers_reread_everything_after_the_listen_connection_drops(
    postgres_server: PostgresServer,
) -> None:
    """NOTIFYs sent while a replica's LISTEN connection was down are lost: on reconnecting, the
    bus tells every task and fleet watcher that anything may have changed (next() is None), and
    WatchProgress then re-reads the tasks it shows."""
    url = postgres_server.create_database()
    store = Store.from_url(url)
    bus = EventBus(store)
    await bus.start()
    try:
        tasks_sub, hosts_sub = bus.subscribe(), bus.subscribe_hosts()
        async with store.engine.connect() as conn:  # drop the LISTEN connection, as a restart
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
                )
            )
            await conn.commit()
        assert await asyncio.wait_for(tasks_sub.next(), 15) is None
        assert await asyncio.wait_for(hosts_sub.next(), 15) is None
    finally:
        await bus.stop()
        await store.close()


async def _drop_listen_connections(store: Store) -> None:
    """End every replica's LISTEN connection, as a network cut or a server restart would, and
    wait until their backends are gone (each replica connects again a second later)."""
    listening = "FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
    async with store.engine.connect() as conn:
        await conn.execute(text(f"SELECT pg_terminate_backend(pid) {listening}"))
        await conn.commit()
        async with asyncio.timeout(10):
            while await conn.scalar(text(f"SELECT count(*) {listening}")):
                await conn.rollback()
                await asyncio.sleep(0.01)


@pytest.mark.postgres
async def test_a_fleet_watcher_sees_a_task_that_ended_while_its_replica_was_not_listening(
    postgres_server: PostgresServer, pki_dir: Path, migrated_postgres: str
) -> None:
    """A task cancelled on one replica while the other's LISTEN connection was down: its NOTIFY
    is lost, and the fleet watcher on the other replica re-reads after the reconnect. It is
    told of that end too, not only of the tasks still active (it went on showing the task
    queued). The cancel falls in the gap: the replica connects again only a second after it
    noticed the loss."""
    async with start_replicas(
        postgres_server.create_database(template=migrated_postgres), pki_dir
    ) as (a, b):
        ch_a = channel(a.address, pki_dir, "operator-ops")
        ch_b = channel(b.address, pki_dir, "operator-ops")
        try:
            task = (await submit(task_service_pb2_grpc.TaskServiceStub(ch_b), "waits")).task
            fleet = progress_service_pb2_grpc.ProgressServiceStub(ch_a).WatchProgress(
                progress_service_pb2.WatchProgressRequest()
            )
            first = await asyncio.wait_for(fleet.read(), 10)
            assert first.snapshot and first.task.task_id == task.task_id
            await _drop_listen_connections(a.store)
            await task_service_pb2_grpc.TaskServiceStub(ch_b).CancelTask(
                task_service_pb2.CancelTaskRequest(task_id=task.task_id, reason="not needed")
            )
            async with asyncio.timeout(15):  # the task sent again unchanged is not its end
                while (seen := await fleet.read()).task.status == types_pb2.TASK_STATUS_QUEUED:
                    pass
            assert seen.task.task_id == task.task_id
            assert seen.task.status == types_pb2.TASK_STATUS_CANCELLED
            assert seen.task.result_summary == "not needed"
            fleet.cancel()
        finally:
            await ch_a.close()
            await ch_b.close()


@pytest.mark.postgres
async def test_fleet_watchers_of_a_replica_share_one_re_read_after_a_listen_gap(
    postgres_server: PostgresServer, pki_dir: Path, migrated_postgres: str
) -> None:
    """After a LISTEN gap every fleet watcher of the replica is told at once that anything may
    have changed, and each re-read every active task (and those ended in the gap) itself: 500
    watchers, 500 identical reads at the same moment. They share one read now; each still gets
    every task again."""
    async with start_replicas(
        postgres_server.create_database(template=migrated_postgres), pki_dir, count=1
    ) as (a,):
        ch = channel(a.address, pki_dir, "operator-ops")
        reads: list[str] = []

        def seen(_c: Any, _cur: Any, statement: str, _p: Any, _ctx: Any, _many: bool) -> None:
            if "finished_at >=" in statement:  # the gap's read of tasks ended since it began
                reads.append(statement)

        event.listen(a.store.engine.sync_engine, "before_cursor_execute", seen)
        try:
            task = (await submit(task_service_pb2_grpc.TaskServiceStub(ch), "waits")).task
            stub = progress_service_pb2_grpc.ProgressServiceStub(ch)
            watchers = [
                stub.WatchProgress(progress_service_pb2.WatchProgressRequest()) for _ in range(5)
            ]
            for watcher in watchers:
                first = await asyncio.wait_for(watcher.read(), 10)
                assert first.snapshot and first.task.task_id == task.task_id
            await _drop_listen_connections(a.store)
            for watcher in watchers:
                again = await asyncio.wait_for(watcher.read(), 15)
                assert not again.snapshot and again.task.task_id == task.task_id
                watcher.cancel()
            # One read shared (two if a watcher woke a loop pass apart); five before: one each.
            assert len(reads) <= 2, reads
        finally:
            event.remove(a.store.engine.sync_engine, "before_cursor_execute", seen)
            await ch.close()


@pytest.mark.postgres
async def test_a_watcher_that_takes_its_gap_late_does_not_share_a_read_begun_before(
    postgres_server: PostgresServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    migrated_postgres: str,
) -> None:
    """Taking a LISTEN gap drops the task changes a watcher's mailbox held and counts on the
    re-read. Watcher B is busy (a reload of task Y, held here) when the gap comes; watcher A
    takes it and begins the shared re-read, which reads task X queued (held here once read);
    then X is cancelled, and that change waits in B's mailbox. B took the gap after that and
    joined A's read: it showed X queued for good. It reads again now, and every watcher's
    last word on X, before a later task Z arrives, is that it was cancelled. Z is submitted
    only once both watchers wait with nothing left to send: submitted as soon as A's read was
    released, it could commit before B's own re-read listed the tasks, and that read sends the
    active tasks (Z) before the ended ones (X), so B's Z came before its word on X (1 run in
    8 under load). (`load_views`, `take_missed_since` and `next` are wrapped only to hold a
    call or watch it: each still does its work.)"""
    async with start_replicas(
        postgres_server.create_database(template=migrated_postgres), pki_dir, count=1
    ) as (cloud,):
        ch = channel(cloud.address, pki_dir, "operator-ops")
        b_busy, b_free = asyncio.Event(), asyncio.Event()
        read_x, release_read = asyncio.Event(), asyncio.Event()
        try:
            ops: Any = task_service_pb2_grpc.TaskServiceStub(ch)
            stub: Any = progress_service_pb2_grpc.ProgressServiceStub(ch)
            x = (await submit(ops, "ends in the gap")).task.task_id
            y = (await submit(ops, "keeps watcher B busy")).task.task_id
            watchers = [
                stub.WatchProgress(progress_service_pb2.WatchProgressRequest()) for _ in range(2)
            ]
            for watcher in watchers:
                for _ in range(2):
                    assert (await asyncio.wait_for(watcher.read(), 10)).snapshot

            load_views = tasks.load_views

            async def held(
                store: Store, ids: list[str], *, usage: bool = True
            ) -> list[tasks.TaskView]:
                watcher = not usage  # the other callers, GetTask or CancelTask, read totals
                if watcher and ids == [y] and not b_busy.is_set():  # the first to reload Y: B
                    b_busy.set()
                    await b_free.wait()
                views = await load_views(store, ids, usage=usage)
                if watcher and x in ids and not read_x.is_set():  # the re-read A began
                    read_x.set()
                    await release_read.wait()
                return views

            monkeypatch.setattr(tasks, "load_views", held)
            took: list[Subscription] = []
            both_took = asyncio.Event()
            take = Subscription.take_missed_since

            def counted(sub: Subscription) -> dt.datetime | None:
                took.append(sub)
                if len(took) == 2:
                    both_took.set()
                return take(sub)

            monkeypatch.setattr(Subscription, "take_missed_since", counted)
            # The watchers waiting for changes with none pending: they sent all they had.
            idle: set[Subscription] = set()
            parked = asyncio.Event()
            wait = Subscription.next

            async def watched(sub: Subscription) -> set[str] | None:
                if not sub._event.is_set():
                    idle.add(sub)
                    parked.set()
                try:
                    return await wait(sub)
                finally:
                    idle.discard(sub)

            monkeypatch.setattr(Subscription, "next", watched)

            await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=y))
            async with asyncio.timeout(10):
                await b_busy.wait()
            await _drop_listen_connections(cloud.store)
            async with asyncio.timeout(15):
                await read_x.wait()  # A's re-read read X queued
            await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=x))
            b_free.set()
            async with asyncio.timeout(10):
                await both_took.wait()  # B took its gap too
            release_read.set()
            async with asyncio.timeout(15):  # both sent the re-read and any reload of X
                while not all(sub in idle and not sub._event.is_set() for sub in took):
                    parked.clear()
                    await parked.wait()

            # Z's change is then alone in each mailbox: each stream's next message.
            z = (await submit(ops, "arrives after it all")).task.task_id
            for watcher in watchers:
                last: dict[str, int] = {}
                async with asyncio.timeout(15):
                    while (task := (await watcher.read()).task).task_id != z:
                        last[task.task_id] = task.status
                assert last[x] == types_pb2.TASK_STATUS_CANCELLED
                watcher.cancel()
        finally:
            b_free.set()
            release_read.set()
            await ch.close()


async def test_a_task_queued_again_shows_that_it_waits_not_the_dead_attempt_s_step(
    cloud: CloudServer, ops: Any, pki_dir: Path
) -> None:
    """An attempt at step 2 whose host went away and whose lease ran out: its task goes back
    to the queue and, from then on, GetTask, ListTasks and both kinds of watcher (told live)
    show that it waits and why, not "step 2 · looking at the screen" as if the dead attempt
    still ran; the attempt's own record keeps its step."""
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = progress_service_pb2_grpc.ProgressServiceStub(ch)
        await host.connect(["p1"])
        task = (await submit(ops, "waits again", target=types_pb2.TaskTarget(host_id="h1"))).task
        a = (await host.next("assignment")).assignment
        await host.send(
            renewal(a, 2, "step 2: looking at the screen", types_pb2.STEP_STATUS_PERCEIVING)
        )
        await host.next("renewed")
        fleet = stub.WatchProgress(progress_service_pb2.WatchProgressRequest())
        one = stub.WatchProgress(progress_service_pb2.WatchProgressRequest(task_id=task.task_id))
        for call in (fleet, one):
            first = (await asyncio.wait_for(call.read(), 10)).task
            assert first.progress.step_index == 2
        await host.close()  # the host is gone: nothing takes the task again
        await lapse(cloud.store, task.task_id)

        waiting = "re-queued after attempt 1 ended: lease expired"
        for call in (fleet, one):
            async with asyncio.timeout(10):
                while (shown := (await call.read()).task).status != types_pb2.TASK_STATUS_QUEUED:
                    pass
            assert (shown.progress.step_index, shown.progress.summary) == (0, waiting)
            assert formatting.progress_badge(shown.progress, shown.status) == waiting
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        listed = (await ops.ListTasks(task_service_pb2.ListTasksRequest())).tasks[0]
        for t in (got, listed, shown):
            assert t.status == types_pb2.TASK_STATUS_QUEUED
            assert t.progress.step_index == 0
            assert t.progress.step_status == types_pb2.STEP_STATUS_UNSPECIFIED
            assert t.progress.summary == waiting
            assert t.progress.updated_at == got.attempts[0].ended_at
        # The dead attempt's history stays in its own record.
        assert got.attempts[0].progress.step_index == 2
        assert got.attempts[0].progress.summary == "step 2: looking at the screen"
        fleet.cancel()
        one.cancel()
    finally:
        await host.close()
        await ch.close()


async def test_a_lease_extension_reaches_watchers_without_reloading_the_task(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal that only extends its lease (its progress as stored, the lease near expiry) is
    shown to a fleet watcher and to a task watcher as the new expiry applied to the task they
    were sent, without reloading the task; so is a renewal that brings only new progress, with
    its progress and step count. What both show is what GetTask says. A cancel request is
    reloaded. (`load_views` is wrapped only to count the reloads: every call
    still reads the store.)"""
    reloads = count_reloads(monkeypatch)
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = progress_service_pb2_grpc.ProgressServiceStub(ch)
        await host.connect(["p1"])
        task = (await submit(ops, goal="renews", lease_duration=Duration(seconds=30))).task
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a, 1, "step one"))  # ASSIGNED -> RUNNING: news
        await host.next("renewed")
        fleet = stub.WatchProgress(progress_service_pb2.WatchProgressRequest())
        one = stub.WatchProgress(progress_service_pb2.WatchProgressRequest(task_id=task.task_id))
        for call in (fleet, one):
            first = await asyncio.wait_for(call.read(), 10)
            assert first.snapshot and first.task.status == types_pb2.TASK_STATUS_RUNNING
        reloads.clear()

        near = cloud.store.now() + dt.timedelta(seconds=10)  # a third of the lease left
        async with cloud.store.write() as db:
            await db.execute(
                update(AttemptRow)
                .where(AttemptRow.task_id == task.task_id)
                .values(lease_expires_at=near)
            )
        await host.send(renewal(a, 1, "step one"))
        renewed = (await host.next("renewed")).renewed
        assert renewed.lease_expires_at.ToDatetime(dt.UTC) > near
        shown = [(await asyncio.wait_for(call.read(), 10)).task for call in (fleet, one)]
        assert reloads == []
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        for t in shown:
            assert t.lease_expires_at == renewed.lease_expires_at == got.lease_expires_at
            assert t.updated_at == got.updated_at
            assert (t.status, t.progress.summary) == (got.status, "step one")
        reloads.clear()  # GetTask's

        await host.send(renewal(a, 2, "step two"))
        await host.next("renewed")
        shown = [(await asyncio.wait_for(call.read(), 10)).task for call in (fleet, one)]
        assert reloads == []
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        for t in shown:
            assert t.progress == got.progress
            assert t.progress.summary == "step two" and t.progress.step_index == 2
            assert (t.lease_expires_at, t.updated_at) == (got.lease_expires_at, got.updated_at)
            assert t.totals.steps == got.totals.steps == 2
        reloads.clear()  # GetTask's

        # A cancel request is news (only a reload can show it).
        await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=task.task_id))
        for call in (fleet, one):
            assert (await asyncio.wait_for(call.read(), 10)).task.cancel_requested
        assert reloads.count([task.task_id]) >= 2
        fleet.cancel()
        one.cancel()
    finally:
        await host.close()
        await ch.close()


async def test_new_progress_of_another_attempt_than_the_one_shown_is_reloaded(
    store: Store,
) -> None:
    """A watcher applies new progress only to the attempt it showed as current: progress of
    any other attempt (the task was requeued since) makes it reload the task. An extension or
    progress written no later than the task it showed changes nothing; one written later is
    applied even when it kept the expiry (a write far from expiry, decision 0070)."""
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=3, lease_seconds=30, timeout_seconds=3600)
    )
    c = await leases.claim(store, "h1", ["p"], 2)
    assert c is not None
    (out,) = await leases.renew_batch(
        store, [leases.RenewalIn("h1", c.task_id, c.attempt, c.lease_id, None)]
    )
    assert out.expires_at is not None and out.renewed_at is not None
    view = await tasks.get(store, c.task_id)
    assert view is not None
    shown = _Shown()
    shown.keep(view)
    later = out.expires_at + dt.timedelta(seconds=5)
    step = leases.ProgressIn(4, 2, "four")
    assert shown.extend(Extension(c.task_id, later, later, c.attempt + 1, step)) is None
    assert shown.extend(Extension(c.task_id, later, out.renewed_at, c.attempt, step)) == KEPT
    patched = shown.extend(Extension(c.task_id, out.expires_at, later, c.attempt, step))
    assert isinstance(patched, types_pb2.Task)
    assert (patched.progress.step_index, patched.progress.summary) == (4, "four")
    assert patched.totals.steps == 4
    assert patched.lease_expires_at == convert.ts(out.expires_at)


@pytest.mark.postgres
async def test_notifications_travel_on_the_stores_own_connection_or_through_the_pool(
    two_buses: tuple[list[Store], list[EventBus]],
) -> None:
    """A replica's NOTIFYs go out as one statement on its store's own connection; while that
    connection cannot be used (it failed a moment ago) they go through the pool, and the other
    replica hears them either way."""
    stores, buses = two_buses
    sub = buses[1].subscribe()
    direct = stores[0].direct_notify
    assert direct is not None
    buses[0].tasks_changed(["t1"])
    assert await asyncio.wait_for(sub.next(), 10) == {"t1"}
    assert direct.backend_pid is not None  # it went the direct way
    # A heartbeat's worth: hundreds of payloads in one statement, odd ids intact.
    hosts_sub = buses[1].subscribe_hosts()
    many = [f'host-{i}-"quoted"\\é' for i in range(4000)]
    buses[0].hosts_changed(many)
    heard: set[str] = set()
    while heard != set(many):
        got = await asyncio.wait_for(hosts_sub.next(), 10)
        assert got is not None
        heard |= got
    await direct.close()
    direct._retry_at = float("inf")  # as after a failure: not tried for a while
    buses[0].tasks_changed(["t2"])
    assert await asyncio.wait_for(sub.next(), 10) == {"t2"}
    assert direct.backend_pid is None


async def test_an_attempts_start_reaches_watchers_without_reloading_the_task(
    cloud: CloudServer, ops: Any, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt's first renewal turns it and its task RUNNING: watchers that were sent the
    task ASSIGNED show it RUNNING, with the renewal's progress and expiry, as GetTask does,
    without reloading it (a fleet's start is every task's first renewal at once)."""
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    ch = channel(cloud.address, pki_dir, "operator-ops")
    try:
        stub: Any = progress_service_pb2_grpc.ProgressServiceStub(ch)
        await host.connect(["p1"])
        task = (await submit(ops, goal="starts", lease_duration=Duration(seconds=30))).task
        a = (await host.next("assignment")).assignment
        fleet = stub.WatchProgress(progress_service_pb2.WatchProgressRequest())
        one = stub.WatchProgress(progress_service_pb2.WatchProgressRequest(task_id=task.task_id))
        for call in (fleet, one):
            first = await asyncio.wait_for(call.read(), 10)
            assert first.snapshot and first.task.status == types_pb2.TASK_STATUS_ASSIGNED
        reloads = count_reloads(monkeypatch)

        await host.send(renewal(a, 1, "step one"))
        await host.next("renewed")
        shown = [(await asyncio.wait_for(call.read(), 10)).task for call in (fleet, one)]
        assert reloads == []
        got = (await ops.GetTask(task_service_pb2.GetTaskRequest(task_id=task.task_id))).task
        for t in shown:
            assert t.status == got.status == types_pb2.TASK_STATUS_RUNNING
            assert t.progress == got.progress and t.progress.summary == "step one"
            assert (t.lease_expires_at, t.updated_at) == (got.lease_expires_at, got.updated_at)
            assert t.totals.steps == got.totals.steps == 1
        fleet.cancel()
        one.cancel()
    finally:
        await host.close()
        await ch.close()


@pytest.mark.postgres
async def test_a_replica_hears_its_own_events_once(
    two_buses: tuple[list[Store], list[EventBus]],
) -> None:
    """The publisher's own watchers hear an event in-process; its NOTIFY, which comes back on
    the publisher's LISTEN too, is not delivered again, while another replica's is."""
    stores, buses = two_buses
    own, other = buses[0].subscribe(), buses[1].subscribe()
    now = stores[0].now()
    first = Extension("t-own", now + dt.timedelta(seconds=30), now, 1)
    buses[0].leases_extended([first])
    buses[0].tasks_changed(["t-changed"])
    assert own.take_extended() == [first]
    assert await asyncio.wait_for(own.next(), 10) == {"t-changed"}
    heard: list[Extension] = []
    async with asyncio.timeout(10):
        while "t-changed" not in (await other.next() or set()):
            pass
        heard = other.take_extended()
    assert heard == [first]
    # Sent after the first NOTIFY was delivered, so the publisher's LISTEN hears it later.
    marker = Extension("t-marker", now + dt.timedelta(seconds=30), now, 1)
    buses[1].leases_extended([marker])
    async with asyncio.timeout(10):
        while marker not in own.take_extended():
            assert await own.next() == set()
    assert own.take_extended() == []


@pytest.mark.postgres
async def test_lease_extensions_reach_another_replicas_watchers_as_extensions(
    two_buses: tuple[list[Store], list[EventBus]],
) -> None:
    """Another replica's watchers hear a lease extension itself (expiry, write time, attempt,
    progress, start), exactly, not a task change to reload; hundreds of extensions with long
    escaped summaries arrive whole across payloads, and of two extensions of one task the later
    write is kept whatever order they arrive in."""
    stores, buses = two_buses
    sub = buses[1].subscribe()
    one = buses[1].subscribe(task_id="t-1")
    now = stores[0].now()
    summary = 'é"\\\n😀' * 40  # 200 characters, each escaped in JSON
    sent = [
        Extension(
            f"t-{i}",
            now + dt.timedelta(seconds=30, microseconds=i),
            now + dt.timedelta(microseconds=i),
            i % 3 + 1,
            leases.ProgressIn(i, 2, summary, None if i % 2 else 50) if i % 4 else None,
            started=i % 5 == 0,
        )
        for i in range(600)
    ]
    buses[0].leases_extended(sent)
    heard: dict[str, Extension] = {}
    while len(heard) < len(sent):
        assert await asyncio.wait_for(sub.next(), 10) == set()  # nothing to reload
        heard |= {e.task_id: e for e in sub.take_extended()}
    assert heard == {e.task_id: e for e in sent}
    assert await asyncio.wait_for(one.next(), 10) == set()
    assert one.take_extended() == [sent[1]]

    newer = Extension("t-1", now + dt.timedelta(minutes=1), now + dt.timedelta(seconds=5), 2)
    older = Extension("t-1", now + dt.timedelta(minutes=2), now + dt.timedelta(seconds=4), 2)
    marker = Extension("t-marker", now + dt.timedelta(minutes=1), now, 1)
    buses[0].leases_extended([newer])
    buses[0].leases_extended([older])
    buses[0].leases_extended([marker])
    # One session's notifications arrive in order: once the marker is heard, so is `older`.
    async with asyncio.timeout(10):
        while marker not in sub.take_extended():
            await sub.next()
    assert await asyncio.wait_for(one.next(), 10) == set()
    assert one.take_extended() == [newer]

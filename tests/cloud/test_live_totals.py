"""A task's watchers see its totals (decisions, tokens, cost) move with each decision counted,
on either planner transport and on every replica, without reloading the task.

Real clouds over mTLS on SQLite and PostgreSQL: the cloud transport plans with the real
Anthropic SDK against the fake Messages server; a direct-transport host ships its decisions and
its failed decisions' calls (ShipDecisions). `load_views` is wrapped only to count the watchers'
reloads (every call still reads the store). The last test applies totals to what a stream sent,
as WatchProgress does, on a real store.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from sqlalchemy import event

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    progress_service_pb2,
    progress_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from cloud.events import EventBus
from cloud.server import CloudServer
from cloud.services.progress_service import KEPT, _Shown
from cloud.store import leases, spend, tasks
from cloud.store.database import Store
from cloud.store.spend import TaskSpent
from planner.convert import usage_to_proto
from planner.decision import Billed, Usage
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import (
    ScriptedHost,
    channel,
    count_reloads,
    renewal,
    start_replicas,
    submit,
    tasks_stub,
)
from tests.cloud.test_shipping import failed_calls, shipped
from tests.planner import scenes
from tests.support.fakes import FakeModelServer, anthropic_message, tool_use
from tests.support.postgres import PostgresServer


async def _watch(stub: Any, task_id: str) -> list[Any]:
    """A fleet-wide and a one-task watcher, each past its snapshot of the running task."""
    calls = [
        stub.WatchProgress(progress_service_pb2.WatchProgressRequest()),
        stub.WatchProgress(progress_service_pb2.WatchProgressRequest(task_id=task_id)),
    ]
    for call in calls:
        first = await asyncio.wait_for(call.read(), 10)
        assert first.snapshot and first.task.status == types_pb2.TASK_STATUS_RUNNING
    return calls


async def _shown(calls: list[Any], ops: Any, task_id: str) -> types_pb2.TaskTotals:
    """The next task each watcher was sent, checked against GetTask's totals; those totals."""
    reply: task_service_pb2.GetTaskResponse = await ops.GetTask(
        task_service_pb2.GetTaskRequest(task_id=task_id)
    )
    got = reply.task
    for call in calls:
        task = (await asyncio.wait_for(call.read(), 10)).task
        while task.totals.HasField("unsettled") and not got.totals.HasField("unsettled"):
            # The model call under way, sent before its decision (test_live_unsettled.py).
            task = (await asyncio.wait_for(call.read(), 10)).task
        assert task.task_id == task_id
        assert task.totals.usage == got.totals.usage
        assert task.totals.decisions == got.totals.decisions
        assert task.status == types_pb2.TASK_STATUS_RUNNING
    return got.totals


async def test_each_decision_the_cloud_plans_moves_its_watchers_totals(
    anthropic_cloud: CloudServer,
    model: FakeModelServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cloud transport: after each Decide, a fleet watcher and the task's watcher are sent the
    task with its new decision count, tokens (cache writes included) and cost, as GetTask says,
    though nothing else about the task changed, and without reloading it."""
    cloud = anthropic_cloud
    launch = {
        "package_name": "com.android.settings",
        "purpose": "open Settings",
        "expected_outcome": "Settings opens",
    }
    for _ in range(2):
        model.script_anthropic(
            anthropic_message(
                tool_use("launch_app", launch),
                input_tokens=900,
                output_tokens=60,
                cache_creation_input_tokens=2000,
                cache_read_input_tokens=300,
            )
        )
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        ops = tasks_stub(ops_ch)
        await host.connect(["p"])
        task_id = (await submit(ops)).task.task_id
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a, 1, "looking"))
        await host.next("renewed")
        watchers = await _watch(progress_service_pb2_grpc.ProgressServiceStub(ops_ch), task_id)
        reloads = count_reloads(monkeypatch)
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        costs = [0.0]
        for n in (1, 2):
            await planner.Decide(
                planner_service_pb2.DecideRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    observation=observation_from_scene(scenes.launcher()),
                )
            )
            totals = await _shown(watchers, ops, task_id)
            assert totals.decisions == n
            assert totals.usage.cache_creation_input_tokens == 2000 * n
            assert totals.usage.cost_usd > costs[-1]
            costs.append(totals.usage.cost_usd)
        assert [ids for ids in reloads if ids != [task_id]] == []
        assert reloads.count([task_id]) == 2  # GetTask's, not the watchers'
        for call in watchers:
            call.cancel()
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()


async def test_each_shipment_of_a_direct_host_moves_its_watchers_totals(
    cloud: CloudServer, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Direct transport: a shipped decision, and a failed decision's shipped calls, reach the
    task's watchers as its new totals; a resend of the same decision sends nothing new."""
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        ops = tasks_stub(ops_ch)
        await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
        task_id = (await submit(ops, lease_duration=Duration(seconds=120))).task.task_id
        a = (await host.next("assignment")).assignment
        await host.send(renewal(a, 1, "looking"))
        await host.next("renewed")
        watchers = await _watch(progress_service_pb2_grpc.ProgressServiceStub(ops_ch), task_id)
        reloads = count_reloads(monkeypatch)
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
        entry = shipped(a, "d1")
        entry.decision.usage.CopyFrom(
            types_pb2.Usage(
                input_tokens=700, output_tokens=50, cache_creation_input_tokens=90, cost_usd=0.02
            )
        )
        await log.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[entry]))
        totals = await _shown(watchers, ops, task_id)
        assert (totals.decisions, totals.usage.input_tokens) == (1, 700)
        assert totals.usage.cost_usd == pytest.approx(0.02)

        await log.ShipDecisions(
            decision_log_service_pb2.ShipDecisionsRequest(
                entries=[entry],  # a resend: counted before
                failed_calls=[failed_calls(a, "f1", input_tokens=400)],
            )
        )
        totals = await _shown(watchers, ops, task_id)
        assert (totals.decisions, totals.usage.input_tokens) == (1, 1100)
        assert totals.usage.cost_usd == pytest.approx(0.023)
        assert [ids for ids in reloads if ids != [task_id]] == []
        assert reloads.count([task_id]) == 2  # GetTask's, not the watchers'
        for call in watchers:
            call.cancel()
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()


@pytest.mark.postgres
async def test_another_replicas_watchers_see_the_totals_a_shipment_moved(
    postgres_server: PostgresServer, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new totals travel between replicas: a watcher on the replica the host does not talk
    to is sent them, without reloading the task."""
    url = postgres_server.create_database()
    async with start_replicas(url, pki_dir, default_lease_seconds=120) as (near, far):
        ops_ch = channel(near.address, pki_dir, "operator-ops")
        far_ch = channel(far.address, pki_dir, "operator-ops")
        host_ch = channel(near.address, pki_dir, "host-h1")
        host = ScriptedHost(near.address, pki_dir, "h1")
        try:
            ops = tasks_stub(ops_ch)
            await host.connect(["s1"], transport=types_pb2.PLANNER_TRANSPORT_DIRECT)
            task_id = (await submit(ops)).task.task_id
            a = (await host.next("assignment")).assignment
            await host.send(renewal(a, 1, "looking"))
            await host.next("renewed")
            stub = progress_service_pb2_grpc.ProgressServiceStub(far_ch)
            watchers = await _watch(stub, task_id)
            reloads = count_reloads(monkeypatch)
            entry = shipped(a, "d1")
            entry.decision.usage.CopyFrom(
                types_pb2.Usage(input_tokens=700, output_tokens=50, cost_usd=0.02)
            )
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
            await log.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(entries=[entry]))
            totals = await _shown(watchers, ops, task_id)
            assert (totals.decisions, totals.usage.output_tokens) == (1, 50)
            assert [ids for ids in reloads if ids != [task_id]] == []
            assert reloads.count([task_id]) == 1  # GetTask's, not the watchers'
            for call in watchers:
                call.cancel()
        finally:
            await host.close()
            for ch in (host_ch, far_ch, ops_ch):
                await ch.close()


async def test_totals_read_before_the_ones_shown_change_nothing(store: Store) -> None:
    """A stream shows the newest totals it has seen of a task, whatever order they arrive in:
    an older reading (it raced a reload that read a newer one) is `KEPT`, a newer one is applied
    with every other field as sent, and one of a task not sent (or ended) is reloaded."""
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=1, lease_seconds=30, timeout_seconds=3600)
    )
    c = await leases.claim(store, "h1", ["p"], 2)
    assert c is not None
    async with store.write() as session:
        await spend.add_to_task_totals(session, c.task_id, Usage(100, 10, 0, 50, 0, 0.5), 2)
    view = await tasks.get(store, c.task_id)
    assert view is not None
    shown = _Shown()
    sent = shown.keep(view)
    (now,) = await spend.task_totals(store, [c.task_id])
    assert now.shown() == (Usage(100, 10, 0, 50, 0, 0.5), 2, (0, Usage()))
    assert shown.spend(TaskSpent(c.task_id, Usage(40, 5, 0, 0, 0, 0.2), 1)) == KEPT
    newer = TaskSpent(c.task_id, Usage(180, 20, 0, 90, 0, 0.9), 3)
    patched = shown.spend(newer)
    assert isinstance(patched, types_pb2.Task)
    assert patched.totals.decisions == 3
    assert patched.totals.usage == usage_to_proto(newer.usage)
    assert shown.spend(newer) == KEPT
    for task in (patched, sent):  # the rest as sent
        task.totals.ClearField("usage")
        task.totals.ClearField("decisions")
    assert patched == sent
    assert shown.spend(TaskSpent("not-sent", Usage(1), 1)) is None


async def test_a_count_s_totals_come_back_from_its_update_not_a_second_read(store: Store) -> None:
    """The totals a count sends its watchers come from its UPDATE (RETURNING): publishing them
    reads the task's unsettled calls only, never the task row again, and they are what the row
    holds. (The statements are captured from the engine, not changed.)"""
    await tasks.submit(
        store, tasks.NewTask(goal="g", max_attempts=1, lease_seconds=30, timeout_seconds=3600)
    )
    c = await leases.claim(store, "h1", ["p"], 2)
    assert c is not None
    bus = EventBus(store)  # not started: its watchers on this replica are enough
    sub = bus.subscribe()
    sent: list[str] = []

    def seen(_c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        sent.append(" ".join(statement.split()))

    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    try:
        heard: list[TaskSpent] = []
        billed = Billed("anthropic", "m", Usage(120, 30, 0, 0, 0, 0.25))
        assert await spend.count_failed(
            store, "h1", c.task_id, c.attempt, billed, "PlannerError", on_totals=heard.append
        )
        await bus.decisions_counted([c.task_id], heard)
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
        sub.close()
    on_tasks = [x for x in sent if " tasks " in f"{x} " or x.startswith("UPDATE tasks")]
    assert len(on_tasks) == 1, on_tasks
    assert on_tasks[0].startswith("UPDATE tasks") and "RETURNING" in on_tasks[0]
    (published,) = sub.take_spent()
    (read,) = await spend.task_totals(store, [c.task_id])
    assert published.shown() == read.shown() == (billed.usage, 0, (0, Usage()))

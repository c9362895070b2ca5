"""A task's watchers see its model calls of unknown cost (decision 0080) appear and settle as
they happen, on either planner transport and on every replica, without reloading the task.

Real clouds over mTLS on SQLite and PostgreSQL: the cloud transport plans with the real
Anthropic SDK against the fake Messages server (an answer held back: a call under way) or
against a socket that reads the request and hangs up (a call whose cost stays unknown); a
direct-transport host ships its calls of unknown cost and the failed decision's calls that
settle one (ShipDecisions). `load_views` is wrapped only to count the watchers' reloads (every
call still reads the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    progress_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from cloud.server import CloudServer
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
from tests.cloud.test_live_totals import _watch
from tests.cloud.test_shipping import failed_calls, unsettled_call
from tests.planner import scenes
from tests.support.fakes import FakeModelServer, ScriptedTurn, tool_use
from tests.support.postgres import PostgresServer

LAUNCH = {
    "package_name": "com.android.settings",
    "purpose": "open Settings",
    "expected_outcome": "Settings opens",
}


async def _shown(calls: list[Any], ops: Any, task_id: str) -> types_pb2.TaskTotals:
    """The next task each watcher was sent, its totals and calls of unknown cost checked
    against GetTask's (asked once the watchers heard: a call under way is written by then);
    those totals."""
    sent = [(await asyncio.wait_for(call.read(), 10)).task for call in calls]
    reply: task_service_pb2.GetTaskResponse = await ops.GetTask(
        task_service_pb2.GetTaskRequest(task_id=task_id)
    )
    got = reply.task.totals
    for task in sent:
        assert task.task_id == task_id
        assert task.totals.unsettled == got.unsettled
        assert task.totals.usage == got.usage
        assert task.totals.decisions == got.decisions
    return got


async def _decide(host_ch: grpc.aio.Channel, a: Any) -> Any:
    planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
    return await planner.Decide(
        planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scenes.launcher()),
        )
    )


async def test_a_call_the_cloud_makes_shows_live_until_its_decision_settles_it(
    anthropic_cloud: CloudServer,
    model: FakeModelServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cloud transport: while the model's answer is held back, a fleet watcher and the task's
    watcher are sent the task with one call of unknown cost (as GetTask says); once the
    decision is logged, with none and the decision counted. No watcher reloads the task."""
    cloud = anthropic_cloud
    held = threading.Event()
    model.script_anthropic(ScriptedTurn([tool_use("launch_app", LAUNCH)], hold=held))
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
        decide = asyncio.create_task(_decide(host_ch, a))
        try:
            totals = await _shown(watchers, ops, task_id)
            assert totals.unsettled.calls == 1  # the call under way
            assert totals.unsettled.at_most.cost_usd > 0
            assert totals.decisions == 0
        finally:
            held.set()
        await decide
        totals = await _shown(watchers, ops, task_id)
        assert not totals.HasField("unsettled")
        assert totals.decisions == 1
        assert [ids for ids in reloads if ids != [task_id]] == []
        assert reloads.count([task_id]) == 2  # GetTask's, not the watchers'
        for call in watchers:
            call.cancel()
    finally:
        held.set()
        await host.close()
        await host_ch.close()
        await ops_ch.close()


@pytest.fixture
async def hang_up() -> AsyncIterator[str]:
    """A provider that reads the request and hangs up: the real SDK's connection error, the
    call's cost unknown (it may have been billed)."""
    answered: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered.append(writer)
        await reader.read(65536)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in answered:  # a connection still being read (the server's close leaves it)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await server.wait_closed()


@pytest.fixture
def anthropic_env(hang_up: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """The hang-up provider for the test that asks for it; the fake Messages server otherwise."""
    if "hang_up_cloud" not in request.fixturenames:
        return {}
    return {"AMC_PLANNER_ANTHROPIC_BASE_URL": hang_up}


@pytest.fixture
def hang_up_cloud(anthropic_cloud: CloudServer) -> CloudServer:
    """`anthropic_cloud`, its provider `hang_up`."""
    return anthropic_cloud


async def test_a_call_hung_up_on_shows_as_unknown_to_the_tasks_watchers(
    hang_up_cloud: CloudServer, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cloud transport: a call whose connection the provider dropped after reading it keeps
    its marker (it may have been billed): the task's watchers are sent it as a call of unknown
    cost, without reloading the task, though the Decide failed (UNAVAILABLE)."""
    cloud = hang_up_cloud
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
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await _decide(host_ch, a)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        totals = await _shown(watchers, ops, task_id)
        assert totals.unsettled.calls == 1
        assert totals.usage.cost_usd == 0
        assert [ids for ids in reloads if ids != [task_id]] == []
        for call in watchers:
            call.cancel()
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()


async def _ship(host_ch: grpc.aio.Channel, **fields: Any) -> None:
    log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(host_ch)
    await log.ShipDecisions(decision_log_service_pb2.ShipDecisionsRequest(**fields))


async def test_a_direct_hosts_calls_of_unknown_cost_reach_its_watchers_as_shipped(
    cloud: CloudServer, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Direct transport: shipped calls of unknown cost, and the failed decision's calls that
    settle one of them, reach the task's watchers as they are recorded; a resend sends nothing
    new. No watcher reloads the task."""
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
        await _ship(host_ch, unsettled_calls=[unsettled_call(a, "c1"), unsettled_call(a, "c2")])
        totals = await _shown(watchers, ops, task_id)
        assert totals.unsettled.calls == 2
        assert totals.unsettled.at_most.cost_usd == pytest.approx(0.32)

        late = failed_calls(a, "f1")
        late.settles_calls.append("c1")
        await _ship(host_ch, unsettled_calls=[unsettled_call(a, "c1")], failed_calls=[late])
        totals = await _shown(watchers, ops, task_id)
        assert totals.unsettled.calls == 1
        assert totals.usage.input_tokens == 500
        assert [ids for ids in reloads if ids != [task_id]] == []
        assert reloads.count([task_id]) == 2  # GetTask's, not the watchers'
        for call in watchers:
            call.cancel()
    finally:
        await host.close()
        await host_ch.close()
        await ops_ch.close()


@pytest.mark.postgres
async def test_another_replicas_watchers_see_a_shipped_call_of_unknown_cost(
    postgres_server: PostgresServer, pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls of unknown cost travel between replicas with the totals: a watcher on the
    replica the host does not talk to is sent them as they appear and settle, without
    reloading the task."""
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
            await _ship(host_ch, unsettled_calls=[unsettled_call(a, "c1")])
            assert (await _shown(watchers, ops, task_id)).unsettled.calls == 1
            late = failed_calls(a, "f1")
            late.settles_calls.append("c1")
            await _ship(host_ch, failed_calls=[late])
            totals = await _shown(watchers, ops, task_id)
            assert not totals.HasField("unsettled")
            assert totals.usage.input_tokens == 500
            assert [ids for ids in reloads if ids != [task_id]] == []
            for call in watchers:
                call.cancel()
        finally:
            await host.close()
            await host_ch.close()
            await ops_ch.close()

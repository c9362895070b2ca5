"""A Decide its caller gave up on mid-decision still counts the model calls answered before,
and the call under way then once the provider answers it.

A real cloud over mTLS plans with the real Anthropic SDK against the local fake Messages server:
the first call is answered without a tool call (500 + 100 tokens, billed), the second (the
retry) is held by the fake. The host's Decide, without a step key, is cancelled or runs into
its deadline meanwhile, then the provider answers the held call (it bills it, whoever waits):
the cloud's handler is cancelled inside the decision, no decision row is logged, and both calls
count in the task's totals and today's spending (the held one once it answers).

With a step key the plan outlives its caller (a retry joins it), so the model's answer comes
even when no caller is left to hear it: a host killed mid-step, whose new process starts the
task's next attempt and never asks for that step again. The decision is logged when it is
planned, so what it cost is in the record and a retry that does come gets it replayed. When
the retry went to another replica, which planned the step again and logged it first, the
first replica's answer is counted as a failed decision's calls: both were paid for.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Literal

import grpc
import pytest

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
)
from cloud.server import CloudServer
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import ScriptedHost, channel, start_replicas, submit, tasks_stub
from tests.planner import scenes
from tests.support.fakes import FakeModelServer, ScriptedTurn, anthropic_message, text, tool_use
from tests.support.postgres import PostgresServer
from tests.support.waiting import until


def _held_launch(hold: threading.Event) -> ScriptedTurn:
    turn = anthropic_message(
        tool_use(
            "launch_app",
            {"package_name": "com.android.settings", "purpose": "open", "expected_outcome": "open"},
        ),
        input_tokens=500,
        output_tokens=100,
    )
    turn.hold = hold
    return turn


@pytest.mark.parametrize("step_key", ["", "1"])
@pytest.mark.parametrize("gives_up", ["cancel", "deadline"])
async def test_a_decide_given_up_mid_decision_counts_its_calls_and_the_one_in_flight(
    anthropic_cloud: CloudServer,
    model: FakeModelServer,
    pki_dir: Path,
    gives_up: Literal["cancel", "deadline"],
    step_key: str,
) -> None:
    cloud = anthropic_cloud
    hold = threading.Event()
    model.script_anthropic(
        anthropic_message(text("Let me look first."), input_tokens=500, output_tokens=100),
        _held_launch(hold),
    )
    ops = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await host.connect(["p"])
        task_id = (await submit(tasks_stub(ops))).task.task_id
        a = (await host.next("assignment")).assignment
        stub: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scenes.launcher()),
            step_key=step_key,
        )
        # The deadline is far beyond the first (local) answer, and the second never comes.
        call = stub.Decide(request, timeout=5.0 if gives_up == "deadline" else None)
        await until(lambda: len(model.bodies("/v1/messages")) == 2, what="the retry asked")
        if gives_up == "cancel":
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        else:
            with pytest.raises(grpc.aio.AioRpcError) as late:
                await call
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        tasks = tasks_stub(ops)

        async def counted() -> bool:
            got = await tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
            return bool(got.task.totals.usage.input_tokens)

        if not step_key:
            # The handler was cancelled (the client may see its deadline first): the call
            # answered before counts at once. (A step-keyed plan goes on: nothing yet.)
            await until(counted, within=15, what="the answered call counted")
        hold.set()  # the provider answers the call it was working on when the host gave up

        async def both_counted() -> bool:
            got = await tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
            return bool(got.task.totals.usage.input_tokens == 1000)

        await until(both_counted, within=15, what="both calls counted")
        task = (await tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))).task
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ops)
        spend = await fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
    finally:
        hold.set()
        await host.close()
        await host_ch.close()
        await ops.close()
    # Without a step key the decision was cut short: its calls count, no decision is logged.
    # With one its plan went on (a retry of the step would join it) and, as nobody waited for
    # it any more, the plan logged its decision itself (both calls) for the retry to find.
    logged = [(d.step_index, d.usage.input_tokens) for d in listed.decisions]
    assert logged == ([(1, 1000)] if step_key else [])
    usage = task.totals.usage
    assert (usage.input_tokens, usage.output_tokens) == (1000, 200)
    assert usage.cost_usd == pytest.approx(0.006)
    assert task.totals.unsettled.calls == 0  # the late call's marker settled when counted
    assert (spend.today.input_tokens, spend.today.output_tokens) == (1000, 200)
    (row,) = spend.rows
    assert (row.host_id, row.model, row.decisions) == (
        "h1",
        "claude-sonnet-4-6",
        1 if step_key else 0,
    )


async def test_a_step_its_host_never_asks_for_again_is_logged_when_planned(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    cloud = anthropic_cloud
    hold = threading.Event()
    model.script_anthropic(_held_launch(hold))
    ops = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(cloud.address, pki_dir, "h1")
    try:
        await host.connect(["p"])
        task_id = (await submit(tasks_stub(ops))).task.task_id
        a = (await host.next("assignment")).assignment
        stub: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        request = planner_service_pb2.DecideRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            observation=observation_from_scene(scenes.launcher()),
            step_key="1",
        )
        call = stub.Decide(request)
        await until(lambda: len(model.bodies("/v1/messages")) == 1, what="the model asked")
        call.cancel()  # what the host's death does to its call
        with pytest.raises(asyncio.CancelledError):
            await call
        hold.set()  # the provider answers (and bills) after the caller is gone

        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        listing = decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)

        async def logged() -> bool:
            return bool((await log.ListDecisions(listing)).decisions)

        await until(logged, within=15, what="the unheard decision logged")
        listed = await log.ListDecisions(listing)
        task = (
            await tasks_stub(ops).GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        ).task
        fleet: Any = fleet_service_pb2_grpc.FleetServiceStub(ops)
        spend = await fleet.GetSpend(fleet_service_pb2.GetSpendRequest())
        again = await stub.Decide(request)  # a retry that does come: the same step, replayed
    finally:
        hold.set()
        await host.close()
        await host_ch.close()
        await ops.close()
    [decision] = listed.decisions
    assert (decision.step_index, decision.tool_name) == (1, "launch_app")
    assert (again.replayed, again.decision.decision_id) == (True, decision.decision_id)
    assert len(model.bodies("/v1/messages")) == 1  # planned once
    assert list(listed.failed_calls) == []
    usage = task.totals.usage
    assert (usage.input_tokens, usage.output_tokens) == (500, 100)
    assert (spend.today.input_tokens, spend.today.output_tokens) == (500, 100)
    (row,) = spend.rows
    assert row.decisions == 1


@pytest.mark.postgres
async def test_a_step_planned_again_on_another_replica_counts_both_answers(
    model: FakeModelServer,
    postgres_server: PostgresServer,
    pki_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    migrated_postgres: str,
) -> None:
    for name, value in {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
        "AMC_PLANNER_ANTHROPIC_API_KEY": "sk-ant-test",
        "AMC_PLANNER_ANTHROPIC_BASE_URL": model.anthropic_base_url,
        "AMC_PLANNER_MAX_RETRIES": "0",
    }.items():
        monkeypatch.setenv(name, value)
    hold = threading.Event()
    model.script_anthropic(
        _held_launch(hold),
        anthropic_message(
            tool_use("press_key", {"key": "home", "purpose": "home", "expected_outcome": "home"}),
            input_tokens=200,
            output_tokens=50,
        ),
    )
    url = postgres_server.create_database(template=migrated_postgres)
    async with start_replicas(url, pki_dir, default_lease_seconds=30) as (first, second):
        ops = channel(first.address, pki_dir, "operator-ops")
        host_chs = [channel(r.address, pki_dir, "host-h1") for r in (first, second)]
        host = ScriptedHost(first.address, pki_dir, "h1")
        try:
            await host.connect(["p"])
            task_id = (await submit(tasks_stub(ops))).task.task_id
            a = (await host.next("assignment")).assignment
            request = planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                observation=observation_from_scene(scenes.launcher()),
                step_key="1",
            )
            stubs: list[Any] = [planner_service_pb2_grpc.PlannerServiceStub(c) for c in host_chs]
            call = stubs[0].Decide(request)
            await until(lambda: len(model.bodies("/v1/messages")) == 1, what="the model asked")
            call.cancel()  # the answer is lost; the host asks again, and reaches the other replica
            with pytest.raises(asyncio.CancelledError):
                await call
            again = await stubs[1].Decide(request)
            hold.set()  # the first replica's plan ends too, after the step was logged

            tasks = tasks_stub(ops)

            async def both_counted() -> bool:
                got = await tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
                return bool(got.task.totals.usage.input_tokens == 700)

            await until(both_counted, within=15, what="both answers counted")
            got = await tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
            unsettled = got.task.totals.unsettled.calls
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
            listed = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
            )
        finally:
            hold.set()
            await host.close()
            for c in host_chs:
                await c.close()
            await ops.close()
    [decision] = listed.decisions
    assert (decision.tool_name, again.decision.decision_id) == ("press_key", decision.decision_id)
    assert unsettled == 0  # the plan logged twice settled its markers as a failed one's calls
    [failed] = listed.failed_calls
    assert (failed.decisions, failed.usage.input_tokens, failed.usage.output_tokens) == (
        1,
        500,
        100,
    )

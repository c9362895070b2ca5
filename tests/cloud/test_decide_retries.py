"""Decide through the real cloud when an answer was lost or the database went away.

A retried step (same `step_key`) gets the decision already logged, on both backends, with one
row in the decision log; while PostgreSQL is down Decide answers UNAVAILABLE with a generic
message and the trailing metadata naming the database (never the driver's text: it names the
database's host and port), and the same step asked again once it is back is planned once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from sqlalchemy.engine import make_url

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
    types_pb2,
)
from cloud.server import CloudServer, build_server
from cloud.settings import CloudSettings
from host.cloud_channel import open_channel
from host.planner_client import CloudPlanner
from host.settings import HostSettings
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import ScriptedHost, channel, start_replicas, submit, tasks_stub
from tests.planner import scenes
from tests.support.fakes import FakeModelServer, ScriptedTurn, thinking, tool_use
from tests.support.postgres import PostgresServer
from tests.support.restartable_postgres import restartable_postgres
from tests.support.waiting import until


def _request(a: Any, step_key: str, **fields: Any) -> planner_service_pb2.DecideRequest:
    return planner_service_pb2.DecideRequest(
        task_id=a.task_id,
        attempt=a.attempt,
        lease_id=a.lease_id,
        observation=observation_from_scene(scenes.launcher()),
        step_key=step_key,
        **fields,
    )


async def test_a_retried_step_is_answered_from_the_decision_log(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    cloud = offline_cloud
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h17")
    host = ScriptedHost(cloud.address, pki_dir, "h17")
    try:
        await host.connect(["p"])
        await submit(tasks_stub(ops_ch))
        a = (await host.next("assignment")).assignment
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        first = await planner.Decide(_request(a, "1"))
        again = await planner.Decide(_request(a, "1"))
        assert (first.replayed, again.replayed) == (False, True)
        assert again.decision.decision_id == first.decision.decision_id
        assert again.decision.step_index == 1
        assert again.decision.action == first.decision.action
        outcome = types_pb2.ActionOutcome(step_index=1, executed=True)
        second = await planner.Decide(_request(a, "2", previous_outcome=outcome))
        assert second.decision.step_index == 2 and not second.replayed

        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_ch)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
        )
        assert [d.step_index for d in listed.decisions] == [1, 2]
        assert listed.decisions[0].outcome.executed  # the retry did not lose the outcome
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()


async def test_a_step_of_a_task_being_cancelled_is_not_planned(
    offline_cloud: CloudServer, pki_dir: Path
) -> None:
    """The operator cancels a running task while its host's Lease stream is down (the host is
    reconnecting: it has not heard the revoke). Its next Decide, over its own channel, is
    refused as its renewal would be (FAILED_PRECONDITION): no model call, nothing logged and
    nothing for the phone to do after the cancel. It used to be planned, the lease being live
    until it ran out, and the phone acted on a cancelled task."""
    cloud = offline_cloud
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    host_ch = channel(cloud.address, pki_dir, "host-h19")
    host = ScriptedHost(cloud.address, pki_dir, "h19")
    try:
        await host.connect(["p"])
        ops: Any = tasks_stub(ops_ch)
        await submit(ops)
        a = (await host.next("assignment")).assignment
        planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        first = await planner.Decide(_request(a, "1"))
        await host.close()  # the stream is down; the host's step goes on
        await ops.CancelTask(task_service_pb2.CancelTaskRequest(task_id=a.task_id, reason="no"))
        outcome = types_pb2.ActionOutcome(step_index=1, executed=True)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await planner.Decide(_request(a, "2", previous_outcome=outcome))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "is not a live lease" in (err.value.details() or "")

        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_ch)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=a.task_id)
        )
        assert [d.decision_id for d in listed.decisions] == [first.decision.decision_id]
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()


async def test_a_screenshot_over_the_contracts_limit_is_left_out_not_refused(
    offline_cloud: CloudServer, pki_dir: Path, tmp_path: Path
) -> None:
    """A host that sends screenshots (AMC_HOST_SEND_SCREENSHOT) on a phone whose screen PNG is
    over the 8 MiB a DecideRequest's screenshot may have (a noisy full screen at a high
    resolution): the step is planned from the observation alone. The cloud used to get it and
    refuse the request (INVALID_ARGUMENT, which a step never asks again): the task failed on
    one picture."""
    cloud = offline_cloud
    ops_ch = channel(cloud.address, pki_dir, "operator-ops")
    settings = HostSettings(
        cloud_address=cloud.address, certs_dir=pki_dir, host_id="h21", data_dir=tmp_path / "h"
    )
    host_ch = open_channel(settings)
    host = ScriptedHost(cloud.address, pki_dir, "h21")
    try:
        await host.connect(["p"])
        await submit(tasks_stub(ops_ch))
        a = (await host.next("assignment")).assignment
        planner = CloudPlanner(host_ch, a.task_id, a.attempt, a.lease_id, send_screenshot=True)
        big = b"\x89PNG\r\n\x1a\n" + bytes(9 * 1024 * 1024)
        decision = await planner.decide("g", scenes.launcher(), [], big)
        assert decision.step_index == 1
    finally:
        await host.close()
        await ops_ch.close()
        await host_ch.close()


@pytest.mark.postgres
async def test_decide_while_the_database_is_down_is_unavailable_then_planned_once(
    pki_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.environ.get("AMC_TEST_SKIP_POSTGRES") == "1":
        pytest.skip("AMC_TEST_SKIP_POSTGRES=1")
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "offline")
    with restartable_postgres() as pg:
        url = pg.server.create_database("amc_decide")
        cloud = await build_server(
            CloudSettings(
                database_url=url,
                listen_address="127.0.0.1:0",
                pki_dir=pki_dir,
                default_lease_seconds=60,
                shutdown_grace_seconds=0.5,
            )
        )
        await cloud.start()
        ops_ch = channel(cloud.address, pki_dir, "operator-ops")
        host_ch = channel(cloud.address, pki_dir, "host-h18")
        host = ScriptedHost(cloud.address, pki_dir, "h18")
        try:
            await host.connect(["p"])
            await submit(tasks_stub(ops_ch))
            a = (await host.next("assignment")).assignment
            planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
            await asyncio.to_thread(pg.stop)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await planner.Decide(_request(a, "1"))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert err.value.details() == "the cloud's database is unavailable; retry"
            assert ("amc-waiting-for", "the cloud's database") in tuple(
                err.value.trailing_metadata() or ()
            )
            await asyncio.to_thread(pg.start)
            answer = await _until_served(planner, _request(a, "1"))
            assert answer.decision.step_index == 1
            again = await planner.Decide(_request(a, "1"))
            assert again.replayed and again.decision.decision_id == answer.decision.decision_id
        finally:
            await host.close()
            await ops_ch.close()
            await host_ch.close()
            await cloud.stop(0.5)


async def _until_served(
    planner: Any, request: planner_service_pb2.DecideRequest
) -> planner_service_pb2.DecideResponse:
    """Decide until the cloud's pool has its database again (each try a real call)."""
    for _ in range(200):
        try:
            answer: planner_service_pb2.DecideResponse = await planner.Decide(request)
            return answer
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("the cloud never planned again after its database came back")


@pytest.mark.postgres
async def test_a_session_turn_answered_while_its_database_connection_drops_is_kept(
    pki_dir: Path,
    postgres_server: PostgresServer,
    migrated_postgres: str,
    model: FakeModelServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Session mode: the model answers, and the write of its turn into the conversation loses
    its database connection (here: it waits on a lock the test holds, and the test ends its
    backend, as a database restart does). The turn is written again once the database takes
    it: the step is logged with that answer, the model is asked once, no call is left of
    unknown cost. Before, the plan failed with the database's error (UNAVAILABLE): the answer
    was neither kept nor counted, and the host's retry paid the model again."""
    for name, value in {
        "AMC_PLANNER_PROVIDER": "anthropic",
        "AMC_PLANNER_MODEL": "claude-sonnet-4-6",
        "AMC_PLANNER_ANTHROPIC_API_KEY": "sk-ant-test",
        "AMC_PLANNER_ANTHROPIC_BASE_URL": model.anthropic_base_url,
        "AMC_PLANNER_MAX_RETRIES": "0",
        "AMC_PLANNER_MODE": "session",
        "AMC_PLANNER_THINKING": "budget",
        "AMC_PLANNER_THINKING_BUDGET_TOKENS": "2048",
    }.items():
        monkeypatch.setenv(name, value)
    caplog.set_level(logging.WARNING, logger="cloud.store.ports")
    hold = threading.Event()
    home = {"key": "home", "purpose": "home", "expected_outcome": "the launcher"}
    model.script_anthropic(
        ScriptedTurn(
            [thinking("Home."), tool_use("press_key", home)], usage=_usage(700), hold=hold
        ),
        ScriptedTurn([thinking("Home again."), tool_use("press_key", home)], usage=_usage(900)),
    )
    url = postgres_server.create_database(template=migrated_postgres)
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    waiting = "model's turn for task"
    async with start_replicas(url, pki_dir, count=1, default_lease_seconds=60) as (cloud,):
        ops_ch = channel(cloud.address, pki_dir, "operator-ops")
        host_ch = channel(cloud.address, pki_dir, "host-h20")
        host = ScriptedHost(cloud.address, pki_dir, "h20")
        try:
            await host.connect(["p"])
            task_id = (await submit(tasks_stub(ops_ch))).task.task_id
            a = (await host.next("assignment")).assignment
            planner: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
            with (
                psycopg.connect(dsn) as locker,
                psycopg.connect(dsn, autocommit=True) as watcher,
            ):
                call = asyncio.ensure_future(planner.Decide(_request(a, "1")))
                await until(lambda: len(model.bodies("/v1/messages")) == 1, what="model asked")
                locker.execute("LOCK TABLE planner_session_items IN EXCLUSIVE MODE")
                hold.set()  # answered: the turn's write waits on the lock
                lost = (
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                await until(lambda: bool(watcher.execute(lost).fetchall()), what="write ended")
                await until(
                    lambda: waiting in caplog.text or call.done(), what="written again, or failed"
                )
                locker.rollback()
            await asyncio.wait([call])
            if call.exception() is None:
                answer = call.result()
            else:  # UNAVAILABLE: the host asks again, as its step would
                answer = await _until_served(planner, _request(a, "1"))
            log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops_ch)
            listed = await log.ListDecisions(
                decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
            )
            got = await tasks_stub(ops_ch).GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        finally:
            hold.set()
            await host.close()
            await ops_ch.close()
            await host_ch.close()
    assert len(model.bodies("/v1/messages")) == 1
    assert answer.decision.usage.input_tokens == 700
    assert [(d.step_index, d.usage.input_tokens) for d in listed.decisions] == [(1, 700)]
    assert got.task.totals.unsettled.calls == 0


def _usage(input_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": 50,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }

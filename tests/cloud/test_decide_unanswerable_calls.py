"""An Anthropic answer whose tool calls the next request cannot answer (two `tool_use` blocks
sharing an id, as an Anthropic-compatible proxy may send) fails the host's Decide with a
planner error it can read, and what the answer cost is counted.

It used to escape as a plain ValueError: the compact corrective request's projection refused
two tool results naming one call (`SessionHistoryError`), the decision attached no usage to
it, and the Decide service, mapping only planner errors, let it reach the RPC boundary: the
host got INTERNAL "internal error; retry later" (a retry pays again) and the paid answer was
counted nowhere. A real cloud over
mTLS plans with the real Anthropic SDK against the local fake Messages server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import (
    decision_log_service_pb2,
    decision_log_service_pb2_grpc,
    planner_service_pb2,
    planner_service_pb2_grpc,
    task_service_pb2,
)
from cloud.server import CloudServer
from planner.observation import observation_from_scene
from tests.cloud.cloud_harness import ScriptedHost, channel, submit, tasks_stub
from tests.planner import scenes
from tests.support.fakes import FakeModelServer, anthropic_message, tool_use

INTENT = {"purpose": "open it", "expected_outcome": "it opens"}
SCENE = '{"package":"com.android.settings","page":"Settings","elements":[{"id":"e1"}]}'


async def test_two_tool_uses_sharing_an_id_fail_the_decide_named_and_counted(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    # Neither call is usable (no such elements), so compact mode sends the answer back
    # with a corrective tool result: the case where the shared id broke the request.
    model.script_anthropic(
        anthropic_message(
            tool_use("tap", {"element_id": "e99", **INTENT}, id="toolu_X"),
            tool_use("tap", {"element_id": "e98", **INTENT}, id="toolu_X"),
            input_tokens=500,
            output_tokens=100,
        )
    )
    ops = channel(anthropic_cloud.address, pki_dir, "operator-ops")
    host_ch = channel(anthropic_cloud.address, pki_dir, "host-h1")
    host = ScriptedHost(anthropic_cloud.address, pki_dir, "h1")
    try:
        await host.connect(["p"])
        task_id = (await submit(tasks_stub(ops))).task.task_id
        a = (await host.next("assignment")).assignment
        stub: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Decide(
                planner_service_pb2.DecideRequest(
                    task_id=a.task_id,
                    attempt=a.attempt,
                    lease_id=a.lease_id,
                    observation=observation_from_scene(scenes.settings_main()),
                )
            )
        task = (
            await tasks_stub(ops).GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        ).task
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
    finally:
        await host.close()
        await host_ch.close()
        await ops.close()
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    details = refused.value.details() or ""
    assert details.startswith("planner: anthropic") and "toolu_X" in details, details
    assert listed.decisions == []  # nothing ran
    usage = task.totals.usage
    assert (usage.input_tokens, usage.output_tokens) == (500, 100)  # the paid answer counted
    [failed] = listed.failed_calls
    assert (failed.decisions, failed.usage.input_tokens) == (1, 500)


async def test_a_session_answer_reusing_an_earlier_calls_id_fails_the_decide_counted(
    anthropic_cloud: CloudServer, model: FakeModelServer, pki_dir: Path
) -> None:
    """Session mode on the cloud transport: a second answer under the first call's id (a
    proxy numbering calls per answer) fails that step's Decide, UNKNOWN and named, counted,
    with nothing kept; the step asked again goes on over the conversation as it was."""
    tap = {"element_id": "e1", **INTENT}
    model.script_anthropic(anthropic_message(tool_use("tap", tap, id="toolu_R")))
    model.script_anthropic(
        anthropic_message(tool_use("tap", tap, id="toolu_R"), input_tokens=700, output_tokens=90)
    )
    model.script_anthropic(anthropic_message(tool_use("tap", tap, id="toolu_S")))
    ops = channel(anthropic_cloud.address, pki_dir, "operator-ops")
    host_ch = channel(anthropic_cloud.address, pki_dir, "host-h2")
    host = ScriptedHost(anthropic_cloud.address, pki_dir, "h2")
    try:
        await host.connect(["p"])
        task_id = (await submit(tasks_stub(ops))).task.task_id
        a = (await host.next("assignment")).assignment
        stub: Any = planner_service_pb2_grpc.PlannerServiceStub(host_ch)

        def step(outcome: str | None = None) -> planner_service_pb2.DecideRequest:
            session = planner_service_pb2.SessionStep(goal="Open Display", scene_json=SCENE)
            if outcome is not None:
                session.previous_outcome.CopyFrom(
                    planner_service_pb2.ToolOutcome(call_id=outcome, output='{"ok":true}')
                )
            return planner_service_pb2.DecideRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                session=session,
                element_ids=["e1"],
            )

        first = await stub.Decide(step())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Decide(step(first.session_call_id))
        again = await stub.Decide(step(first.session_call_id))
        task = (
            await tasks_stub(ops).GetTask(task_service_pb2.GetTaskRequest(task_id=task_id))
        ).task
        log: Any = decision_log_service_pb2_grpc.DecisionLogServiceStub(ops)
        listed = await log.ListDecisions(
            decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
        )
    finally:
        await host.close()
        await host_ch.close()
        await ops.close()
    assert first.session_call_id == "toolu_R" and again.session_call_id == "toolu_S"
    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    details = refused.value.details() or ""
    assert "call ids ['toolu_R']" in details, details
    assert len(listed.decisions) == 2  # the refused answer ran nothing
    [failed] = listed.failed_calls
    assert (failed.usage.input_tokens, failed.usage.output_tokens) == (700, 90)
    assert task.totals.usage.input_tokens >= 700
    assert model.rejections == []

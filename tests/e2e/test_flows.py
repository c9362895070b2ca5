"""Learned flows end to end: a goal done once is learned, done again without the model, and a
changed screen hands the replay back to the model — on both planner transports, through the
real cloud, host, virtual phone over adb and the offline planner."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from rich.console import Console

from amc.v1 import (
    decision_log_service_pb2,
    flow_service_pb2,
    task_service_pb2,
    types_pb2,
)
from cloud import metrics
from console.embedded import EmbeddedStack, Transport, embedded_stack, follow_tasks
from host.devices.virtual.suite import SETTINGS
from tests.support.migrated import seeded

GOAL = "Turn on dark theme"


def _metric(name: str) -> float:
    """A cloud counter's value in this process (the embedded stack's cloud records here)."""
    return metrics.REGISTRY.get_sample_value(name) or 0.0


async def _run(stack: EmbeddedStack, goal: str, *, no_replay: bool = False) -> types_pb2.Task:
    submitted = await stack.operator.tasks.SubmitTask(
        task_service_pb2.SubmitTaskRequest(goal=goal, no_replay=no_replay)
    )
    task_id = submitted.task.task_id
    await follow_tasks(stack.operator, [task_id], Console(quiet=True), 30)
    reply: task_service_pb2.GetTaskResponse = await stack.operator.tasks.GetTask(
        task_service_pb2.GetTaskRequest(task_id=task_id)
    )
    return reply.task


async def _decisions(stack: EmbeddedStack, task_id: str) -> list[types_pb2.Decision]:
    reply = await stack.operator.decisions.ListDecisions(
        decision_log_service_pb2.ListDecisionsRequest(task_id=task_id)
    )
    return list(reply.decisions)


async def _flows_when(stack: EmbeddedStack, count: int, uses: int = 0) -> list[types_pb2.Flow]:
    """The flows once the learning loop has `count` of them and counted `uses` in all (the
    loop runs after the result is acknowledged: poll with a deadline)."""
    deadline = time.monotonic() + 20
    while True:
        reply = await stack.operator.flows.ListFlows(flow_service_pb2.ListFlowsRequest())
        found = list(reply.flows)
        if len(found) >= count and sum(f.uses for f in found) >= uses:
            return found
        assert time.monotonic() < deadline, f"flows: {found}"
        await asyncio.sleep(0.1)


def _fresh(stack: EmbeddedStack) -> None:
    phone = next(iter(stack.adb.phones.values()))
    phone.reset()


def _scrolled_settings(stack: EmbeddedStack) -> None:
    phone = next(iter(stack.adb.phones.values()))
    phone.reset()
    phone.launch(SETTINGS)
    phone.current_page().scroll["list"] = 10_000


async def test_a_learned_flow_replays_without_the_model_and_hands_over_when_the_screen_changed(
    tmp_path: Path,
) -> None:
    async with embedded_stack(seeded(tmp_path), transport="cloud") as stack:
        first = await _run(stack, GOAL)
        assert first.status == types_pb2.TASK_STATUS_SUCCEEDED, first.result_summary
        assert first.attempts[0].flow.reason == "no flow learned yet"
        learned = await _decisions(stack, first.task_id)
        assert all(d.mode == types_pb2.PLANNER_MODE_COMPACT for d in learned)
        # every device step was checked, and the model judged every step but the first
        checked = [d for d in learned[:-1]]
        assert all(d.verification.verdict != types_pb2.VERDICT_UNSPECIFIED for d in checked)
        assert all(d.HasField("target") for d in checked if d.tool_name == "tap")
        (flow,) = await _flows_when(stack, 1)
        assert flow.goal_template == GOAL
        assert flow.status == types_pb2.FLOW_STATUS_ACTIVE

        _fresh(stack)
        replayed_before = _metric("amc_cloud_flow_steps_replayed_total")
        again = await _run(stack, GOAL)
        assert again.status == types_pb2.TASK_STATUS_SUCCEEDED, again.result_summary
        use = again.attempts[0].flow
        assert use.flow_id == flow.flow_id and use.score == 1.0
        assert use.reason.startswith("score 1.00 >= 0.80 (lexical)")
        replayed = await _decisions(stack, again.task_id)
        assert [d.mode for d in replayed] == [types_pb2.PLANNER_MODE_REPLAY] * len(replayed)
        assert all(d.usage.input_tokens == d.usage.output_tokens == 0 for d in replayed)
        assert [d.flow_step for d in replayed] == list(range(1, len(replayed) + 1))
        assert replayed[-1].tool_name == "complete"
        assert len(replayed) == len(learned)
        assert use.steps_replayed == len(replayed) - 1 and use.diverged_at_step == 0
        # The replayed steps are counted for Prometheus (each Decide answered without the model).
        assert _metric("amc_cloud_flow_steps_replayed_total") - replayed_before >= len(replayed)

        # Settings left scrolled down: the flow's first step (open Settings from home) does
        # not fit, the model takes over and still reaches the goal. Where the phone was left,
        # with nothing replayed, is no fault of the flow: set aside, nothing counted (0089).
        _scrolled_settings(stack)
        divergences_before = _metric("amc_cloud_flow_divergences_total")
        diverged = await _run(stack, GOAL)
        assert diverged.status == types_pb2.TASK_STATUS_SUCCEEDED, diverged.result_summary
        took_over = (await _decisions(stack, diverged.task_id))[0]
        assert took_over.mode == types_pb2.PLANNER_MODE_COMPACT
        assert took_over.flow_id == flow.flow_id and took_over.flow_step == 1
        assert not took_over.replay_divergence
        assert "the phone is not where the flow starts" in took_over.flow_set_aside
        assert "expects" in took_over.flow_set_aside
        assert f"flow {flow.flow_id}" in took_over.user_prompt
        assert "Step 1 was not replayed" in took_over.user_prompt
        assert diverged.attempts[0].flow.diverged_at_step == 0
        assert _metric("amc_cloud_flow_divergences_total") == divergences_before
        # the run is learned from (a flow for the scrolled start); the flow set aside at once
        # replayed nothing, so it is not counted as used (as a midway hand-over)
        flows = await _flows_when(stack, 2)
        counted = next(f for f in flows if f.flow_id == flow.flow_id)
        got = await stack.operator.flows.GetFlow(
            flow_service_pb2.GetFlowRequest(flow_id=flow.flow_id)
        )
        assert counted.uses == 1 and counted.replays_completed == 1
        assert counted.divergences == 0 and dict(got.flow.divergences_by_step) == {}

        # and now the scrolled start has a flow of its own: replayed too
        _scrolled_settings(stack)
        scrolled_again = await _run(stack, GOAL)
        assert scrolled_again.status == types_pb2.TASK_STATUS_SUCCEEDED
        modes = {d.mode for d in await _decisions(stack, scrolled_again.task_id)}
        assert modes == {types_pb2.PLANNER_MODE_REPLAY}

        # "no replay": the model plans every step
        _fresh(stack)
        fresh = await _run(stack, GOAL, no_replay=True)
        assert fresh.no_replay
        assert fresh.attempts[0].flow.reason == "the task asked for no replay"
        modes = {d.mode for d in await _decisions(stack, fresh.task_id)}
        assert modes == {types_pb2.PLANNER_MODE_COMPACT}


async def _learn_then_run(tmp_path: Path, transport: Transport) -> tuple[types_pb2.Task, str]:
    async with embedded_stack(seeded(tmp_path), transport="cloud") as stack:
        first = await _run(stack, GOAL)
        assert first.status == types_pb2.TASK_STATUS_SUCCEEDED
        (flow,) = await _flows_when(stack, 1)
    # the same cloud database, a host on the other transport
    async with embedded_stack(seeded(tmp_path), transport=transport) as stack:
        task = await _run(stack, GOAL)
        await _flows_when(stack, 1, uses=1)
        got = await stack.operator.flows.GetFlow(
            flow_service_pb2.GetFlowRequest(flow_id=flow.flow_id)
        )
        assert got.flow.uses == 1 and got.flow.replays_completed == 1
    return task, flow.flow_id


async def test_a_host_on_the_direct_transport_replays_the_same_flow(tmp_path: Path) -> None:
    task, flow_id = await _learn_then_run(tmp_path, "direct")
    assert task.status == types_pb2.TASK_STATUS_SUCCEEDED, task.result_summary
    use = task.attempts[0].flow
    assert use.flow_id == flow_id and use.steps_replayed >= 3 and use.diverged_at_step == 0
    assert task.result_summary.startswith(f"replayed learned flow {flow_id}")


async def test_a_success_on_the_direct_transport_teaches_a_flow_once_its_decisions_arrive(
    tmp_path: Path,
) -> None:
    """A direct-transport host plans itself and ships its decisions in the background: the
    learning loop waits for the log to end in the attempt's `complete`, then learns the same
    flow a cloud-transport success would teach."""
    async with embedded_stack(seeded(tmp_path), transport="direct") as stack:
        first = await _run(stack, GOAL)
        assert first.status == types_pb2.TASK_STATUS_SUCCEEDED, first.result_summary
        (flow,) = await _flows_when(stack, 1)
        assert flow.goal_template == GOAL and flow.status == types_pb2.FLOW_STATUS_ACTIVE
        assert flow.source_task_id == first.task_id
        shipped = await _decisions(stack, first.task_id)
        assert shipped[-1].tool_name == "complete"
        assert len(flow.steps) == len(shipped) - 1  # every step but the `complete`
        # The cloud reads each step's page from the screen the host shipped with it: what a
        # replay checks before it acts (without them a flow was replayed blind).
        assert all(s.page_before and s.page_after for s in flow.steps), flow.steps
        assert flow.steps[1].page_before == "com.android.settings: Settings"

        # So a replay from another screen hands over at once, on this transport too (set
        # aside: where the phone was left is no fault of the flow).
        _scrolled_settings(stack)
        diverged = await _run(stack, GOAL)
        assert diverged.status == types_pb2.TASK_STATUS_SUCCEEDED, diverged.result_summary
        use = diverged.attempts[0].flow
        assert use.flow_id == flow.flow_id
        assert (use.steps_replayed, use.diverged_at_step) == (0, 0)

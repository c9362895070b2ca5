"""A model provider outage while tasks run, through every real part: the embedded stack (cloud
gRPC server, host agent, virtual phones over adb) on the cloud planner transport, the cloud's
real Anthropic SDK against the fake provider, which is down for a while.

Running tasks wait inside their leases ("waiting for the model provider since …") and finish
once it is back; none fails for the outage. Once every call fails the cloud stops handing out
new tasks (the fleet says why) and resumes when the provider answers again.

"Two minutes" is a window the test controls, not wall time: the provider stays down until the
waiting steps have been refused several times and dispatch has paused (signals the test waits
for), with the host's backoff shortened so the test stays fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from amc.v1 import fleet_service_pb2, task_service_pb2, types_pb2
from console.embedded import EmbeddedStack, embedded_stack
from tests.support.fakes import FakeModelServer, ScriptedTurn, text, tool_use

DONE = ScriptedTurn(
    [text("Nothing to do."), tool_use("complete", {"success": True, "reason": "ok"})]
)
TERMINAL = {
    types_pb2.TASK_STATUS_SUCCEEDED,
    types_pb2.TASK_STATUS_FAILED,
    types_pb2.TASK_STATUS_CANCELLED,
}


async def until(check: Callable[[], Awaitable[bool]], what: str, tries: int = 1200) -> None:
    """Poll `check` (a state read, not a timer) until it holds."""
    for _ in range(tries):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def tasks(stack: EmbeddedStack, ids: list[str]) -> list[types_pb2.Task]:
    return [
        (await stack.operator.tasks.GetTask(task_service_pb2.GetTaskRequest(task_id=t))).task
        for t in ids
    ]


async def submit(stack: EmbeddedStack, goal: str) -> str:
    request = task_service_pb2.SubmitTaskRequest(goal=goal)
    response: task_service_pb2.SubmitTaskResponse = await stack.operator.tasks.SubmitTask(request)
    return response.task.task_id


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> FakeModelServer:
    fake = FakeModelServer(anthropic_key="sk-ant-test")
    fake.start()
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
    monkeypatch.setenv("AMC_PLANNER_MODEL", "claude-sonnet-4-6")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
    monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
    monkeypatch.setenv("AMC_HOST_PLANNER_WAIT_INITIAL_S", "0.05")
    monkeypatch.setenv("AMC_HOST_PLANNER_WAIT_MAX_S", "0.2")
    monkeypatch.setenv("AMC_CLOUD_PROVIDER_PROBE_SECONDS", "0.2")
    return fake


async def test_tasks_wait_out_an_outage_and_dispatch_pauses_until_the_provider_is_back(
    tmp_path: Path, provider: FakeModelServer
) -> None:
    provider.script_anthropic(*[DONE] * 3)
    provider.go_down(529)
    try:
        async with embedded_stack(tmp_path, phones=3, transport="cloud") as stack:
            running = [await submit(stack, f"Task {n}") for n in (1, 2)]

            async def both_waiting() -> bool:
                return all(
                    "waiting for the model provider since" in t.progress.summary
                    for t in await tasks(stack, running)
                )

            await until(both_waiting, "both running tasks report waiting for the provider")

            async def paused() -> bool:
                fleet = await stack.operator.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
                return bool(fleet.dispatch.paused)

            await until(paused, "dispatch paused")
            fleet = await stack.operator.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
            assert "the model provider is unavailable since" in fleet.dispatch.reason
            assert "HTTP 529" in fleet.dispatch.reason

            # A new task while the provider is down for everyone: a dispatch pass runs (the
            # third phone is idle) and hands it to no one.
            queued = await submit(stack, "Task 3")
            await stack.cloud.leases.dispatcher.dispatch_pass()
            (waiting,) = await tasks(stack, [queued])
            assert waiting.status == types_pb2.TASK_STATUS_QUEUED and waiting.attempt == 0
            refused = provider.outage_hits
            assert refused >= 4  # the waiting steps kept asking, and were refused

            provider.come_back()
            everything = [*running, queued]

            async def all_ended() -> bool:
                return all(t.status in TERMINAL for t in await tasks(stack, everything))

            await until(all_ended, "every task ended after the provider came back")
            ended = await tasks(stack, everything)
            fleet = await stack.operator.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
    finally:
        provider.stop()

    assert [t.status for t in ended] == [types_pb2.TASK_STATUS_SUCCEEDED] * 3, [
        t.result_summary for t in ended
    ]
    # None failed an attempt for the outage: each finished on its first attempt.
    assert [t.attempt for t in ended] == [1, 1, 1]
    assert all(a.status == types_pb2.TASK_STATUS_SUCCEEDED for t in ended for a in t.attempts)
    assert not fleet.dispatch.paused and fleet.dispatch.reason == ""

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
from tests.support.migrated import seeded

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
        async with embedded_stack(seeded(tmp_path), phones=3, transport="cloud") as stack:
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


async def test_a_refused_api_key_holds_queued_tasks_until_the_provider_takes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider refuses the cloud's key (HTTP 401: revoked, or the account's billing
    lapsed): the first step to ask fails, and every further task would too, so dispatch pauses
    at once with a reason naming the setting, and queued tasks stay queued instead of draining.
    The task whose step was refused is not failed for it (the key is the cloud's, not the
    task's): its attempt ends retryable and it waits in the queue with the others. Once the
    provider takes the key again (the probe gets a 200) they all run."""
    fake = FakeModelServer(anthropic_key="sk-ant-another")  # not the key the cloud has
    fake.start()
    monkeypatch.setenv("AMC_PLANNER_PROVIDER", "anthropic")
    monkeypatch.setenv("AMC_PLANNER_MODEL", "claude-sonnet-4-6")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("AMC_PLANNER_ANTHROPIC_BASE_URL", fake.anthropic_base_url)
    monkeypatch.setenv("AMC_PLANNER_MAX_RETRIES", "0")
    monkeypatch.setenv("AMC_CLOUD_PROVIDER_PROBE_SECONDS", "0.2")
    fake.script_anthropic(*[DONE] * 3)
    try:
        async with embedded_stack(seeded(tmp_path), phones=1, transport="cloud") as stack:
            first, *queued = [await submit(stack, f"Task {n}") for n in (1, 2, 3)]

            async def first_attempt_ended() -> bool:
                (task,) = await tasks(stack, [first])
                return bool(task.attempts) and task.attempts[0].status in TERMINAL

            await until(first_attempt_ended, "the first task's attempt failed at its first step")
            fleet = await stack.operator.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
            assert fleet.dispatch.paused, [t.status for t in await tasks(stack, queued)]
            assert fleet.dispatch.reason.startswith("the model provider refused the API key")
            assert "planner: Anthropic rejected the API key" in fleet.dispatch.reason
            assert "set AMC_PLANNER_ANTHROPIC_API_KEY" in fleet.dispatch.reason
            assert "sk-ant-test" not in fleet.dispatch.reason

            # The phone is free again: a pass runs and hands the queued tasks to no one.
            await stack.cloud.leases.dispatcher.dispatch_pass()
            held = await tasks(stack, queued)
            assert [(t.status, t.attempt) for t in held] == [(types_pb2.TASK_STATUS_QUEUED, 0)] * 2

            (refused,) = await tasks(stack, [first])
            assert (refused.status, refused.attempt) == (types_pb2.TASK_STATUS_QUEUED, 1), (
                refused.result_summary
            )

            with fake.lock:
                fake.messages.key = "sk-ant-test"  # the provider takes the cloud's key again

            async def all_ended() -> bool:
                return all(t.status in TERMINAL for t in await tasks(stack, [first, *queued]))

            await until(all_ended, "the held tasks ran once the key was taken again")
            retried, *ended = await tasks(stack, [first, *queued])
            fleet = await stack.operator.fleet.ListHosts(fleet_service_pb2.ListHostsRequest())
    finally:
        fake.stop()

    assert [(t.status, t.attempt) for t in ended] == [(types_pb2.TASK_STATUS_SUCCEEDED, 1)] * 2, [
        t.result_summary for t in ended
    ]
    assert (retried.status, retried.attempt) == (types_pb2.TASK_STATUS_SUCCEEDED, 2), (
        retried.result_summary
    )
    assert "rejected the API key" in retried.attempts[0].failure_reason
    assert not fleet.dispatch.paused and fleet.dispatch.reason == ""

"""A step whose planning is temporarily impossible waits inside its lease instead of failing the
attempt (direct transport: the host calls the model itself). A real virtual phone, the real
compact planner and Anthropic SDK against the fake provider, which goes down and comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from host.agent.loop import AgentLoop, LoopSettings, TaskSpec
from host.agent.planning_wait import CloudBack, WaitPolicy, plan_patiently
from host.agent.progress import ProgressHolder, ProgressSnapshot
from host.devices.virtual.driver import VirtualDriver
from host.devices.virtual.phone import VirtualPhone
from host.perception.perceive import Perceiver
from host.planner_client import CloudPlanError
from planner.errors import PlannerRateLimited
from planner.planner import Planner
from planner.settings import PlannerSettings
from planner.vendors import make_adapter
from tests.support.fakes import FakeModelServer, ScriptedTurn, text, tool_use


async def _ignore_wait(since: object, why: object) -> None:
    """`on_wait` for a test that does not look at the waits."""


FAST = WaitPolicy(initial_s=0.02, max_s=0.1)
DONE = ScriptedTurn(
    [text("Nothing to do."), tool_use("complete", {"success": True, "reason": "ok"})]
)


@pytest.fixture
def provider() -> Iterator[FakeModelServer]:
    with FakeModelServer(anthropic_key="sk-ant-test") as server:
        yield server


@pytest.fixture
async def planners() -> AsyncIterator[list[Planner]]:
    made: list[Planner] = []
    yield made
    for planner in made:
        await planner.aclose()


def _loop(provider: FakeModelServer, made: list[Planner], key: str = "sk-ant-test") -> AgentLoop:
    settings = PlannerSettings(
        provider="anthropic",
        model="claude-sonnet-4-6",
        anthropic_api_key=key,
        anthropic_base_url=provider.anthropic_base_url,
        max_retries=0,
    )
    made.append(Planner(make_adapter(settings), settings))
    return AgentLoop(
        VirtualDriver(VirtualPhone("emulator-5554")),
        made[-1],
        Perceiver(None, retries=1, retry_delay_s=0),
        None,
        LoopSettings(max_steps=3, settle_delay_s=0, ocr=False, planner_wait=FAST),
    )


def _spec(deadline: float | None = None) -> TaskSpec:
    return TaskSpec("t1", 1, "Do nothing", "emulator-5554", "L1", deadline)


async def test_a_provider_outage_is_waited_out_and_the_task_finishes(
    provider: FakeModelServer, planners: list[Planner]
) -> None:
    provider.script_anthropic(DONE)
    provider.go_down(529)
    progress = ProgressHolder()
    waiting: list[str] = []

    def watch(snap: ProgressSnapshot) -> None:
        if "waiting for the model provider since" in snap.summary:
            waiting.append(snap.summary)
            if len(waiting) == 3:  # three refused asks: the provider comes back
                provider.come_back()

    progress.add_listener(watch)
    deadline = time.monotonic() + 3600
    outcome = await _loop(provider, planners).run(_spec(deadline), progress)
    assert outcome.status == "succeeded", outcome.summary
    assert len(waiting) == 3 and provider.outage_hits == 3
    assert "Anthropic is unavailable (HTTP 529" in waiting[0]
    assert waiting[0].startswith("step 1: waiting for the model provider since ")


async def test_at_the_deadline_the_attempt_ends_retryable_not_failed_for_the_task(
    provider: FakeModelServer, planners: list[Planner]
) -> None:
    provider.go_down(500)
    outcome = await _loop(provider, planners).run(_spec(time.monotonic() + 0.3))
    assert (outcome.status, outcome.retryable) == ("failed", True)
    assert outcome.summary.startswith("the model provider stayed unavailable since ")
    assert provider.outage_hits >= 1


async def test_refused_credentials_fail_fast_without_waiting(
    provider: FakeModelServer, planners: list[Planner]
) -> None:
    outcome = await _loop(provider, planners, key="sk-ant-wrong").run(_spec())
    assert (outcome.status, outcome.retryable) == ("failed", False)
    assert outcome.summary == "planner: Anthropic rejected the API key"
    assert len(provider.requests) == 1


@pytest.mark.parametrize("transport", ["direct", "cloud"])
async def test_a_wait_is_at_least_what_the_provider_asked_for(transport: str) -> None:
    """A rate limit's retry-after (which the planner leaves to the host when it is long) sets
    the least wait: asking again after the usual second would only meet the same limit. On
    the cloud transport the cloud passes it on (`amc-retry-after-s`)."""
    asked: list[Exception] = [
        PlannerRateLimited("planner: Anthropic rate limit", retry_after=171.0)
        if transport == "direct"
        else CloudPlanError(
            "cloud planner: RESOURCE_EXHAUSTED: rate limit",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "the model provider",
            171.0,
        )
    ]
    slept: list[float] = []

    async def plan() -> str:
        if asked:
            raise asked.pop()
        return "decided"

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    decided = await plan_patiently(
        plan,
        on_wait=_ignore_wait,
        deadline=time.monotonic() + 3600,
        policy=FAST,
        sleep=sleep,
    )
    assert decided == "decided"
    assert slept == [171.0]


@pytest.mark.parametrize("waiting_for", ["", "the cloud's database"])
async def test_a_step_waiting_for_the_cloud_asks_again_when_the_stream_is_welcomed(
    waiting_for: str,
) -> None:
    """After a rolling deploy the backoff had grown to 30 s: every running step idled up to
    that long after the cloud was back. A welcome of the lease stream ends the wait: the
    injected sleep never ends, so only the welcome can let the step ask again."""
    back = CloudBack()
    asked = 0

    async def plan() -> str:
        nonlocal asked
        asked += 1
        if asked == 1:
            raise CloudPlanError(
                "cloud planner: UNAVAILABLE", grpc.StatusCode.UNAVAILABLE, waiting_for
            )
        return "decided"

    async def forever(seconds: float) -> None:
        await asyncio.Event().wait()

    async def welcome_once_waiting(since: object, why: object) -> None:
        asyncio.get_running_loop().call_soon(back.said)

    decided = await asyncio.wait_for(
        plan_patiently(
            plan,
            on_wait=welcome_once_waiting,
            deadline=time.monotonic() + 3600,
            policy=WaitPolicy(initial_s=30, max_s=30),
            sleep=forever,
            cloud_back=back,
        ),
        timeout=60,
    )
    assert (decided, asked) == ("decided", 2)


async def test_a_wait_the_model_provider_asked_for_is_not_cut_short_by_a_welcome() -> None:
    """A rate limit's retry-after is the provider's; the cloud coming back does not end it."""
    back = CloudBack()
    slept: list[float] = []
    asked: list[Exception] = [
        CloudPlanError(
            "cloud planner: RESOURCE_EXHAUSTED: rate limit",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "the model provider",
            171.0,
        )
    ]

    async def plan() -> str:
        if asked:
            raise asked.pop()
        return "decided"

    async def sleep(seconds: float) -> None:
        back.said()  # a welcome in the middle of the wait
        await asyncio.sleep(0)
        slept.append(seconds)

    decided = await plan_patiently(
        plan,
        on_wait=_ignore_wait,
        deadline=time.monotonic() + 3600,
        policy=FAST,
        sleep=sleep,
        cloud_back=back,
    )
    assert decided == "decided"
    assert slept == [171.0]  # the whole wait was slept


async def test_a_welcome_while_the_failed_ask_was_out_is_not_missed() -> None:
    """In a rolling deploy the lease stream is often welcomed again before the step's failed
    Decide returns: the wait must end at once, not wait for a next welcome that never comes."""
    back = CloudBack()
    asked = 0

    async def plan() -> str:
        nonlocal asked
        asked += 1
        if asked == 1:
            back.said()  # the stream reconnected while this ask was failing
            raise CloudPlanError("cloud planner: UNAVAILABLE", grpc.StatusCode.UNAVAILABLE)
        return "decided"

    async def forever(seconds: float) -> None:
        await asyncio.Event().wait()

    decided = await asyncio.wait_for(
        plan_patiently(
            plan,
            on_wait=_ignore_wait,
            deadline=time.monotonic() + 3600,
            policy=WaitPolicy(initial_s=30, max_s=30),
            sleep=forever,
            cloud_back=back,
        ),
        timeout=60,
    )
    assert (decided, asked) == ("decided", 2)

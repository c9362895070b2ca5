"""A Decide retried after a lost answer is planned once: `DecideRequest.step_key`.

The real `PlannerServicer` over a real grpc.aio server on 127.0.0.1 port 0, with the in-memory
decision log (`tests/support/memory_log.py`, the store's ports are tested on both backends in
tests/cloud/test_decide_retries.py) and the offline provider behind a counter, so "no second
model call" and "no second row" are counted, not assumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from sqlalchemy.exc import OperationalError

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc, types_pb2
from planner.decision import Decision, Usage
from planner.model_profiles import RetryForm
from planner.observation import observation_from_scene
from planner.planner import Planner
from planner.providers.offline import OfflineProvider
from planner.service import PlannerServicer
from planner.step_once import StepPlans
from planner.vendors import Turn, TurnRequest
from tests.planner import scenes
from tests.support.memory_log import MemoryDecisionLog

HOST = "host-a"
TASK, ATTEMPT, LEASE = "task-1", 1, "lease-1"
MD = (("x-test-host", HOST),)


class Gate:
    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
        return (host_id, task_id, attempt, lease_id) == (HOST, TASK, ATTEMPT, LEASE)


@dataclass
class Counting:
    """The offline provider, counting its calls; `hold` (when set) keeps each call waiting."""

    inner: OfflineProvider = field(default_factory=OfflineProvider)
    calls: int = 0
    hold: asyncio.Event | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def model(self) -> str:
        return str(self.inner.model)

    @property
    def retry_form(self) -> RetryForm:
        form: RetryForm = self.inner.retry_form
        return form

    async def complete(self, request: TurnRequest) -> Turn:
        self.calls += 1
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        turn: Turn = await self.inner.complete(request)
        return turn

    async def aclose(self) -> None:
        await self.inner.aclose()


class FlakyLog(MemoryDecisionLog):
    """The decision log whose next `failures` appends fail as a database that went away does."""

    failures = 0

    async def append(
        self, host_id: str, task_id: str, attempt: int, decision: Decision, step_key: str = ""
    ) -> tuple[str, int] | None:
        if self.failures:
            self.failures -= 1
            raise OperationalError("INSERT", {}, ConnectionError("server closed the connection"))
        return await super().append(host_id, task_id, attempt, decision, step_key)


@dataclass
class Served:
    stub: Any
    log: FlakyLog
    provider: Counting


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    log = FlakyLog({TASK: "Turn on dark theme"})
    provider = Counting()
    server = grpc.aio.server()
    planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(
        PlannerServicer(
            caller_host_id=lambda context: dict(context.invocation_metadata()).get(
                "x-test-host", ""
            ),
            lease_gate=Gate(),
            sink=log,
            planner=Planner(provider),
            attempts=log,
        ),
        server,
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Served(planner_service_pb2_grpc.PlannerServiceStub(channel), log, provider)
    finally:
        await channel.close()
        await server.stop(grace=None)


def typed(step_key: str, **fields: Any) -> planner_service_pb2.DecideRequest:
    values: dict[str, Any] = {
        "task_id": TASK,
        "attempt": ATTEMPT,
        "lease_id": LEASE,
        "observation": observation_from_scene(scenes.launcher()),
        "step_key": step_key,
        **fields,
    }
    return planner_service_pb2.DecideRequest(**values)


async def test_a_retried_step_gets_the_logged_decision_back(served: Served) -> None:
    first = await served.stub.Decide(typed("1"), metadata=MD)
    again = await served.stub.Decide(typed("1"), metadata=MD)
    assert not first.replayed and again.replayed
    assert again.decision.decision_id == first.decision.decision_id
    assert again.decision.step_index == first.decision.step_index == 1
    assert again.decision.action == first.decision.action
    assert served.provider.calls == 1  # no second model call
    assert len(served.log.rows) == 1  # no second row
    # The next step is a new key: planned, logged as step 2.
    outcome = types_pb2.ActionOutcome(step_index=1, executed=True)
    second = await served.stub.Decide(typed("2", previous_outcome=outcome), metadata=MD)
    assert (second.replayed, second.decision.step_index) == (False, 2)
    assert served.provider.calls == 2
    # Without a key every call plans, as before.
    await served.stub.Decide(typed(""), metadata=MD)
    await served.stub.Decide(typed(""), metadata=MD)
    assert served.provider.calls == 4


async def test_a_retry_joins_the_plan_its_lost_original_started(served: Served) -> None:
    """The host gives up on the first call while the model thinks (its answer is lost); the
    retry with the same key waits for that same plan: one model call, one row."""
    served.provider.hold = asyncio.Event()
    first = served.stub.Decide(typed("1"), metadata=MD)
    await served.provider.started.wait()
    first.cancel()  # the answer will never reach the host
    with pytest.raises(asyncio.CancelledError):
        await first
    retry = asyncio.ensure_future(served.stub.Decide(typed("1"), metadata=MD))
    served.provider.hold.set()
    answer = await retry
    assert answer.decision.step_index == 1
    assert served.provider.calls == 1
    assert len(served.log.rows) == 1


async def test_a_plan_whose_logging_failed_is_logged_by_the_retry(served: Served) -> None:
    """The model answered, then the database went away before the row was written: the retry
    logs the kept plan without asking the model again."""
    served.log.failures = 1
    with pytest.raises(grpc.aio.AioRpcError):
        await served.stub.Decide(typed("1"), metadata=MD)
    assert served.provider.calls == 1 and not served.log.rows
    answer = await served.stub.Decide(typed("1"), metadata=MD)
    assert answer.decision.step_index == 1 and not answer.replayed
    assert served.provider.calls == 1
    assert len(served.log.rows) == 1


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (typed("k" * 65), "step_key: at most 64 characters"),
        (typed("step 1"), "step_key: printable ASCII characters without spaces only"),
        (typed("schritt-ä"), "step_key: printable ASCII characters without spaces only"),
        (
            planner_service_pb2.DecideRequest(
                task_id=TASK,
                attempt=ATTEMPT,
                lease_id=LEASE,
                system_prompt="s",
                user_prompt="u",
                step_key="1",
            ),
            "step_key: only with observation",
        ),
    ],
)
async def test_a_step_key_outside_the_contract_is_invalid_argument(
    served: Served, request_: planner_service_pb2.DecideRequest, named: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.stub.Decide(request_, metadata=MD)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (err.value.details() or "")
    assert served.provider.calls == 0


async def test_a_replayed_sensitive_input_comes_back_masked(served: Served) -> None:
    """A sensitive value is never stored, so the repeat cannot carry it: it says "•••" (the host
    then does not type it, tests/host/test_cloud_planner.py)."""
    served.log.goals[TASK] = "Log in with the password hunter22"
    sensitive = observation_from_scene(scenes.login_form())
    first = await served.stub.Decide(typed("1", observation=sensitive), metadata=MD)
    assert first.decision.action.input_text.sensitive
    assert first.decision.action.input_text.text == "hunter22"  # revealed to the host only
    again = await served.stub.Decide(typed("1", observation=sensitive), metadata=MD)
    assert again.replayed
    assert again.decision.action.input_text.text == "•••"
    assert "hunter22" not in again.decision.arguments_json


def _decision() -> Decision:
    return Decision(
        tool_name="press_key", arguments={"key": "back"}, action=types_pb2.Action(),
        purpose="", expected_outcome="", rationale="", thinking=[], usage=Usage(),
        provider="offline", model="m", latency_s=0.0, forced_retry=False, system_prompt="",
        user_prompt="",
    )  # fmt: skip


async def test_ended_plans_are_forgotten_after_keep_s_and_running_ones_kept() -> None:
    """`StepPlans` forgets an ended plan made more than `keep_s` ago at the next call; a plan
    still running is kept however old, and so is every plan made since the cutoff."""
    now = [0.0]
    plans = StepPlans(keep_s=10.0, clock=lambda: now[0])
    stuck: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()

    async def running() -> Decision:
        return await stuck

    async def done() -> Decision:
        return _decision()

    await plans.plan(("t", 1, "1"), done)
    waiting = asyncio.create_task(plans.plan(("t", 1, "2"), running))
    await asyncio.sleep(0)
    now[0] = 5.0
    await plans.plan(("t", 1, "3"), done)
    assert len(plans) == 3
    now[0] = 12.0  # "1" and "2" are past keep_s; "2" is still planning
    await plans.plan(("t", 1, "4"), done)
    assert len(plans) == 3  # "1" forgotten; "2", "3", "4" kept
    stuck.set_result(_decision())
    await waiting
    now[0] = 16.0  # "3" is past keep_s too now
    await plans.plan(("t", 1, "5"), done)
    assert len(plans) == 2  # "4" and "5"

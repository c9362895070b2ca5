"""A Decide whose lease ends while the model answers gets no action, on the step-key paths too.

3a8162be refuses such a Decide FAILED_PRECONDITION once it has logged the decision, but only
when this call wrote the row: a call that found its step logged by someone else meanwhile (the
plan a cancelled first call left, which it joined; another replica the host's earlier try
reached) answered with that decision, `replayed`, whether or not its lease was still live. The
host acts on a replayed decision as on any other, so a cancelled task's phone was driven all
the same. The real `PlannerServicer` over grpc.aio, the in-memory log, the offline provider.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from amc.v1 import planner_service_pb2, planner_service_pb2_grpc
from planner.observation import observation_from_scene
from planner.planner import Planner
from planner.service import PlannerServicer
from planner.vendors import Turn, TurnRequest
from tests.planner import scenes
from tests.planner.test_decide_step_keys import Counting, _decision
from tests.support.memory_log import MemoryDecisionLog

HOST = "host-a"
TASK, ATTEMPT, LEASE = "task-1", 1, "lease-1"
MD = (("x-test-host", HOST),)


class Gate:
    """One live lease until `end()` (an operator's cancel)."""

    def __init__(self) -> None:
        self.live = True

    def end(self) -> None:
        self.live = False

    async def is_live(self, host_id: str, task_id: str, attempt: int, lease_id: str) -> bool:
        return self.live and (host_id, task_id, attempt, lease_id) == (HOST, TASK, ATTEMPT, LEASE)


@dataclass
class Held(Counting):
    """The offline provider; each call waits for `hold`, and runs `meanwhile` as it answers."""

    hold: asyncio.Event = field(default_factory=asyncio.Event)
    meanwhile: Any = None

    async def complete(self, request: TurnRequest) -> Turn:
        turn = await super().complete(request)
        if self.meanwhile is not None:
            await self.meanwhile()
        return turn

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Served:
    stub: Any
    log: MemoryDecisionLog
    provider: Held
    gate: Gate


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    log = MemoryDecisionLog({TASK: "Turn on dark theme"})
    provider, gate = Held(), Gate()
    server = grpc.aio.server()
    planner_service_pb2_grpc.add_PlannerServiceServicer_to_server(
        PlannerServicer(
            caller_host_id=lambda context: dict(context.invocation_metadata()).get(
                "x-test-host", ""
            ),
            lease_gate=gate,
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
        yield Served(planner_service_pb2_grpc.PlannerServiceStub(channel), log, provider, gate)
    finally:
        await channel.close()
        await server.stop(grace=None)


def typed(step_key: str) -> planner_service_pb2.DecideRequest:
    return planner_service_pb2.DecideRequest(
        task_id=TASK,
        attempt=ATTEMPT,
        lease_id=LEASE,
        observation=observation_from_scene(scenes.launcher()),
        step_key=step_key,
    )


async def _refused(served: Served, call: Any) -> grpc.aio.AioRpcError:
    try:
        answer = await call
    except grpc.aio.AioRpcError as err:
        return err
    pytest.fail(f"an action for an ended lease: {answer.decision.tool_name} {answer.replayed=}")


async def test_a_step_another_replica_logged_meanwhile_is_refused_once_the_lease_ended(
    served: Served,
) -> None:
    """The host's earlier try of step 1 reached another replica, which logged its decision
    while this one's model answered; the task was cancelled in those seconds. This call's
    write finds the step logged and used to answer with that decision (replayed)."""

    async def other_replica_logs_and_the_task_is_cancelled() -> None:
        await served.log.append(HOST, TASK, ATTEMPT, _decision(), "1")
        served.gate.end()

    served.provider.meanwhile = other_replica_logs_and_the_task_is_cancelled
    served.provider.hold.set()
    err = await _refused(served, served.stub.Decide(typed("1"), metadata=MD))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ended while the model was deciding" in (err.details() or "")
    assert len(served.log.rows) == 1  # the record is kept


async def test_a_retry_that_joined_the_plan_is_refused_once_the_lease_ended(
    served: Served,
) -> None:
    """The host gave up on step 1 while the model thought (its answer lost) and asked again
    with the same key; the retry joined that plan. The task was cancelled before the model
    answered: whichever of the two logs the row, the retry must not get the action."""
    first = served.stub.Decide(typed("1"), metadata=MD)
    await served.provider.started.wait()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    retry = asyncio.ensure_future(served.stub.Decide(typed("1"), metadata=MD))
    await asyncio.sleep(0.3)  # the retry is past its lease check, waiting on the plan
    served.gate.end()
    served.provider.hold.set()
    err = await _refused(served, retry)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert served.provider.calls == 1
    assert len(served.log.rows) == 1

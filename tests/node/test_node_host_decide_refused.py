"""What the Node example host does with each refusal of PlannerService.Decide that ends the
attempt (planner_service.proto), as the Python host does (host/lease_client.py, `_run_task`).

Real parts: host.js as its own process, a virtual phone served over the adb protocol, and one
real gRPC server over mTLS holding the in-test LeaseService of tests/host/lease_fake.py and a
PlannerService whose Decide answers with the status under test: the real cloud answers the
lease one ("not a live lease") only in a race, with a revoke the host has not heard yet, or
from a replica whose clock runs ahead.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest

from amc.v1 import (
    lease_service_pb2,
    planner_service_pb2,
    planner_service_pb2_grpc,
    types_pb2,
)
from host.agent.planning_wait import WaitPolicy
from tests.host.lease_fake import FakeCloud, Lease
from tests.node.rig import fake_cloud_and_phones, running_host
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_parts import _AtCeiling

__all__ = ["node"]


class _RefusingPlanner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Answers every Decide with one status and its details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details, self.calls = code, details, 0

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> NoReturn:
        self.calls += 1
        await context.abort(self.code, self.details)
        raise AssertionError("abort returns only by raising")


async def _one_task(
    node: str,
    tmp_path: Path,
    planner: planner_service_pb2_grpc.PlannerServiceServicer,
    **env: str,
) -> tuple[lease_service_pb2.TaskResult, str]:
    """Runs host.js (with `env`'s settings besides) against the fake LeaseService and
    `planner` until the result of the one task it is given comes: that result, and what the
    host said."""
    async with (
        fake_cloud_and_phones(tmp_path, HOST_ID, planner=planner) as rig,
        running_host(node, rig, HOST_ID, tmp_path / "host-data", certs=None, **env) as run,
    ):
        cloud = rig.cloud
        await cloud.wait_for(lambda: cloud.hellos, 60)
        await cloud.assign("t1", "emulator-5554", "Turn on dark theme")
        await cloud.wait_for(lambda: cloud.results, 60)
    [result] = cloud.results
    return result, run.said


@pytest.mark.parametrize(
    ("code", "details", "summary", "retryable"),
    [
        # The lease is not live by the cloud's clock: retryable, whatever ended it. Before, a
        # FAILED that was not retryable, which a cloud taking it late recorded as the task's end.
        (
            grpc.StatusCode.FAILED_PRECONDITION,
            "lease 'lease-t1-1' of task 't1' attempt 1 is not a live lease of host 'node-1'",
            "stopped: the cloud said the lease is no longer live",
            True,
        ),
        # The task's budget is spent: it fails, and is not run again.
        (
            grpc.StatusCode.FAILED_PRECONDITION,
            "budget exhausted: 10,412 tokens of the task's 10,000",
            "host error: budget exhausted: 10,412 tokens of the task's 10,000",
            False,
        ),
    ],
    ids=["lease-not-live", "budget-exhausted"],
)
async def test_a_refused_decide_ends_the_attempt_as_the_python_host_ends_it(
    node: str, tmp_path: Path, code: grpc.StatusCode, details: str, summary: str, retryable: bool
) -> None:
    planner = _RefusingPlanner(code, details)
    result, said = await _one_task(node, tmp_path, planner)
    assert planner.calls == 1, said  # asked once: refused, not "ask again"
    assert (result.status, result.summary, result.retryable) == (
        types_pb2.TASK_STATUS_FAILED,
        summary,
        retryable,
    ), said


class _ResetThenRefusingPlanner(_RefusingPlanner):
    """Answers the first Decide as gRPC reports a stream a proxy reset mid-call (INTERNAL, with
    RST_STREAM in its details), every later one with the status it was given."""

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> NoReturn:
        if self.calls == 0:
            self.calls += 1
            await context.abort(
                grpc.StatusCode.INTERNAL, "Received RST_STREAM with code 2 (Internal server error)"
            )
        await super().Decide(request, context)
        raise AssertionError("abort returns only by raising")


async def test_a_decide_whose_stream_was_reset_is_asked_again_as_the_python_host_asks(
    node: str, tmp_path: Path
) -> None:
    # The Python host asks again (host/agent/planning_wait.py, `_RESET_STREAM`): the answer was
    # lost on the way, and the cloud answers the same step key from its log. Before, the Node
    # host failed the attempt for good with "host error: Received RST_STREAM ...".
    planner = _ResetThenRefusingPlanner(
        grpc.StatusCode.FAILED_PRECONDITION, "budget exhausted: 10,412 tokens of the task's 10,000"
    )
    result, said = await _one_task(node, tmp_path, planner)
    assert planner.calls == 2, said  # asked again after the reset, then refused for good
    assert result.summary == "host error: budget exhausted: 10,412 tokens of the task's 10,000"


class _UnavailableThenRefusingPlanner(_RefusingPlanner):
    """Answers the first `unavailable` Decides UNAVAILABLE (a cloud restarting), every later
    one with the status it was given."""

    def __init__(self, unavailable: int, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.unavailable = unavailable

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> NoReturn:
        if self.calls < self.unavailable:
            self.calls += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the cloud is restarting")
        await super().Decide(request, context)
        raise AssertionError("abort returns only by raising")


class _AtFloor(random.Random):
    """A random source whose every draw is the bottom of its range."""

    def uniform(self, a: float, b: float) -> float:
        return a


async def test_a_decide_asked_again_waits_as_the_python_hosts_wait_policy(
    node: str, tmp_path: Path
) -> None:
    # The Python host waits between asks as its WaitPolicy says (host/agent/planning_wait.py):
    # AMC_HOST_PLANNER_WAIT_INITIAL_S doubling with each wait up to AMC_HOST_PLANNER_WAIT_MAX_S,
    # each drawn between half and all of that. host.js waited its reconnect backoff, which
    # began at 0 failures (a first wait of 0.05 to 0.5 s where the Python host waits 0.5 to
    # 1 s) and read neither setting. Each wait is now logged with its length.
    planner = _UnavailableThenRefusingPlanner(
        3,
        grpc.StatusCode.FAILED_PRECONDITION,
        "budget exhausted: 10,412 tokens of the task's 10,000",
    )
    result, said = await _one_task(
        node,
        tmp_path,
        planner,
        AMC_HOST_PLANNER_WAIT_INITIAL_S="0.2",
        AMC_HOST_PLANNER_WAIT_MAX_S="0.4",
    )
    assert planner.calls == 4, said  # asked again after each UNAVAILABLE, then refused
    waits = [
        float(s)
        for s in re.findall(r"step 1: the cloud is restarting; asking again in ([\d.]+) s", said)
    ]
    policy = WaitPolicy(0.2, 0.4)  # 0.1-0.2 s, 0.2-0.4 s, then capped at 0.2-0.4 s
    bounds = [(policy.delay(n, _AtFloor()), policy.delay(n, _AtCeiling())) for n in range(3)]
    assert len(waits) == 3, said
    for wait, (low, high) in zip(waits, bounds, strict=True):
        assert low - 0.0005 <= wait <= high + 0.0005, (waits, bounds, said)
    assert result.summary == "host error: budget exhausted: 10,412 tokens of the task's 10,000"


async def test_a_step_waiting_for_the_cloud_asks_again_once_the_stream_is_welcomed_again(
    node: str, tmp_path: Path
) -> None:
    # A step whose Decide met the cloud away (UNAVAILABLE: a restart) waits; the Python host
    # ends that wait when the lease stream is welcomed again (host/agent/planning_wait.py,
    # `CloudBack`), so steps resume as soon as a restarted cloud is back rather than after a
    # backoff grown to 30 s. host.js slept the wait out. The wait here is 300 to 600 s, the
    # stream cut and welcomed again right after the first ask: the second ask comes at the
    # welcome.
    planner = _UnavailableThenRefusingPlanner(
        1,
        grpc.StatusCode.FAILED_PRECONDITION,
        "budget exhausted: 10,412 tokens of the task's 10,000",
    )
    async with (
        fake_cloud_and_phones(tmp_path, HOST_ID, planner=planner) as rig,
        running_host(
            node,
            rig,
            HOST_ID,
            tmp_path / "host-data",
            certs=None,
            AMC_HOST_PLANNER_WAIT_INITIAL_S="600",
            AMC_HOST_PLANNER_WAIT_MAX_S="600",
        ) as run,
    ):
        cloud = rig.cloud
        await cloud.wait_for(lambda: cloud.hellos, 60)
        await cloud.assign("t1", "emulator-5554", "Turn on dark theme")
        await cloud.wait_for(lambda: planner.calls == 1, 60)
        streams = cloud.streams
        cloud.cut()  # the host connects again and is welcomed
        await cloud.wait_for(lambda: cloud.streams > streams, 60)
        await cloud.wait_for(lambda: cloud.results, 120)  # before: not for 300 s at least
    [result] = cloud.results
    assert planner.calls == 2, run.said
    assert result.summary == "host error: budget exhausted: 10,412 tokens of the task's 10,000"


class _DatabaseDownPlanner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Answers every Decide UNAVAILABLE, naming what is unavailable in `amc-waiting-for` as the
    cloud names it (planner/errors.py) when its database is down."""

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> NoReturn:
        context.set_trailing_metadata((("amc-waiting-for", "the cloud's database"),))
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "the cloud's database is unavailable; retry"
        )
        raise AssertionError("abort returns only by raising")


async def test_a_step_waiting_to_plan_says_what_it_waits_for_in_its_progress(
    node: str, tmp_path: Path
) -> None:
    # The Python host's step reports its wait as its progress (host/agent/loop.py, `waiting`):
    # "step N: waiting for <what the cloud named, else the cloud> since HH:MM:SS UTC (<why>)",
    # so an operator sees why a task stands still. host.js's progress said "planning" for as
    # long as the wait lasted.
    async with (
        fake_cloud_and_phones(tmp_path, HOST_ID, planner=_DatabaseDownPlanner()) as rig,
        running_host(node, rig, HOST_ID, tmp_path / "host-data") as run,
    ):
        cloud = rig.cloud
        await cloud.wait_for(lambda: cloud.hellos, 60)
        await cloud.assign("t1", "emulator-5554", "Turn on dark theme")
        said = re.compile(
            r"^step 1: waiting for the cloud's database since \d\d:\d\d:\d\d UTC "
            r"\(the cloud's database is unavailable; retry\)$"
        )

        def waiting() -> bool:
            return any(
                said.match(r.renewal.progress.summary)
                and r.renewal.progress.step_status == types_pb2.STEP_STATUS_PLANNING
                for r in cloud.received
                if r.WhichOneof("kind") == "renewal"
            )

        await cloud.wait_for(waiting, 60)
    assert run.alive, run.said


class _DeadlineCloud(FakeCloud):
    """The fake LeaseService whose assignments give the task `deadline_s` to run."""

    def __init__(self, deadline_s: float) -> None:
        super().__init__()
        self.deadline_s = deadline_s

    def _assignment(self, lease: Lease, resumed: bool) -> lease_service_pb2.LeaseResponse:
        response = super()._assignment(lease, resumed)
        response.assignment.deadline_remaining.CopyFrom(self._duration(self.deadline_s))
        return response


async def test_a_step_whose_planning_stays_impossible_until_the_deadline_ends_retryable(
    node: str, tmp_path: Path
) -> None:
    # The Python host ends the attempt, retryable, once the next wait to plan would reach the
    # task's deadline (host/agent/planning_wait.py, `PlanningPostponed`): the task keeps its
    # attempts. host.js asked on past the deadline for as long as the cloud kept the lease.
    cloud = _DeadlineCloud(deadline_s=20)
    async with (
        fake_cloud_and_phones(
            tmp_path, HOST_ID, cloud=cloud, planner=_DatabaseDownPlanner()
        ) as rig,
        running_host(
            node,
            rig,
            HOST_ID,
            tmp_path / "host-data",
            certs=None,
            AMC_HOST_PLANNER_WAIT_INITIAL_S="4",
            AMC_HOST_PLANNER_WAIT_MAX_S="4",
        ) as run,
    ):
        await cloud.wait_for(lambda: cloud.hellos, 60)
        await cloud.assign("t1", "emulator-5554", "Turn on dark theme")
        await cloud.wait_for(lambda: cloud.results, 60)
    [result] = cloud.results
    assert result.status == types_pb2.TASK_STATUS_FAILED, run.said
    assert result.retryable, run.said
    assert re.fullmatch(
        r"the cloud's database stayed unavailable since \d\d:\d\d:\d\d UTC until the deadline "
        r"came near: the cloud's database is unavailable; retry",
        result.summary,
    ), (result.summary, run.said)

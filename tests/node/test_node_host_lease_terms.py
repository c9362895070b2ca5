"""How long the Node example host takes a lease to run, from what the cloud said, as the Python
host takes it (host/lease_client.py, `_mono_expiry`, `_on_assignment`).

Real parts: host.js as its own process against the in-test LeaseService of
tests/host/lease_fake.py (a cloud that says only what these tests need it to say) over mTLS,
and a virtual phone served over the adb protocol.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import lease_service_pb2, planner_service_pb2, planner_service_pb2_grpc, types_pb2
from host.agent.lease_pause import PAUSED_SUMMARY, PausedPastDeadline
from tests.host.lease_fake import FakeCloud, Lease
from tests.node.rig import assigned_host
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_lease_pause import (
    CONFIRMED,
    RAN_OUT,
    _Planner,
    _SilentCloud,
    _summaries,
)

__all__ = ["node"]


class _TimestampCloud(FakeCloud):
    """A cloud from before `lease_remaining`, or a foreign one: its assignments and renewals say
    when the lease runs out only as a time (`lease_expires_at`, `lease_s` from now). Its
    assignments grant a lease of `duration_s` (`lease_duration`, what each renewal would
    grant); its renewals go unanswered while `silent`."""

    def __init__(self, lease_s: float, duration_s: float, *, silent: bool) -> None:
        super().__init__(lease_s=lease_s, renew_s=1.0)
        self.duration_s = duration_s
        self.silent = silent

    def _assignment(self, lease: Lease, resumed: bool) -> lease_service_pb2.LeaseResponse:
        response = super()._assignment(lease, resumed)
        response.assignment.lease_duration.CopyFrom(self._duration(self.duration_s))
        return response

    async def _on_request(
        self,
        req: lease_service_pb2.LeaseRequest,
        out: asyncio.Queue[lease_service_pb2.LeaseResponse | None],
    ) -> None:
        if self.silent and req.WhichOneof("kind") == "renewal":
            return
        await super()._on_request(req, out)


async def test_renewals_that_say_only_when_the_lease_ends_keep_it_running(
    node: str, tmp_path: Path
) -> None:
    """Every renewal is answered with a new `lease_expires_at` 3 s on and no `lease_remaining`
    while step 2 waits for its Decide. Before, host.js ignored such a `Renewed`: the lease ran
    out 3 s after the assignment by its clock and the attempt paused, though every renewal was
    answered. Now it reads the time against its own clock, as the Python host does: the
    attempt runs on."""
    cloud = _TimestampCloud(lease_s=3.0, duration_s=3.0, silent=False)
    planner = _Planner()
    planning = "step 2: planning"
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner, AMC_TASKS="1") as host:
        # Renewed every second, step 2's progress unchanged: five of them are past the first
        # term. A pause ends them (its renewals say so).
        await cloud.wait_for(
            lambda: _summaries(cloud).count(planning) >= 5 or RAN_OUT in host.text(), 60
        )
    said = host.said
    assert RAN_OUT not in said, said
    assert not any(PAUSED_SUMMARY in s for s in _summaries(cloud)), said


async def test_an_assignment_that_says_only_when_the_lease_ends_ends_it_there(
    node: str, tmp_path: Path
) -> None:
    """The assignment's lease runs out in 3 s (`lease_expires_at`, no `lease_remaining`)
    though its `lease_duration` is an hour, and no renewal is answered. Before, host.js counted
    the whole `lease_duration` from the assignment: the attempt would have run on for an hour
    on a lease the cloud had swept. Now it ends the lease where the cloud said, as the Python
    host does, and the attempt pauses."""
    cloud = _TimestampCloud(lease_s=3.0, duration_s=3600.0, silent=True)
    async with assigned_host(node, tmp_path, HOST_ID, cloud, _Planner(), AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: RAN_OUT in host.text(), 30)
        # Paused: its renewals say so (the first comes as the next step is held).
        await cloud.wait_for(lambda: any(PAUSED_SUMMARY in s for s in _summaries(cloud)), 30)


class _ResumeCloud(_SilentCloud):
    """`_SilentCloud` (renewals answered with `lease_remaining`, `lease_s`; none while
    `silent`) whose assignments say their term as `lease_remaining` too, and whose resume of a
    held assignment (the reconnect's hello named it) grants `resumed_s` and gives the task
    `deadline_s` (`deadline_remaining`; None: no deadline)."""

    def __init__(self, lease_s: float) -> None:
        super().__init__(lease_service_pb2.REVOKE_REASON_EXPIRED)
        self.lease_s = lease_s
        self.resumed_s = lease_s
        self.deadline_s: float | None = None

    def _assignment(self, lease: Lease, resumed: bool) -> lease_service_pb2.LeaseResponse:
        response = super()._assignment(lease, resumed)
        a = response.assignment
        term = self.resumed_s if resumed else self.lease_s
        a.lease_expires_at.FromDatetime(datetime.now(UTC) + timedelta(seconds=term))
        a.lease_duration.CopyFrom(self._duration(term))
        a.lease_remaining.CopyFrom(self._duration(term))
        if resumed and self.deadline_s is not None:
            a.deadline_remaining.CopyFrom(self._duration(self.deadline_s))
        return response


@pytest.mark.parametrize("when", ["running", "paused"])
async def test_a_resumed_assignment_moves_the_lease_end_and_the_deadline(
    node: str, tmp_path: Path, when: str
) -> None:
    """The stream drops while step 2 waits for its Decide, the attempt running on an hour's
    lease ("running") or paused, its 4 s lease run out with no renewal answered ("paused").
    The cloud resumes it with a 2 s term and a deadline 6 s on, then answers no renewal. Now,
    as the Python host does, the attempt pauses when that term ends and ends retryable at
    that deadline. Before, host.js took neither from a resumed assignment: a running attempt
    ran on to its old lease's end (an hour: the cloud had swept the lease long before), and a
    paused one, confirmed and paused again, waited for the task's first deadline (none)."""
    cloud = _ResumeCloud(lease_s=3600.0 if when == "running" else 4.0)
    planner = _Planner()
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner, AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        cloud.silent = True
        if when == "paused":
            await cloud.wait_for(lambda: RAN_OUT in host.text(), 30)
        cloud.resumed_s, cloud.deadline_s = 2.0, 6.0
        cloud.cut()  # the reconnect's hello names the lease; the cloud resumes it
        if when == "paused":
            await cloud.wait_for(lambda: CONFIRMED in host.text(), 30)
        await cloud.wait_for(
            lambda: host.text().count(RAN_OUT) == (2 if when == "paused" else 1), 30
        )
        await cloud.wait_for(lambda: cloud.results, 30)
    said = host.said
    sent = cloud.results[0]
    assert (sent.status, sent.summary, sent.retryable) == (
        types_pb2.TASK_STATUS_FAILED,
        str(PausedPastDeadline()),
        True,
    ), said
    assert sent.final_progress.summary.endswith(PAUSED_SUMMARY), said


async def test_a_resumed_assignment_sets_how_often_the_lease_is_renewed(
    node: str, tmp_path: Path
) -> None:
    """The stream drops while step 2 waits for its Decide on an hour's lease (renewed every
    20 minutes); the cloud resumes it with a 2 s term, and answers each renewal with 2 s more.
    Now the attempt renews at a third of the resumed term, as the Python host does, and runs
    on. Before, host.js kept renewing every 20 minutes: the lease ran out 2 s after the
    resume (had its end been watched) with every renewal the cloud would have answered unsent."""
    cloud = _ResumeCloud(lease_s=3600.0)
    planner = _Planner()
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner, AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        cloud.lease_s = cloud.resumed_s = 2.0
        hellos = len(cloud.hellos)
        cloud.cut()
        await cloud.wait_for(lambda: len(cloud.hellos) > hellos, 30)
        before = len(_summaries(cloud))
        # Five renewals at a third of 2 s are past the resumed term.
        await cloud.wait_for(
            lambda: len(_summaries(cloud)) - before >= 5 or RAN_OUT in host.text(), 30
        )
    said = host.said
    assert RAN_OUT not in said, said


async def test_an_assignment_of_the_attempt_running_here_re_confirms_it(
    node: str, tmp_path: Path
) -> None:
    """While step 2 waits for its Decide the cloud sends the attempt's assignment again, not
    marked `resumed` (a cloud from before the field re-confirms a held lease so; a duplicate).
    Before, host.js checked it as a new one and refused it (here "the host is stopping": its
    one task had begun; else its phone was busy with that very attempt) with a FAILED result
    under the running attempt's lease: the cloud would end the attempt and queue the task
    while the phone ran on. Now it re-confirms the
    attempt, as the Python host does: no result, and the attempt renews on."""
    cloud = _ResumeCloud(lease_s=30.0)
    cloud.renew_s = 1.0
    planner = _Planner()
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner, AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        before = len(_summaries(cloud))
        await cloud.send(cloud._assignment(host.lease, resumed=False))
        # A refusal goes at once; three renewals take two seconds.
        await cloud.wait_for(lambda: cloud.results or len(_summaries(cloud)) - before >= 3, 30)
    said = host.said
    assert not cloud.results, (list(cloud.results), said)
    assert "refused" not in said, said


class _DonePlanner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Ends every task at its first step (`complete`, success); notes every Decide's step key."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        self.asked.append(request.step_key)
        done = types_pb2.CompleteAction(success=True, reason="done")
        return planner_service_pb2.DecideResponse(
            decision=types_pb2.Decision(
                step_index=1,
                tool_name="complete",
                arguments_json='{"success": true}',
                purpose="finish",
                action=types_pb2.Action(complete=done, purpose="finish"),
            )
        )


async def test_an_assignment_of_an_attempt_whose_result_waits_does_not_run_it_again(
    node: str, tmp_path: Path
) -> None:
    """The attempt ends at step 1 and its result goes unanswered; the cloud then sends the
    attempt's assignment again, not marked `resumed`. Before, host.js took it for a new one
    and ran the task again on the same lease, asking the model step 1 again. Now it re-confirms
    the lease whose result it holds, as the Python host does (it keeps the attempt until its
    result is answered): nothing runs again, and the result is the one it had."""
    cloud = FakeCloud(lease_s=30.0, renew_s=1.0)
    cloud.ack_results = False
    planner = _DonePlanner()
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner) as host:
        await cloud.wait_for(lambda: cloud.results, 60)
        await cloud.send(cloud._assignment(host.lease, resumed=False))
        # Run again, the task asks step 1 at once; the result is sent again every 5 s.
        await cloud.wait_for(lambda: len(planner.asked) > 1 or len(cloud.results) >= 2, 30)
    said = host.said
    assert planner.asked == ["1"], said
    assert {(r.status, r.summary) for r in cloud.results} == {
        (types_pb2.TASK_STATUS_SUCCEEDED, "done")
    }, said


class _ResumesNewLeases(FakeCloud):
    """A cloud whose assignments all say `resumed`, also of a lease this host never held (one
    that confused its hosts' leases, a foreign one)."""

    def _assignment(self, lease: Lease, resumed: bool) -> lease_service_pb2.LeaseResponse:
        return super()._assignment(lease, resumed=True)


async def test_a_resumed_assignment_of_a_lease_never_held_is_run(node: str, tmp_path: Path) -> None:
    """A resumed assignment naming a lease this process never held is run as a new one, as the
    Python host runs it (`_on_assignment` keys on the attempt it holds, not the flag): its
    first step is planned. Before, host.js set the lease's expiry and ran nothing, while the
    cloud counted the task running there until the lease ran out."""
    cloud = _ResumesNewLeases(lease_s=30.0, renew_s=1.0)
    planner = _Planner()
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner, AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: "1" in planner.asked, 30)
    assert "1" in planner.asked, host.said

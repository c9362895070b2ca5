"""When the Node example host renews a lease, as the Python host renews it (host/lease_client.py,
`_renew_loop`, `_on_welcome`): at the renew interval or by the lease's end, whichever comes
first; soon after a progress report, at most once a second, the latest progress; and at once on
a new stream.

Real parts: host.js as its own process against the in-test LeaseService of
tests/host/lease_fake.py over mTLS, and a virtual phone served over the adb protocol.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from amc.v1 import lease_service_pb2, planner_service_pb2, planner_service_pb2_grpc, types_pb2
from tests.host.lease_fake import FakeCloud
from tests.node.rig import assigned_host
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_lease_pause import RAN_OUT, _Planner, _summaries
from tests.node.test_node_host_lease_terms import _ResumeCloud

__all__ = ["node"]

PLANNING = "step 2: planning"


class _LookingPlanner(planner_service_pb2_grpc.PlannerServiceServicer):
    """Answers step 1 with get_ui_tree (nothing done on the phone: the host reports it acting
    and done in one go) and never answers step 2."""

    async def Decide(
        self,
        request: planner_service_pb2.DecideRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> planner_service_pb2.DecideResponse:
        if request.step_key != "1":
            await asyncio.Event().wait()  # until the host cancels the call
        return planner_service_pb2.DecideResponse(
            decision=types_pb2.Decision(
                step_index=1,
                tool_name="get_ui_tree",
                arguments_json="{}",
                purpose="read the screen",
                action=types_pb2.Action(get_ui_tree=types_pb2.GetUiTreeAction()),
            )
        )


async def test_progress_reported_at_once_goes_in_one_renewal_its_latest(
    node: str, tmp_path: Path
) -> None:
    """Step 1's get_ui_tree is reported acting, then done, within one turn of host.js's event
    loop; the lease is an hour's (renewed every 20 minutes). Before, each report sent a renewal
    there and then: the cloud heard "acting" and "done" within a millisecond, and a busy
    attempt renewed many times a second. Now, as the Python host, progress renews at most once
    a second, with the latest state when it goes: "acting" never goes alone, and step 2's
    "planning", the last state, does go (the interval is 20 minutes)."""
    cloud = _ResumeCloud(lease_s=3600.0)
    async with assigned_host(node, tmp_path, HOST_ID, cloud, _LookingPlanner(), AMC_TASKS="1"):
        await cloud.wait_for(lambda: PLANNING in _summaries(cloud), 60)
    summaries = _summaries(cloud)
    assert not [s for s in summaries if s.startswith("step 1: get_ui_tree")], summaries
    assert summaries[-1] == PLANNING, summaries


async def test_a_renew_interval_longer_than_the_lease_renews_by_its_end(
    node: str, tmp_path: Path
) -> None:
    """The assignment grants 2 s (`lease_remaining`, as is each renewal) and says to renew
    every 30 s. Before, host.js renewed only every 30 s: with step 2 waiting for its Decide,
    the lease ran out 2 s after its last progress and the attempt paused. Now it renews by the
    lease's end, as the Python host does, and runs on."""
    cloud = _ResumeCloud(lease_s=2.0)
    cloud.renew_s = 30.0
    planner = _Planner()
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner, AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        before = len(_summaries(cloud))
        # Five renewals of an unchanged step are past two terms.
        await cloud.wait_for(
            lambda: len(_summaries(cloud)) - before >= 5 or RAN_OUT in host.text(), 60
        )
    said = host.said
    assert RAN_OUT not in said, said


def _renewed_after_the_last_hello(cloud: FakeCloud) -> bool:
    """Whether the host sent a renewal after its latest hello."""
    kinds = [r.WhichOneof("kind") for r in cloud.received]
    last = len(kinds) - 1 - kinds[::-1].index("hello")
    return "renewal" in kinds[last:]


class _NoResumeCloud(_ResumeCloud):
    """`_ResumeCloud` whose welcome resumes nothing the hello names (the lease stays live, and
    is renewed), as a cloud that holds its leases over a reconnect without saying so again."""

    async def _on_request(
        self,
        req: lease_service_pb2.LeaseRequest,
        out: asyncio.Queue[lease_service_pb2.LeaseResponse | None],
    ) -> None:
        if req.WhichOneof("kind") == "hello":
            req = lease_service_pb2.LeaseRequest()
            req.hello.CopyFrom(lease_service_pb2.HostHello())
        await super()._on_request(req, out)


async def test_a_reconnect_renews_every_lease_at_once(node: str, tmp_path: Path) -> None:
    """The stream drops while step 2 waits for its Decide on an hour's lease (renewed every
    20 minutes); the cloud welcomes the reconnect and resumes nothing. Now host.js renews the
    lease on the new stream at once, as the Python host does. Before, nothing went until the
    interval came, 20 minutes on: a cloud that was down and gave the lease a short new term
    heard nothing of it."""
    cloud = _NoResumeCloud(lease_s=3600.0)
    planner = _Planner()
    async with assigned_host(node, tmp_path, HOST_ID, cloud, planner, AMC_TASKS="1") as host:
        await cloud.wait_for(lambda: "2" in planner.asked, 60)
        await cloud.wait_for(lambda: PLANNING in _summaries(cloud), 30)
        hellos = len(cloud.hellos)
        cloud.cut()
        await cloud.wait_for(lambda: len(cloud.hellos) > hellos, 30)
        await cloud.wait_for(lambda: _renewed_after_the_last_hello(cloud), 30)
    said = host.said
    assert RAN_OUT not in said, said

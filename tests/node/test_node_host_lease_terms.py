"""How long the Node example host takes a lease to run, from what the cloud said, as the Python
host takes it (host/lease_client.py, `_mono_expiry`, `_on_assignment`).

Real parts: host.js as its own process against the in-test LeaseService of
tests/host/lease_fake.py (a cloud that says only what these tests need it to say) over mTLS,
and a virtual phone served over the adb protocol.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from amc.v1 import lease_service_pb2
from host.agent.lease_pause import PAUSED_SUMMARY
from tests.host.lease_fake import FakeCloud, Lease
from tests.node.rig import assigned_host
from tests.node.test_node_host import HOST_ID, node
from tests.node.test_node_host_lease_pause import RAN_OUT, _Planner, _summaries

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
    said = host.said
    assert any(PAUSED_SUMMARY in s for s in _summaries(cloud)), said
